"""A kernel-log line read late (behind a backlog of kernel records) amends the incident NVML's
Xid already opened with its cause unknown: one fault, one incident (the same id), its cause,
basis and the pods' Events patched, never a second incident; a line older than the amend
window is counted ``late`` and opens nothing."""

from __future__ import annotations

import functools

import pytest

from exporter.core.labels import label_schema
from exporter.core.model import DeviceSample, ProcessRow, ProcessSample, Snapshot, Workload
from exporter.incidents.engine import AMEND_WINDOW, IncidentConfig, IncidentTracker
from exporter.incidents.kmsg import XidRecord
from exporter.incidents.messages import incident_id

BUS = "00000000:3B:00.0"
TRAINER = Workload(kind="kubernetes", namespace="ml", pod="trainer", container="main", pod_uid="uid-trainer")
NOTEBOOK = Workload(kind="kubernetes", namespace="ml", pod="notebook", container="main", pod_uid="uid-notebook")
PIDS = {101: TRAINER, 202: NOTEBOOK}  # both on GPU 2: time-shared, so only the line can tell


def _gpu(xids: int) -> DeviceSample:
    return DeviceSample(index=2, uuid="GPU-2", model="H100", pci_bus_id=BUS, memory_total_bytes=80 * 2**30,
                        memory_used_bytes=20 * 2**30, processes=(ProcessSample(101, 2**30), ProcessSample(202, 2**30)),
                        xid_errors={"31": 1} if xids else {})


def _line(at: float) -> XidRecord:
    return XidRecord(9, int(at * 1e6), BUS, 31, 101, "python3", "MMU Fault")


class Passes:
    """One pass a second (times: seconds since boot), NVML's Xid 31 counted at pass ``fault``."""

    def __init__(self, fault: int) -> None:
        self.tracker = IncidentTracker("gpu-node-7", IncidentConfig(xid_hold=2.0))
        self.fault, self.n, self.now = fault, 0, 1000.0

    def pass_(self, records: tuple[XidRecord, ...] = ()) -> list:
        self.n += 1
        self.now += 1.0
        new_xids = {"GPU-2": {"31": 1}} if self.n == self.fault else {}
        return self.tracker.observe(self.now, 1.7e9 + self.now, [_gpu(self.n >= self.fault)], PIDS, records,
                                    starts={101: 10.0, 202: 20.0}, new_xids=new_xids)


def test_a_line_read_behind_a_backlog_amends_the_incident_nvml_opened() -> None:
    node = Passes(fault=3)
    opened = [i for _ in range(6) for i in node.pass_()]
    [first] = opened  # the 2 s wait for the line expired: cause unknown
    assert (first.cause_known, first.caused_by, set(first.affected)) == (False, (), {TRAINER, NOTEBOOK})
    logged_at = 1000.0 + 3 - 0.4  # the kernel logged it as the fault happened, before the pass counted it
    for _ in range(12):  # 60,000 kernel records read 4,096 a second: the line comes 12 s later
        assert node.pass_() == []
    [amended] = node.pass_((_line(logged_at),))
    assert amended.previous is first and incident_id(amended) == incident_id(first)
    assert (amended.cause_known, amended.cause_basis, amended.caused_by) == (True, "kernel_log", (TRAINER,))
    assert amended.affected == (NOTEBOOK,)
    assert "read 1" in amended.detail and "after NVML's Xid" in amended.detail
    assert node.tracker.recent() == (amended,)  # one fault, one incident


def test_a_line_read_after_the_amend_window_is_counted_late_and_opens_nothing() -> None:
    node = Passes(fault=3)
    for _ in range(int(AMEND_WINDOW) + 5):  # over ten minutes of passes
        node.pass_()
    assert node.pass_((_line(1000.0 + 3 - 0.4),)) == []
    assert node.tracker.late_lines == 1 and len(node.tracker.recent()) == 1


pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")

from cgroup_helpers import kubeconfig  # noqa: E402
from waiting import wait_until  # noqa: E402

from exporter.incidents.events import EventSink, default_api_factory  # noqa: E402
from exporter.incidents.watch import IncidentWatch  # noqa: E402


class Lines:
    """A kernel log whose lines the test hands in."""

    def __init__(self) -> None:
        self.due: list[XidRecord] = []

    def poll(self) -> list[XidRecord]:
        out, self.due = self.due, []
        return out

    def counts(self) -> dict[str, int]:
        return {}

    def failures(self) -> int:
        return 0

    def close(self) -> None:
        return None


def test_the_amendment_patches_the_pods_events_rather_than_posting_new_ones(apiserver, tmp_path) -> None:
    clock = [1000.0]
    names, labeller = label_schema([])
    sink = EventSink(functools.partial(default_api_factory, kubeconfig(tmp_path, apiserver)), "gpu-node-7")
    lines = Lines()
    watch = IncidentWatch("gpu-node-7", labeller, names, tracker=IncidentTracker("gpu-node-7", IncidentConfig(
        xid_hold=2.0)), kernel_log=lines, events=sink, clock=lambda: clock[0])
    rows = tuple(ProcessRow("GPU-2", pid, "python3", w, 2**30, None, start_time=10.0) for pid, w in PIDS.items())

    def observe(seq: int, faults: tuple[int, ...] = (3,)) -> None:
        clock[0] = 1000.0 + seq
        watch.observe(Snapshot(seq=seq, node="gpu-node-7", timestamp=1.7e9 + clock[0], devices=(_gpu(seq >= 3),),
                               processes=rows, new_xids={"GPU-2": {"31": 1}} if seq in faults else {}))

    try:
        for seq in range(1, 7):
            observe(seq)
        wait_until(lambda: sink.counts()["posted"] == 2, what="both pods' Events (cause unknown)")
        assert {e["reason"] for e in apiserver.core_events.values()} == {"GPUFaultAffected"}
        lines.due.append(_line(1003.0 - 0.4))
        for seq in range(7, 20):
            observe(seq)
        wait_until(lambda: sink.counts()["amended"] == 1, what="the trainer's Event amended")
        events = {e["involvedObject"]["name"]: e for e in apiserver.core_events.values()}
        assert len(events) == 2 and sink.counts()["posted"] == 2  # no new Event
        assert events["trainer"]["reason"] == "GPUFaultCaused" and events["trainer"]["count"] == 1
        assert "this container's process raised it" in events["trainer"]["message"]
        assert events["notebook"]["reason"] == "GPUFaultAffected"
        [incident] = watch.recent_json()
        assert [w["pod"] for w in incident["caused_by"]] == ["trainer"]
        caused = [(labels, n) for (labels, kind, role), n in watch.incident_counts().items() if role == "caused"]
        assert [("trainer" in labels, n) for labels, n in caused] == [(True, 1)]
        # a second fault whose line is read over ten minutes later: counted late, nothing opened
        second = 30
        for seq in range(20, second + int(AMEND_WINDOW) + 5):
            observe(seq, faults=(second,))
        lines.due.append(_line(1000.0 + second - 0.4))
        observe(second + int(AMEND_WINDOW) + 5)
        from exporter.incidents.watch import IncidentFamilies

        [records] = IncidentFamilies(watch, frozenset({"l9gpu_kernel_log_records_total"})).collect()
        assert [(s.labels, s.value) for s in records.samples if s.name.endswith("_total")] == [
            ({"outcome": "late"}, 1.0)]
        assert len(watch.recent_json()) == 2  # the two faults, each once
    finally:
        sink.close(timeout=5.0)
