"""NVIDIA's Xid lines from the kernel log, read without blocking.

``/dev/kmsg`` hands out one record per ``read()``::

    <prio>,<seq>,<usec since boot>,<flags>[,<more>];<message>\\n
     KEY=value\\n            (optional continuation lines, each starting with a space)

The kernel writes every control character and backslash of the message as ``\\xNN``,
so a record's message is one line whatever a process put into it. `KernelLog` opens the
device non-blocking, starts at the newest record (or at the oldest still buffered, with
``from_start``), and each `KernelLog.poll` reads until the device has nothing more
(``EAGAIN``). Records the kernel overwrote before they were read (the reader was too
slow: ``EPIPE``) show as a gap in the sequence numbers; they are counted and reading
goes on. A regular file holding records in the same format, one per line, is read from
its start and then followed as lines are appended (for replaying a saved log).

Reading ``/dev/kmsg`` needs CAP_SYSLOG (or ``kernel.dmesg_restrict=0``) and, in a
container, the host's ``/dev/kmsg`` mounted: without them opening raises
`KernelLogUnavailable` with one line that says which. Root may write records to it too,
so a line there is only as trustworthy as the node's root.

`parse_xid` reads the driver's line, e.g.::

    NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python3, Ch 00000008, intr 00000000. ...
    NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:ab:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (...)

The process name is the process's own choice (its comm: up to 15 bytes, anything), and so
is whatever follows it: both are kept escaped for a terminal (`exporter.core.escape`). Numbers
are bounded by the kernel's ranges (`MAX_SEQ`, `MAX_USEC`, `MAX_PID`, `MAX_XID`): a record
outside them is counted ``malformed`` and skipped, never an exception that costs the
records read with it. A file replaced at its path (rotated) or rewritten in place is read
again from its start.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from dataclasses import dataclass

from exporter.core.escape import for_terminal

log = logging.getLogger(__name__)

DEV_KMSG = "/dev/kmsg"
# Larger than the longest record the kernel hands out (CONSOLE_EXT_LOG_MAX, 8 KiB): a
# read with a smaller buffer fails with EINVAL.
READ_SIZE = 16384
# Records one poll reads at most, so that a flood of kernel messages cannot hold up a
# pass; the rest is read by the next poll.
MAX_RECORDS_PER_POLL = 4096

# The outcomes `KernelLog.counts` reports, by reason.
OUTCOMES = ("read", "xid", "overwritten", "malformed", "truncated")

# The kernel's ranges for a record's numbers: anything outside is no record of its own
# and is counted ``malformed`` (a hostile or broken writer, never a reason to fail).
MAX_SEQ = 2**63 - 1  # a u64 counter that starts at 0 at boot; 2**63 records is centuries of logging
MAX_USEC = 2**53  # microseconds since boot: 285 years, and exact as a float
MAX_PID = 4_194_304  # PID_MAX_LIMIT on 64-bit kernels
MAX_XID = 65_535  # NVIDIA's catalog is in the hundreds
MAX_PRIO = 2**31 - 1  # facility * 8 + level
# A jump in sequence numbers of more than this between two records is no overwritten
# stretch of a real ring buffer (32 MiB at most: under 2**21 records): malformed.
MAX_GAP = 2**32
# Counts are clamped here: a float (the exposition's type) holds every integer up to it.
MAX_COUNT = 2**53


class MalformedRecord(ValueError):
    """A record whose numbers are outside the kernel's ranges (counted, then skipped)."""


def bounded_int(text: str, low: int, high: int, what: str) -> int:
    """``text`` as a whole number within [low, high]; `MalformedRecord` otherwise (also for
    thousands of digits, read no further than the range needs)."""
    text = text.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isdigit() or not digits.isascii() or len(digits) > len(str(max(abs(low), abs(high)))) + 1:
        raise MalformedRecord(f"{what} {text[:24]!r} is not a number in {low}-{high}")
    value = int(text)
    if not low <= value <= high:
        raise MalformedRecord(f"{what} {value} is outside {low}-{high}")
    return value

_XID = re.compile(
    r"^NVRM: Xid \((?:PCI:)?(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})"
    r"(?:\.(?P<function>[0-7]))?\): (?P<xid>\d+)(?:, ?(?P<rest>.*))?$")
# "pid=<n>, name=<comm>, <text>": the driver's form for a fault it can pin on a channel.
_PROCESS = re.compile(r"^pid=(?P<pid>[^,]*), name=(?P<comm>.*?)(?:, (?P<text>.*))?$")
_KERNEL_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_UNKNOWN = ("<unknown>", "'<unknown>'", "")


class KernelLogUnavailable(Exception):
    """The kernel log cannot be read; the message is one line saying why."""


@dataclass(frozen=True)
class XidRecord:
    """One Xid line of the NVIDIA driver.

    Attributes:
        seq: the kernel log's sequence number of the record.
        boot_usec: when it was logged, microseconds since boot (CLOCK_MONOTONIC); -1
            where the reader could not tell (a journal entry of another boot with no
            wall-clock stamp).
        pci_bus_id: the GPU in NVML's form, ``00000000:3B:00.0``.
        xid: the Xid code.
        pid: the process the driver named, None where it named none (or ``<unknown>``).
        comm: that process's name as it chose it, escaped for a terminal; None where
            there is none.
        text: the rest of the line (the driver's description), escaped for a terminal.
    """

    seq: int
    boot_usec: int
    pci_bus_id: str
    xid: int
    pid: int | None
    comm: str | None
    text: str

    @property
    def time(self) -> float | None:
        """When it was logged, seconds since boot on the clock of ``time.monotonic()``
        (the clock of the agent's passes); None when the reader could not tell."""
        return self.boot_usec / 1e6 if self.boot_usec >= 0 else None


def _unescaped(text: str) -> str:
    """``text`` with the kernel's ``\\xNN`` escapes turned back into the bytes they stand
    for, then escaped for a terminal: one form whether the line came from the device
    (escaped by the kernel) or from a file written by hand (raw)."""
    raw = _KERNEL_ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8", "surrogateescape"))
    return for_terminal(raw.decode("utf-8", "replace"))


def normalise_pci_bus_id(domain: str, bus: str, device: str, function: str | None = None) -> str:
    """NVML's form of a PCI address: 8 hex digits of domain, upper case, function 0 by
    default (``0000:3b:00`` -> ``00000000:3B:00.0``)."""
    return f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.{function or '0'}"


def parse_xid(message: str, seq: int = 0, boot_usec: int = 0) -> XidRecord | None:
    """The Xid of one kernel log message, or None when it is no Xid line of NVIDIA's.

    Args:
        message: the record's message (after the ``;``), as the kernel hands it out.
        seq, boot_usec: the record's sequence number and time, kept in the result.

    Raises:
        MalformedRecord: an Xid line whose Xid code or pid is outside the kernel's ranges.
    """
    match = _XID.match(message.rstrip("\n"))
    if match is None:
        return None
    rest = match.group("rest") or ""
    pid: int | None = None
    comm: str | None = None
    process = _PROCESS.match(rest)
    if process is not None:
        raw_pid = process.group("pid").strip()
        # pid 0 is the kernel's own context: no process
        pid = (bounded_int(raw_pid, 0, MAX_PID, "pid") or None) if raw_pid.isdigit() else None
        raw_comm = process.group("comm")
        comm = None if raw_comm in _UNKNOWN else _unescaped(raw_comm)
        rest = process.group("text") or ""
    return XidRecord(seq=seq, boot_usec=boot_usec,
                     pci_bus_id=normalise_pci_bus_id(match.group("domain"), match.group("bus"),
                                                     match.group("device"), match.group("function")),
                     xid=bounded_int(match.group("xid"), 0, MAX_XID, "Xid"), pid=pid, comm=comm, text=_unescaped(rest))


def _open_error(path: str, exc: OSError) -> KernelLogUnavailable:
    if exc.errno in (errno.EPERM, errno.EACCES):
        why = "permission denied (it needs CAP_SYSLOG, or kernel.dmesg_restrict=0)"
    elif exc.errno == errno.ENOENT:
        why = "no such file"
        if path == DEV_KMSG:
            why += " (in a container, mount the host's /dev/kmsg)"
    else:
        why = os.strerror(exc.errno or 0) or str(exc)
    return KernelLogUnavailable(f"cannot read the kernel log {path}: {why}")


class KernelLog:
    """Xid records from ``/dev/kmsg`` (or a character device like it) or a file of records.

    Args:
        path: a character device speaking kmsg's protocol, or a regular file holding
            records in its format, one per line (read from its start, then followed).
        from_start: for a device, read the records still buffered first; by default
            only those logged after opening.

    Raises:
        KernelLogUnavailable: it cannot be opened for reading (the message says why).
    """

    def __init__(self, path: str = DEV_KMSG, from_start: bool = False):
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise _open_error(path, exc) from None
        mode = os.fstat(self._fd).st_mode
        if stat.S_ISCHR(mode):
            self._device = True
            if not from_start:
                os.lseek(self._fd, 0, os.SEEK_END)
        elif stat.S_ISREG(mode):
            self._device = False
        else:
            os.close(self._fd)
            raise KernelLogUnavailable(f"cannot read the kernel log {path}: neither a character device nor a file")
        self._closed = False
        self._pending = b""  # a file's last line, until its newline is written
        self._offset = 0  # how far a file was read
        self._identity = _identity(os.fstat(self._fd))
        self._edge = b""  # a file's bytes just before the offset, to notice a rewrite in place
        self._last_seq: int | None = None
        self._counts = dict.fromkeys(OUTCOMES, 0)
        self._error_logged = False
        self._bad_logged = False

    def counts(self) -> dict[str, int]:
        """Records by outcome since opening: ``read`` (every record), ``xid`` (Xid lines
        among them), ``overwritten`` (records the kernel dropped before they were read),
        ``malformed`` (a header that is not kmsg's, or a number outside the kernel's
        ranges), ``truncated`` (no ``;``: cut short). Each at most `MAX_COUNT`."""
        return {k: min(v, MAX_COUNT) for k, v in self._counts.items()}

    def poll(self) -> list[XidRecord]:
        """The Xid records logged since the last poll (never blocks, never raises: a
        record that cannot be read is counted ``malformed`` and the others kept)."""
        if self._closed:
            return []
        try:
            raws = self._read_device() if self._device else self._read_file()
        except Exception as exc:  # noqa: BLE001 - a reader's failure is logged, never the pass's
            self._read_failed(exc)
            return []
        if not raws:
            return []
        batch = self._batch(raws)
        if batch is not None:
            return batch
        records = []
        last, plain = self._last_seq, 0
        for raw in raws:
            # The common case inline (a busy kernel logs thousands a second): a well-formed
            # header, the next sequence number, a message that is no NVIDIA line.
            header, sep, rest = raw.partition(b";")
            fields = header.split(b",", 3)
            if (sep and len(fields) == 4 and last is not None and not rest.startswith(_NVRM)
                    and fields[1].isdigit() and len(fields[1]) <= 19 and int(fields[1]) == last + 1
                    and fields[0].isdigit() and len(fields[0]) <= 10
                    and fields[2].isdigit() and len(fields[2]) <= 16 and int(fields[2]) <= MAX_USEC):
                last += 1
                plain += 1
                continue
            self._last_seq = last
            try:
                record = self._record(raw)
            except Exception as exc:  # noqa: BLE001 - one bad record costs itself only
                self._counts["malformed"] += 1
                self._bad_record(exc)
                record = None
            last = self._last_seq
            if record is not None:
                records.append(record)
        self._last_seq = last
        self._counts["read"] += plain
        return records

    def _batch(self, raws: list[bytes]) -> list[XidRecord] | None:
        """The records of a poll read at once, in the common case: every header well formed
        and the sequence numbers consecutive from the last one read (a busy kernel logs
        thousands a second); None for anything else, which is read record by record."""
        if self._last_seq is None:
            return None
        # each record starts after a newline (a device's end in one; a file's lines were split
        # at them), and its message holds none: one well-formed header per record or none
        blob = b"\n" + (b"".join(raws) if self._device else b"\n".join(raws) + b"\n")
        seqs = _HEADERS.findall(blob)
        first = self._last_seq + 1
        if len(seqs) != len(raws) or list(map(int, seqs)) != list(range(first, first + len(seqs))):
            return None
        self._last_seq = first + len(seqs) - 1
        self._counts["read"] += len(seqs)
        records = []
        marker = b";" + _NVRM
        at = blob.find(marker)
        while at >= 0:
            start = blob.rfind(b"\n", 0, at) + 1
            end = blob.find(b"\n", at)
            if blob.find(b";", start) == at and blob[start:start + 1] != b" ":  # the message starts there
                header = blob[start:at].split(b",")
                try:
                    record = parse_xid(blob[at + 1:end].decode("utf-8", "replace"), int(header[1]),
                                       int(header[2]))
                except Exception as exc:  # noqa: BLE001 - one bad record costs itself only
                    self._counts["malformed"] += 1
                    self._bad_record(exc)
                else:
                    if record is not None:
                        self._counts["xid"] += 1
                        records.append(record)
            at = blob.find(marker, end)
        return records

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)

    def __enter__(self) -> KernelLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reading ---------------------------------------------------------------------

    def _read_device(self) -> list[bytes]:
        raws: list[bytes] = []
        while len(raws) < MAX_RECORDS_PER_POLL:
            try:
                raw = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                break  # EAGAIN: nothing more for now
            except BrokenPipeError:
                continue  # EPIPE: records were overwritten; the gap shows in the next seq
            except OSError as exc:
                self._read_failed(exc)
                break
            if not raw:
                break
            raws.append(raw)
        return raws

    def _read_file(self) -> list[bytes]:
        try:
            lines = self._follow()
        except OSError as exc:
            self._read_failed(exc)
            return []
        # Continuation lines (" KEY=value") belong to the record before them.
        return [line for line in lines if line and line[0] != 32 and not line.isspace()]  # 32: " "

    def _follow(self) -> list[bytes]:
        """The complete lines a file gained, after a rotation or a rewrite noticed: by
        identity (another file now at the path: the rest of the old one is read, then the
        new one from its start), by size (shorter than what was read) or by content (the
        bytes before the offset changed: rewritten in place, even when it grew past it)."""
        out: list[bytes] = []
        current = _stat_path(self.path)
        if current is not None and _identity(current) != self._identity:
            out += self._read_chunks()  # what the old file still had (logrotate renamed it)
            if self._pending:
                out.append(self._pending)
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                self._read_failed(exc)
                return out
            os.close(self._fd)
            self._fd = fd
            self._identity = _identity(os.fstat(fd))
            self._restart()
        elif self._rewritten():
            self._restart()
            os.lseek(self._fd, 0, os.SEEK_SET)
        return out + self._read_chunks()

    def _rewritten(self) -> bool:
        size = os.fstat(self._fd).st_size
        if size < self._offset:
            return True
        if not self._edge:
            return False
        return os.pread(self._fd, len(self._edge), self._offset - len(self._edge)) != self._edge

    def _restart(self) -> None:
        self._offset, self._pending, self._last_seq, self._edge = 0, b"", None, b""

    def _read_chunks(self) -> list[bytes]:
        chunks: list[bytes] = []
        size = 0
        while size < READ_SIZE * 64:  # bounded like a device's poll; the rest comes next time
            chunk = os.read(self._fd, READ_SIZE * 4)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if not size:
            return []
        self._offset += size
        data = b"".join(chunks)
        self._edge = (self._edge + data)[-64:]
        lines = (self._pending + data).split(b"\n")
        self._pending = lines.pop()  # "" after a final newline, else a line still being written
        return lines

    def _read_failed(self, exc: BaseException) -> None:
        if not self._error_logged:
            self._error_logged = True
            why = os.strerror(exc.errno or 0) if isinstance(exc, OSError) and exc.errno else repr(exc)
            log.warning("reading the kernel log %s failed: %s", self.path, why)

    def _bad_record(self, exc: BaseException) -> None:
        if not self._bad_logged:
            self._bad_logged = True
            log.warning("kernel log %s: a record skipped (%s); more are only counted as malformed",
                        self.path, str(exc)[:200])

    def _record(self, raw: bytes) -> XidRecord | None:
        """The Xid of one raw record (header, message, continuation lines), counted."""
        self._counts["read"] += 1
        header, sep, rest = raw.partition(b";")
        if not sep:
            self._counts["truncated"] += 1
            return None
        fields = header.split(b",")
        try:
            if len(fields) < 4:
                raise MalformedRecord(f"header {header[:40]!r}")
            _header_int(fields[0], MAX_PRIO, "priority")
            seq = _header_int(fields[1], MAX_SEQ, "sequence number")
            boot_usec = _header_int(fields[2], MAX_USEC, "timestamp")
            if self._last_seq is not None and seq > self._last_seq + MAX_GAP:
                raise MalformedRecord(f"sequence number {seq} jumps from {self._last_seq}")
            # only an NVIDIA line is decoded and parsed: the rest of a busy kernel's log is counted
            record = (parse_xid(rest.split(b"\n", 1)[0].decode("utf-8", "replace"), seq, boot_usec)
                      if rest.startswith(_NVRM) else None)
        except MalformedRecord as exc:
            self._counts["malformed"] += 1
            self._bad_record(exc)
            return None
        if self._last_seq is not None and seq > self._last_seq + 1:
            self._counts["overwritten"] += seq - self._last_seq - 1
        self._last_seq = seq
        if record is not None:
            self._counts["xid"] += 1
        return record


_NVRM = b"NVRM: Xid"
# A record's header at the start of a line, numbers within range by their length alone
# (a timestamp of at most 15 digits is under MAX_USEC); continuation lines start with a space.
_HEADERS = re.compile(rb"\n\d{1,10},(\d{1,18}),\d{1,15},[^;\n]*;")


def _header_int(field: bytes, high: int, what: str) -> int:
    """A number of a record's header, 0 to ``high`` (`MalformedRecord` otherwise)."""
    if field.isdigit() and len(field) <= 19:  # ASCII digits only, and at most 2**63's
        value = int(field)
        if value <= high:
            return value
    return bounded_int(field.decode("ascii", "replace"), 0, high, what)  # raises, saying why


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _stat_path(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None
