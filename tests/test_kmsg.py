"""The kernel log: NVIDIA's Xid lines read back from the machine's /dev/kmsg, and the odd
cases (every format real drivers print, cut records, hostile process names, overwritten
records) from a file in kmsg's record format."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest
from waiting import wait_until

from exporter.incidents.kernel_log import open_kernel_log
from exporter.incidents.kmsg import (
    KernelLog,
    KernelLogUnavailable,
    XidRecord,
    parse_xid,
)

# Lines as drivers print them (open-gpu-kernel-modules issues, NVIDIA's forums).
MMU_FAULT = ("NVRM: Xid (PCI:0000:3b:00): 31, pid=1234, name=python3, Ch 00000008, intr 00000000. "
             "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_c0000000. Fault is of type FAULT_PDE")
OFF_THE_BUS = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
WARP = ("NVRM: Xid (PCI:0000:18:00): 13, pid=2857, name=python, Graphics SM Warp Exception on "
        "(GPC 0, TPC 0, SM 0): Out Of Range Address")
GSP_TIMEOUT = ("NVRM: Xid (PCI:0000:ca:00): 119, pid=8021, name=nvidia-smi, Timeout after 6s of waiting for "
               "RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)")
RECOVERY = "NVRM: Xid (PCI:0000:ab:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
WITH_FUNCTION = "NVRM: Xid (PCI:0000:3b:00.0): 45, pid=1818990, name=python3, Ch 00000001"
GSP_WORDS = "NVRM: Xid (PCI:0000:01:00): 62, 323f0f30 0000c3d8 00000000 206dae68 206da022"


@pytest.mark.parametrize("line,expected", [
    (MMU_FAULT, ("00000000:3B:00.0", 31, 1234, "python3",
                 "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_c0000000. "
                 "Fault is of type FAULT_PDE")),
    (OFF_THE_BUS, ("00000000:3B:00.0", 79, None, None, "GPU has fallen off the bus.")),
    (WARP, ("00000000:18:00.0", 13, 2857, "python",
            "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address")),
    (GSP_TIMEOUT, ("00000000:CA:00.0", 119, 8021, "nvidia-smi",
                   "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL)")),
    (RECOVERY, ("00000000:AB:00.0", 154, None, None,
                "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")),
    (WITH_FUNCTION, ("00000000:3B:00.0", 45, 1818990, "python3", "Ch 00000001")),
    (GSP_WORDS, ("00000000:01:00.0", 62, None, None, "323f0f30 0000c3d8 00000000 206dae68 206da022")),
])
def test_every_format_the_driver_prints(line: str, expected: tuple[object, ...]) -> None:
    record = parse_xid(line, seq=7, boot_usec=99)
    assert record is not None
    assert (record.pci_bus_id, record.xid, record.pid, record.comm, record.text) == expected
    assert (record.seq, record.boot_usec) == (7, 99)


@pytest.mark.parametrize("line", [
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
    "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
    "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver",
    "usb 1-1: NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x",  # not at the start: not the driver's
    "NVRM: Xid (PCI:zz:3b:00): 31, pid=1, name=x",
    "",
])
def test_other_lines_are_no_xid(line: str) -> None:
    assert parse_xid(line) is None


def test_a_function_digit_and_a_short_domain_normalise_alike() -> None:
    a = parse_xid("NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a")
    b = parse_xid("NVRM: Xid (PCI:00000000:3B:00.0): 31, pid=1, name=a")
    c = parse_xid("NVRM: Xid (PCI:0001:3b:1f.3): 31, pid=1, name=a")
    assert a is not None and b is not None and c is not None
    assert a.pci_bus_id == b.pci_bus_id == "00000000:3B:00.0"
    assert c.pci_bus_id == "00000001:3B:1F.3"


# ---- a file in kmsg's record format -------------------------------------------------------

def _record(seq: int, message: str, prio: int = 3, usec: int | None = None) -> str:
    return f"{prio},{seq},{usec if usec is not None else seq * 1000},-;{message}"


def _file_log(tmp_path: Path, lines: list[str]) -> tuple[KernelLog, Path]:
    path = tmp_path / "kmsg.log"
    path.write_text("".join(line + "\n" for line in lines))
    return KernelLog(str(path)), path


def test_a_file_of_records_is_read_from_its_start(tmp_path: Path) -> None:
    lines = [_record(10, "Linux version 6.8.0"), _record(11, MMU_FAULT), " SUBSYSTEM=pci", " DEVICE=+pci:0000:3b:00.0",
             _record(12, OFF_THE_BUS), _record(13, WARP), _record(14, GSP_TIMEOUT), _record(15, RECOVERY),
             _record(16, WITH_FUNCTION)]
    log, _ = _file_log(tmp_path, lines)
    with log:
        records = log.poll()
        assert [r.xid for r in records] == [31, 79, 13, 119, 154, 45]
        assert [r.seq for r in records] == [11, 12, 13, 14, 15, 16]
        assert records[0].boot_usec == 11000
        assert log.counts() == {"read": 7, "xid": 6, "overwritten": 0, "malformed": 0, "truncated": 0}
        assert log.poll() == []


def test_a_file_is_followed_as_lines_are_appended(tmp_path: Path) -> None:
    log, path = _file_log(tmp_path, [_record(1, MMU_FAULT)])
    with log:
        assert [r.xid for r in log.poll()] == [31]
        with path.open("a") as f:
            f.write(_record(2, OFF_THE_BUS)[:30])  # half a line: not yet a record
            f.flush()
            assert log.poll() == []
            f.write(_record(2, OFF_THE_BUS)[30:] + "\n")
        assert [r.xid for r in log.poll()] == [79]
        assert log.counts()["truncated"] == 0


def test_cut_and_malformed_records_are_counted_and_skipped(tmp_path: Path) -> None:
    lines = [_record(1, MMU_FAULT),
             "3,2,2000,-",  # cut before the ';'
             "3,3,30",  # cut in the header
             "name=python3, Ch 00000008",  # the second half of a cut record
             "x,4,4000,-;" + WARP,  # a header that is not kmsg's
             "3,5;" + WARP,  # too few fields
             _record(6, OFF_THE_BUS)]
    log, _ = _file_log(tmp_path, lines)
    with log:
        assert [r.xid for r in log.poll()] == [31, 79]
        counts = log.counts()
    assert counts["truncated"] == 3
    assert counts["malformed"] == 2
    assert counts["xid"] == 2 and counts["read"] == 7


def test_terminal_escapes_and_a_forged_line_in_the_name_come_out_escaped(tmp_path: Path) -> None:
    forged = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    lines = [
        # As /dev/kmsg hands them out: the kernel wrote the control characters as \xNN.
        _record(1, r"NVRM: Xid (PCI:0000:3b:00): 31, pid=66, name=a\x1b[2Jb, Ch 00000008"),
        _record(2, r"NVRM: Xid (PCI:0000:3b:00): 31, pid=67, name=x\x0a" + forged),
        # Raw in a file written by hand: the same result.
        _record(3, "NVRM: Xid (PCI:0000:3b:00): 31, pid=68, name=a\x1b[2Jb\x07, Ch 0\x1b]0;pwned\x07"),
        _record(4, "NVRM: Xid (PCI:0000:3b:00): 31, pid=69, name=\u202eevil\x9b, Ch 00000008"),
    ]
    log, _ = _file_log(tmp_path, lines)
    with log:
        first, second, third, fourth = log.poll()
    assert first.comm == "a\\x1b[2Jb" and first.text == "Ch 00000008"
    assert second.pid == 67 and second.xid == 31
    assert second.comm is not None and "\n" not in second.comm and second.comm.startswith("x\\x0aNVRM: Xid")
    assert third.comm == "a\\x1b[2Jb\\x07" and third.text == "Ch 0\\x1b]0;pwned\\x07"
    assert fourth.comm == "\\u202eevil\\x9b"
    for record in (first, second, third, fourth):
        assert not any(ord(ch) < 0x20 or 0x7f <= ord(ch) <= 0x9f for ch in (record.comm or "") + record.text)


def test_binary_garbage_never_crashes(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.log"
    path.write_bytes(b"\xff\xfe\x00;\n3,1,1,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=\xff\xc3, Ch\n" + os.urandom(512)
                     + b"\n" + _record(9, WARP).encode() + b"\n")
    with KernelLog(str(path)) as log:
        records = log.poll()
    assert [r.xid for r in records][:1] == [31] and records[-1].xid == 13
    assert records[0].comm == "\ufffd\ufffd"


def test_a_gap_in_the_sequence_numbers_counts_as_overwritten(tmp_path: Path) -> None:
    log, _ = _file_log(tmp_path, [_record(100, MMU_FAULT), _record(101, "other"), _record(105, WARP),
                                  _record(106, OFF_THE_BUS)])
    with log:
        assert [r.seq for r in log.poll()] == [100, 105, 106]
        assert log.counts()["overwritten"] == 3


def test_off_is_none_and_a_missing_path_is_one_clear_error(tmp_path: Path) -> None:
    assert open_kernel_log("off") is None
    missing = tmp_path / "no-such-kmsg"
    with pytest.raises(KernelLogUnavailable) as info:
        open_kernel_log(str(missing))
    message = str(info.value)
    assert message == f"cannot read the kernel log {missing}: no such file"
    assert "\n" not in message and info.value.__cause__ is None and info.value.__suppress_context__


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KernelLogUnavailable, match="neither a character device nor a file"):
        open_kernel_log(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file: a permission error cannot be arranged")
def test_an_unreadable_file_says_permission_denied(tmp_path: Path) -> None:
    path = tmp_path / "kmsg.log"
    path.write_text("")
    path.chmod(0)
    with pytest.raises(KernelLogUnavailable, match="permission denied .*CAP_SYSLOG"):
        open_kernel_log(str(path))


def test_auto_without_a_readable_kmsg_is_none_with_the_reason(monkeypatch, caplog) -> None:
    from exporter.incidents import journal, kmsg

    monkeypatch.setattr(kmsg, "DEV_KMSG", "/nonexistent/kmsg")
    monkeypatch.setattr(journal, "JOURNAL_DIRS", ("/nonexistent/var/log/journal", "/nonexistent/run/log/journal"))
    with caplog.at_level(logging.INFO, logger="exporter.incidents.kernel_log"):
        assert open_kernel_log("auto") is None
    assert "cannot read the kernel log /nonexistent/kmsg: no such file" in caplog.text
    assert "neither /nonexistent/var/log/journal nor /nonexistent/run/log/journal exists" in caplog.text


# ---- the machine's own /dev/kmsg ----------------------------------------------------------

@pytest.fixture
def kmsg_writer() -> int:
    """A file descriptor writing to the real /dev/kmsg (root only)."""
    try:
        reader = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        pytest.skip(f"/dev/kmsg cannot be read here ({os.strerror(exc.errno or 0)}): needs root or CAP_SYSLOG")
    os.close(reader)
    try:
        fd = os.open("/dev/kmsg", os.O_WRONLY)
    except OSError as exc:
        pytest.skip(f"/dev/kmsg cannot be written here ({os.strerror(exc.errno or 0)}): needs root")
    yield fd
    os.close(fd)


def _collect(log: KernelLog, marker: str, count: int) -> list[XidRecord]:
    """Poll until ``count`` records whose text carries ``marker`` arrived (other processes
    on the machine may log meanwhile)."""
    seen: list[XidRecord] = []

    def arrived() -> bool:
        seen.extend(r for r in log.poll() if marker in r.text)
        return len(seen) >= count

    wait_until(arrived, what=f"{count} record(s) marked {marker} in /dev/kmsg")
    return seen


def test_lines_written_to_dev_kmsg_are_read_back(kmsg_writer: int) -> None:
    marker = uuid.uuid4().hex
    log = open_kernel_log("/dev/kmsg")
    assert log is not None
    with log:
        assert all(marker not in r.text for r in log.poll())  # starts at the end: nothing of ours yet
        os.write(kmsg_writer, f"<3>{MMU_FAULT} {marker}\n".encode())
        os.write(kmsg_writer, f"<3>{OFF_THE_BUS} {marker}\n".encode())
        os.write(kmsg_writer, f"<3>NVRM: Xid (PCI:0000:3b:00): 31, pid=4242, name=a\x1b[2Jb\nforged, {marker}\n"
                 .encode())
        mmu, bus, hostile = _collect(log, marker, 3)
        counts = log.counts()
    assert (mmu.pci_bus_id, mmu.xid, mmu.pid, mmu.comm) == ("00000000:3B:00.0", 31, 1234, "python3")
    assert (bus.xid, bus.pid, bus.comm) == (79, None, None)
    assert bus.seq > mmu.seq and bus.boot_usec >= mmu.boot_usec > 0
    assert hostile.pid == 4242 and hostile.comm == "a\\x1b[2Jb\\x0aforged"
    assert counts["xid"] >= 3 and counts["malformed"] == 0 and counts["truncated"] == 0


def test_from_start_reads_what_is_buffered(kmsg_writer: int) -> None:
    marker = uuid.uuid4().hex
    os.write(kmsg_writer, f"<3>{WARP} {marker}\n".encode())
    log = open_kernel_log("auto", from_start=True)
    assert log is not None
    with log:
        (record,) = _collect(log, marker, 1)
    assert (record.xid, record.pid, record.comm) == (13, 2857, "python")


# ---- hostile and absurd records ------------------------------------------------------------

GOOD = "3,20,5000000,-;" + MMU_FAULT


@pytest.mark.parametrize("bad", [
    "3,21,5000001,-;NVRM: Xid (PCI:0000:3b:00): " + "9" * 5000 + ", pid=1, name=x, y",  # an Xid of 5000 digits
    "3,21,5000001,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=" + "7" * 5000 + ", name=x, y",  # a pid of 5000 digits
    "3,21,5000001,-;NVRM: Xid (PCI:0000:3b:00): 70000, pid=1, name=x, y",  # no Xid code is that high
    "3,21,5000001,-;NVRM: Xid (PCI:0000:3b:00): 31, pid=99999999, name=x, y",  # over PID_MAX_LIMIT
    "3,-5,5000001,-;" + MMU_FAULT,  # a negative sequence number
    "3," + str(2**64) + ",5000001,-;" + MMU_FAULT,  # beyond a u64
    "3," + str(10**309) + ",5000001,-;" + MMU_FAULT,  # beyond a float
    "3,21,-1,-;" + MMU_FAULT,  # a negative timestamp
    "3,21," + str(2**64) + ",-;" + MMU_FAULT,  # a timestamp beyond the kernel's clock
    "99999999999,21,5000001,-;" + MMU_FAULT,  # a priority beyond an int
    "3,21,5000001;" + MMU_FAULT,  # a header one field short
    "3,٣١,5000001,-;" + MMU_FAULT,  # digits of another script
])
def test_a_record_outside_the_kernels_ranges_is_counted_and_costs_only_itself(tmp_path: Path, bad: str,
                                                                              caplog) -> None:
    log = tmp_path / "kmsg"
    log.write_text(GOOD + "\n" + bad + "\n" + GOOD.replace("3,20,", "3,22,") + "\n")
    with KernelLog(str(log)) as reader, caplog.at_level(logging.WARNING):
        records = reader.poll()
        assert [r.seq for r in records] == [20, 22]  # the records read with it are kept
        counts = reader.counts()
    assert counts["malformed"] == 1 and counts["xid"] == 2 and counts["read"] == 3
    assert counts["overwritten"] <= 1 and all(v <= 2**53 for v in counts.values())
    assert "Traceback" not in caplog.text
    assert caplog.text.count("a record skipped") == 1


def test_a_sequence_jump_beyond_any_ring_buffer_is_malformed_not_overwritten(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text(f"6,5,1,-;a\n6,{2**62},2,-;b\n6,6,3,-;c\n")
    with KernelLog(str(log)) as reader:
        reader.poll()
        assert reader.counts()["overwritten"] == 0 and reader.counts()["malformed"] == 1


def test_a_file_rewritten_in_place_past_the_old_offset_loses_nothing(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("6,1,1,-;first line of the old file\n")
    with KernelLog(str(log)) as reader:
        assert reader.poll() == []
        with log.open("r+") as f:  # rewritten from scratch, longer than what was read
            f.write(GOOD + "\n" + GOOD.replace("3,20,", "3,21,") + "\n")
        assert [r.seq for r in reader.poll()] == [20, 21]


def test_a_file_rotated_under_the_reader_is_followed_to_the_new_one(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("6,1,1,-;old\n")
    with KernelLog(str(log)) as reader:
        assert reader.poll() == []
        with log.open("a") as f:
            f.write(GOOD.replace("3,20,", "3,2,") + "\n")  # written to the old file before it is renamed
        log.rename(tmp_path / "kmsg.1")
        log.write_text(GOOD.replace("3,20,", "3,3,") + "\n")  # a new file at the path
        assert [r.seq for r in reader.poll()] == [2, 3]
        assert reader.counts()["overwritten"] == 0


def test_a_busy_kernels_records_read_at_once_are_the_same_as_one_by_one(tmp_path: Path) -> None:
    lines = ["6,1,1,-;first"]
    for seq in range(2, 400):
        if seq % 50 == 0:
            lines.append(f"3,{seq},{seq * 1000},-;" + MMU_FAULT.replace("pid=1234", f"pid={seq}"))
        elif seq % 77 == 0:  # a process's own words that quote a driver line are no driver line
            lines.append(f"4,{seq},{seq * 1000},-;myapp: ;NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=x, y")
        else:
            lines.append(f"6,{seq},{seq * 1000},-;eth0: link up ({seq})")
    log = tmp_path / "kmsg"
    log.write_text(lines[0] + "\n")
    with KernelLog(str(log)) as reader:
        reader.poll()
        with log.open("a") as f:
            f.write("\n".join(lines[1:]) + "\n")
        records = reader.poll()
        assert [(r.seq, r.pid, r.boot_usec) for r in records] == [(s, s, s * 1000) for s in range(50, 400, 50)]
        assert reader.counts() == {"read": 399, "xid": 7, "overwritten": 0, "malformed": 0, "truncated": 0}
        with log.open("a") as f:  # a gap: read one by one, counted
            f.write(f"6,405,1,-;after a gap\n3,406,2,-;{MMU_FAULT}\n")
        assert [r.seq for r in reader.poll()] == [406]
        assert reader.counts()["overwritten"] == 5
