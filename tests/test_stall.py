"""A GPU busy with no work is called stalled after --stall-after, and nothing else is.

GPUs from the tests' NVML fake, read by the real NVML backend (GPM included) and the real
collector on a fake clock; owners from the real attribution code (a fixture /proc tree and
pods in the index); Events through the real event sink against the test API server; the
stall watch as ``serve`` wires it. Six GPUs, one pod each: a wedged collective, a
checkpoint, a data-loader stall, an evaluation, real compute at low tensor use and a zombie,
plus a GPU no process holds that reads busy. Only the wedge becomes ``stalled``, at
--stall-after and not a pass before; its incident and one Event per pod appear, and both
end when it computes again.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")

from cgroup_helpers import kubeconfig  # noqa: E402
from fakes.pynvml_fake import (  # noqa: E402
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_DRAM_BW_UTIL,
    NVML_GPM_METRIC_GRAPHICS_UTIL,
    NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    FakeGpu,
    FakeNvml,
    FakeProcess,
)
from waiting import wait_until  # noqa: E402

from exporter.attribution.kubernetes import PodIndex, pod_meta  # noqa: E402
from exporter.attribution.resolver import ProcAttributor  # noqa: E402
from exporter.attribution.simulated import scenario_pods, write_proc_tree  # noqa: E402
from exporter.collect.collector import Collector  # noqa: E402
from exporter.core.labels import label_schema  # noqa: E402
from exporter.devices.nvml import NvmlBackend  # noqa: E402
from exporter.incidents.events import EventSink, default_api_factory  # noqa: E402
from exporter.output import catalogue as cat  # noqa: E402
from exporter.stall.watch import StallFamilies, StallWatch  # noqa: E402

GiB = 2**30
STALL_AFTER = 300.0
STEP = 30.0
WALL = 1.8e9
PODS = ("trainer-0", "ckpt-1", "loader-2", "eval-3", "fp32-4", "zombie-5")
WEDGE, CHECKPOINT, LOADER, EVALUATION, LOW_TENSOR, ZOMBIE, UNHELD = range(7)


def gpm(graphics: float, tensor: float, dram: float, pcie_mib: float) -> dict[int, float]:
    """GPM values in NVML's units (percent, MiB/s)."""
    return {NVML_GPM_METRIC_GRAPHICS_UTIL: graphics, NVML_GPM_METRIC_ANY_TENSOR_UTIL: tensor,
            NVML_GPM_METRIC_DRAM_BW_UTIL: dram, NVML_GPM_METRIC_PCIE_TX_PER_SEC: pcie_mib,
            NVML_GPM_METRIC_PCIE_RX_PER_SEC: pcie_mib}


# (utilisation %, power W, GPM) per GPU: what each is doing
WEDGED = (100, 160, gpm(100, 0.0, 1.0, 0.01))
COMPUTING = (98, 610, gpm(98, 62.0, 30.0, 900.0))
PLAN = {
    WEDGE: WEDGED,
    CHECKPOINT: (0, 75, gpm(0, 0.0, 0.0, 3000.0)),   # writing to storage: no kernel, PCIe busy
    LOADER: (35, 200, gpm(35, 20.0, 6.0, 400.0)),     # waiting for batches between steps
    EVALUATION: (55, 300, gpm(55, 18.0, 12.0, 50.0)),
    LOW_TENSOR: (100, 520, gpm(100, 0.5, 45.0, 5.0)),  # FP32 elementwise: DRAM busy, power high
    ZOMBIE: (0, 70, gpm(0, 0.0, 0.0, 0.0)),           # memory held, nothing runs
    UNHELD: (100, 160, gpm(100, 0.0, 1.0, 0.0)),      # reads like a wedge, but no process holds it
}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def set_gpu(fake: FakeNvml, index: int, state: tuple[int, int, dict[int, float]]) -> None:
    util, watts, values = state
    gpu = fake.gpus[index]
    gpu.utilization_gpu, gpu.utilization_memory, gpu.power_mw = util, int(values[NVML_GPM_METRIC_DRAM_BW_UTIL]), \
        watts * 1000
    fake.set_gpm(index, values)


@pytest.fixture
def node(tmp_path, apiserver):
    clock = Clock()
    fake = FakeNvml([FakeGpu(memory_used=40 * GiB, clock_reasons=0) for _ in range(7)])
    fake.gpm_clock = clock
    index = PodIndex()
    for gpu, pod in enumerate(PODS):
        pid = 5000 + gpu
        workload = {"namespace": "batch", "pod": pod, "container": "pytorch", "owner": {"kind": "Job", "name": pod}}
        proc = SimpleNamespace(pid=pid, name="python", gpu=gpu, workload=workload)
        write_proc_tree(str(tmp_path / "proc"), [proc])
        for spec in scenario_pods([proc]):
            index.upsert(pod_meta(spec))
        fake.gpus[gpu].processes.append(FakeProcess(pid=pid, used_memory=38 * GiB))
    for gpu, state in PLAN.items():
        set_gpu(fake, gpu, state)
    backend = NvmlBackend(nvml=fake, gpm=True, gpm_interval=0.0)
    backend.open()
    extra, labeller = label_schema([])
    collector = Collector([backend], "gpu-node-7", attributor=ProcAttributor(str(tmp_path / "proc"), index),
                          labeller=labeller, clock=clock, wall=lambda: WALL + clock.t)
    sink = EventSink(functools.partial(default_api_factory, kubeconfig(tmp_path, apiserver)), "gpu-node-7")
    watch = StallWatch("gpu-node-7", STALL_AFTER, extra, events=sink)
    families = StallFamilies(watch, cat.enabled_names(), extra)

    def step() -> None:
        watch.observe(collector.collect_once())
        clock.t += STEP

    yield SimpleNamespace(fake=fake, watch=watch, families=families, step=step, clock=clock, sink=sink,
                          apiserver=apiserver)
    sink.close(timeout=5.0)
    collector.stop()
    backend.close()


def stalled(node) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for f in node.families.collect() if f.name == "gpu_stalled" for s in f.samples}


def test_only_the_wedge_is_stalled_after_stall_after_and_its_incident_and_events_end(node) -> None:
    # the first pass sees the wedge's signature; every pass until --stall-after later does not call it stalled
    node.step()
    started = node.clock.t - STEP
    while node.clock.t - started < STALL_AFTER:
        node.step()
        assert set(stalled(node).values()) == {0.0}, f"stalled before --stall-after, at {node.clock.t - STEP}"
        assert node.watch.recent_json() == []
    node.step()  # the pass --stall-after after the first
    assert stalled(node) == {str(g): float(g == WEDGE) for g in range(7)}
    [incident] = node.watch.recent_json()
    assert incident["kind"] == "stalled" and incident["gpu"] == WEDGE and incident["ended"] is None
    assert incident["declared"] - incident["began"] == STALL_AFTER
    assert [w["pod"] for w in incident["affected"]] == ["trainer-0"]
    assert incident["signals"]["tensor_active"] == 0.0 and incident["signals"]["utilization"] == 1.0
    assert incident["signals"]["power_ratio"] == pytest.approx(160 / 700)
    entries = node.watch.gpu_entries()
    states = [e["state"] for e in entries.values()]
    assert len(entries) == 7 and states.count("stalled") == 1 and states.count("not_judged") == 1
    assert entries[(_uuid(node, UNHELD), "")]["why_not"] == "no process holds it"
    by_gpu = {int(e["headline"].split()[1]) if e["headline"] else None: e for e in entries.values()}
    assert "GPU 0 busy with no work for 5m 0s: batch/trainer-0" == by_gpu[0]["headline"]
    # one Warning Event on the wedged pod, and only one however many passes it lasts
    wait_until(lambda: node.sink.counts()["posted"] >= 1, what="the stall's Event")
    for _ in range(3):
        node.step()
    events = list(node.apiserver.core_events.values())
    assert [(e["involvedObject"]["name"], e["type"], e["reason"], e["count"]) for e in events] == [
        ("trainer-0", "Warning", "GPUStalled", 1)]
    assert "busy with no work" in events[0]["message"] and "tensor 0%" in events[0]["message"]
    seconds = {s.labels["gpu"]: s.value for f in node.families.collect() if f.name == "gpu_stalled_seconds"
               for s in f.samples}
    assert seconds["0"] == STALL_AFTER + 3 * STEP and seconds["4"] == 0.0
    pods = {s.labels["pod"]: s.value for f in node.families.collect() if f.name == "container_gpu_stalled"
            for s in f.samples}
    assert pods == {"trainer-0": 1.0, "ckpt-1": 0.0, "loader-2": 0.0, "eval-3": 0.0, "fp32-4": 0.0,
                    "zombie-5": 0.0}
    # it computes again: one pass of it is noise, the second ends the stall
    set_gpu(node.fake, WEDGE, COMPUTING)
    node.step()
    assert stalled(node)["0"] == 1.0
    node.step()
    assert stalled(node)["0"] == 0.0
    [incident] = node.watch.recent_json()
    assert incident["ended"] is not None and incident["end_reason"] == "computes again"
    assert incident["duration_seconds"] == incident["ended"] - incident["began"]
    wait_until(lambda: node.sink.counts()["posted"] >= 2, what="the end's Event")
    ended = [e for e in node.apiserver.core_events.values() if e["reason"] == "GPUStallEnded"]
    assert [(e["involvedObject"]["name"], e["type"]) for e in ended] == [("trainer-0", "Normal")]
    assert "stall ended after" in ended[0]["message"] and "computes again" in ended[0]["message"]


def _uuid(node, index: int) -> str:
    return node.fake.nvmlDeviceGetUUID(node.fake.nvmlDeviceGetHandleByIndex(index))


def test_a_stall_ends_at_once_when_its_workload_leaves(node) -> None:
    for _ in range(int(STALL_AFTER / STEP) + 1):
        node.step()
    assert stalled(node)["0"] == 1.0
    node.fake.gpus[WEDGE].processes.clear()
    node.step()
    [incident] = node.watch.recent_json()
    assert incident["end_reason"] == "no process holds the GPU any more"
    assert stalled(node)["0"] == 0.0


def test_off_wedges_nothing_and_a_thermal_throttle_is_a_straggler_not_a_stall(node) -> None:
    node.fake.gpus[WEDGE].clock_reasons = 0x40  # hw_thermal_slowdown
    for _ in range(int(STALL_AFTER / STEP) + 2):
        node.step()
    assert set(stalled(node).values()) == {0.0}
    entry = next(e for e in node.watch.gpu_entries().values() if e["signals"].get("throttled"))
    assert "clocks held down (hw_thermal_slowdown)" in entry["why_not"]
