"""The agent under a journal fault: a journal file truncated under its reader (libsystemd's
mapping then faults with SIGBUS) ends the reader's process, never the agent; the agent
keeps serving, counts the failure, and reads the kernel log again once the file is replaced."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from journal_helpers import append_entries, journal_unavailable, kernel_entry
from waiting import wait_until

pytestmark = pytest.mark.skipif(bool(journal_unavailable()), reason=journal_unavailable() or "ok")

MACHINE = "0123456789abcdef0123456789abcdef"
# GPU 6 of the simulated node (PCI 0000:78:00) is time-shared; pid 62101 is the reranker's
XID_13 = "NVRM: Xid (PCI:0000:78:00): 13, pid=62101, name=reranker, Graphics SM Warp Exception on (GPC 0)"


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _reader_pid(agent_pid: int) -> int:
    def reader() -> int | None:
        for child in _children(agent_pid):
            try:
                if b"exporter.incidents.journal_reader" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
            except OSError:
                continue
        return None

    return wait_until(reader, what="the journal reader's process")


def test_a_journal_file_truncated_under_the_reader_ends_the_reader_not_the_agent(agent_factory, tmp_path):
    journal = tmp_path / "journal" / MACHINE / "system.journal"
    append_entries(journal, [kernel_entry("Linux version 6.8.0")])
    agent = agent_factory("--backend", "simulated", "--interval", "200ms",
                          "--kernel-log", f"journal:{tmp_path / 'journal'}")

    def counted(name: str, **labels: str) -> float:
        return sum(v for lab, v in agent.samples().get(name, []) if all(lab.get(k) == w for k, w in labels.items()))

    assert counted("l9gpu_kernel_log_reader_failures_total") == 0
    # A backlog the reader is still working through when the file shrinks: written while the
    # reader is stopped, then read at its pace (4,096 entries a second) once it goes on.
    reader = _reader_pid(agent.proc.pid)
    os.kill(reader, signal.SIGSTOP)
    try:
        append_entries(journal, [kernel_entry(f"usb {i}: " + "x" * 200) for i in range(30_000)])
    finally:
        os.kill(reader, signal.SIGCONT)
    assert journal.stat().st_size > 8 * 2**20
    wait_until(lambda: counted("l9gpu_kernel_log_records_total", outcome="read") >= 4096,
               what="the reader's first batch of the backlog")
    os.truncate(journal, 4 * 2**20)  # `truncate -s 4M system.journal`: an administrator freeing disk

    wait_until(lambda: counted("l9gpu_kernel_log_reader_failures_total") >= 1, what="the reader's failure counted")
    assert agent.proc.poll() is None and agent.get("/metrics")[0] == 200
    assert "journal reader of" in agent.log() and "killed by SIGBUS" in agent.log()
    assert agent.log().count("journal reader of") == 1  # logged once, then only counted

    journal.unlink()  # replaced (journald rotates a file it finds corrupt; here, a new one)
    append_entries(journal, [kernel_entry(XID_13)])
    [incident] = wait_until(lambda: json.loads(agent.get("/api/v1/incidents")[2])["incidents"],
                            what="the Xid read from the replaced file")
    assert (incident["xid"], incident["gpu"], incident["cause_basis"]) == (13, 6, "kernel_log")
    assert [w["owner"] for w in incident["caused_by"]] == ["search/reranker-5b8d4-fghij/reranker"]
    assert agent.proc.poll() is None and "Traceback" not in agent.log()
