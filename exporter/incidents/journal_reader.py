"""The journal reader's own process: libsystemd reads the journal's files here, never in the agent.

libsystemd maps journal files into memory. When a file shrinks under it (an administrator's
``truncate``, a full disk emptied by hand) the next read past the new end raises SIGBUS, which
ends the process: journalctl installs its own handler (systemd's ``sigbus_install``), a Python
process cannot catch it in a thread. So `exporter.incidents.journal.JournalKernelLog` runs this
module as a child (``python -m exporter.incidents.journal_reader``) and the fault ends only the
child; the agent counts it and starts another from where this one stopped.

The child opens one ``systemd.journal.Reader`` per directory, keeps the kernel transport's
entries, and writes to its stdout one JSON line per batch it read::

    {"x": [[boot_usec, pci_bus_id, xid, pid, comm, text], ...], "c": {outcome: n, ...}, "k": [cursor, ...]}

``x`` holds the batch's Xid records, ``c`` its counts by outcome since the child started and
``k`` the cursor of the last entry each reader read (None before its first). The first line is
``{"ready": ..., "k": [...]}`` once the directories are open, or ``{"error": "one line"}``
before it exits with status 2. It reads what journald appends as it comes (the directories'
inotify descriptors), at most `MAX_BATCH` entries a line and a second, and answers a line ``sync N`` on its
stdin with ``{"sync": N}`` once it has read everything written before it. It ends when its stdin
closes (the agent went away).

Only this machine's (``--machine``, its ``/etc/machine-id``) and this boot's (``--boot``)
kernel entries give a record: an entry of another machine (a directory copied from another
node, a forged ``_MACHINE_ID``) or of another boot is counted ``other_machine`` or
``other_boot`` and skipped, so that it can never name a process of this boot. An entry's time
is the kernel's own stamp (``_SOURCE_MONOTONIC_TIMESTAMP``, microseconds since boot, the
``/dev/kmsg`` clock), else journald's monotonic stamp of this boot.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
from typing import Any, Iterable, TextIO

from exporter.incidents.kmsg import MAX_USEC, OUTCOMES, MalformedRecord, bounded_int, parse_xid

# Entries read before a line is written (and a sync or the stdin's end is looked at); after
# a full batch the reader pauses `BATCH_PAUSE` seconds, so that a flood of kernel records
# costs the node at most about 5 ms of CPU a second (the rest is read in later batches).
MAX_BATCH = 4096
BATCH_PAUSE = 1.0
# Seconds between two looks at the directories when inotify says nothing (a file replaced
# on a file system that does not report it).
IDLE_WAIT = 1.0
# Seconds the reader lets journald go on writing once inotify says it wrote: one read then
# takes what a burst appended, not a wake-up per entry (a sync is still answered at once).
SETTLE = 0.2
_PREFIX = b"NVRM: Xid"
# The outcomes this reader adds to `kmsg.OUTCOMES`.
JOURNAL_OUTCOMES = ("other_machine", "other_boot")


class _Reader:
    """One directory's libsystemd reader and where it stands."""

    def __init__(self, journal: Any, path: str, from_start: bool, cursor: str | None):
        self.reader = journal.Reader(flags=0, path=path)
        self.reader.add_match(_TRANSPORT="kernel")
        self.cursor = cursor
        self.held = False  # the reader stands on an entry not read yet (`advance` returns it first)
        if cursor:
            self.reader.seek_cursor(cursor)
            # the entry at the cursor was read by the process before: skip it where it is still there;
            # where it is gone (the file replaced), the entry found after its place is new
            self.held = bool(self.reader._next()) and not self.reader.test_cursor(cursor)
        elif from_start:
            self.reader.seek_head()
        else:
            self.reader.seek_tail()
            if self.reader._previous():  # the newest entry; the next read returns what follows it
                self.cursor = self.reader._get_cursor()
        self.fd = self.reader.fileno()  # inotify on the directory: new and rotated files

    def advance(self) -> bool:
        """Step to the next entry (False at the end)."""
        if self.held:
            self.held = False
            return True
        return bool(self.reader._next())

    def usage(self) -> int:
        try:
            return int(self.reader.get_usage())
        except (OSError, ValueError):
            return 0


class Child:
    """The reading loop (see the module docstring)."""

    def __init__(self, dirs: list[str], boot: bytes, machine: bytes, from_start: bool, cursors: list[str | None],
                 out: TextIO):
        from systemd import journal

        self.readers = []
        for path, cursor in zip(dirs, cursors):
            try:
                self.readers.append(_Reader(journal, path, from_start, cursor))
            except OSError as exc:
                why = os.strerror(exc.errno) if exc.errno else str(exc)
                raise OSError(exc.errno, f"{path}: {why}") from None
        self.boot, self.machine = boot, machine
        self.counts = dict.fromkeys(OUTCOMES + JOURNAL_OUTCOMES, 0)
        self.out = out

    def read(self) -> bool:
        """Read up to `MAX_BATCH` entries and write them as one line; True when more may wait."""
        records: list[list[Any]] = []
        budget = MAX_BATCH
        for entry in self.readers:
            entry.reader.process()  # new or rotated files; returns at once
            advance, get = entry.advance, entry.reader._get
            start = budget
            while budget > 0 and advance():
                budget -= 1
                try:
                    message = get("MESSAGE")
                except KeyError:
                    self.counts["truncated"] += 1
                    continue
                if message.startswith(_PREFIX):  # only NVIDIA's lines are read further
                    record = self._entry(entry.reader, message)
                    if record is not None:
                        records.append(record)
            if budget < start:
                entry.cursor = entry.reader._get_cursor()
                self.counts["read"] += start - budget
        if budget < MAX_BATCH:
            self._write({"x": records, "c": self.counts, "k": [e.cursor for e in self.readers]})
        return budget == 0

    def _entry(self, reader: Any, message: bytes) -> list[Any] | None:
        try:
            machine = reader._get("_MACHINE_ID")
        except KeyError:
            machine = b""
        if self.machine and machine != self.machine:
            self.counts["other_machine"] += 1
            return None
        try:
            boot = reader._get("_BOOT_ID")
        except KeyError:
            boot = b""
        if boot != self.boot:
            self.counts["other_boot"] += 1
            return None
        try:
            line = message.split(b"\n", 1)[0]  # the kernel writes one line; a forged rest is no record
            record = parse_xid(line.decode("utf-8", "replace"), 0, self._usec(reader))
        except Exception as exc:  # noqa: BLE001 - one bad entry costs itself only
            self.counts["malformed"] += 1
            if self.counts["malformed"] == 1:
                self._write({"bad": str(exc)[:200]})
            return None
        if record is None:
            return None
        self.counts["xid"] += 1
        return [record.boot_usec, record.pci_bus_id, record.xid, record.pid, record.comm, record.text]

    @staticmethod
    def _usec(reader: Any) -> int:
        """The entry's time, microseconds since this boot.

        Raises:
            MalformedRecord: a stamp outside the kernel's range.
        """
        try:
            return bounded_int(reader._get("_SOURCE_MONOTONIC_TIMESTAMP").decode("ascii", "replace"), 0, MAX_USEC,
                               "timestamp")
        except KeyError:
            usec = int(reader._get_monotonic()[0])
            if not 0 <= usec <= MAX_USEC:
                raise MalformedRecord(f"monotonic stamp {usec} out of range") from None
            return usec

    def _write(self, doc: dict[str, Any]) -> None:
        self.out.write(json.dumps(doc, separators=(",", ":")) + "\n")
        self.out.flush()

    def run(self, stdin: Any) -> None:
        """Read until stdin closes."""
        self._write({"ready": any(e.usage() for e in self.readers), "k": [e.cursor for e in self.readers]})
        pending = b""
        fds = [e.fd for e in self.readers]
        while True:
            more = self.read()
            ready, _, _ = select.select([stdin] if more else [stdin, *fds], [], [], BATCH_PAUSE if more else IDLE_WAIT)
            if ready and stdin not in ready:
                ready, _, _ = select.select([stdin], [], [], SETTLE)
            if stdin in ready:
                chunk = os.read(stdin, 4096)
                if not chunk:
                    return  # the agent is gone
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.startswith(b"sync "):
                        while self.read():
                            pass
                        self._write({"sync": int(line[5:] or 0)})


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporter.incidents.journal_reader")
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--boot", default="")
    parser.add_argument("--machine", default="")
    parser.add_argument("--from-start", action="store_true")
    parser.add_argument("--cursors", default="", help="a JSON list: each directory's cursor to go on after")
    args = parser.parse_args(list(argv) if argv is not None else None)
    cursors = json.loads(args.cursors) if args.cursors else [None] * len(args.dirs)
    try:
        # a reader started again goes on after each cursor; one with none read nothing yet: all is new
        child = Child(args.dirs, args.boot.encode(), args.machine.encode(), args.from_start or bool(args.cursors),
                      cursors, sys.stdout)
    except OSError as exc:
        sys.stdout.write(json.dumps({"error": exc.strerror or str(exc)}) + "\n")
        return 2
    child.run(sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
