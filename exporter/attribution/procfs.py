"""Read what attribution needs about a PID from a proc root (``/proc`` or a host mount).

Per PID: the start time (field 22 of ``stat``, clock ticks since boot, which together
with the PID identifies one process for its whole life), ``comm``, the real uid
(``status``), the parsed ``cgroup`` file, and for Slurm steps an allow-listed subset of
``environ``. `ProcCache` keeps these per (pid, start time), so a cycle costs one small
``stat`` read per known PID, a reused PID never inherits an old owner, and entries of
PIDs that are gone are dropped.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from exporter.attribution.cgroups import SLURM, UNKNOWN_OWNER, CgroupOwner, parse_cgroup_file
from exporter.model import frozen_mapping

log = logging.getLogger(__name__)

# The only environment variables ever read from a process, and only from Slurm steps.
# Nothing else from environ is kept, logged or exported.
SLURM_ENV_ALLOWED: frozenset[str] = frozenset(
    {"SLURM_JOB_ID", "SLURM_JOB_USER", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT"})
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
        slurm_env: allow-listed ``SLURM_JOB_*`` variables (Slurm steps only).
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


def _max_kept_open() -> int:
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


class ProcCache:
    """`ProcInfo` per (pid, start time), refreshed once per cycle.

    Args:
        procfs: the reader.
    """

    def __init__(self, procfs: ProcFS):
        self.procfs = procfs
        self._entries: dict[int, ProcInfo] = {}
        self.reads = 0  # full reads so far (cache misses), for tests and benchmarks
        # On a real procfs, an open /proc/<pid>/comm stays bound to that process: reading it
        # again costs one small pread (no path lookup, no stat to format), and fails once
        # the process is gone, even if its PID was given to another. Fixture trees (plain
        # files, which outlive nothing) are read by path every pass.
        self._real_procfs = os.path.islink(os.path.join(procfs.root, "self"))
        self._fds: dict[int, int] = {}
        self._max_open = _max_kept_open()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, pids: Iterable[int]) -> dict[int, ProcInfo | None]:
        """Info for each PID (None when gone); forgets PIDs not asked for this cycle."""
        result: dict[int, ProcInfo | None] = {}
        fresh: dict[int, ProcInfo] = {}
        fds = self._fds
        kept: dict[int, int] = {}
        for pid in pids:
            start = self._start_time(pid, fds, kept) if self._real_procfs else self.procfs.start_time(pid)
            if start is None:
                result[pid] = None
                continue
            cached = self._entries.get(pid)
            if cached is None or cached.start_time != start:
                # New PID or a reused one (different start time): read everything again.
                cached = self.procfs.read(pid, start)
                self.reads += 1
            result[pid] = cached
            if cached is not None:
                fresh[pid] = cached
        self._entries = fresh
        for pid, fd in fds.items():  # processes no longer asked about
            if kept.get(pid) != fd:
                os.close(fd)
        self._fds = kept
        return result

    def _start_time(self, pid: int, fds: dict[int, int], kept: dict[int, int]) -> int | None:
        """The start time of the process that has ``pid`` now, None when there is none.

        A process seen before is checked with one small read of its kept-open ``comm``:
        that file stays bound to the process it was opened for, so the read succeeds while
        that very process lives and fails (ESRCH) once it is gone, even if its PID now
        belongs to another. Then its known start time is returned, with no ``stat`` to
        format and parse. A new PID (or one whose process went) is read by path, with the
        ``comm`` file opened first, so the file can only be bound to this process or to
        one that ends before the read (which the next pass notices).
        """
        fd = fds.get(pid)
        if fd is not None:
            cached = self._entries.get(pid)
            try:
                alive = bool(os.pread(fd, 64, 0))
            except OSError:  # ESRCH: that process is gone (its PID may live on in another)
                alive = False
            if alive and cached is not None:
                kept[pid] = fd
                return cached.start_time
        if len(kept) >= self._max_open:
            return self.procfs.start_time(pid)
        try:
            fd = os.open(f"{self.procfs.root}/{pid}/comm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        start = self.procfs.start_time(pid)
        if start is None:
            os.close(fd)
            return None
        kept[pid] = fd
        return start

    def close(self) -> None:
        """Close the proc files kept open."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def comm(self, pid: int) -> str:
        entry = self._entries.get(pid)
        return entry.comm if entry else ""
