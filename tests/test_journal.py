"""The kernel log from the systemd journal: journal files written by the real tool
(systemd-journal-remote), read through libsystemd's API (systemd-python), without
privilege; hostile entries, other boots and a missing binding."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest
from journal_helpers import append_entries, journal_unavailable, kernel_entry, read_back

from exporter.incidents.kernel_log import open_kernel_log
from exporter.incidents.kmsg import KernelLogUnavailable

pytestmark = pytest.mark.skipif(bool(journal_unavailable()), reason=journal_unavailable() or "ok")

XID_31 = "NVRM: Xid (PCI:0000:38:00): 31, pid=52001, name=python3, Ch 00000008, intr 00000000. MMU Fault"
MACHINE = "0123456789abcdef0123456789abcdef"  # journald keeps a machine's files under its id
XID_13 = "NVRM: Xid (PCI:0000:38:00): 13, pid=52001, name=python3, Graphics SM Warp Exception"


def test_xids_are_read_from_the_kernels_entries_starting_at_the_newest(tmp_path: Path) -> None:
    from exporter.incidents.journal import JournalKernelLog

    path = tmp_path / MACHINE / "system.journal"
    path.parent.mkdir()
    now = time.monotonic()
    append_entries(path, [kernel_entry(XID_13, now - 60), kernel_entry("usb 1-1: new device", now - 59)])
    assert read_back(path) == [XID_13, "usb 1-1: new device"]
    with JournalKernelLog(str(tmp_path)) as journal:
        assert journal.poll() == []  # what was there before opening is history
        not_kernel = {**kernel_entry(XID_31), "_TRANSPORT": "syslog"}  # a process writing the same words
        append_entries(path, [kernel_entry(XID_31, now), not_kernel])
        [record] = journal.poll()
        assert (record.xid, record.pid, record.comm, record.pci_bus_id) == (31, 52001, "python3", "00000000:38:00.0")
        assert record.time == pytest.approx(now, abs=1e-6)
        assert journal.poll() == []
        append_entries(tmp_path / MACHINE / "system@rotated.journal", [kernel_entry(XID_13, now + 1)])
        assert [r.xid for r in journal.poll()] == [13]  # a new file (rotation) is picked up
        assert journal.counts()["xid"] == 2


def test_from_the_start_a_replay_reads_every_entry(tmp_path: Path) -> None:
    from exporter.incidents.journal import JournalKernelLog

    append_entries(tmp_path / "k.journal", [kernel_entry(XID_13, 100.0), kernel_entry(XID_31, 200.0)])
    with JournalKernelLog(str(tmp_path), from_start=True) as journal:
        assert [(r.xid, r.time) for r in journal.poll()] == [(13, 100.0), (31, 200.0)]


def test_an_entry_of_another_boot_is_placed_by_its_wall_clock_stamp(tmp_path: Path) -> None:
    from exporter.incidents.journal import JournalKernelLog

    earlier = int((time.time() - time.monotonic() - 3600) * 1e6)  # an hour before this boot
    append_entries(tmp_path / "k.journal", [kernel_entry(XID_31, 50.0, boot="0" * 32, realtime_usec=earlier)])
    with JournalKernelLog(str(tmp_path), from_start=True) as journal:
        [record] = journal.poll()
        assert record.time is None  # before this boot: it can name no process of it


@pytest.mark.parametrize("entry", [
    kernel_entry(XID_31, source_usec=str(10**309)),
    kernel_entry(XID_31, source_usec="-5"),
    kernel_entry("NVRM: Xid (PCI:0000:38:00): " + "9" * 5000 + ", pid=1, name=x, y"),
    kernel_entry("NVRM: Xid (PCI:0000:38:00): 31, pid=" + "7" * 5000 + ", name=x, y"),
])
def test_a_hostile_entry_is_counted_and_costs_only_itself(tmp_path: Path, entry: dict, caplog) -> None:
    from exporter.incidents.journal import JournalKernelLog

    now = time.monotonic()
    append_entries(tmp_path / "k.journal", [kernel_entry(XID_13, now), entry, kernel_entry(XID_31, now)])
    with JournalKernelLog(str(tmp_path), from_start=True) as journal, caplog.at_level(logging.WARNING):
        assert [r.xid for r in journal.poll()] == [13, 31]
        assert journal.counts()["malformed"] == 1
    assert "Traceback" not in caplog.text


def test_binary_and_multiline_messages_are_data(tmp_path: Path) -> None:
    from exporter.incidents.journal import JournalKernelLog

    forged = (XID_31.replace("python3", "evil\x1b[2J") + "\nNVRM: Xid (PCI:0000:38:00): 31, pid=1, name=x").encode()
    append_entries(tmp_path / "k.journal", [kernel_entry(forged + b"\xff\xfe"), kernel_entry(XID_13)])
    with JournalKernelLog(str(tmp_path), from_start=True) as journal:
        records = journal.poll()
        assert [r.xid for r in records] == [31, 13]
        assert "\x1b" not in (records[0].comm or "") and "\n" not in records[0].text


def test_journal_names_a_directory_and_says_why_it_cannot(tmp_path: Path, monkeypatch) -> None:
    from exporter.incidents import journal

    with pytest.raises(KernelLogUnavailable, match=r"journal /nonexistent/j: no such directory"):
        open_kernel_log("journal:/nonexistent/j")
    monkeypatch.setattr(journal, "JOURNAL_DIRS", ("/nonexistent/var", "/nonexistent/run"))
    with pytest.raises(KernelLogUnavailable, match="neither /nonexistent/var nor /nonexistent/run exists"):
        open_kernel_log("journal")
    monkeypatch.setitem(sys.modules, "systemd", None)  # the binding not installed
    with pytest.raises(KernelLogUnavailable, match=r"systemd-python binding is not installed \(pip install"):
        open_kernel_log(f"journal:{tmp_path}")


def test_auto_without_kmsg_reads_the_journal_and_says_so(tmp_path: Path, monkeypatch, caplog) -> None:
    from exporter.incidents import journal, kmsg

    monkeypatch.setattr(kmsg, "DEV_KMSG", "/nonexistent/kmsg")
    monkeypatch.setattr(journal, "JOURNAL_DIRS", (str(tmp_path), "/nonexistent/run"))
    with caplog.at_level(logging.INFO, logger="exporter.incidents.kernel_log"):
        source = open_kernel_log("auto")
    assert isinstance(source, journal.JournalKernelLog)
    source.close()
    assert f"--kernel-log auto: reading the kernel log from the journal ({tmp_path})" in caplog.text


def test_an_empty_journal_directory_is_followed_as_files_appear(tmp_path: Path, caplog) -> None:
    from exporter.incidents.journal import JournalKernelLog

    machine = tmp_path / MACHINE
    machine.mkdir()
    with caplog.at_level(logging.INFO, logger="exporter.incidents.journal"):
        journal = JournalKernelLog(str(tmp_path))
    assert f"the journal at {tmp_path} holds no file the agent can read yet" in caplog.text
    with journal:
        assert journal.poll() == []
        append_entries(machine / "system.journal", [kernel_entry(XID_31)])  # journald starts writing
        assert [r.xid for r in journal.poll()] == [31]
        append_entries(machine / "system.journal", [kernel_entry(XID_13)])
        assert [r.xid for r in journal.poll()] == [13]


@pytest.mark.parametrize("value, message", [
    ("journal:relative/dir", "--kernel-log: journal:relative/dir: name the journal directory by its absolute path"),
    ("journal:/nonexistent/journal", "--kernel-log cannot read the kernel log from the journal /nonexistent/journal: "
                                     "no such directory"),
])
def test_serve_says_in_one_line_what_is_wrong_with_a_journal_value(value: str, message: str) -> None:
    from agent import run_cli

    result = run_cli(["serve", "--backend", "simulated", "--listen", "127.0.0.1:0", "--kernel-log", value])
    assert result.returncode != 0 and message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
