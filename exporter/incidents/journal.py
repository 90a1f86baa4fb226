"""NVIDIA's Xid lines from the kernel's records in the systemd journal, read without privilege.

journald copies every kernel log record into the journal (``_TRANSPORT=kernel``): on a
node where it keeps one, ``/var/log/journal`` (persistent) or ``/run/log/journal``
(volatile, lost at reboot), mounted read-only, give the agent the same Xid lines as
``/dev/kmsg`` without CAP_SYSLOG or a privileged container. The files are read through
libsystemd's own journal API (the ``systemd-python`` binding, an optional dependency:
``pip install '.[journal]'`` in l9gpu's checkout or Debian's ``python3-systemd``), never parsed by hand.

libsystemd maps the files into memory, and a file truncated under it ends its process with
SIGBUS, which Python cannot catch. So the library runs in a child process of its own
(`exporter.incidents.journal_reader`), started once and kept: it follows the directories as
journald appends (new and rotated files included) and sends only the Xid records and its
counts through a pipe. `JournalKernelLog.poll` reads that pipe without waiting: no fork and
no library call on a pass. A child that dies (SIGBUS on a truncated file, anything else) is
an outcome, not the agent's end: counted (`JournalKernelLog.failures`, for
``l9gpu_kernel_log_reader_failures_total``), logged once, and started again after 1 s, then
2, 4, ... up to `MAX_BACKOFF` while it keeps dying, going on after the last entry the one
before sent (the journal's cursor). A file journald or an administrator replaces is read
again; a file left truncated is skipped by the library once it opens it again.

Only this machine's and this boot's kernel entries make a record (the child's docstring
says how each is told); the others are counted ``other_machine`` and ``other_boot``.
"""

from __future__ import annotations

import glob
import grp
import json
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import time
from typing import Any, Callable

from exporter.incidents.journal_reader import JOURNAL_OUTCOMES
from exporter.incidents.kmsg import MAX_COUNT, OUTCOMES, KernelLogUnavailable, XidRecord

log = logging.getLogger(__name__)

# Where journald keeps its files: persistent first, then volatile.
JOURNAL_DIRS = ("/var/log/journal", "/run/log/journal")
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
MACHINE_ID_PATH = "/etc/machine-id"
# Seconds the first child has to open the directories at start-up.
START_TIMEOUT = 30.0
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 60.0
_READ_SIZE = 65536


def _binding() -> None:
    try:
        from systemd import journal  # noqa: F401 - only whether it imports: the child uses it
    except ImportError:
        raise KernelLogUnavailable(
            "cannot read the kernel log from the journal: the systemd-python binding is not installed "
            "(pip install '.[journal]' in l9gpu's checkout, or Debian's python3-systemd)") from None


def _read_id(path: str) -> str:
    """A 128-bit id as journald writes it (32 hex digits, no dashes); "" where unreadable."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(64).strip().replace(b"-", b"").decode("ascii", "replace").lower()
    except OSError:
        return ""
    return text if len(text) == 32 and all(c in "0123456789abcdef" for c in text) else ""


def _package_root() -> str:
    import exporter

    return os.path.dirname(os.path.dirname(os.path.abspath(exporter.__file__)))


def unreadable_files(dirs: list[str]) -> list[str]:
    """The journal files in ``dirs`` (or in their ``<machine-id>/`` folders) that this
    process may not read: libsystemd skips them without a word."""
    found = []
    for directory in dirs:
        for pattern in ("*.journal", "*.journal~", "*/*.journal", "*/*.journal~"):
            found += [path for path in glob.glob(os.path.join(glob.escape(directory), pattern))
                      if not os.access(path, os.R_OK)]
    return sorted(found)


def unreadable_message(where: str, paths: list[str]) -> str:
    """What to do about journal files the agent may not read: run it in the group that owns
    them (systemd-journal on most distributions), or as root."""
    try:
        st = os.stat(paths[0])
    except OSError:
        owner = ""
    else:
        try:
            group = f"{grp.getgrgid(st.st_gid).gr_name} (GID {st.st_gid})"
        except KeyError:
            group = f"GID {st.st_gid}"
        owner = f", mode {stat.filemode(st.st_mode)}, group {group}"
    return (f"the journal at {where} has {len(paths)} file(s) the agent may not read (UID {os.getuid()}; "
            f"{paths[0]}{owner}): Xid lines are not read from it until the agent runs in the group that owns "
            "them (Helm: podSecurityContext.supplementalGroups, see the chart's README) or as root")


class JournalKernelLog:
    """Xid records from the kernel's entries in journal files, read by a child process.

    Args:
        directory: a journal directory (holding ``<machine-id>/*.journal`` or the files
            themselves); None reads `JOURNAL_DIRS`, those that exist.
        from_start: read the oldest entries first (a replay); by default only those
            written after opening.
        clock: the monotonic clock (seconds), for the restarts' backoff.
        machine_id: this machine's id; None reads `MACHINE_ID_PATH` (with none readable,
            only the boot id is checked, said once at start).

    Raises:
        KernelLogUnavailable: no binding, no directory, or none can be opened (the
            message says which).
    """

    def __init__(self, directory: str | None = None, from_start: bool = False,
                 clock: Callable[[], float] = time.monotonic, machine_id: str | None = None):
        _binding()
        dirs = [directory] if directory else [d for d in JOURNAL_DIRS if os.path.isdir(d)]
        self.path = ",".join(dirs) if dirs else ",".join(JOURNAL_DIRS)
        if not dirs:
            raise KernelLogUnavailable(
                f"cannot read the kernel log from the journal: neither {' nor '.join(JOURNAL_DIRS)} exists "
                "(journald keeps no journal on this node, or the directories are not mounted)")
        if not os.path.isdir(dirs[0]):
            raise KernelLogUnavailable(f"cannot read the kernel log from the journal {dirs[0]}: no such directory")
        self._dirs = dirs
        self._from_start = from_start
        self._clock = clock
        self._boot = _read_id(BOOT_ID_PATH)
        self._machine = _read_id(MACHINE_ID_PATH) if machine_id is None else machine_id
        if not self._machine:
            log.info("this machine's id cannot be read (%s): the journal's kernel entries are told apart by "
                     "their boot id only", MACHINE_ID_PATH)
        self._ended = dict.fromkeys(OUTCOMES + JOURNAL_OUTCOMES, 0)  # the counts of the children that ended
        self._child_counts: dict[str, int] = {}
        self._cursors: list[str | None] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._pending: list[XidRecord] = []
        self._seq = 0
        self._failures = 0
        self._backoff = FIRST_BACKOFF
        self._restart_at = 0.0
        self._synced = 0
        self._logged: set[str] = set()
        self._closed = False
        ready = self._start(wait=True)
        if not ready:
            unreadable = unreadable_files(dirs)
            if unreadable:
                log.warning("%s", unreadable_message(self.path, unreadable))
            else:
                log.info("the journal at %s holds no file the agent can read yet; it is followed as files appear",
                         self.path)

    # ---- the child ---------------------------------------------------------------------

    def _start(self, wait: bool) -> bool:
        """Start a child; with ``wait``, until it opened the directories (its ``ready``)."""
        argv = [sys.executable, "-m", "exporter.incidents.journal_reader", *self._dirs, "--boot", self._boot,
                "--machine", self._machine]
        if self._cursors is not None:
            argv += ["--cursors", json.dumps(self._cursors)]
        if self._from_start and self._cursors is None:
            argv.append("--from-start")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_package_root(), os.environ.get(
            "PYTHONPATH", "")) if p)}
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, env=env, close_fds=True)
        assert self._proc.stdout is not None
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._buffer = b""
        if not wait:
            return True
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            for doc in self._receive():
                if "error" in doc:
                    self._stop()
                    raise KernelLogUnavailable(f"cannot read the kernel log from the journal {doc['error']}")
                if "ready" in doc:
                    return bool(doc["ready"])
            if self._proc is None or time.monotonic() > deadline:
                self._stop()
                raise KernelLogUnavailable(f"cannot read the kernel log from the journal {self.path}: its reader "
                                           "did not start")
            select.select([self._proc.stdout], [], [], 0.1)

    def _receive(self) -> list[dict[str, Any]]:
        """The child's lines read so far, without waiting; handles its end."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            return []
        ended = False
        fd = proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                ended = True
                break
            self._buffer += chunk
        docs = []
        if b"\n" in self._buffer:
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict):
                    docs.append(doc)
                    self._take(doc)
        if ended:
            self._child_ended()
        return docs

    def _take(self, doc: dict[str, Any]) -> None:
        for row in doc.get("x") or ():
            self._seq += 1
            self._pending.append(XidRecord(self._seq, int(row[0]), str(row[1]), int(row[2]),
                                           None if row[3] is None else int(row[3]), row[4], str(row[5])))
        if "x" in doc:
            self._backoff = FIRST_BACKOFF  # it read: the next end starts the backoff anew
        if isinstance(doc.get("c"), dict):
            self._child_counts = doc["c"]
        if isinstance(doc.get("k"), list):
            self._cursors = doc["k"]
        if "bad" in doc:
            self._log_once("bad", "journal %s: a kernel entry skipped (%s); more are only counted as malformed",
                           self.path, doc["bad"])
        if "sync" in doc:
            self._synced = int(doc["sync"])
        if "error" in doc and self._failures:
            self._log_once("error", "the journal reader cannot open %s again: %s", self.path, doc["error"])

    def _child_ended(self) -> None:
        proc, self._proc = self._proc, None
        assert proc is not None
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        for outcome, count in self._child_counts.items():
            if outcome in self._ended:
                self._ended[outcome] += int(count)
        self._child_counts = {}
        if self._closed:
            return
        self._failures += 1
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        if -code == signal.SIGBUS:
            how += " (a journal file shrank under it: truncated or emptied in place)"
        self._log_once("ended", "the journal reader of %s ended (%s); the agent goes on, starts another in %gs and "
                       "reads on from the last entry read; further ends are only counted "
                       "(l9gpu_kernel_log_reader_failures_total)", self.path, how, self._backoff)
        self._restart_at = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, MAX_BACKOFF)

    def _log_once(self, what: str, message: str, *args: object) -> None:
        if what not in self._logged:
            self._logged.add(what)
            log.warning(message, *args)

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    # ---- the agent's side ----------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Kernel entries by outcome since opening, as `kmsg.KernelLog.counts` (``read``,
        ``xid``, ``malformed``, ``truncated``: an entry without a message), and
        ``other_machine`` and ``other_boot`` (skipped: they name no process). The journal
        loses no entry between two reads, so ``overwritten`` stays 0."""
        out = dict(self._ended)
        for outcome, count in self._child_counts.items():
            if outcome in out:
                out[outcome] += int(count)
        return {k: min(v, MAX_COUNT) for k, v in out.items()}

    def failures(self) -> int:
        """How many times the reader's process ended (and was started again)."""
        return self._failures

    def poll(self) -> list[XidRecord]:
        """The Xid records the reader sent since the last poll (never blocks, never raises;
        starts a new reader where the last one ended and its backoff is over)."""
        if self._closed:
            return []
        try:
            if self._proc is None and self._clock() >= self._restart_at:
                self._restart_at = self._clock() + self._backoff  # a start that fails is tried on the backoff
                self._start(wait=False)
            self._receive()
        except Exception as exc:  # noqa: BLE001 - a reader's failure is logged, never the pass's
            self._log_once("poll", "reading the kernel log from the journal %s failed: %r", self.path, exc)
        records, self._pending = self._pending, []
        return records

    def sync(self, timeout: float = 30.0) -> bool:
        """Wait until the reader has read everything written to the journal before this call
        (for a replay and for tests); its records are those of the next `poll`. False when
        no reader runs or it did not answer in time."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            return False
        token = self._synced + 1
        try:
            proc.stdin.write(f"sync {token}\n".encode())
            proc.stdin.flush()
        except OSError:
            return False
        deadline = time.monotonic() + timeout
        while self._synced < token and self._proc is proc and time.monotonic() < deadline:
            select.select([proc.stdout], [], [], 0.1)
            self._receive()
        return self._synced >= token

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stop()

    def __enter__(self) -> JournalKernelLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
