"""Incidents from passes: who filled a GPU, who raised a fault, who was hurt (pure)."""

from __future__ import annotations

from typing import Iterable, Mapping

import pytest

from exporter.attribution import NullAttributor
from exporter.collect.collector import Collector
from exporter.collect.xids import XidBaseline, xid_step
from exporter.core.labels import label_schema
from exporter.core.model import UNKNOWN, DeviceSample, ProcessSample, Snapshot, Workload
from exporter.devices.base import Backend
from exporter.incidents.engine import IncidentConfig, IncidentTracker
from exporter.incidents.kmsg import XidRecord
from exporter.incidents.messages import event_messages, incident_json
from exporter.incidents.peaks import PeakSeries
from exporter.incidents.watch import IncidentWatch

GIB = 2**30
TOTAL = 80 * GIB
BUS = "00000000:3B:00.0"


def pod(name: str) -> Workload:
    return Workload(kind="kubernetes", namespace="ml", pod=name, container="main", pod_uid=f"uid-{name}")


TRAINER, NOTEBOOK, VLLM = pod("trainer"), pod("notebook"), pod("vllm")


def gpu(procs: dict[int, int], index: int = 2, xids: dict[str, int] | None = None, up: bool = True) -> DeviceSample:
    return DeviceSample(index=index, uuid=f"GPU-{index}", model="H100", pci_bus_id=BUS if index == 2 else "", up=up,
                        memory_total_bytes=TOTAL, memory_used_bytes=sum(procs.values()) + GIB // 2,
                        processes=tuple(ProcessSample(pid, mem) for pid, mem in procs.items()),
                        xid_errors=xids or {})


class Node:
    """Passes one second apart through one tracker (times: seconds since boot), with the
    pass's new XIDs as the collector gives them (`exporter.collect.xids`)."""

    def __init__(self, owners: dict[int, Workload], **config: float) -> None:
        self.tracker = IncidentTracker("gpu-node-7", IncidentConfig(**config))  # type: ignore[arg-type]
        self.owners = owners
        self.starts: dict[int, float] = {}
        self.comms: dict[int, str] = {}
        self.now = 1000.0
        self.xids = XidBaseline()

    def pass_(self, *devices: DeviceSample, records: tuple[XidRecord, ...] = (),
              reasons: dict[str, set[str]] | None = None, unchanged: frozenset[str] = frozenset()) -> list:
        self.now += 1.0
        self.xids, new_xids = xid_step(self.xids, devices)
        return self.tracker.observe(self.now, 1.7e9 + self.now, devices, self.owners, records, reasons,
                                    starts=self.starts, comms=self.comms, new_xids=new_xids, unchanged=unchanged)


def xid(code: int, pid: int | None, at: float, comm: str = "python3", text: str = "MMU Fault") -> XidRecord:
    """A kernel-log Xid line on GPU 2 (BUS), logged ``at`` seconds since boot."""
    return XidRecord(7, int(at * 1e6), BUS, code, pid, comm if pid is not None else None, text)


def test_a_trainer_fills_the_gpu_and_the_notebook_that_exits_is_its_victim():
    node = Node({1: TRAINER, 2: NOTEBOOK, 3: NOTEBOOK, 4: NOTEBOOK})
    trainer = 40 * GIB
    for _ in range(30):  # the trainer grows, the notebook holds steady
        assert node.pass_(gpu({1: trainer, 2: 10 * GIB, 3: 2 * GIB, 4: 2 * GIB})) == []
        trainer = min(trainer + GIB, 65 * GIB + GIB // 2)
    full = gpu({1: trainer, 2: 10 * GIB, 3: 2 * GIB, 4: 2 * GIB})
    assert TOTAL - full.memory_used_bytes < 2 * GIB  # under max(2%, 1 GiB): full
    assert node.pass_(full) == []  # full alone is no incident
    [incident] = node.pass_(gpu({1: trainer, 3: 2 * GIB, 4: 2 * GIB}))  # the notebook's process exits
    assert incident.kind == "memory_exhausted"
    assert incident.affected == (NOTEBOOK,)
    assert incident.caused_by == (TRAINER,) and incident.cause_known
    # from 40 GiB to the 64 GiB at which the GPU filled (under 2 GiB free), the minute before
    assert "ml/trainer/main grew 24.0 GiB over the minute before" in incident.detail
    # more exits in the same episode: still the one incident
    assert node.pass_(gpu({1: trainer, 4: 2 * GIB})) == []
    assert node.pass_(gpu({1: trainer})) == []
    messages = event_messages(incident)
    assert [(w.pod, reason) for w, reason, _ in messages] == [("trainer", "GPUMemoryExhausted"),
                                                              ("notebook", "GPUMemoryExhausted")]
    assert messages[1][2] == ("GPU 2 (GPU-2, node gpu-node-7) ran out of memory (inferred) while this container held "
                              "it; suspected cause: ml/trainer/main")
    doc = incident_json(incident)
    assert doc["kind"] == "memory_exhausted" and doc["xid"] is None and doc["gpu"] == 2
    assert doc["caused_by"][0]["pod"] == "trainer" and doc["affected"][0]["pod"] == "notebook"
    assert doc["time_rfc3339"].endswith("Z")


def test_a_vllm_pod_keeping_its_gpu_92_percent_full_for_an_hour_raises_nothing():
    node = Node({1: VLLM})
    for _ in range(3600):
        assert node.pass_(gpu({1: int(0.92 * TOTAL)})) == []
    assert node.tracker.recent() == ()


def test_xid_31_from_a_pods_pid_names_it_even_after_the_process_exited():
    node = Node({1: TRAINER, 2: NOTEBOOK})
    node.pass_(gpu({1: 10 * GIB, 2: 10 * GIB}))
    faulted = node.now + 0.5  # between the last pass that saw it and the first that did not
    node.pass_(gpu({2: 10 * GIB}))  # the faulting process is gone
    node.pass_(gpu({2: 10 * GIB}))
    record = XidRecord(7, int(faulted * 1e6), BUS, 31, 1, "python3", "Ch 00000008, intr 00000000. MMU Fault")
    [incident] = node.pass_(gpu({2: 10 * GIB}, xids={"31": 1}), records=(record,))
    assert incident.kind == "xid" and incident.xid == 31 and incident.action == "restart_app"
    assert incident.caused_by == (TRAINER,) and incident.affected == (NOTEBOOK,)
    assert incident.cause_basis == "kernel_log" and incident_json(incident)["cause_basis"] == "kernel_log"
    assert [reason for _, reason, _ in event_messages(incident)] == ["GPUFaultCaused", "GPUFaultAffected"]
    # NVML counted the same Xid: one incident, the kernel log's
    assert node.pass_(gpu({2: 10 * GIB}, xids={"31": 1})) == []


def test_xid_79_on_a_time_shared_gpu_affects_every_pod_and_names_no_cause():
    a, b, c = pod("a"), pod("b"), pod("c")
    node = Node({1: a, 2: b, 3: c})
    node.pass_(gpu({1: GIB, 2: GIB, 3: GIB}))
    [incident] = node.pass_(gpu({1: GIB, 2: GIB, 3: GIB}, xids={"79": 1}))
    assert incident.xid == 79 and incident.action == "reboot_node"
    assert incident.caused_by == () and not incident.cause_known
    assert set(incident.affected) == {a, b, c}
    message = event_messages(incident)[0][2]
    assert message.startswith("GPU 2 (GPU-2, node gpu-node-7) raised Xid 79 (") and "while this container held it" in message


def test_xid_119_naming_nvidia_smi_has_no_cause():
    node = Node({1: TRAINER})
    node.pass_(gpu({1: GIB}))
    record = xid(119, 4242, node.now, "nvidia-smi", "Timeout after 6s of waiting for RPC response")
    [incident] = node.pass_(gpu({1: GIB}), records=(record,))
    assert incident.caused_by == () and incident.affected == (TRAINER,)
    assert "nvidia-smi" in incident.detail and "not a cause" in incident.detail


def test_a_process_the_driver_names_without_its_name_is_said_so_not_none():
    node = Node({1: TRAINER})
    node.pass_(gpu({1: GIB}))
    record = XidRecord(9, int((node.now + 0.5) * 1e6), BUS, 31, 1, None, "MMU Fault")  # pid=1, name=<unknown>
    [incident] = node.pass_(gpu({1: GIB}), records=(record,))
    assert "from the kernel log, pid 1 (name unknown): MMU Fault" in incident.detail
    assert "None" not in incident.detail


def test_an_nvml_xid_waits_for_the_kernel_log_line_when_one_is_read():
    node = Node({1: TRAINER}, xid_hold=2.0)
    node.pass_(gpu({1: GIB}))
    assert node.pass_(gpu({1: GIB}, xids={"13": 1})) == []  # held: the log may name the process
    record = xid(13, 1, node.now, "python", "Graphics SM Warp Exception")
    [incident] = node.pass_(gpu({1: GIB}, xids={"13": 1}), records=(record,))
    assert incident.caused_by == (TRAINER,) and incident.cause_basis == "kernel_log"
    assert node.pass_(gpu({1: GIB}, xids={"13": 1})) == [] and node.pass_(gpu({1: GIB}, xids={"13": 1})) == []
    # no line comes: reported from NVML after the hold
    assert node.pass_(gpu({1: GIB}, xids={"13": 2})) == []
    node.pass_(gpu({1: GIB}, xids={"13": 2}))
    [late] = node.pass_(gpu({1: GIB}, xids={"13": 2}))
    # without the line, the trainer is still named: it alone held the GPU
    assert late.xid == 13 and late.caused_by == (TRAINER,) and late.affected == ()
    assert late.cause_basis == "sole_holder" and "ml/trainer/main alone held the GPU" in late.detail


def test_a_gpu_lost_reason_affects_whoever_held_it():
    node = Node({1: TRAINER})
    node.pass_(gpu({1: GIB}))
    [incident] = node.pass_(gpu({}, up=False), reasons={"GPU-2": {"gpu_lost"}})
    assert incident.kind == "gpu_lost" and incident.affected == (TRAINER,)
    assert node.pass_(gpu({}, up=False), reasons={"GPU-2": {"gpu_lost"}}) == []  # once, when it appears


def test_the_history_is_bounded():
    node = Node({1: TRAINER}, history=3)
    node.pass_(gpu({1: GIB}))
    for n in range(1, 6):
        node.pass_(gpu({1: GIB}, xids={"79": n}))
    assert [i.time for i in node.tracker.recent()] == sorted((i.time for i in node.tracker.recent()), reverse=True)
    assert len(node.tracker.recent()) == 3


def test_peaks_catch_a_spike_between_two_scrapes_and_forget_it_after_the_window():
    peaks: PeakSeries[str] = PeakSeries(30.0)
    for t, used in enumerate([10, 12, 70, 11, 10]):
        peaks.observe(float(t), [("GPU-2", used)])
    assert peaks.peaks() == {"GPU-2": 70}
    peaks.observe(33.0, [("GPU-2", 9)])
    assert peaks.peaks() == {"GPU-2": 11}  # the spike at t=2 left the window
    peaks.observe(70.0, [])
    assert peaks.peaks() == {}  # a series not fed for a window is forgotten


# ---- who held a PID when: the record's time decides ------------------------------------

def test_a_pid_reused_after_the_fault_blames_the_process_that_held_it_then():
    a, b = pod("a"), pod("b")
    node = Node({1: a, 2: NOTEBOOK})
    node.starts = {1: 900.0, 2: 800.0}
    node.pass_(gpu({1: GIB, 2: GIB}))
    faulted = node.now + 0.2
    node.pass_(gpu({2: GIB}))  # a's process exits after its Xid 31
    node.owners, node.starts = {1: b, 2: NOTEBOOK}, {1: faulted + 3.0, 2: 800.0}  # 3 s later b gets the PID
    node.pass_(gpu({2: GIB}))
    node.now = faulted + 3.5
    node.pass_(gpu({1: GIB, 2: GIB}))
    [incident] = node.pass_(gpu({1: GIB, 2: GIB}), records=(xid(31, 1, faulted),))  # read after b started
    assert incident.caused_by == (a,) and incident.cause_basis == "kernel_log"
    assert b in incident.affected and a not in incident.affected
    # a record stamped after b started is b's
    [later] = node.pass_(gpu({1: GIB, 2: GIB}), records=(xid(31, 1, node.now - 0.5),))
    assert later.caused_by == (b,)


def test_a_record_stamped_before_the_process_started_names_no_one():
    b = pod("b")
    node = Node({1: b, 2: NOTEBOOK})
    node.starts = {1: 1005.0, 2: 800.0}
    node.now = 1010.0
    node.pass_(gpu({1: GIB, 2: GIB}))
    [incident] = node.pass_(gpu({1: GIB, 2: GIB}), records=(xid(31, 1, 1003.0),))
    # the GPU was shared, so no sole holder either
    assert incident.caused_by == () and not incident.cause_known and incident.cause_basis == ""
    assert "no process with pid 1 was seen on a GPU at the record's time" in incident.detail


def test_a_record_within_the_clock_margin_of_a_pid_changing_hands_names_no_one():
    a, b = pod("a"), pod("b")
    node = Node({1: a, 2: NOTEBOOK})
    node.starts = {1: 900.0, 2: 800.0}
    node.pass_(gpu({1: GIB, 2: GIB}))
    node.owners, node.starts = {1: b, 2: NOTEBOOK}, {1: node.now + 0.5, 2: 800.0}
    node.pass_(gpu({1: GIB, 2: GIB}))
    [incident] = node.pass_(gpu({1: GIB, 2: GIB}), records=(xid(31, 1, node.starts[1] - 0.2),))
    assert incident.caused_by == () and "pid 1 changed hands near the record's time" in incident.detail


def test_without_start_times_a_record_before_the_first_pass_that_saw_the_pid_names_no_one():
    node = Node({1: TRAINER, 2: NOTEBOOK})
    node.pass_(gpu({1: GIB, 2: GIB}))
    [before] = node.pass_(gpu({1: GIB, 2: GIB}), records=(xid(31, 1, node.now - 30),))
    assert before.caused_by == ()
    [after] = node.pass_(gpu({1: GIB, 2: GIB}), records=(xid(31, 1, node.now - 0.5),))
    assert after.caused_by == (TRAINER,)


def test_a_replay_from_a_file_start_names_only_processes_known_at_each_records_time():
    a, b = pod("a"), pod("b")
    node = Node({1: a, 2: NOTEBOOK})
    node.starts = {1: 1001.5, 2: 800.0}
    for _ in range(5):
        node.pass_(gpu({1: GIB, 2: GIB}))
    node.owners, node.starts = {1: b, 2: NOTEBOOK}, {1: 1010.0, 2: 800.0}
    node.now = 1011.0
    node.pass_(gpu({1: GIB, 2: GIB}))
    # the whole file at once: one record from before a started, one of a, one of b
    out = node.pass_(gpu({1: GIB, 2: GIB}), records=(xid(31, 1, 1000.0), xid(31, 1, 1003.0), xid(31, 1, 1011.5)))
    assert [i.caused_by for i in out] == [(), (a,), (b,)]


def test_a_record_from_the_future_names_no_one():
    node = Node({1: TRAINER, 2: NOTEBOOK})
    node.pass_(gpu({1: GIB, 2: GIB}))
    [incident] = node.pass_(gpu({1: GIB, 2: GIB}), records=(xid(31, 1, node.now + 3600),))
    assert incident.caused_by == ()


# ---- the sole holder -------------------------------------------------------------------

def test_an_nvml_application_xid_on_a_gpu_one_pod_holds_names_it():
    node = Node({1: TRAINER, 7: Workload(kind="host"), 8: Workload(kind="host")})
    node.comms = {7: "nvidia-smi", 8: "python3"}
    node.tracker.config = IncidentConfig(agent_pid=8)  # the agent itself reads the GPU too
    node.pass_(gpu({1: GIB, 7: GIB // 8, 8: GIB // 8}))
    [incident] = node.pass_(gpu({1: GIB, 8: GIB // 8}, xids={"31": 1}))
    assert incident.caused_by == (TRAINER,) and incident.cause_known and incident.cause_basis == "sole_holder"
    doc = incident_json(incident)
    assert doc["cause_basis"] == "sole_holder" and doc["caused_by"][0]["pod"] == "trainer"
    [(_, reason, message)] = event_messages(incident)
    assert reason == "GPUFaultCaused"
    assert message.startswith("GPU 2 (GPU-2, node gpu-node-7) raised Xid 31 (")
    assert message.endswith(": this container alone held the GPU then, so its process raised it")


def test_an_nvml_application_xid_on_a_time_shared_gpu_names_no_one():
    node = Node({1: TRAINER, 2: NOTEBOOK})
    node.pass_(gpu({1: GIB, 2: GIB}))
    [incident] = node.pass_(gpu({1: GIB, 2: GIB}, xids={"31": 1}))
    assert incident.caused_by == () and incident.cause_basis == "" and incident_json(incident)["cause_basis"] is None
    assert "the GPU is shared and no kernel log names the process" in incident.detail


def test_a_process_of_no_workload_beside_the_pod_leaves_the_cause_unknown():
    node = Node({1: TRAINER, 9: Workload(kind="host")})
    node.comms = {9: "my-host-job"}
    node.pass_(gpu({1: GIB, 9: GIB}))
    [incident] = node.pass_(gpu({1: GIB, 9: GIB}, xids={"31": 1}))
    assert incident.caused_by == ()


def test_a_pod_that_left_just_before_the_xid_still_shares_the_blame():
    # the notebook held the GPU at the pass before: two holders around the Xid, no sole one
    node = Node({1: TRAINER, 2: NOTEBOOK})
    node.pass_(gpu({1: GIB, 2: GIB}))
    [incident] = node.pass_(gpu({1: GIB}, xids={"13": 1}))
    assert incident.caused_by == ()


def test_a_device_fault_names_no_sole_holder():
    node = Node({1: TRAINER})
    node.pass_(gpu({1: GIB}))
    [incident] = node.pass_(gpu({1: GIB}, xids={"79": 1}))
    assert incident.caused_by == () and incident.affected == (TRAINER,)


def test_a_kernel_log_line_without_a_pid_falls_back_to_the_sole_holder_at_its_time():
    node = Node({1: TRAINER})
    node.pass_(gpu({1: GIB}))
    [incident] = node.pass_(gpu({1: GIB}), records=(xid(43, None, node.now + 0.5),))
    assert incident.caused_by == (TRAINER,) and incident.cause_basis == "sole_holder"


def test_the_sole_holder_is_taken_at_the_lines_time_not_at_the_pass_that_reads_it():
    b = pod("b")
    node = Node({1: TRAINER, 2: b})
    for _ in range(5):  # the trainer alone
        node.pass_(gpu({1: GIB}))
    alone = node.now - 2.5
    for _ in range(3):  # then b shares the GPU
        node.pass_(gpu({1: GIB, 2: GIB}))
    shared = node.now - 0.5
    early, late = node.pass_(gpu({1: GIB, 2: GIB}), records=(xid(43, None, alone), xid(43, None, shared)))
    assert early.caused_by == (TRAINER,) and early.cause_basis == "sole_holder"
    assert late.caused_by == () and set(late.affected) == {TRAINER, b}


def mig(index: int, instance: str, procs: dict[int, int]) -> DeviceSample:
    return DeviceSample(index=index, uuid=f"MIG-{index}-{instance}", model="H100", pci_bus_id=BUS,
                        gpu_instance=instance, memory_total_bytes=TOTAL // 7,
                        memory_used_bytes=sum(procs.values()),
                        processes=tuple(ProcessSample(pid, mem) for pid, mem in procs.items()))


def test_on_a_mig_gpu_the_xid_of_the_gpu_names_the_one_workload_on_its_instances():
    node = Node({1: TRAINER, 2: NOTEBOOK})
    node.pass_(gpu({}), mig(2, "1", {1: GIB}), mig(2, "2", {}))
    [incident] = node.pass_(gpu({}, xids={"31": 1}), mig(2, "1", {1: GIB}), mig(2, "2", {}))
    assert incident.caused_by == (TRAINER,) and incident.cause_basis == "sole_holder"
    # two workloads on two instances of the GPU: NVML's Xid names the GPU, not the instance
    node.pass_(gpu({}, xids={"31": 1}), mig(2, "1", {1: GIB}), mig(2, "2", {2: GIB}))
    [shared] = node.pass_(gpu({}, xids={"31": 2}), mig(2, "1", {1: GIB}), mig(2, "2", {2: GIB}))
    assert shared.caused_by == () and set(shared.affected) == {TRAINER, NOTEBOOK}


@pytest.mark.parametrize("told", [True, False], ids=["told-unchanged", "not-told"])
def test_passes_that_see_the_very_processes_of_the_last_pass_keep_lives_holders_and_memory(told: bool):
    """A GPU whose processes the caller says are the last pass's (``unchanged``: the
    collector's `Snapshot.unchanged_processes`) is not gone through process by process; its
    lives still move on, its holders and memory stand, as where it is gone through."""
    node = Node({1: TRAINER, 2: NOTEBOOK})
    node.starts = {1: 900.0, 2: 950.0}
    steady = gpu({1: 40 * GIB, 2: 38 * GIB})
    assert TOTAL - steady.memory_used_bytes < 2 * GIB  # full from the first pass
    assert node.pass_(steady) == []
    first = node.tracker._gpus[steady.key].last_pass
    for _ in range(19):
        assert node.pass_(steady, unchanged=frozenset({steady.key}) if told else frozenset()) == []
    # taken on pass after pass where told, made afresh each pass where not
    assert (node.tracker._gpus[steady.key].last_pass is first) == told
    assert node.tracker._gpus[steady.key].last_pass.lives[0].last_seen == node.now  # moved on every pass
    # one run of passes with the same holders, up to this pass
    [run] = node.tracker._gpus[steady.key].passes
    assert (run.first, run.last, run.workloads, run.others) == (node.now - 19, node.now, {TRAINER, NOTEBOOK}, False)
    faulted = node.now - 0.5  # while the same tuple was seen pass after pass
    new = node.pass_(gpu({2: 38 * GIB}), records=(xid(31, 1, faulted),))  # the trainer exits
    by_kind = {incident.kind: incident for incident in new}
    assert sorted(by_kind) == ["memory_exhausted", "xid"]
    assert by_kind["xid"].caused_by == (TRAINER,) and by_kind["xid"].cause_basis == "kernel_log"
    assert by_kind["memory_exhausted"].affected == (TRAINER,)
    after = gpu({2: 38 * GIB})
    node.pass_(after)
    node.pass_(after, unchanged=frozenset({after.key}) if told else frozenset())
    runs = list(node.tracker._gpus[steady.key].passes)
    assert [(r.first, r.last, r.workloads) for r in runs] == [
        (node.now - 22, node.now - 3, {TRAINER, NOTEBOOK}), (node.now - 2, node.now, {NOTEBOOK})]


# ---- fed by the collector: its word that a GPU's processes are the last pass's ----------------


class _SameTuple(Backend):
    """GPU 2 (BUS) whose processes tuple is handed on as the very same object pass after pass,
    as NVML's backend does while the driver lists the same PIDs with the same memory."""

    name = "same-tuple"

    def __init__(self, procs: tuple[ProcessSample, ...]) -> None:
        self.procs = procs

    def sample(self, now: float) -> list[DeviceSample]:
        used = sum(p.used_memory_bytes or 0 for p in self.procs)
        return [DeviceSample(index=2, uuid="GPU-2", model="H100", pci_bus_id=BUS, memory_total_bytes=TOTAL,
                             memory_used_bytes=used, processes=self.procs)]


class _Owners(NullAttributor):
    """Each PID's owner and process start, as the test sets them."""

    def __init__(self, owners: dict[int, Workload], starts: dict[int, float]) -> None:
        self.owners, self.starts = owners, starts

    def resolve(self, pids: Iterable[int], now: float) -> Mapping[int, Workload]:
        return {pid: self.owners.get(pid, UNKNOWN) for pid in pids}

    def comm(self, pid: int) -> str:
        return "python3"

    def start_time(self, pid: int) -> float | None:
        return self.starts.get(pid)

    @property
    def generation(self) -> int:  # type: ignore[override]
        """Changes with the starts a test sets."""
        return hash(tuple(sorted(self.starts.items())))


class _KernelLog:
    """A kernel log whose next poll reads what the test wrote."""

    def __init__(self) -> None:
        self.records: list[XidRecord] = []

    def poll(self) -> list[XidRecord]:
        out, self.records = self.records, []
        return out

    def counts(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        return None


class Agent:
    """A collector whose snapshots an incident watch follows, one pass a second (times:
    seconds since boot), GPU 2 running PID 1 in a tuple that stays the same object."""

    def __init__(self, owners: dict[int, Workload], starts: dict[int, float]) -> None:
        self.now = 1000.0
        self.attributor = _Owners(owners, starts)
        names, labeller = label_schema([])
        self.log = _KernelLog()
        self.collector = Collector([_SameTuple((ProcessSample(1, 40 * GIB),))], "gpu-node-7",
                                   attributor=self.attributor, labeller=labeller, clock=lambda: self.now,
                                   wall=lambda: 1.7e9 + self.now)
        self.watch = IncidentWatch("gpu-node-7", labeller, names, tracker=IncidentTracker("gpu-node-7"),
                                   kernel_log=self.log, clock=lambda: self.now)

    def pass_(self, *records: XidRecord, followed: bool = True) -> Snapshot:
        self.now += 1.0
        self.log.records = list(records)
        snap = self.collector.collect_once()
        if followed:
            self.watch.observe(snap)
        return snap

    def caused(self) -> list[tuple[Workload, ...]]:
        return [incident.caused_by for incident in reversed(self.watch.tracker.recent())]


def test_a_pid_another_containers_process_took_in_the_same_processes_tuple_is_the_new_ones():
    """The driver lists the same PID with the same memory (the same tuple), but the process
    under it is another container's: the pass is not one of the same processes, and the
    kernel log's Xid after the change names the new container, the one before the old."""
    agent = Agent({1: TRAINER}, {1: 900.0})
    assert agent.pass_().unchanged_processes == frozenset()
    assert agent.pass_().unchanged_processes == {"GPU-2"}  # 1002
    agent.attributor.owners[1], agent.attributor.starts[1] = NOTEBOOK, 1002.2
    assert agent.pass_().unchanged_processes == frozenset()  # 1003
    assert agent.pass_().unchanged_processes == {"GPU-2"}  # 1004
    agent.pass_(xid(31, 1, 1001.5), xid(31, 1, 1003.5))
    assert agent.caused() == [(TRAINER,), (NOTEBOOK,)]


def test_an_owner_told_later_for_the_same_process_is_its_workload_from_then_on():
    """Attribution learns the pod of a process it first could not place (the same tuple, the
    same start): the pass after is not one of unchanged processes, and the trainer is named."""
    agent = Agent({}, {1: 900.0})
    agent.pass_()
    agent.pass_()
    agent.attributor.owners[1] = TRAINER
    assert agent.pass_().unchanged_processes == frozenset()
    agent.pass_(xid(31, 1, agent.now))
    assert agent.caused() == [(TRAINER,)]
    assert agent.watch.tracker._gpus["GPU-2"].holders == (TRAINER,)


def test_a_snapshot_the_watch_missed_voids_the_next_ones_word_that_the_processes_are_unchanged():
    """The collector's mark compares with the snapshot before; where the watch did not take
    that one in, the tracker's last pass is an older one and must go through the processes."""
    agent = Agent({1: TRAINER}, {1: 900.0})
    agent.pass_()
    agent.pass_()
    agent.attributor.owners[1], agent.attributor.starts[1] = NOTEBOOK, 1002.2
    agent.pass_(followed=False)  # 1003: not followed
    assert agent.pass_().unchanged_processes == {"GPU-2"}  # 1004: as 1003, which the tracker did not see
    agent.pass_(xid(31, 1, 1003.5))
    assert agent.caused() == [(NOTEBOOK,)]
