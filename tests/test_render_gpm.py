"""GPM families: device series, and per-workload series only where one workload uses the GPU.

The devices come from the NVIDIA backend over the fake pynvml (its GPM counters), the
owners from a fixed PID -> workload map; the collector, derive and render are the real ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pytest
from fakes.pynvml_fake import (
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_SM_UTIL,
    FakeGpm,
    FakeGpu,
    FakeMig,
    FakeNvml,
    FakeProcess,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.attribution import NullAttributor
from exporter.collect.collector import Collector
from exporter.core.model import UNKNOWN, DeviceSample, Workload
from exporter.devices.nvml import NvmlBackend
from exporter.output import catalogue as cat
from exporter.output.render import SnapshotCollector

GiB = 2**30


def pod(name: str) -> Workload:
    return Workload(kind="kubernetes", namespace="ml", pod=name, container="main", pod_uid=f"uid-{name}")


class Owners(NullAttributor):
    def __init__(self, owners: Mapping[int, Workload]):
        self.owners = owners

    def resolve(self, pids: Iterable[int], now: float) -> Mapping[int, Workload]:
        return {pid: self.owners.get(pid, UNKNOWN) for pid in pids}

    def allocations(self, devices: Sequence[DeviceSample]):  # type: ignore[no-untyped-def]
        return None


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def scrape(fake: FakeNvml, owners: Mapping[int, Workload], enabled: frozenset[str] | None = None):  # type: ignore[no-untyped-def]
    """Two passes one second apart; the exposition of the second, parsed."""
    clock = Clock()
    fake.gpm_clock = clock
    backend = NvmlBackend(nvml=fake, gpm_interval=0)
    backend.open()
    collector = Collector([backend], "n1", attributor=Owners(owners), clock=clock, wall=lambda: 1e9 + clock.t)
    collector.collect_once()
    clock.t += 1.0
    collector.collect_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, enabled))
    text = generate_latest(registry).decode()
    backend.close()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def series(m, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:  # type: ignore[no-untyped-def]
    return [(lab, v) for lab, v in m.get(name, []) if all(lab.get(k) == val for k, val in labels.items())]


def test_device_gpm_families_and_one_pod_per_gpu_gets_its_own_labels():
    fake = FakeNvml(gpus=[
        FakeGpu(processes=[FakeProcess(pid=101, used_memory=4 * GiB), FakeProcess(pid=102, used_memory=GiB)]),
        FakeGpu(processes=[FakeProcess(pid=201), FakeProcess(pid=202)]),  # shared by two pods
        FakeGpu(processes=[FakeProcess(pid=301), FakeProcess(pid=302)]),  # a pod and a host process
        FakeGpu(name="NVIDIA A100-SXM4-80GB", processes=[FakeProcess(pid=401)]),  # no GPM
        FakeGpu(),  # nobody on it
    ])
    fake.set_gpm(1, {NVML_GPM_METRIC_ANY_TENSOR_UTIL: 20.0})
    owners = {101: pod("train-0"), 102: pod("train-0"), 201: pod("a"), 202: pod("b"), 301: pod("c"),
              401: pod("old")}
    m = scrape(fake, owners, cat.enabled_names(detail=True))  # every GPM family, the breakdown too

    # device series: ratios 0-1 and bytes/s, on every Hopper GPU whoever uses it
    assert [v for _, v in series(m, "gpu_tensor_active_ratio", gpu="0")] == [pytest.approx(0.53)]
    assert [v for _, v in series(m, "gpu_tensor_active_ratio", gpu="1")] == [pytest.approx(0.20)]
    assert [v for _, v in series(m, "gpu_sm_active_ratio", gpu="4")] == [pytest.approx(0.546)]
    assert [v for _, v in series(m, "gpu_gpm_pcie_rx_bytes_per_second", gpu="0")] == [pytest.approx(250 * 2**20)]
    assert series(m, "gpu_nvlink_tx_bytes_per_second") == []  # not reported by these cards: absent
    assert series(m, "gpu_tensor_active_ratio", gpu="3") == []  # pre-Hopper: absent, not 0
    assert [v for _, v in series(m, "gpu_power_watts", gpu="3")] == [250.0]

    # per workload: only GPU 0, whose processes all belong to train-0 (two processes, one pod)
    rows = series(m, "container_gpu_tensor_active_ratio")
    assert [(lab["gpu"], lab["pod"], lab["namespace"], lab["container"], lab["uuid"]) for lab, _ in rows] == [
        ("0", "train-0", "ml", "main", fake.gpus[0].uuid)]
    assert rows[0][1] == pytest.approx(0.53)
    assert series(m, "container_gpu_sm_occupancy_ratio", pod="train-0")[0][1] == pytest.approx(0.081)
    for key, name, _, _ in cat.GPM_FAMILIES:
        device = series(m, "gpu_" + name, gpu="0")
        assert [v for _, v in series(m, "container_gpu_" + name)] == [v for _, v in device], key
    # shared GPU 1 and GPU 2 (a host process too): no pod gets the device's numbers
    assert series(m, "container_gpu_tensor_active_ratio", gpu="1") == []
    assert series(m, "container_gpu_tensor_active_ratio", gpu="2") == []
    # their pods still get their own memory and SM share series
    assert len(series(m, "container_gpu_memory_used_bytes", gpu="1")) == 2


def test_mig_instance_used_by_one_pod_gets_its_instance_values():
    migs = [FakeMig(uuid="MIG-1111", gpu_instance_id=1, processes=[FakeProcess(pid=501)],
                    gpm=FakeGpm(values={NVML_GPM_METRIC_ANY_TENSOR_UTIL: 70.0, NVML_GPM_METRIC_SM_UTIL: 75.0})),
            FakeMig(uuid="MIG-2222", gpu_instance_id=2, processes=[FakeProcess(pid=502), FakeProcess(pid=503)],
                    gpm=FakeGpm(values={NVML_GPM_METRIC_ANY_TENSOR_UTIL: 10.0}))]
    fake = FakeNvml(gpus=[FakeGpu(mig_devices=migs)])
    m = scrape(fake, {501: pod("infer-0"), 502: pod("x"), 503: pod("y")})
    assert series(m, "gpu_tensor_active_ratio", gpu_instance="") == []
    assert [v for _, v in series(m, "gpu_tensor_active_ratio", gpu_instance="1")] == [pytest.approx(0.70)]
    assert [v for _, v in series(m, "gpu_tensor_active_ratio", gpu_instance="2")] == [pytest.approx(0.10)]
    rows = series(m, "container_gpu_tensor_active_ratio")
    assert [(lab["gpu_instance"], lab["uuid"], lab["pod"]) for lab, _ in rows] == [("1", "MIG-1111", "infer-0")]
    assert series(m, "container_gpu_sm_active_ratio", pod="infer-0")[0][1] == pytest.approx(0.75)


def test_gpm_families_can_be_disabled_and_none_exist_on_the_first_pass():
    fake = FakeNvml(gpus=[FakeGpu(processes=[FakeProcess(pid=101)])])
    enabled = cat.enabled_names(disable=["gpu_tensor_active_ratio", "container_gpu_tensor_active_ratio"])
    m = scrape(fake, {101: pod("p")}, enabled)
    assert "gpu_tensor_active_ratio" not in m and "container_gpu_tensor_active_ratio" not in m
    assert series(m, "container_gpu_sm_active_ratio", pod="p")

    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu(processes=[FakeProcess(pid=101)])])
    fake.gpm_clock = clock
    backend = NvmlBackend(nvml=fake, gpm_interval=0)
    backend.open()
    collector = Collector([backend], "n1", attributor=Owners({101: pod("p")}), clock=clock)
    collector.collect_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot))
    text = generate_latest(registry).decode()
    assert "gpu_sm_active_ratio{" not in text and "container_gpu_sm_active_ratio{" not in text
    assert "gpu_power_watts{" in text
