"""Journal files written by the real tool: Debian's ``systemd-journal-remote`` turns
entries in the journal's export format into a journal file (``journalctl --file`` reads
it back), so tests read what journald's own library wrote, never a fake of the format.

`journal_unavailable` says why a test must skip (no binding, no tool); `kernel_entry`
makes one entry as journald stores a kernel record; `append_entries` writes entries to a
journal file (creating it, or adding to it as journald does while a reader follows).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

TOOL_PATHS = ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote")


def journal_remote() -> str | None:
    found = shutil.which("systemd-journal-remote")
    return found or next((p for p in TOOL_PATHS if Path(p).exists()), None)


def journal_unavailable() -> str:
    """Why journal files cannot be written and read here ("" when they can)."""
    try:
        import systemd.journal  # noqa: F401
    except ImportError:
        return "the systemd-python binding is not installed (pip install systemd-python)"
    if journal_remote() is None:
        return "systemd-journal-remote is not installed (apt-get install systemd-journal-remote)"
    return ""


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")


def machine_id() -> str:
    """This machine's id (``/etc/machine-id``), as journald stamps its entries."""
    return Path("/etc/machine-id").read_text().strip()


def kernel_entry(message: str | bytes, at: float | None = None, *, boot: str | None = None,
                 source_usec: str | None = None, realtime_usec: int | None = None,
                 machine: str | None = None) -> dict[str, str | bytes]:
    """A kernel record as journald stores it: ``_TRANSPORT=kernel``, logged ``at`` seconds
    since boot (default: now, on ``time.monotonic()``) in this boot (or ``boot``) on this
    machine (or ``machine``)."""
    at = time.monotonic() if at is None else at
    usec = int(at * 1e6)
    realtime = realtime_usec if realtime_usec is not None else int((time.time() - time.monotonic() + at) * 1e6)
    return {"__REALTIME_TIMESTAMP": str(realtime), "__MONOTONIC_TIMESTAMP": str(max(usec, 0)),
            "_BOOT_ID": boot or boot_id(), "_MACHINE_ID": machine or machine_id(), "_TRANSPORT": "kernel", "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "3",
            "SYSLOG_FACILITY": "0", "_SOURCE_MONOTONIC_TIMESTAMP": source_usec if source_usec is not None else
            str(max(usec, 0)), "MESSAGE": message}


def export_format(entries: Sequence[Mapping[str, str | bytes]]) -> bytes:
    """Entries in the journal's export format (binary-safe where a value needs it)."""
    out = bytearray()
    for entry in entries:
        for name, value in entry.items():
            data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
            if b"\n" in data or any(b < 0x20 and b != 0x09 for b in data):
                out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
            else:
                out += name.encode() + b"=" + data + b"\n"
        out += b"\n"
    return bytes(out)


def append_entries(path: Path, entries: Sequence[Mapping[str, str | bytes]]) -> None:
    """Write ``entries`` to the journal file ``path`` (``*.journal``) with the real tool."""
    tool = journal_remote()
    assert tool is not None, journal_unavailable()
    path.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([tool, f"--output={path}", "-"], input=export_format(entries),
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def read_back(path: Path) -> list[str]:
    """The MESSAGE of each entry of a journal file, as ``journalctl --file`` reads it."""
    done = subprocess.run(["journalctl", "--file", str(path), "-o", "cat", "--no-pager"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()
