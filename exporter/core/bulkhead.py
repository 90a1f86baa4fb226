"""Deadlines on what the agent asks the GPU drivers, so that a stuck call degrades only itself.

A call into a GPU driver can block for seconds or for ever: a GPU that fell off the bus,
the driver's own lock held by another process. ctypes releases the GIL during the call,
but a thread stuck in it can be neither interrupted nor killed. So a pass asks the
driver from a worker thread and waits for it with a deadline; a read that overruns is
*abandoned*: its thread is left to finish the call whenever it returns, the pass goes on
without it, and no other call is started on the same key (the same GPU) until it has
returned. Then the key is read again as before: a GPU that recovers needs no restart.

A pass is a list of `Read`\\ s, each one key's part of the pass (one GPU's queries, the XID
event drain, or a whole backend that has no finer parts). `Bulkhead.run` hands the whole
list to one long-lived worker thread and waits for it: in a normal pass that is one
hand-off, not a thread per GPU (reading GPUs concurrently costs CPU, see
docs/PERFORMANCE.md). Only when a read overruns does the pass fan out: the reads left
after it each get a thread of their own and are waited for together, so a pass in which
every call blocks (the driver's lock held) still ends within two deadlines whatever the
number of GPUs, and leaves at most one thread behind per stuck key. Reads marked
``last`` (cleanup after the others) run after the fan-out.

Which call is stuck is read off the stuck thread's stack when the deadline passes (the
innermost frame whose function name starts with one of the read's ``calls`` prefixes,
e.g. ``nvml``: pynvml's and the fake's function names are NVML's own), so a normal pass
pays nothing for it.

A thread given up on stops as soon as its call returns: backends call `check_abandoned`
after each driver call (the NVML backend does it in its one call wrapper), which raises
`Abandoned`, so the rest of that stale read does not run beside the newer passes.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Any, Callable, Hashable, Sequence

log = logging.getLogger(__name__)

#: Seconds a read (one GPU's queries in a pass) may take before it is given up on. A
#: normal read takes milliseconds on a real driver (the slowest NVML query, ~20 ms).
DEFAULT_READ_TIMEOUT = 1.0
#: Seconds between two warnings about the same part (stuck, or returned): a GPU that keeps
#: overrunning and answering is logged once a minute, with a count, not once per pass.
LOG_EVERY = 60.0

# Idents of the threads whose read was given up on (backends only read it): tested by
# `check_abandoned` after every driver call, so a plain set (an empty one is a cheap falsy test).
ABANDONED: set[int] = set()
_get_ident = threading.get_ident


class Abandoned(BaseException):
    """Raised in a thread whose read was given up on, once its call has returned.

    A BaseException, so that the ``except Exception`` of a backend's error handling does
    not swallow it: the stale read stops where it is.
    """


def check_abandoned() -> None:
    """Raise `Abandoned` in a thread whose read the pass has given up on (call after each
    driver call; costs one test of an empty set otherwise)."""
    if ABANDONED and _get_ident() in ABANDONED:
        raise Abandoned()


@dataclass(frozen=True)
class Read:
    """One key's part of a collection pass, which can be given up on by itself.

    Attributes:
        key: what a stuck call blocks; never two reads of one key at a time (a GPU
            index, "events"). Unique within a pass.
        what: the part for people: "GPU 1", "XID events", "the amd backend".
        run: does the reading; returns this part's `DeviceSample`\\ s (or anything the
            caller expects).
        calls: prefixes of the vendor library's function names (``("nvml",)``), to name
            the call a stuck read is in.
        timeout: seconds this read may take (None: the bulkhead's default).
        last: run after every other read of the pass (cleanup that needs their results).
        down: the devices this part covers, reported down with the given reason while it
            gives no answer (stuck, or failed); None for a part that covers no device.
    """

    key: Hashable
    what: str
    run: Callable[[], Any]
    calls: tuple[str, ...] = ()
    timeout: float | None = None
    last: bool = False
    down: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class Failed:
    """A read that raised: its exception."""

    error: BaseException


@dataclass(frozen=True)
class Stuck:
    """A read that has not returned within its deadline.

    Attributes:
        key, what: the read's.
        call: the vendor call it is in (e.g. ``nvmlDeviceGetPowerUsage``), else what it
            is doing as far as the stack tells.
        since: wall-clock time (Unix seconds) at which the read started.
        seconds: how long it had been running when the pass looked.
    """

    key: Hashable
    what: str
    call: str
    since: float
    seconds: float


@dataclass
class _Abandon:
    """A read given up on: whose thread, since when (monotonic and wall clock)."""

    read: Read
    ident: int
    started: float
    since: float
    call: str


class _Job:
    """Reads one thread runs in order; progress is shared with the waiting pass under ``lock``.

    A plain class with slots: one is made per pass.
    """

    __slots__ = ("reads", "indexes", "done", "clock", "lock", "results", "current", "started", "ident", "shared",
                 "abandoned", "finished")

    def __init__(self, reads: Sequence[Read], indexes: list[int], done: SimpleQueue, clock: Callable[[], float]):
        self.reads = reads
        self.indexes = indexes
        self.done = done
        self.clock = clock
        self.lock = threading.Lock()
        self.results: dict[int, Any] = {}
        self.current: int | None = None  # index of the read running now
        self.started = 0.0  # monotonic start of that read
        self.ident = 0  # the thread running the job
        self.shared = False  # run by the long-lived worker
        self.abandoned = False
        self.finished = False

    def execute(self, bulkhead: Bulkhead) -> bool:
        """Run the reads (in the job's thread); False if the thread was given up on."""
        self.ident = _get_ident()
        for position in self.indexes:
            read = self.reads[position]
            with self.lock:
                self.current, self.started = position, self.clock()
            try:
                value: Any = read.run()
            except Abandoned:
                value = None
            except Exception as exc:  # noqa: BLE001 - reported as the read's failure
                value = Failed(exc)
            with self.lock:
                if self.abandoned:  # the pass gave up on this read; its call has now returned
                    bulkhead._returned(read.key, self.ident)
                    return False
                self.results[position] = value
                self.current = None
        with self.lock:
            self.finished = True
        self.done.put(self)
        return True


class Bulkhead:
    """Runs a pass's reads with a deadline on each (see the module doc).

    Args:
        timeout: default seconds a read may take before it is given up on.
        clock: monotonic clock, seconds.
        wall: wall clock, Unix seconds (for when a stuck read started).
        name: name of the worker threads.
    """

    def __init__(self, timeout: float = DEFAULT_READ_TIMEOUT, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, name: str = "l9gpu-read"):
        self.timeout = timeout
        self._clock = clock
        self._wall = wall
        self._name = name
        self._lock = threading.Lock()
        self._stuck: dict[Hashable, _Abandon] = {}
        self._jobs: SimpleQueue | None = None  # the long-lived worker's queue; None: no idle worker
        self._warned: dict[Hashable, tuple[float, int]] = {}  # topic -> (last warning, quieted since)

    # ---- what is stuck ------------------------------------------------------------------

    def stuck(self) -> list[Stuck]:
        """The reads given up on whose call has not returned yet, oldest first."""
        now = self._clock()
        with self._lock:
            entries = list(self._stuck.values())
        frames = sys._current_frames() if entries else {}
        return sorted((self._report(e, now, frames) for e in entries), key=lambda s: s.since)

    def _report(self, entry: _Abandon, now: float, frames: dict[int, Any]) -> Stuck:
        call = _innermost_call(frames.get(entry.ident), entry.read.calls) or entry.call
        return Stuck(entry.read.key, entry.read.what, call, entry.since, max(0.0, now - entry.started))

    def _returned(self, key: Hashable, ident: int) -> None:
        """The call of a read given up on has returned (in that read's thread)."""
        with self._lock:
            entry = self._stuck.get(key)
            if entry is not None and entry.ident == ident:
                del self._stuck[key]
            ABANDONED.discard(ident)
        if entry is not None:
            self._warn((key, "returned"), "%s: %s returned after %.1f s; reading it again", entry.read.what,
                       entry.call, self._clock() - entry.started)

    def _warn(self, topic: Hashable, message: str, *args: Any) -> None:
        """Log a warning, at most one per `LOG_EVERY` seconds and topic; the ones in
        between go to debug, and the next warning says how many there were (a GPU that
        keeps overrunning and answering must not flood the log)."""
        now = self._clock()
        with self._lock:
            last, quiet = self._warned.get(topic, (None, 0))
            recent = last is not None and now - last < LOG_EVERY
            self._warned[topic] = (last, quiet + 1) if recent else (now, 0)  # type: ignore[assignment]
        if recent:
            log.debug(message, *args)
        elif quiet and last is not None:
            log.warning(message + " (%d more times in the last %.0f s)", *args, quiet, now - last)
        else:
            log.warning(message, *args)

    # ---- one pass -----------------------------------------------------------------------

    def run(self, reads: Sequence[Read]) -> list[Any]:
        """Run ``reads`` in order, each within its deadline.

        Returns:
            Per read, in order: what its ``run`` returned, a `Failed` with what it raised,
            or a `Stuck` when it overran its deadline now or in an earlier pass (it is then
            not run again until its call has returned).

        Called from one thread at a time (the collector's).
        """
        out: list[Any] = [None] * len(reads)
        first: list[int] = []
        last: list[int] = []
        now = self._clock()
        with self._lock:
            stuck = {i: self._stuck[r.key] for i, r in enumerate(reads) if r.key in self._stuck}
        if stuck:
            frames = sys._current_frames()
            for i, entry in stuck.items():
                out[i] = self._report(entry, now, frames)
        for i, read in enumerate(reads):
            if i not in stuck:
                (last if read.last else first).append(i)
        if not first and not last:
            return out
        done: SimpleQueue = SimpleQueue()
        active = [self._start(_Job(reads, first + last, done, self._clock), shared=True)]
        deferred: list[int] = []
        while active or deferred:
            if not active:  # the fanned-out reads are done: now the ones that come last
                active.append(self._start(_Job(reads, deferred, done, self._clock), shared=False))
                deferred = []
            wake = min(self._due(job) for job in active)
            finished: _Job | None = None
            delay = wake - self._clock()
            if delay > 0:
                try:
                    finished = done.get(timeout=delay)
                except Empty:
                    pass
            if finished is not None:
                active.remove(finished)
                out_update(out, finished.results)
                continue
            for job in list(active):
                abandoned = self._abandon(job)
                if abandoned is None:
                    continue
                position, entry, rest = abandoned
                active.remove(job)
                out_update(out, job.results)
                out[position] = self._report(entry, self._clock(), {})
                for i in rest:
                    if reads[i].last:
                        deferred.append(i)
                    else:  # fan out: the reads left each get a thread
                        active.append(self._start(_Job(reads, [i], done, self._clock), shared=False))
        return out

    def _due(self, job: _Job) -> float:
        """When the read ``job`` runs now overruns (monotonic seconds)."""
        position, started = job.current, job.started
        if position is None:  # between two reads, or not started yet: look again soon
            return self._clock() + self.timeout
        timeout = job.reads[position].timeout
        return started + (self.timeout if timeout is None else timeout)

    def _start(self, job: _Job, shared: bool) -> _Job:
        """Hand ``job`` to the long-lived worker (``shared``) or to a thread of its own."""
        job.shared = shared
        if shared:
            if self._jobs is None:
                self._jobs = SimpleQueue()
                threading.Thread(target=self._serve, args=(self._jobs,), name=self._name, daemon=True).start()
            self._jobs.put(job)
        else:
            what = job.reads[job.indexes[0]].what
            threading.Thread(target=job.execute, args=(self,), name=f"{self._name} {what}", daemon=True).start()
        return job

    def _serve(self, jobs: SimpleQueue) -> None:
        """The long-lived worker: runs one job per pass until it is given up on."""
        while True:
            job = jobs.get()
            if job is None or not job.execute(self):
                return

    def _abandon(self, job: _Job) -> tuple[int, _Abandon, list[int]] | None:
        """Give up on ``job`` if its current read overran: (that read, its entry, the reads
        left), else None."""
        now = self._clock()
        with job.lock:
            position = job.current
            if job.finished or position is None or now < self._due(job):
                return None
            job.abandoned = True
            read = job.reads[position]
            call = _innermost_call(sys._current_frames().get(job.ident), read.calls) or f"{read.what} read"
            entry = _Abandon(read, job.ident, job.started, self._wall() - (now - job.started), call)
            with self._lock:
                self._stuck[read.key] = entry
                ABANDONED.add(job.ident)
            rest = job.indexes[job.indexes.index(position) + 1:]
        if job.shared:
            self._jobs = None  # that worker is stuck: the next pass starts another
        self._warn((read.key, "stuck"), "%s: %s has not returned after %.1f s; reporting it stuck and reading the "
                   "rest without it", read.what, call, now - entry.started)
        return position, entry, rest

    def close(self) -> None:
        """Let the idle worker thread end."""
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None


def out_update(out: list[Any], results: dict[int, Any]) -> None:
    for position, value in results.items():
        out[position] = value


def _innermost_call(frame: Any, prefixes: tuple[str, ...]) -> str:
    """The innermost function on a thread's stack whose name starts with one of ``prefixes``."""
    if not prefixes:
        return ""
    while frame is not None:
        name = frame.f_code.co_name
        if name.startswith(prefixes):
            return str(name)
        frame = frame.f_back
    return ""


@dataclass(frozen=True)
class Outcome:
    """What `call_within` saw: the result, or what was raised, or the call it is stuck in."""

    returned: bool
    value: Any = None
    error: BaseException | None = None
    call: str = ""


def call_within(fn: Callable[[], Any], timeout: float, calls: tuple[str, ...] = (),
                name: str = "l9gpu-call") -> Outcome:
    """Run ``fn`` on a thread of its own and wait at most ``timeout`` seconds for it.

    For what runs once and may hang (opening or closing a vendor library): the caller
    goes on either way; a call that does not return is left to its (daemon) thread.

    Returns:
        ``returned`` with ``value`` or ``error`` when it ended in time; otherwise the
        call it is stuck in (the innermost function named with one of ``calls``).
    """
    box: dict[str, Any] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finished.set()

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    if finished.wait(timeout):
        return Outcome(True, box.get("value"), box.get("error"))
    ident = thread.ident
    frame = sys._current_frames().get(ident) if ident is not None else None
    return Outcome(False, call=_innermost_call(frame, calls))


__all__ = ["DEFAULT_READ_TIMEOUT", "Abandoned", "Bulkhead", "Failed", "Outcome", "Read", "Stuck", "call_within",
           "check_abandoned"]
