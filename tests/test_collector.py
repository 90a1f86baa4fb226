"""The collector (`exporter.collect.collector.Collector`): one pass, one published snapshot.

Each pass reads every backend through the bulkhead, attributes the processes, derives the
counters and publishes a new immutable `Snapshot` that scrapes read; a part that fails
(a backend, attribution, the pass itself) degrades only its own part and says so in
``l9gpu_collector_success``, and what was last published stays served. The backends here
are small in-process ones with fixed devices; the collector runs its own thread where the
test is about the thread, as in the agent. Tests of a behaviour that takes several modules
(a hung GPU, an outage of a pod source, per-process shares) have files of their own.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Iterable, Mapping, Sequence

import pytest
from agent import parse_metrics, pick
from prometheus_client import CollectorRegistry, generate_latest
from waiting import FakeClock, wait_until, within

from exporter.attribution import NullAttributor
from exporter.collect.collector import Collector
from exporter.core.bulkhead import Read
from exporter.core.model import UNKNOWN, AllocationRow, CollectorStatus, DeviceSample, ProcessSample, Workload
from exporter.core.shares import READ_ALL, PassPlan, passes_between_reads
from exporter.devices.base import Backend
from exporter.devices.capabilities import ProcessShareReads
from exporter.output.render import SnapshotCollector

GIB = 2**30
TRAINER = Workload(kind="kubernetes", namespace="ml", pod="trainer-0", container="main")


class StaticBackend(Backend):
    """Fixed devices; the whole read can be made to fail, its error counts set, and each
    pass's plan is recorded."""

    name = "static"

    def __init__(self, devices: list[DeviceSample]):
        self.devices = devices
        self.fail = False
        self.problems: dict[str, int] = {}
        self.plans: list[PassPlan] = []

    def reads(self, now: float, plan: PassPlan = READ_ALL) -> list[Read]:
        self.plans.append(plan)
        return super().reads(now, plan)

    def sample(self, now: float) -> list[DeviceSample]:
        if self.fail:
            raise RuntimeError("driver went away")
        return list(self.devices)

    def errors(self) -> Mapping[str, int]:
        return dict(self.problems)


class Deferring(StaticBackend, ProcessShareReads):
    """A backend that leaves per-process samples until the owners are known (as NVML's)."""

    def process_share_reads(self, devices: Sequence[DeviceSample]) -> list[Read]:
        return [Read(("shares", d.index), f"GPU {d.index}'s shares", functools.partial(lambda d: d, d))
                for d in devices]


class Owners(NullAttributor):
    """Owners by PID; any of its answers can be made to fail."""

    def __init__(self, owners: Mapping[int, Workload] | None = None, sources: Mapping[str, bool] | None = None):
        self.owners = dict(owners or {})
        self.sources = dict(sources or {})
        self.fail_resolve = False
        self.fail_allocations = False

    def resolve(self, pids: Iterable[int], now: float) -> Mapping[int, Workload]:
        if self.fail_resolve:
            raise OSError("the pod index is unreadable")
        return {pid: self.owners.get(pid, UNKNOWN) for pid in pids}

    def comm(self, pid: int) -> str:
        return "python3"

    def allocations(self, devices: Sequence[DeviceSample]) -> tuple[AllocationRow, ...] | None:
        if self.fail_allocations:
            raise RuntimeError("the kubelet's answer is malformed")
        return ()

    def statuses(self) -> Mapping[str, bool]:
        return dict(self.sources)


def render(collector: Collector) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, None, ()))
    return parse_metrics(generate_latest(registry).decode())


def statuses(collector: Collector) -> dict[str, bool]:
    assert collector.snapshot is not None
    return {s.name: s.success for s in collector.snapshot.collectors}


# ---- one pass, one snapshot ------------------------------------------------------------------


def test_nothing_is_published_before_the_first_pass_and_each_pass_publishes_a_new_snapshot() -> None:
    clock = FakeClock(0.0)
    c = Collector([StaticBackend([DeviceSample(index=0, uuid="GPU-a")])], "node-1", clock=clock,
                  wall=lambda: 1_700_000_000.0 + clock.now)
    assert c.snapshot is None
    first = c.collect_once()
    assert c.snapshot is first
    assert (first.seq, first.node, first.timestamp) == (1, "node-1", 1_700_000_000.0)
    assert [d.uuid for d in first.devices] == ["GPU-a"]
    clock.now = 1.0
    second = c.collect_once()
    assert c.snapshot is second and second is not first
    assert (second.seq, second.timestamp) == (2, 1_700_000_001.0)
    assert first.seq == 1  # what a scrape already holds does not change under it


def test_on_snapshot_sees_every_published_snapshot_and_a_failing_hook_stops_nothing(caplog) -> None:
    seen: list[Any] = []
    c = Collector([StaticBackend([])], "n", clock=FakeClock(), on_snapshot=seen.append)
    published = [c.collect_once(), c.collect_once()]
    assert seen == published

    def broken(snapshot: Any) -> None:
        raise ValueError("the page could not be rendered")

    c.on_snapshot = broken
    with caplog.at_level(logging.ERROR, logger="exporter.collect.collector"):
        third = c.collect_once()
    assert c.snapshot is third and third.seq == 3
    assert "snapshot hook failed" in caplog.text


def test_the_thread_runs_the_first_pass_at_once_and_stops_when_asked() -> None:
    c = Collector([StaticBackend([DeviceSample(index=0, uuid="GPU-a")])], "n", interval=3600.0)
    assert c.liveness() == (False, "collector thread is not running")
    c.start()
    try:
        # the first pass at once: an hour's interval is not waited first
        wait_until(lambda: c.snapshot is not None, within(0.0), "the first pass")
        assert c.alive() and c.liveness() == (True, "")
    finally:
        c.stop()
    assert not c.alive()


# ---- what fails degrades only itself ---------------------------------------------------------


def test_backend_failure_marks_known_gpus_down_and_the_collector_failed():
    backend = StaticBackend([DeviceSample(index=0, uuid="GPU-a", model="H100", power_watts=300.0)])
    c = Collector([backend], "n", clock=FakeClock())
    c.collect_once()
    backend.fail = True
    c.collect_once()
    m = render(c)
    assert pick(m, "gpu_up", uuid="GPU-a") == [0.0]
    assert pick(m, "l9gpu_collector_success", collector="static") == [0.0]
    assert pick(m, "l9gpu_collector_success", collector="attribution") == [1.0]
    assert pick(m, "l9gpu_collector_success", collector="kubernetes") == []  # NullAttributor has none


def test_a_failed_read_keeps_the_last_good_devices_down_with_the_reason_until_the_backend_answers(caplog) -> None:
    gpus = [DeviceSample(index=i, uuid=f"GPU-{i}", model="H100", pci_bus_id=f"00000000:1{i}:00.0",
                         utilization=0.5) for i in range(2)]
    backend = StaticBackend(gpus)
    c = Collector([backend], "n", clock=FakeClock())
    c.collect_once()
    backend.fail = True
    with caplog.at_level(logging.WARNING, logger="exporter.collect.collector"):
        failed = c.collect_once()
    # the devices of the last good pass, with their identity, down, with what went wrong
    assert [(d.uuid, d.model, d.pci_bus_id, d.up, d.error) for d in failed.devices] == [
        ("GPU-0", "H100", "00000000:10:00.0", False, "driver went away"),
        ("GPU-1", "H100", "00000000:11:00.0", False, "driver went away")]
    assert all(d.utilization is None for d in failed.devices)
    assert statuses(c)["static"] is False and "driver went away" in caplog.text
    backend.fail = False
    again = c.collect_once()
    assert [(d.up, d.utilization) for d in again.devices] == [(True, 0.5), (True, 0.5)]
    assert statuses(c)["static"] is True


def test_a_pass_that_fails_keeps_the_last_good_snapshot_published_and_the_thread_goes_on(caplog) -> None:
    class Flaky(StaticBackend):
        """Its error counts cannot be read while ``broken`` (the pass cannot finish)."""

        def __init__(self, devices: list[DeviceSample]):
            super().__init__(devices)
            self.broken = False
            self.asked = 0

        def errors(self) -> Mapping[str, int]:
            self.asked += 1
            if self.broken:
                raise RuntimeError("the error counters are unreadable")
            return {}

    backend = Flaky([DeviceSample(index=0, uuid="GPU-a")])
    c = Collector([backend], "n", interval=0.05)
    with caplog.at_level(logging.ERROR, logger="exporter.collect.collector"):
        c.start()
        try:
            good = wait_until(lambda: c.snapshot, within(0.05), "the first pass")
            backend.broken = True
            asked = backend.asked
            wait_until(lambda: backend.asked >= asked + 3, within(3 * 0.05), "three more passes")
            # the passes that failed published nothing: scrapes serve the last good snapshot
            last_good = c.snapshot
            assert last_good is not None and last_good.seq >= good.seq and c.alive()
            asked = backend.asked
            wait_until(lambda: backend.asked >= asked + 2, within(2 * 0.05), "two more failed passes")
            assert c.snapshot is last_good
            backend.broken = False
            wait_until(lambda: c.snapshot is not None and c.snapshot.seq > last_good.seq, within(0.05),
                       "a new snapshot once passes finish again")
        finally:
            c.stop()
    assert "collection pass failed" in caplog.text


def test_attribution_that_fails_degrades_only_the_labels(caplog) -> None:
    device = DeviceSample(index=0, uuid="GPU-a", utilization=0.9, processes=(ProcessSample(10, GIB, 0.9),))
    owners = Owners({10: TRAINER})
    c = Collector([StaticBackend([device])], "n", attributor=owners, clock=FakeClock())
    assert c.collect_once().processes[0].workload == TRAINER
    owners.fail_resolve = True
    with caplog.at_level(logging.WARNING, logger="exporter.collect.collector"):
        snap = c.collect_once()
    assert statuses(c) == {"static": True, "attribution": False}
    assert [d.up for d in snap.devices] == [True] and snap.devices[0].utilization == 0.9
    assert [(row.pid, row.workload) for row in snap.processes] == [(10, UNKNOWN)]
    assert snap.info["unattributed_processes"] == 1.0
    assert "attributing GPU processes failed" in caplog.text


def test_allocations_that_fail_leave_only_the_allocations_out(caplog) -> None:
    owners = Owners()
    owners.fail_allocations = True
    c = Collector([StaticBackend([DeviceSample(index=0, uuid="GPU-a")])], "n", attributor=owners, clock=FakeClock())
    with caplog.at_level(logging.WARNING, logger="exporter.collect.collector"):
        snap = c.collect_once()
    assert snap.allocations == () and [d.up for d in snap.devices] == [True]
    assert statuses(c) == {"static": True, "attribution": True}
    assert "joining GPU allocations failed" in caplog.text


def test_the_attributors_sources_and_the_backends_error_counts_are_published() -> None:
    backend = StaticBackend([DeviceSample(index=0, uuid="GPU-a")])
    backend.problems = {"timeout": 3, "malformed_line": 1}
    c = Collector([backend], "n", attributor=Owners(sources={"kubernetes": False, "cri": True}), clock=FakeClock())
    snap = c.collect_once()
    assert CollectorStatus("kubernetes", False, 0.0) in snap.collectors
    assert CollectorStatus("cri", True, 0.0) in snap.collectors
    assert dict(snap.backend_errors) == {("static", "timeout"): 3, ("static", "malformed_line"): 1}


def test_a_backend_that_cannot_even_say_its_reads_fails_alone() -> None:
    class Broken(StaticBackend):
        name = "broken"

        def reads(self, now: float, plan: PassPlan = READ_ALL) -> list[Read]:
            raise RuntimeError("no handle")

    c = Collector([Broken([]), StaticBackend([DeviceSample(index=0, uuid="GPU-a")])], "n", clock=FakeClock())
    snap = c.collect_once()
    assert c.name == "broken,static"
    assert [(d.uuid, d.up) for d in snap.devices] == [("GPU-a", True)]
    assert statuses(c)["broken,static"] is False


# ---- several backends, and the deadline of each read -----------------------------------------


class PerGpu(Backend):
    """One read per GPU, keyed by its index (as NVML's and amdsmi's), GPU 0's able to hang."""

    name = "left"
    call_prefixes = ("hang_",)

    def __init__(self, devices: list[DeviceSample]):
        self.devices = devices
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def hang_in_the_library(self) -> None:
        self.entered.set()
        assert self.gate is not None
        self.gate.wait()

    def _read(self, device: DeviceSample) -> list[DeviceSample]:
        if device.index == 0 and self.gate is not None and not self.gate.is_set():
            self.hang_in_the_library()
        return [device]

    def reads(self, now: float, plan: PassPlan = READ_ALL) -> list[Read]:
        return [Read(d.index, f"GPU {d.index}", functools.partial(self._read, d), calls=self.call_prefixes,
                     down=lambda reason, d=d: [d.down(reason)]) for d in self.devices]

    def sample(self, now: float) -> list[DeviceSample]:
        return list(self.devices)


class OtherPerGpu(PerGpu):
    name = "right"


def test_two_backends_gpu_0_are_told_apart_when_one_is_stuck() -> None:
    left = PerGpu([DeviceSample(index=i, uuid=f"GPU-left-{i}") for i in range(2)])
    right = OtherPerGpu([DeviceSample(index=0, uuid="GPU-right-0", vendor="amd")])
    c = Collector([left, right], "mixed", clock=FakeClock(), read_timeout=0.2)
    assert c.name == "left,right"
    left.gate = threading.Event()
    try:
        snap = c.collect_once()
        assert left.entered.is_set()
        assert [(d.uuid, d.up) for d in snap.devices] == [("GPU-left-0", False), ("GPU-left-1", True),
                                                           ("GPU-right-0", True)]
        (stuck,) = snap.stuck
        assert (stuck.backend, stuck.what, stuck.call, stuck.devices) == ("left", "GPU 0", "hang_in_the_library",
                                                                          ("GPU-left-0",))
        assert c.degraded().startswith("stuck in driver calls: GPU 0: hang_in_the_library for ")
        # the next pass asks nothing of the stuck GPU, and still reads the other backend's GPU 0
        snap = c.collect_once()
        assert [(d.uuid, d.up) for d in snap.devices] == [("GPU-left-0", False), ("GPU-left-1", True),
                                                           ("GPU-right-0", True)]
    finally:
        left.gate.set()
        c.stop()


def test_the_collector_counts_as_stuck_itself_only_past_a_minute_or_three_intervals() -> None:
    assert Collector([StaticBackend([])], "n", interval=1.0).stall_limit == 60.0
    assert Collector([StaticBackend([])], "n", interval=30.0, read_timeout=1.0).stall_limit == 3 * 30 + 2 * 1.0
    slow = StaticBackend([])
    slow.read_timeout = 10.0  # a backend with a deadline of its own (Gaudi's hl-smi)
    assert Collector([slow], "n", interval=30.0).stall_limit == 3 * 30 + 2 * 10.0


# ---- what each pass reads of the per-process samples ----------------------------------------


def test_a_backend_that_defers_process_shares_gets_each_passs_plan() -> None:
    deferring = Deferring([DeviceSample(index=0, uuid="GPU-a")])
    plain = StaticBackend([DeviceSample(index=0, uuid="GPU-b")])
    c = Collector([deferring, plain], "n", interval=1.0, clock=FakeClock())
    for _ in range(3):
        c.collect_once()
    # without per-process series: read what the plan names, a shared GPU every few passes
    assert [(p.process_metrics, p.every, p.seq) for p in deferring.plans] == [
        (False, passes_between_reads(1.0), 0), (False, passes_between_reads(1.0), 1),
        (False, passes_between_reads(1.0), 2)]
    assert passes_between_reads(1.0) > 1
    # a backend that reads every sample anyway is told to read everything
    assert all(p.process_metrics for p in plain.plans)


def test_with_per_process_series_every_pass_reads_every_sample() -> None:
    deferring = Deferring([DeviceSample(index=0, uuid="GPU-a")])
    c = Collector([deferring], "n", clock=FakeClock(), process_metrics=True)
    for _ in range(3):
        c.collect_once()
    assert [p.process_metrics for p in deferring.plans] == [True, True, True]


# ---- process rows -----------------------------------------------------------------------------


def test_a_process_row_that_did_not_change_is_the_same_row_next_pass() -> None:
    device = DeviceSample(index=0, uuid="GPU-a", processes=(ProcessSample(10, GIB, 0.5), ProcessSample(11, GIB, 0.1)))
    backend = StaticBackend([device])
    c = Collector([backend], "n", attributor=Owners({10: TRAINER}), clock=FakeClock())
    first = c.collect_once().processes
    assert [(r.device_key, r.pid, r.comm, r.workload, r.used_memory_bytes, r.sm_utilization) for r in first] == [
        ("GPU-a", 10, "python3", TRAINER, GIB, 0.5), ("GPU-a", 11, "python3", UNKNOWN, GIB, 0.1)]
    backend.devices = [DeviceSample(index=0, uuid="GPU-a",
                                    processes=(ProcessSample(10, GIB, 0.5), ProcessSample(11, 2 * GIB, 0.1)))]
    second = c.collect_once().processes
    assert second[0] is first[0]  # unchanged: the same row
    assert second[1] is not first[1] and second[1].used_memory_bytes == 2 * GIB


def test_a_down_gpu_has_no_process_rows() -> None:
    device = DeviceSample(index=0, uuid="GPU-a", up=False, error="GPU is lost", processes=(ProcessSample(10, GIB),))
    c = Collector([StaticBackend([device])], "n", attributor=Owners({10: TRAINER}), clock=FakeClock())
    assert c.collect_once().processes == ()


class Lives(Owners):
    """Owners, with process names and starts that a test can change (a PID another process
    took over, a process that renamed itself)."""

    def __init__(self, owners: Mapping[int, Workload]):
        super().__init__(owners)
        self.names: dict[int, str] = {}
        self.starts: dict[int, float] = {}

    def comm(self, pid: int) -> str:
        return self.names.get(pid, "python3")

    def start_time(self, pid: int) -> float | None:
        return self.starts.get(pid)

    @property
    def generation(self) -> int:  # type: ignore[override]
        """Changes with the names and starts a test sets."""
        return hash((tuple(sorted(self.names.items())), tuple(sorted(self.starts.items()))))


def test_a_gpu_is_marked_unchanged_only_while_its_processes_tuple_owners_names_and_starts_are_the_last_passs():
    """`Snapshot.unchanged_processes` is what the incident tracker trusts instead of looking
    at each process: the processes tuple the very same object is not enough."""
    procs = (ProcessSample(10, GIB, 0.5), ProcessSample(11, GIB, 0.1))
    other = (ProcessSample(12, GIB),)
    backend = StaticBackend([DeviceSample(index=0, uuid="GPU-a", processes=procs),
                             DeviceSample(index=1, uuid="GPU-b", processes=other)])
    attributor = Lives({10: TRAINER, 12: TRAINER})
    attributor.starts = {10: 900.0, 11: 901.0, 12: 902.0}
    c = Collector([backend], "n", attributor=attributor, clock=FakeClock())

    def marked() -> frozenset[str]:
        return c.collect_once().unchanged_processes

    def owner_of(pid: int) -> Workload:
        assert c.snapshot is not None
        [row] = [row for row in c.snapshot.processes if row.pid == pid]
        return row.workload

    assert marked() == frozenset()  # no pass before
    assert marked() == {"GPU-a", "GPU-b"}
    # PID 11 is another container's now (the driver lists the same PID and memory: the same tuple)
    notebook = Workload(kind="kubernetes", namespace="ml", pod="notebook", container="main")
    attributor.owners[11] = notebook
    attributor.starts[11] = 950.0
    assert marked() == {"GPU-b"} and owner_of(11) is notebook
    assert marked() == {"GPU-a", "GPU-b"}
    attributor.owners[11] = Workload(kind="kubernetes", namespace="ml", pod="notebook", container="main")
    assert marked() == {"GPU-b"}  # an equal owner that is another object: the owner is not taken for the same
    attributor.starts[10] = 960.0  # the same owner, a new process under the PID
    assert marked() == {"GPU-b"}
    attributor.names[12] = "vllm"
    assert marked() == {"GPU-a"}
    backend.devices = [DeviceSample(index=0, uuid="GPU-a", processes=tuple(list(procs))),
                       DeviceSample(index=1, uuid="GPU-b", processes=other)]
    assert marked() == {"GPU-b"}  # equal processes in another tuple are not told to be the same ones
    backend.devices[1] = DeviceSample(index=1, uuid="GPU-b", up=False, error="GPU is lost", processes=other)
    assert marked() == {"GPU-a"}
    backend.devices[1] = DeviceSample(index=1, uuid="GPU-b", processes=other)
    assert marked() == {"GPU-a"}  # back up: not seen in the pass before
    assert marked() == {"GPU-a", "GPU-b"}


def test_after_a_pass_that_published_nothing_no_gpu_is_marked_unchanged() -> None:
    """The mark says "as in the snapshot before": a pass that made its rows and then failed
    published no snapshot, so the next one compares with a pass no one saw."""
    class Flaky(StaticBackend):
        fail_errors = False

        def errors(self) -> Mapping[str, int]:
            if self.fail_errors:
                raise RuntimeError("the error counters are unreadable")
            return {}

    procs = (ProcessSample(10, GIB, 0.5),)
    backend = Flaky([DeviceSample(index=0, uuid="GPU-a", processes=procs)])
    c = Collector([backend], "n", attributor=Owners({10: TRAINER}), clock=FakeClock())
    c.collect_once()
    assert c.collect_once().unchanged_processes == {"GPU-a"}
    backend.fail_errors = True
    with pytest.raises(RuntimeError):
        c.collect_once()
    backend.fail_errors = False
    snap = c.collect_once()
    assert snap.unchanged_processes == frozenset() and snap.processes[0].workload is TRAINER
    assert c.collect_once().unchanged_processes == {"GPU-a"}
