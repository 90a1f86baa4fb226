"""Read what attribution needs about a PID from a proc root (``/proc`` or a host mount).

Per PID: the start time (field 22 of ``stat``, clock ticks since boot, which together
with the PID identifies one process for its whole life), ``comm``, the real uid
(``status``), the parsed ``cgroup`` file, and for Slurm steps an allow-listed subset of
``environ``. `ProcCache` keeps these per (pid, start time), so a cycle costs one small
``stat`` read per known PID (on the agent's own procfs: no read at all, see
`ProcessExits`), a reused PID never inherits an old owner, and entries of PIDs that are
gone are dropped.
"""

from __future__ import annotations

import errno
import logging
import os
import select
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from exporter.attribution.cgroups import SLURM, UNKNOWN_OWNER, CgroupOwner, parse_cgroup_file
from exporter.core.model import frozen_mapping

log = logging.getLogger(__name__)

# The only environment variables ever read from a process, and only from Slurm steps.
# Nothing else from environ is kept, logged or exported.
SLURM_ENV_ALLOWED: frozenset[str] = frozenset(
    {"SLURM_JOB_ID", "SLURM_JOB_USER", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT",
     "SLURM_PROCID"})  # the task's rank in its step: the workload's training rank
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/<pid>/stat's unit
_ENVIRON_LIMIT = 256 * 1024  # bytes; environ is rarely over a few KiB


@dataclass(frozen=True)
class ProcInfo:
    """One process, read once.

    Attributes:
        pid: the PID in the proc root's PID namespace (the host's with hostPID).
        start_time: clock ticks since boot at which the process started.
        comm: the short command name ("" when unreadable).
        uid: the real uid, None when unreadable.
        cgroup: the owner named by its cgroup file.
        slurm_env: the allow-listed variables (`SLURM_ENV_ALLOWED`; Slurm steps only).
    """

    pid: int
    start_time: int
    comm: str = ""
    uid: int | None = None
    cgroup: CgroupOwner = UNKNOWN_OWNER
    slurm_env: Mapping[str, str] = field(default_factory=frozen_mapping)


def parse_start_time(stat: str) -> int | None:
    """Field 22 (starttime) of a ``/proc/<pid>/stat`` line, or None when malformed.

    The second field, ``(comm)``, may itself contain spaces and parentheses, so the
    fields are counted from the last ``)``.
    """
    end = stat.rfind(")")
    if end < 0:
        return None
    rest = stat[end + 1:].split()
    # rest[0] is field 3 (state), so field 22 is rest[19].
    if len(rest) < 20:
        return None
    try:
        return int(rest[19])
    except ValueError:
        return None


def parse_uid(status: str) -> int | None:
    """The real uid from a ``/proc/<pid>/status`` text, or None."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
            return None
    return None


def parse_environ(data: bytes, allowed: frozenset[str] = SLURM_ENV_ALLOWED) -> dict[str, str]:
    """The allow-listed variables of a NUL-separated ``environ``; everything else is dropped."""
    found: dict[str, str] = {}
    for entry in data.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if not sep:
            continue
        name = key.decode("ascii", "replace")
        if name in allowed:
            found[name] = value.decode("utf-8", "replace")
    return found


class ProcFS:
    """Reads processes under a proc root.

    Args:
        root: the proc root, ``/proc`` or where the host's /proc is mounted.
    """

    def __init__(self, root: str = "/proc"):
        self.root = root

    def _path(self, pid: int, name: str) -> str:
        return os.path.join(self.root, str(pid), name)

    def _text(self, pid: int, name: str) -> str | None:
        try:
            with open(self._path(pid, name), "rb") as fh:
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return None

    def exists(self, pid: int) -> bool:
        """True when the proc root has a directory for ``pid``."""
        return os.path.isdir(os.path.join(self.root, str(pid)))

    def start_time(self, pid: int) -> int | None:
        """The process's start time in clock ticks, None when it is gone or unreadable.

        Called for every GPU PID on every pass, so it reads with plain os calls.
        """
        try:
            fd = os.open(f"{self.root}/{pid}/stat", os.O_RDONLY)
        except OSError:
            return None
        try:
            data = os.read(fd, 4096)
        except OSError:
            return None
        finally:
            os.close(fd)
        return parse_start_time(data.decode("utf-8", "replace"))

    def read(self, pid: int, start_time: int | None = None) -> ProcInfo | None:
        """Everything attribution needs about ``pid``; None when it is gone."""
        if start_time is None:
            start_time = self.start_time(pid)
            if start_time is None:
                return None
        cgroup_text = self._text(pid, "cgroup")
        if cgroup_text is None:
            return None
        owner = parse_cgroup_file(cgroup_text)
        if owner.kind == "unknown" and cgroup_text.strip():
            log.debug("pid %d: no recognisable line in its cgroup file", pid)
        comm = (self._text(pid, "comm") or "").strip()
        status = self._text(pid, "status")
        uid = parse_uid(status) if status else None
        env: Mapping[str, str] = frozen_mapping()
        if owner.kind == SLURM:
            env = frozen_mapping(self._slurm_env(pid))
        return ProcInfo(pid, start_time, comm, uid, owner, env)

    def _slurm_env(self, pid: int) -> dict[str, str]:
        try:
            with open(self._path(pid, "environ"), "rb") as fh:
                data = fh.read(_ENVIRON_LIMIT)
        except OSError:
            return {}
        return parse_environ(data)


def max_kept_open() -> int:
    """Proc files kept open at most (one per GPU process): a quarter of the descriptor
    limit, 2048 at most (GPU processes rarely number more than a few hundred on a node)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 8192
    except (ImportError, OSError, ValueError):
        soft = 1024
    return max(0, min(2048, soft // 4))


def _own_pid_namespace(root: str) -> bool:
    """True when ``root`` is the procfs of the agent's own PID namespace (``/proc``, or the
    host's with hostPID), so that a PID read there names the process ``pidfd_open`` opens."""
    try:
        return os.readlink(os.path.join(root, "self")) == str(os.getpid())
    except OSError:
        return False


class ProcessExits:
    """Which watched processes have exited, for all of them in one system call.

    Each watched process gets a pidfd (``pidfd_open``, Linux 5.3+): it is bound to that
    process, not to its PID, and becomes readable once the process exits, even if the PID
    has since been given to another. All pidfds sit in one epoll set, so a pass learns
    which of hundreds of GPU processes ended with one ``epoll_wait``, instead of reading a
    file per process.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._count = 0

    @classmethod
    def open(cls) -> ProcessExits | None:
        """A watcher, or None where the kernel (or Python) has no pidfds."""
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is None:
            return None
        try:
            os.close(pidfd_open(os.getpid()))
            return cls()
        except OSError:  # ENOSYS before Linux 5.3, or refused by a seccomp profile
            return None

    def watch(self, pid: int) -> int | None:
        """Watch the process that has ``pid`` now; its pidfd, None when there is none.

        Raises:
            OSError: the pidfd could not be opened for another reason than the process
                being gone (EMFILE: out of descriptors).
        """
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:  # ESRCH: no such process
            return None
        try:
            self._epoll.register(fd, select.EPOLLIN)
        except OSError:
            os.close(fd)
            raise
        self._count += 1
        return fd

    def exited(self) -> set[int]:
        """The pidfds whose process has exited (a zombie counts as exited)."""
        if not self._count:
            return set()
        return {fd for fd, _ in self._epoll.poll(0, self._count + 1)}

    @staticmethod
    def has_exited(fd: int) -> bool:
        """Whether the process of one pidfd has exited (a zombie counts as exited)."""
        return bool(select.select([fd], [], [], 0)[0])

    def unwatch(self, fd: int) -> None:
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass
        self._count -= 1
        os.close(fd)

    def close(self) -> None:
        self._epoll.close()
        self._count = 0


class ProcCache:
    """`ProcInfo` per (pid, start time), refreshed once per cycle.

    Args:
        procfs: the reader.
        pidfds: on the agent's own procfs, watch processes through pidfds (`ProcessExits`);
            False keeps the ``comm`` files open instead, as on another PID namespace's.
    """

    def __init__(self, procfs: ProcFS, pidfds: bool = True):
        self.procfs = procfs
        self._entries: dict[int, ProcInfo] = {}
        # changes whenever the processes cached change (`comm` and `start_seconds` may then
        # answer otherwise for some PID)
        self.generation = 0
        self.reads = 0  # full reads so far (cache misses), for tests and benchmarks
        # On a real procfs, an open /proc/<pid>/comm stays bound to that process: reading it
        # again costs one small pread (no path lookup, no stat to format), and fails once
        # the process is gone, even if its PID was given to another. Fixture trees (plain
        # files, which outlive nothing) are read by path every pass.
        self._real_procfs = os.path.islink(os.path.join(procfs.root, "self"))
        # On the agent's own procfs, cheaper still: a pidfd per process, all checked at once.
        self._exits = (ProcessExits.open()
                       if pidfds and self._real_procfs and _own_pid_namespace(procfs.root) else None)
        self._fds: dict[int, int] = {}
        self._max_open = max_kept_open()
        # The last lookup, while it can stand for the next one (see `lookup`): its PIDs and
        # its answer.
        self._settled: tuple[list[int], dict[int, ProcInfo | None]] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, pids: Iterable[int]) -> dict[int, ProcInfo | None]:
        """Info for each PID (None when gone); forgets PIDs not asked for this cycle.

        Watched through pidfds, the same PIDs as last time, each found then and none
        exited since, are the same processes: the last answer is returned, the very same
        mapping (callers read it, never change it), without looking at any of them.
        """
        pids = list(pids)
        exited = self._exits.exited() if self._exits is not None else set()
        settled = self._settled
        if settled is not None and not exited and settled[0] == pids:
            return settled[1]
        result: dict[int, ProcInfo | None] = {}
        fresh: dict[int, ProcInfo] = {}
        fds = self._fds
        kept: dict[int, int] = {}
        for pid in pids:
            if self._real_procfs:
                start, replaced = self._start_time(pid, fds, kept, exited)
            else:
                start, replaced = self.procfs.start_time(pid), False
            if start is None:
                result[pid] = None
                continue
            cached = self._entries.get(pid)
            if cached is None or cached.start_time != start or replaced:
                # New PID or a reused one (different start time, or a new process in the
                # same clock tick): read everything again.
                cached = self.procfs.read(pid, start)
                self.reads += 1
            result[pid] = cached
            if cached is not None:
                fresh[pid] = cached
        before = self._entries
        if len(fresh) != len(before) or any(before.get(pid) is not info for pid, info in fresh.items()):
            self.generation += 1
        self._entries = fresh
        for pid, fd in fds.items():  # processes gone or no longer asked about
            if kept.get(pid) != fd:
                self._release(fd)
        self._fds = kept
        # Every PID found and watched by its pidfd: until one exits, the answer stands.
        watched = self._exits is not None and len(fresh) == len(kept) == len(pids)
        self._settled = (pids, result) if watched else None
        return result

    def _start_time(self, pid: int, fds: dict[int, int], kept: dict[int, int],
                    exited: set[int]) -> tuple[int | None, bool]:
        """(start time of the process that has ``pid`` now or None when there is none,
        whether it replaced the process cached for that PID).

        A process seen before is checked without reading its ``stat``. On the agent's own
        procfs its pidfd tells whether it exited (``exited``: one ``epoll_wait`` for all);
        on another real procfs (the host's, mounted without hostPID) one small read of its
        kept-open ``comm`` does: that file stays bound to the process it was opened for, so
        the read fails (ESRCH) once it is reaped. Either way the check is about that very
        process, even if its PID now belongs to another, and its known start time is
        returned while it lives. A new PID (or one whose process went) is read by path,
        with the pidfd or ``comm`` file opened first, so it can only be bound to this
        process or to one that ends before the read (which the next pass notices). A
        process that took the PID of a cached one is reported as a replacement, since it
        may have started in the same clock tick (same start time).
        """
        fd = fds.get(pid)
        gone = False
        if fd is not None:
            cached = self._entries.get(pid)
            if self._exits is not None:
                alive = fd not in exited
            else:
                try:
                    alive = bool(os.pread(fd, 64, 0))
                except OSError:  # ESRCH: that process is gone (its PID may live on in another)
                    alive = False
            if alive and cached is not None:
                kept[pid] = fd
                return cached.start_time, False
            gone = not alive
        if len(kept) >= self._max_open:
            return self.procfs.start_time(pid), False
        if self._exits is not None:
            try:
                new_fd = self._exits.watch(pid)
            except OSError:  # out of descriptors: read by path this pass, watch it on a later one
                return self.procfs.start_time(pid), False
            if new_fd is None:
                return None, False
            fd = new_fd
            # The cached process exited; a zombie is still that process (and its pidfd is
            # readable at once), a live process under its PID is another one.
            replaced = gone and not self._exits.has_exited(fd)
        else:
            try:
                fd = os.open(f"{self.procfs.root}/{pid}/comm", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):  # out of descriptors: by path this pass
                    return self.procfs.start_time(pid), False
                return None, False
            replaced = gone  # a zombie's comm still reads: a failed read means reaped
        start = self.procfs.start_time(pid)
        if start is None:
            self._release(fd)
            return None, False
        kept[pid] = fd
        return start, replaced

    def _release(self, fd: int) -> None:
        if self._exits is not None:
            self._exits.unwatch(fd)
        else:
            os.close(fd)

    def close(self) -> None:
        """Close the pidfds and proc files kept open."""
        self._settled = None
        for fd in self._fds.values():
            self._release(fd)
        self._fds = {}
        if self._exits is not None:
            self._exits.close()
            self._exits = None

    def comm(self, pid: int) -> str:
        entry = self._entries.get(pid)
        return entry.comm if entry else ""

    def start_seconds(self, pid: int) -> float | None:
        """When the process cached for ``pid`` started, seconds since boot (the clock of
        ``time.monotonic()`` and of the kernel log's stamps); None where unknown or where
        the proc root is no real procfs (a fixture tree's start times are made up)."""
        entry = self._entries.get(pid)
        if entry is None or not self._real_procfs:
            return None
        return entry.start_time / CLOCK_TICKS
