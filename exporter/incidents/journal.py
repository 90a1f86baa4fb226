"""NVIDIA's Xid lines from the kernel's records in the systemd journal, read without privilege.

journald copies every kernel log record into the journal (``_TRANSPORT=kernel``): on a
node where it keeps one, ``/var/log/journal`` (persistent) or ``/run/log/journal``
(volatile, lost at reboot), mounted read-only, give the agent the same Xid lines as
``/dev/kmsg`` without CAP_SYSLOG or a privileged container. The files are read through
libsystemd's own journal API (the ``systemd-python`` binding, an optional dependency:
``pip install '.[journal]'`` in l9gpu's checkout or Debian's ``python3-systemd``), never parsed by hand.

`JournalKernelLog` opens the directories, keeps only the kernel transport's entries,
starts at the newest (or the oldest, with ``from_start``), and each
`JournalKernelLog.poll` reads what was appended since, at most `MAX_RECORDS_PER_POLL`
entries, without waiting: journald writes with its own locking-free append, and the
library picks up rotated and new files (``sd_journal_process``) on the next poll.

An entry's time is the kernel's own stamp (``_SOURCE_MONOTONIC_TIMESTAMP``, microseconds
since boot, the ``/dev/kmsg`` clock) when it was logged in this boot, else journald's
monotonic stamp of this boot, else its wall-clock stamp turned into this boot's clock
(an entry of an earlier boot then lies before every process the agent knows, so it
names none).
"""

from __future__ import annotations

import glob
import grp
import logging
import os
import stat
import time
from typing import Any, Callable

from exporter.incidents.kmsg import (
    MAX_COUNT,
    MAX_RECORDS_PER_POLL,
    MAX_USEC,
    OUTCOMES,
    KernelLogUnavailable,
    MalformedRecord,
    XidRecord,
    bounded_int,
    parse_xid,
)

log = logging.getLogger(__name__)

# Where journald keeps its files: persistent first, then volatile.
JOURNAL_DIRS = ("/var/log/journal", "/run/log/journal")
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_PREFIX = b"NVRM: Xid"
# Wall-clock microseconds since 1970 up to the year 2500: beyond is no journal's stamp.
_MAX_REALTIME = 16_725_225_600 * 10**6


def _binding() -> Any:
    try:
        from systemd import journal
    except ImportError:
        raise KernelLogUnavailable(
            "cannot read the kernel log from the journal: the systemd-python binding is not installed "
            "(pip install '.[journal]' in l9gpu's checkout, or Debian's python3-systemd)") from None
    return journal


def _boot_id() -> bytes:
    try:
        with open(BOOT_ID_PATH, "rb") as fh:
            return fh.read().strip().replace(b"-", b"")
    except OSError:
        return b""


def _usage(reader: Any) -> int:
    try:
        return int(reader.get_usage())
    except (OSError, ValueError):
        return 0


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
    """Xid records from the kernel's entries in journal files.

    Args:
        directory: a journal directory (holding ``<machine-id>/*.journal`` or the files
            themselves); None reads `JOURNAL_DIRS`, those that exist.
        from_start: read the oldest entries first (a replay); by default only those
            written after opening.
        clock, wall: the monotonic and the wall clock (seconds), to place an entry of
            another boot on this boot's clock.

    Raises:
        KernelLogUnavailable: no binding, no directory, or none can be opened (the
            message says which).
    """

    def __init__(self, directory: str | None = None, from_start: bool = False,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        journal = _binding()
        dirs = [directory] if directory else [d for d in JOURNAL_DIRS if os.path.isdir(d)]
        self.path = ",".join(dirs) if dirs else ",".join(JOURNAL_DIRS)
        if not dirs:
            raise KernelLogUnavailable(
                f"cannot read the kernel log from the journal: neither {' nor '.join(JOURNAL_DIRS)} exists "
                "(journald keeps no journal on this node, or the directories are not mounted)")
        if not os.path.isdir(dirs[0]):
            raise KernelLogUnavailable(f"cannot read the kernel log from the journal {dirs[0]}: no such directory")
        self._readers: list[Any] = []
        for path in dirs:
            try:
                reader = journal.Reader(flags=0, path=path)
                reader.add_match(_TRANSPORT="kernel")
                if from_start:
                    reader.seek_head()
                else:
                    reader.seek_tail()
                    reader._previous()  # the newest entry; the next read returns what follows it
                reader.fileno()  # watch the directory for new and rotated files (inotify)
            except OSError as exc:
                for r in self._readers:
                    r.close()
                why = os.strerror(exc.errno) if exc.errno else str(exc)
                raise KernelLogUnavailable(f"cannot read the kernel log from the journal {path}: {why}") from None
            self._readers.append(reader)
        if not any(_usage(r) for r in self._readers):
            unreadable = unreadable_files(dirs)
            if unreadable:
                log.warning("%s", unreadable_message(self.path, unreadable))
            else:
                log.info("the journal at %s holds no file the agent can read yet; it is followed as files appear",
                         self.path)
        self._boot = _boot_id()
        self._clock, self._wall = clock, wall
        self._counts = dict.fromkeys(OUTCOMES, 0)
        self._seq = 0
        self._error_logged = False
        self._bad_logged = False
        self._closed = False

    def counts(self) -> dict[str, int]:
        """Kernel entries by outcome since opening, as `kmsg.KernelLog.counts` (``read``,
        ``xid``, ``malformed``; the journal loses no entry between two reads, so
        ``overwritten`` and ``truncated`` stay 0)."""
        return {k: min(v, MAX_COUNT) for k, v in self._counts.items()}

    def poll(self) -> list[XidRecord]:
        """The Xid records journald wrote since the last poll (never blocks, never raises)."""
        if self._closed:
            return []
        records: list[XidRecord] = []
        budget = MAX_RECORDS_PER_POLL
        for reader in self._readers:
            try:
                reader.process()  # new or rotated files; returns at once
                advance, get = reader._next, reader._get
                start = budget
                try:
                    while budget > 0 and advance():
                        budget -= 1
                        try:
                            message = get("MESSAGE")
                        except KeyError:
                            self._counts["truncated"] += 1
                            continue
                        if message.startswith(_PREFIX):  # only NVIDIA's lines are read further
                            record = self._entry(reader, message)
                            if record is not None:
                                records.append(record)
                finally:
                    self._counts["read"] += start - budget
            except Exception as exc:  # noqa: BLE001 - a reader's failure is logged, never the pass's
                if not self._error_logged:
                    self._error_logged = True
                    log.warning("reading the kernel log from the journal %s failed: %r", self.path, exc)
        return records

    def _entry(self, reader: Any, message: bytes) -> XidRecord | None:
        self._seq += 1
        try:
            line = message.split(b"\n", 1)[0]  # the kernel writes one line; a forged rest is no record
            record = parse_xid(line.decode("utf-8", "replace"), self._seq, self._usec(reader))
        except Exception as exc:  # noqa: BLE001 - one bad entry costs itself only
            self._counts["malformed"] += 1
            if not self._bad_logged:
                self._bad_logged = True
                log.warning("journal %s: a kernel entry skipped (%s); more are only counted as malformed",
                            self.path, str(exc)[:200])
            return None
        if record is not None:
            self._counts["xid"] += 1
        return record

    def _usec(self, reader: Any) -> int:
        """The entry's time, microseconds since this boot; -1 where it cannot be told.

        Raises:
            MalformedRecord: a stamp outside the kernel's (or the journal's) range.
        """
        try:
            boot = reader._get("_BOOT_ID")
        except KeyError:
            boot = b""
        if self._boot and boot == self._boot:
            try:
                return bounded_int(reader._get("_SOURCE_MONOTONIC_TIMESTAMP").decode("ascii", "replace"), 0,
                                   MAX_USEC, "timestamp")
            except KeyError:
                usec = int(reader._get_monotonic()[0])
                if not 0 <= usec <= MAX_USEC:
                    raise MalformedRecord(f"monotonic stamp {usec} out of range") from None
                return usec
        realtime = int(reader._get_realtime())
        if not 0 < realtime <= _MAX_REALTIME:
            raise MalformedRecord(f"wall-clock stamp {realtime} out of range")
        since_boot = realtime / 1e6 - (self._wall() - self._clock())
        return int(since_boot * 1e6) if since_boot >= 0 else -1

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for reader in self._readers:
                reader.close()

    def __enter__(self) -> JournalKernelLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
