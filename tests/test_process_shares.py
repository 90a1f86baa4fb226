"""A GPU held by one owner is not asked for its per-process samples.

The per-process utilisation read (``nvmlDeviceGetProcessesUtilizationInfo``, 1.5 ms per
GPU on an H200) only splits a GPU's SM time between owners. Where every process on a GPU
belongs to one workload (or none is attributed) and per-process series are off, the
owner's SM share is the GPU's utilisation; the read comes back in the very pass a second
owner appears. Owners come from the real attribution code (a fixture /proc tree in real
cgroup layouts, pods in the index), GPUs from the tests' NVML fake, /metrics from the
agent's HTTP app. The rules alone, pass by pass, are in tests/test_shares.py.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from agent import parse_metrics, pick
from aiohttp.test_utils import TestClient, TestServer
from fakes.pynvml_fake import FakeGpu, FakeNvml, FakeProcess, FakeUtilSample

from exporter.app.cli import build_parser
from exporter.app.wiring import build_registry
from exporter.attribution.kubernetes import PodIndex, pod_meta
from exporter.attribution.resolver import ProcAttributor
from exporter.attribution.simulated import scenario_pods, write_proc_tree
from exporter.collect.collector import Collector
from exporter.core.labels import label_schema
from exporter.core.model import UNKNOWN, Workload
from exporter.core.shares import READ_ALL, SHARED_READ_PERIOD, passes_between_reads
from exporter.devices.nvml import NvmlBackend
from exporter.output import catalogue as cat
from exporter.web.app import make_app
from exporter.web.exposition import Exposition

GiB = 2**30
UTIL_CALL = "nvmlDeviceGetProcessesUtilizationInfo"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Node:
    """A fixture /proc tree and pod index for GPU processes, and the NVML fake they run on."""

    def __init__(self, root: str, gpus: int = 1):
        self.root = root
        self.index = PodIndex()
        self.fake = FakeNvml([FakeGpu(utilization_gpu=0) for _ in range(gpus)])

    def start(self, pid: int, pod: str | None, gpu: int = 0, memory: int = GiB, sm: int = 0) -> None:
        """A process of ``pod`` (None: a login session's, unattributed) on ``gpu``."""
        workload = {"namespace": "ml", "pod": pod, "container": "main",
                    "owner": {"kind": "Job", "name": pod}} if pod else {}
        proc = SimpleNamespace(pid=pid, name="python3", gpu=gpu, workload=workload)
        write_proc_tree(self.root, [proc])
        for spec in scenario_pods([proc]):
            meta = pod_meta(spec)
            assert meta is not None
            self.index.upsert(meta)
        self.fake.gpus[gpu].processes.append(FakeProcess(pid=pid, used_memory=memory))
        self.sm(pid, gpu, sm)

    def sm(self, pid: int, gpu: int, percent: int) -> None:
        """The process's SM share as the driver's per-process samples give it."""
        live = self.fake.gpus[gpu].live_sm or {}
        live[pid] = percent
        self.fake.gpus[gpu].live_sm = live

    def collector(self, process_metrics: bool = False, clock: Clock | None = None) -> Collector:
        backend = NvmlBackend(nvml=self.fake, gpm=False)
        backend.open()
        _, labeller = label_schema([])
        return Collector([backend], "n", attributor=ProcAttributor(self.root, self.index), labeller=labeller,
                         clock=clock or Clock(), process_metrics=process_metrics)

    def util_reads(self) -> int:
        return len(self.fake.called(UTIL_CALL))


def metrics(collector: Collector) -> dict:
    """/metrics of the agent's HTTP app serving the collector's snapshot."""
    registry = build_registry(lambda: collector.snapshot, cat.enabled_names(detail=True), label_schema([])[0])
    exposition = Exposition(registry, lambda: collector.snapshot, max_age=1e9)
    app = make_app(exposition, lambda: collector.snapshot, lambda: True, "n")

    async def get() -> str:
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/metrics")
            assert resp.status == 200
            return await resp.text()

    return parse_metrics(asyncio.run(get()))


def test_one_pod_on_a_gpu_gets_the_gpus_utilisation_without_the_per_process_read(tmp_path):
    node = Node(str(tmp_path))
    node.start(101, "train-a", sm=10)
    node.start(102, "train-a", sm=15)  # a second process of the same container
    node.fake.gpus[0].utilization_gpu = 73
    clock = Clock()
    collector = node.collector(clock=clock)
    collector.collect_once()
    first = metrics(collector)
    for t in range(1, 5):
        clock.t = float(t)
        collector.collect_once()
    assert node.util_reads() == 0
    m = metrics(collector)
    assert pick(m, "gpu_utilization_ratio", gpu="0") == [pytest.approx(0.73)]
    assert pick(m, "container_gpu_utilization_ratio", pod="train-a") == [pytest.approx(0.73)]
    assert pick(m, "container_gpu_processes", pod="train-a") == [2.0]
    # GPU-seconds of SM time: the device's utilisation over the 4 s since the first pass.
    assert pick(m, "container_gpu_usage_seconds_total", pod="train-a") == [pytest.approx(0.73 * 4)]
    # Holding memory and computing: not idle. The whole GPU's energy is the pod's.
    assert pick(m, "container_gpu_idle_seconds", pod="train-a") == [0.0]
    used = pick(m, "gpu_energy_joules_total", gpu="0")[0] - pick(first, "gpu_energy_joules_total", gpu="0")[0]
    assert used == pytest.approx(4 * 250.0)  # the fake GPU draws 250 W
    assert pick(m, "container_gpu_energy_joules_total", pod="train-a") == [pytest.approx(used)]


def test_energy_and_time_of_a_single_owner_gpu_go_to_it_whole(tmp_path):
    """With one owner all of ΔE goes to it whatever the split, and all the GPU's time."""
    node = Node(str(tmp_path))
    node.start(201, "infer-b", memory=40 * GiB)
    node.fake.gpus[0].utilization_gpu = 30
    clock = Clock()
    collector = node.collector(clock=clock)
    first = collector.collect_once().device_energy_joules
    for t in range(1, 11):
        clock.t = float(t)
        node.fake.gpus[0].energy_mj += 400_000  # 400 J a second
        snap = collector.collect_once()
    assert node.util_reads() == 0
    device_delta = snap.device_energy_joules[snap.devices[0].key] - first[snap.devices[0].key]
    (usage,) = [w for w in snap.workloads if w.present]
    assert usage.energy_joules_total == pytest.approx(device_delta)
    assert usage.allocation_seconds_total == pytest.approx(10.0)
    assert usage.usage_seconds_total == pytest.approx(3.0)
    (rest,) = snap.unattributed
    assert rest.energy_joules_total == pytest.approx(0.0)


def test_an_idle_single_owner_counts_idle_seconds_from_the_devices_utilisation(tmp_path):
    node = Node(str(tmp_path))
    node.start(301, "notebook", memory=70 * GiB)
    node.fake.gpus[0].utilization_gpu = 0
    clock = Clock()
    collector = node.collector(clock=clock)
    for t in range(0, 31, 5):
        clock.t = float(t)
        snap = collector.collect_once()
    (usage,) = snap.workloads
    assert usage.utilization == 0.0 and usage.idle_seconds == pytest.approx(30.0)
    # It computes again: idle time ends in that pass.
    node.fake.gpus[0].utilization_gpu = 40
    clock.t = 31.0
    (usage,) = collector.collect_once().workloads
    assert usage.utilization == pytest.approx(0.4) and usage.idle_seconds == 0.0
    assert node.util_reads() == 0


def test_the_read_comes_back_in_the_pass_a_second_owner_appears_and_goes_when_it_leaves(tmp_path):
    node = Node(str(tmp_path), gpus=2)
    node.start(401, "train-a", gpu=0, sm=60)
    node.start(501, "train-z", gpu=1, sm=20)
    node.fake.gpus[0].utilization_gpu = 60
    clock = Clock()
    collector = node.collector(clock=clock)
    for t in range(3):
        clock.t = float(t)
        collector.collect_once()
    assert node.util_reads() == 0
    # A second pod starts on GPU 0: the same pass reads GPU 0's per-process samples (only
    # GPU 0's) and splits its SM time between the two.
    node.start(402, "eval-b", gpu=0, sm=25)
    node.fake.gpus[0].utilization_gpu = 85
    clock.t = 3.0
    snap = collector.collect_once()
    reads = node.fake.called(UTIL_CALL)
    assert len(reads) == 1
    shares = {w.workload.pod: w.utilization for w in snap.workloads if w.device_key == snap.devices[0].key}
    assert shares == {"train-a": pytest.approx(0.60), "eval-b": pytest.approx(0.25)}
    assert not snap.devices[0].sm_share_from_device and snap.devices[1].sm_share_from_device
    # While both are there, read every SHARED_READ_PERIOD seconds (one read a pass at most,
    # in GPU 0's part of the pass), the shares carried in between: each process's share of
    # the last read, scaled by the GPU's utilisation since.
    every = passes_between_reads(1.0)
    assert every == int(SHARED_READ_PERIOD) > 1
    node.fake.gpus[0].utilization_gpu = 17  # a fifth of 85: carried shares are a fifth
    carried = []
    for t in range(4, 4 + 2 * every):
        clock.t = float(t)
        before = node.util_reads()
        snap = collector.collect_once()
        assert node.util_reads() - before <= 1
        assert not snap.devices[0].sm_share_from_device and snap.devices[1].sm_share_from_device
        if node.util_reads() == before:
            carried.append({w.workload.pod: w.utilization for w in snap.workloads
                            if w.device_key == snap.devices[0].key})
    # the pass after the one that found the second owner reads too (the schedule starts)
    assert node.util_reads() - 1 == 1 + 2 and len(carried) == 2 * every - 3
    assert carried[-1] == {"train-a": pytest.approx(0.60), "eval-b": pytest.approx(0.25)}  # read at 17 %
    # ... and no longer once the second has gone: one owner again, the GPU's utilisation.
    reads = node.util_reads()
    node.fake.gpus[0].processes = [p for p in node.fake.gpus[0].processes if p.pid != 402]
    for t in range(4 + 2 * every, 7 + 2 * every):
        clock.t = float(t)
        snap = collector.collect_once()
    assert node.util_reads() <= reads + 1
    assert snap.devices[0].sm_share_from_device
    assert [w.utilization for w in snap.workloads if w.present and w.device_key == snap.devices[0].key] == [
        pytest.approx(0.17)]


def test_a_pod_beside_an_unattributed_process_is_shared_and_unattributed_processes_alone_are_one_owner(tmp_path):
    node = Node(str(tmp_path), gpus=2)
    node.start(601, None, gpu=0, sm=5)  # a login session's process
    node.start(602, None, gpu=0, sm=7)
    node.start(701, None, gpu=1, sm=5)
    node.start(702, "train-c", gpu=1, sm=50)
    collector = node.collector()
    snap = collector.collect_once()
    assert [d.sm_share_from_device for d in snap.devices] == [True, False]
    assert [args[0].index for args in node.fake.called(UTIL_CALL)] == [1]


def test_process_metrics_on_keeps_reading_per_process_samples(tmp_path):
    node = Node(str(tmp_path))
    node.start(801, "train-a", sm=42)
    clock = Clock()
    collector = node.collector(process_metrics=True, clock=clock)
    for t in range(3):
        clock.t = float(t)
        snap = collector.collect_once()
    assert node.util_reads() == 3
    assert [row.sm_utilization for row in snap.processes] == [pytest.approx(0.42)]
    assert not snap.devices[0].sm_share_from_device


def test_a_per_process_read_stuck_in_the_driver_degrades_only_its_gpu(tmp_path):
    """The second read of a pass has a deadline like the first: a GPU stuck in it is
    published down, with the call, and the other GPUs as read."""
    node = Node(str(tmp_path), gpus=2)
    node.start(901, "a", gpu=0)
    node.start(902, "b", gpu=0)
    node.start(903, "c", gpu=1)
    node.fake.add_util_samples(0, [FakeUtilSample(pid=901, timestamp=5, sm=10)])
    backend = NvmlBackend(nvml=node.fake, gpm=False)
    backend.open()
    _, labeller = label_schema([])
    block = node.fake.block(UTIL_CALL, gpu=0)
    collector = Collector([backend], "n", attributor=ProcAttributor(node.root, node.index), labeller=labeller,
                          read_timeout=0.2)
    try:
        snap = collector.collect_once()
        assert [d.up for d in snap.devices] == [False, True]
        assert UTIL_CALL in snap.devices[0].error
        assert [(s.what, s.call) for s in snap.stuck] == [("GPU 0", UTIL_CALL)]
        assert snap.devices[1].sm_share_from_device
    finally:
        block.release()
        collector.stop()


def test_over_a_minute_of_the_simulated_node_carried_shares_stay_within_a_point_of_reading_every_pass():
    """The demo node's GPU 6 is shared by five pods (steady shares, a wave, an idle
    notebook) and GPUs 0-1 by two processes of one pod beside nothing else: over a minute,
    each workload's SM share (usage seconds per second) with reads every
    `SHARED_READ_PERIOD` and the shares carried in between is within one point of the
    pass-by-pass read."""
    from dataclasses import replace as dc_replace

    from exporter.attribution import build_attributor
    from exporter.core.bulkhead import Read
    from exporter.core.model import updated
    from exporter.devices.capabilities import ProcessShareReads
    from exporter.devices.simulated.backend import SimulatedBackend

    class Deferring(SimulatedBackend, ProcessShareReads):
        """The demo node read as NVML reads a GPU: per-process samples only where the
        pass's plan says, or when the collector asks for them."""

        def reads(self, now, plan=READ_ALL):  # type: ignore[no-untyped-def]
            self._plan, self._now = plan, now
            return super().reads(now, plan)

        def sample(self, now):  # type: ignore[no-untyped-def]
            self._true = {d.index: d for d in super().sample(now)}
            reads[self._plan.process_metrics] += self._plan.reads_shares(6)
            return [d if self._plan.reads_shares(d.index) else updated(d, processes=tuple(
                dc_replace(p, sm_utilization=None, memory_utilization=None) for p in d.processes))
                for d in self._true.values()]

        def process_share_reads(self, devices):  # type: ignore[no-untyped-def]
            reads[False] += len(devices)
            return [Read(d.index, f"GPU {d.index}", lambda d=d: [self._true[d.index]]) for d in devices]

    reads = {True: 0, False: 0}  # GPU 6's per-process reads, with process metrics and without

    def usage_after_a_minute(process_metrics: bool) -> dict[tuple[str, str], float]:
        clock = Clock()
        backend = Deferring(clock=clock)
        backend.open()
        args = build_parser().parse_args(["serve", "--backend", "simulated"])
        attributor = build_attributor(args, "n", scenario=backend.scenario)
        _, labeller = label_schema([])
        collector = Collector([backend], "n", attributor=attributor, labeller=labeller, clock=clock,
                              process_metrics=process_metrics)
        try:
            for t in range(61):
                clock.t = 100.0 + t
                snap = collector.collect_once()
        finally:
            attributor.close()
        return {(w.device_key, w.workload.pod): w.usage_seconds_total / 60.0 for w in snap.workloads
                if w.usage_seconds_total is not None}

    every_pass = usage_after_a_minute(process_metrics=True)
    carried = usage_after_a_minute(process_metrics=False)
    assert every_pass.keys() == carried.keys() and len(every_pass) >= 8
    shared = [key for key in every_pass if "-0006-" in key[0]]
    assert len(shared) == 5, every_pass
    assert reads[True] == 61 and reads[False] <= 61 // int(SHARED_READ_PERIOD) + 3, reads
    for key, share in every_pass.items():
        assert carried[key] == pytest.approx(share, abs=0.01), key


def test_has_one_owner_is_the_rule_derive_groups_by():
    """`has_one_owner` decides on the distinct owner objects without building the groups:
    it answers what `group_processes(...).one_owner` answers, for every mix of one
    container's processes, equal workloads in distinct objects, unattributed processes,
    and workloads whose labels differ."""
    import itertools

    from exporter.core.model import DeviceSample, ProcessSample
    from exporter.core.process_groups import group_processes, has_one_owner

    a = Workload(kind="kubernetes", namespace="ml", pod="a", container="main")
    a_again = Workload(kind="kubernetes", namespace="ml", pod="a", container="main")  # equal, not the same
    b = Workload(kind="kubernetes", namespace="ml", pod="b", container="main")
    job = Workload(kind="slurm", slurm_job_id="42")
    host = Workload(kind="host")
    _, labeller = label_schema([])
    choices = [a, a_again, b, job, host, UNKNOWN, None]
    cases = 0
    for size in range(0, 4):
        for chosen in itertools.product(choices, repeat=size):
            device = DeviceSample(index=0, uuid="GPU-0", model="m",
                                  processes=tuple(ProcessSample(pid=i + 1) for i in range(size)))
            owners = {i + 1: owner for i, owner in enumerate(chosen) if owner is not None}
            assert has_one_owner(device, owners, labeller) == group_processes(
                device, owners, labeller).one_owner, chosen
            cases += 1
    assert cases == 1 + 7 + 49 + 343


def test_between_reads_the_nvml_backend_carries_the_shares_scaled_by_the_gpus_utilisation(tmp_path):
    node = Node(str(tmp_path))
    node.start(1001, "train-a", sm=60)
    node.start(1002, "eval-b", sm=20)
    node.fake.gpus[0].utilization_gpu = 80
    clock = Clock()
    collector = node.collector(clock=clock)
    every = passes_between_reads(1.0)
    util, halved, reads_at_40 = 80, [], []
    for t in range(3 * every):
        clock.t = float(t)
        node.fake.gpus[0].utilization_gpu = util
        before = node.util_reads()
        snap = collector.collect_once()
        read = node.util_reads() > before
        shares = {w.workload.pod: w.utilization for w in snap.workloads}
        if read:
            assert shares == {"train-a": pytest.approx(0.6), "eval-b": pytest.approx(0.2)}  # the driver's
            if util == 40:
                reads_at_40.append(t)
            if t >= 2:
                util = 40  # after a read at 80 %, half the utilisation
        elif util == 40 and not reads_at_40:
            halved.append(shares)  # carried from the read at 80 %: half the shares
    assert len(halved) == every - 1 and reads_at_40
    assert all(s == {"train-a": pytest.approx(0.3), "eval-b": pytest.approx(0.1)} for s in halved)
    assert node.util_reads() <= 2 + 3
