"""GPU allocations from the kubelet's pod-resources socket, against a real gRPC server.

The kubelet (tests/fakes/kubelet_podresources.py) is a grpcio server on a unix socket in
a temporary directory that implements ``v1.PodResourcesLister/List`` from the agent's own
``podresources_api.proto``.
The attributor reads it through the real client, joins it with a fixture /proc tree and
a pod index, and the collector and renderer turn it into series, as on a node.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (pip install '.[k8s]' in l9gpu's checkout)")
api = pytest.importorskip("exporter.attribution.podresources_api_pb2", reason="protobuf is not installed")

from fakes.kubelet_podresources import FakeKubelet, pod  # noqa: E402
from test_attribution import write_proc  # noqa: E402
from waiting import wait_until, within  # noqa: E402

from exporter.attribution import build_attributor, podresources  # noqa: E402
from exporter.attribution.kubernetes import PodIndex, StaticPodSource  # noqa: E402
from exporter.attribution.resolver import ProcAttributor  # noqa: E402
from exporter.collect.collector import Collector  # noqa: E402
from exporter.core.labels import label_schema  # noqa: E402
from exporter.core.model import DeviceSample, ProcessSample  # noqa: E402
from exporter.devices.base import Backend  # noqa: E402
from exporter.output import catalogue as cat  # noqa: E402
from exporter.output.render import SnapshotCollector  # noqa: E402

GIB = 2**30
UID = "8c1f2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b"
CID = "3f2a" + "0" * 58 + "19"
GPU0 = "GPU-1b849e72-0000-4c1d-9a3e-5f0c2d7b0000"
GPU1 = "GPU-1b849e72-0001-4c1d-9a3e-5f0c2d7b0001"
GPU2 = "GPU-1b849e72-0002-4c1d-9a3e-5f0c2d7b0002"
MIG = "MIG-5e2a3c4d-1111-5a6b-8c9d-0e1f2a3b4c5d"


@pytest.fixture
def kubelet(sockdir: str) -> Iterator[FakeKubelet]:
    server = FakeKubelet(sockdir)
    yield server
    server.stop()


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = dict(proc_root="/proc", kubernetes="off", kubeconfig=None, pod_label=[],
                                   cri_socket="off", pod_resources_socket="auto")
    base.update(kw)
    return argparse.Namespace(**base)


class StaticBackend(Backend):
    name = "static"

    def __init__(self, devices: list[DeviceSample]):
        self.devices = devices

    def sample(self, now: float) -> list[DeviceSample]:
        return list(self.devices)

    def close(self) -> None:
        pass


class Clock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def scrape(collector: Collector, extra: tuple[str, ...] = ()) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, cat.enabled_names(detail=True), extra))
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def series(metrics: dict, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    return [(lab, v) for lab, v in metrics.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]


def value(metrics: dict, name: str, **labels: str) -> float:
    hits = series(metrics, name, **labels)
    assert len(hits) == 1, (name, labels, metrics.get(name))
    return hits[0][1]


# ---- device ids ----------------------------------------------------------------------

def test_every_device_id_form_maps_to_its_gpu(kubelet: FakeKubelet) -> None:
    devices = [
        DeviceSample(index=0, uuid=GPU0, vendor="nvidia", pci_bus_id="00000000:18:00.0", serial="1652320000001"),
        DeviceSample(index=1, uuid=GPU1, vendor="nvidia", pci_bus_id="00000000:28:00.0"),
        DeviceSample(index=2, uuid=GPU2, vendor="nvidia", pci_bus_id="00000000:38:00.0", serial="1652320000003"),
        DeviceSample(index=2, uuid=MIG, vendor="nvidia", gpu_instance="1", pci_bus_id="00000000:38:00.0",
                     serial="1652320000003"),
        DeviceSample(index=3, uuid="amd-0", vendor="amd", pci_bus_id="0000:C1:00.0"),
        DeviceSample(index=4, uuid="amd-1", vendor="amd", pci_bus_id="00000000:c2:00.0"),
        DeviceSample(index=5, uuid="01P4-HL2080A0-15", vendor="gaudi", serial="AM12345678",
                     pci_bus_id="0000:b3:00.0"),
    ]
    kubelet.pods = [
        pod("ml", "whole", main=[("nvidia.com/gpu", [GPU0.upper()])]),
        pod("ml", "sliced-a", main=[("nvidia.com/gpu", [GPU1 + "::0"])]),
        pod("ml", "sliced-b", main=[("nvidia.com/gpu", [GPU1 + "::7"])]),
        pod("ml", "mig", main=[("nvidia.com/mig-1g.10gb", [MIG])]),
        pod("rocm", "amd", main=[("amd.com/gpu", ["0000:c1:00.0", "0000:C2:00.0"])]),
        pod("hpu", "gaudi", main=[("habana.ai/gaudi", ["AM12345678"])]),
        pod("net", "sriov", main=[("intel.com/sriov_netdevice", ["0000:3b:02.1"]),
                                  ("nvidia.com/gpu", ["GPU-ffffffff-0000-0000-0000-000000000000"])]),
    ]
    source = podresources.PodResourcesSource(kubelet.path, timeout=5.0)
    attributor = ProcAttributor("/proc", PodIndex(), allocation_source=source)
    try:
        assert source.refresh() and source.healthy()
        rows = attributor.allocations(devices)
        assert rows is not None
        got = {(r.workload.pod, r.device_id): r.device_key for r in rows}
        assert got == {
            ("whole", GPU0.upper()): GPU0,
            ("sliced-a", GPU1 + "::0"): GPU1,
            ("sliced-b", GPU1 + "::7"): GPU1,
            ("mig", MIG): MIG,  # the MIG instance, not its parent
            ("amd", "0000:c1:00.0"): "amd-0",
            ("amd", "0000:C2:00.0"): "amd-1",
            ("gaudi", "AM12345678"): "01P4-HL2080A0-15",
        }
        assert {r.resource_name for r in rows if r.workload.pod == "mig"} == {"nvidia.com/mig-1g.10gb"}
        # other plugins' devices and GPUs the agent cannot see: counted, not errors
        assert sorted(attributor.unknown_device_ids) == ["0000:3b:02.1", "GPU-ffffffff-0000-0000-0000-000000000000"]
        assert attributor.statuses() == {"pod_resources": True}
    finally:
        attributor.close()


@pytest.mark.parametrize("raw,expected", [
    ("00000000:C1:00.0", "0000:c1:00.0"), ("0000:c1:00.0", "0000:c1:00.0"), ("c1:00.0", "0000:c1:00.0"),
    ("0001:3:1.7", "0001:03:01.7"), ("GPU-abc", None), ("AM12345678", None), ("", None),
])
def test_pci_bus_ids_are_normalised(raw: str, expected: str | None) -> None:
    assert podresources.normalize_pci_bus_id(raw) == expected


# ---- the join with the pod index and the series it gives ---------------------------

POD_JSON = {
    "metadata": {"name": "vllm-6d8b94df7-q5z82", "namespace": "ml", "uid": UID,
                 "labels": {"team": "inference", "pod-template-hash": "6d8b94df7"},
                 "ownerReferences": [{"kind": "ReplicaSet", "name": "vllm-6d8b94df7", "controller": True}]},
    "status": {"containerStatuses": [{"name": "engine", "containerID": "containerd://" + CID},
                                     {"name": "sidecar", "containerID": "containerd://" + "c" * 64}]},
}


def _node(tmp_path: Path, kubelet: FakeKubelet, clock: Clock) -> tuple[Collector, tuple[str, ...]]:
    """GPU 0 runs the pod's engine process; GPU 1 is allocated to its sidecar, which runs nothing."""
    write_proc(tmp_path, 10, f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/"
                             f"cri-containerd-{CID}.scope\n")
    index = PodIndex()
    source = StaticPodSource(index, [POD_JSON])
    allocations = podresources.build(kubelet.path)
    attributor = ProcAttributor(str(tmp_path), index, source, allocation_source=allocations)
    devices = [
        DeviceSample(index=0, uuid=GPU0, power_watts=300.0, utilization=0.5,
                     processes=(ProcessSample(10, 20 * GIB, 0.5),)),
        DeviceSample(index=1, uuid=GPU1, power_watts=70.0, utilization=0.0),
        DeviceSample(index=2, uuid=GPU2, power_watts=70.0, utilization=0.0),
    ]
    extra, labeller = label_schema(["team"])
    return Collector([StaticBackend(devices)], "node-a", attributor=attributor, labeller=labeller, clock=clock), extra


def test_allocations_join_the_pod_index_and_match_the_process_series(tmp_path: Path, kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        pod("ml", "vllm-6d8b94df7-q5z82", engine=[("nvidia.com/gpu", [GPU0])], sidecar=[("nvidia.com/gpu", [GPU1])]),
        pod("ml", "not-in-the-index", main=[("nvidia.com/gpu", [GPU2])]),
    ]
    clock = Clock()
    collector, extra = _node(tmp_path, kubelet, clock)
    try:
        collector.collect_once()
        m = scrape(collector, extra)
        # the engine's allocation and its process are one workload: the very same label set
        [(allocated_labels, allocated)] = series(m, "container_gpu_allocated", gpu="0")
        [(process_labels, processes)] = series(m, "container_gpu_processes", gpu="0")
        assert allocated_labels == process_labels and (allocated, processes) == (1.0, 1.0)
        assert (allocated_labels["pod_uid"], allocated_labels["owner_kind"], allocated_labels["owner_name"],
                allocated_labels["label_team"], allocated_labels["container"]) == (
            UID, "Deployment", "vllm", "inference", "engine")
        # the sidecar holds GPU 1 and runs nothing: honest zeros, same pod identity
        side = dict(gpu="1", container="sidecar", pod_uid=UID, owner_kind="Deployment", label_team="inference")
        assert value(m, "container_gpu_allocated", **side) == 1.0
        assert value(m, "container_gpu_processes", **side) == 0.0
        assert value(m, "container_gpu_memory_used_bytes", **side) == 0.0
        assert value(m, "container_gpu_utilization_ratio", **side) == 0.0
        assert value(m, "container_gpu_energy_joules_total", **side) == 0.0
        # a pod the index does not know: names from the kubelet, no UID, owner or labels
        [(labels, _)] = series(m, "container_gpu_allocated", gpu="2")
        assert (labels["namespace"], labels["pod"], labels["pod_uid"], labels["owner_kind"], labels["label_team"]) == (
            "ml", "not-in-the-index", "", "", "")
        assert value(m, "l9gpu_collector_success", collector="pod_resources") == 1.0

        # time passes with no process on GPU 1: allocation and idle time grow, energy share stays 0
        for t in (10.0, 25.0):
            clock.t = t
            collector.collect_once()
        m = scrape(collector, extra)
        assert value(m, "container_gpu_allocation_seconds_total", **side) == 25.0
        assert value(m, "container_gpu_idle_seconds", **side) == 25.0
        assert value(m, "container_gpu_energy_joules_total", **side) == 0.0
        assert value(m, "gpu_unattributed_energy_joules_total", gpu="1") == pytest.approx(70.0 * 25)
        # the engine computes: allocated time grows too, and it is not idle
        engine = dict(gpu="0", container="engine")
        assert value(m, "container_gpu_allocation_seconds_total", **engine) == 25.0
        assert value(m, "container_gpu_idle_seconds", **engine) == 0.0
        snap = collector.snapshot
        assert snap is not None and len(snap.allocations) == 3
    finally:
        collector.attributor.close()


def test_a_time_sliced_gpu_shared_by_three_pods_gives_three_series(tmp_path: Path, kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("search", f"worker-{n}", main=[("nvidia.com/gpu", [f"{GPU2}::{n}"])]) for n in range(3)]
    collector, extra = _node(tmp_path, kubelet, Clock())
    try:
        collector.collect_once()
        m = scrape(collector, extra)
        got = series(m, "container_gpu_allocated", gpu="2")
        assert sorted(lab["pod"] for lab, _ in got) == ["worker-0", "worker-1", "worker-2"]
        assert {lab["uuid"] for lab, _ in got} == {GPU2} and {v for _, v in got} == {1.0}
        # the engine runs on GPU 0 without an allocation the kubelet knows of: 0, not absent
        assert value(m, "container_gpu_allocated", gpu="0", container="engine") == 0.0
    finally:
        collector.attributor.close()


def _gpu_time(m: dict, gpu: str) -> tuple[dict[str, float], float, float]:
    """(allocation seconds by pod, unallocated seconds, capacity seconds) of one GPU."""
    shares = {lab["pod"]: v for lab, v in series(m, "container_gpu_allocation_seconds_total", gpu=gpu)}
    return (shares, value(m, "gpu_unallocated_seconds_total", gpu=gpu),
            value(m, "gpu_capacity_seconds_total", gpu=gpu))


def test_time_slicing_replicas_split_the_gpu_and_free_ones_are_unallocated(tmp_path: Path,
                                                                            kubelet: FakeKubelet) -> None:
    """GPU 2 is advertised as 4 replicas: a pod with 2 of them pays half, one with 1 a quarter,
    the free replica is unallocated; then replicas change hands and the plugin re-advertises."""
    kubelet.allocatable = [("nvidia.com/gpu", [GPU0, GPU1] + [f"{GPU2}::{n}" for n in range(4)])]
    kubelet.pods = [pod("search", "two", main=[("nvidia.com/gpu", [f"{GPU2}::0", f"{GPU2}::1"])]),
                    pod("search", "one", main=[("nvidia.com/gpu", [f"{GPU2}::2"])])]
    clock = Clock()
    collector, extra = _node(tmp_path, kubelet, clock)
    try:
        source = collector.attributor.allocation_source
        for t in (0.0, 10.0, 20.0):
            clock.t = t
            collector.collect_once()
        shares, free, capacity = _gpu_time(scrape(collector, extra), "2")
        assert shares == pytest.approx({"two": 10.0, "one": 5.0}) and free == pytest.approx(5.0)
        assert capacity == pytest.approx(20.0)
        # GPU 0: the engine runs there outside the device plugin and holds all of it
        assert value(scrape(collector, extra), "container_gpu_allocation_seconds_total", gpu="0") == 20.0

        # "one" leaves, "new" takes two replicas: nothing is free any more
        kubelet.pods = [kubelet.pods[0], pod("search", "new", main=[("nvidia.com/gpu", [f"{GPU2}::2", f"{GPU2}::3"])])]
        assert source.refresh()
        for t in (30.0, 40.0):
            clock.t = t
            collector.collect_once()
        shares, free, capacity = _gpu_time(scrape(collector, extra), "2")
        assert shares == pytest.approx({"two": 20.0, "one": 5.0, "new": 10.0})  # "one" kept in its grace period
        assert free == pytest.approx(5.0) and capacity == pytest.approx(40.0)

        # the plugin is reconfigured to 8 replicas: the same holdings are half as much of the GPU
        kubelet.allocatable = [("nvidia.com/gpu", [f"{GPU2}::{n}" for n in range(8)])]
        assert source.refresh()
        clock.t = 50.0
        collector.collect_once()
        shares, free, capacity = _gpu_time(scrape(collector, extra), "2")
        assert shares == pytest.approx({"two": 22.5, "one": 5.0, "new": 12.5})
        assert free == pytest.approx(10.0)
        assert sum(shares.values()) + free == pytest.approx(capacity)
    finally:
        collector.attributor.close()


def test_an_older_kubelet_without_allocatable_shares_the_gpu_by_the_replicas_held(
        tmp_path: Path, kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture) -> None:
    kubelet.allocatable = None  # kubelet < 1.23: GetAllocatableResources is UNIMPLEMENTED
    kubelet.pods = [pod("search", "two", main=[("nvidia.com/gpu", [f"{GPU2}::0", f"{GPU2}::1"])]),
                    pod("search", "one", main=[("nvidia.com/gpu", [f"{GPU2}::2"])])]
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="exporter.attribution.podresources"):
        collector, extra = _node(tmp_path, kubelet, clock)
    try:
        for t in (0.0, 30.0):
            clock.t = t
            collector.collect_once()
        shares, free, capacity = _gpu_time(scrape(collector, extra), "2")
        assert shares == pytest.approx({"two": 20.0, "one": 10.0}) and free == 0.0 and capacity == 30.0
        assert "has no GetAllocatableResources" in caplog.text
        assert value(scrape(collector, extra), "l9gpu_collector_success", collector="pod_resources") == 1.0
    finally:
        collector.attributor.close()


# ---- failures never stall a pass -----------------------------------------------------

def test_a_missing_socket_is_unhealthy_and_passes_stay_fast(tmp_path: Path, sockdir: str) -> None:
    missing = os.path.join(sockdir, "nothing-here.sock")
    attributor = build_attributor(_args(proc_root=str(tmp_path), pod_resources_socket=missing), "n")
    try:
        assert isinstance(attributor, ProcAttributor) and attributor.allocation_source is not None
        devices = [DeviceSample(index=0, uuid=GPU0)]
        collector = Collector([StaticBackend(devices)], "n", attributor=attributor)
        source = attributor.allocation_source
        callers: list[str] = []
        refresh = source.refresh
        source.refresh = lambda: callers.append(threading.current_thread().name) or refresh()
        collector.collect_once()
        assert threading.current_thread().name not in callers  # the pass did not call the kubelet
        m = scrape(collector)
        assert value(m, "l9gpu_collector_success", collector="pod_resources") == 0.0
        assert "container_gpu_allocated" not in m  # unknown, not "not allocated"
    finally:
        attributor.close()


def test_a_hung_kubelet_never_stalls_a_pass(tmp_path: Path, kubelet: FakeKubelet) -> None:
    kubelet.pods = [pod("ml", "reserved", main=[("nvidia.com/gpu", [GPU0])])]
    now = [0.0]
    source = podresources.PodResourcesSource(kubelet.path, interval=0.1, timeout=0.3, stale_after=60.0,
                                             clock=lambda: now[0])
    attributor = ProcAttributor(str(tmp_path), PodIndex(), allocation_source=source)
    collector = Collector([StaticBackend([DeviceSample(index=0, uuid=GPU0)])], "n", attributor=attributor)
    callers: list[str] = []
    refresh = source.refresh

    def spy() -> bool:
        callers.append(threading.current_thread().name)
        return refresh()

    source.refresh = spy  # type: ignore[method-assign]
    try:
        wait_until(refresh, what="a first listing")
        source.start()
        kubelet.hang.set()
        wait_until(lambda: not source.healthy(), within(source.outage_bound), "the deadline expiring")
        assert source.last_code == "DEADLINE_EXCEEDED"
        for _ in range(5):  # while the background listing waits on the hung kubelet
            collector.collect_once()
        # Only the background thread ever asked the kubelet: a pass never waits on it.
        assert set(callers) == {source.thread_name}, callers
        m = scrape(collector)
        assert value(m, "l9gpu_collector_success", collector="pod_resources") == 0.0
        # a kubelet restart: the last list is still served for a while, then it is unknown
        assert value(m, "container_gpu_allocated", pod="reserved") == 1.0
        now[0] = 61.0
        collector.collect_once()
        assert "container_gpu_allocated" not in scrape(collector)
        kubelet.hang.clear()
        kubelet.release.set()  # the kubelet answers again
        wait_until(source.healthy, what="the kubelet answering again")
        collector.collect_once()
        m = scrape(collector)
        assert value(m, "container_gpu_allocated", pod="reserved") == 1.0
        assert value(m, "l9gpu_collector_success", collector="pod_resources") == 1.0
    finally:
        attributor.close()


# ---- flags -----------------------------------------------------------------------------

def test_flag_off_auto_and_path(tmp_path: Path, kubelet: FakeKubelet, monkeypatch: pytest.MonkeyPatch) -> None:
    off = build_attributor(_args(proc_root=str(tmp_path), pod_resources_socket="off"), "n")
    assert isinstance(off, ProcAttributor) and off.allocation_source is None
    assert "pod_resources" not in off.statuses() and off.allocations([]) is None
    off.close()
    monkeypatch.setattr(podresources, "POD_RESOURCES_SOCKET", os.path.join(os.path.dirname(kubelet.path), "no.sock"))
    quiet = build_attributor(_args(proc_root=str(tmp_path)), "n")  # auto, no kubelet socket: off
    assert isinstance(quiet, ProcAttributor) and quiet.allocation_source is None
    quiet.close()
    monkeypatch.setattr(podresources, "POD_RESOURCES_SOCKET", kubelet.path)
    for value_ in ("auto", kubelet.path, "unix://" + kubelet.path):
        on = build_attributor(_args(proc_root=str(tmp_path), pod_resources_socket=value_), "n")
        try:
            assert isinstance(on, ProcAttributor) and on.allocation_source is not None
            assert on.statuses() == {"pod_resources": True}  # listed once before the first pass
        finally:
            on.close()


def test_the_cli_takes_the_flag_and_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.app.cli import build_parser

    args = build_parser().parse_args(["snapshot", "--pod-resources-socket", "off"])
    assert args.pod_resources_socket == "off"
    monkeypatch.setenv("L9GPU_POD_RESOURCES_SOCKET", "/run/x.sock")
    assert build_parser().parse_args(["serve"]).pod_resources_socket == "/run/x.sock"


def test_without_grpcio_allocations_are_off_with_one_warning(monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # import grpc raises ImportError
    with caplog.at_level(logging.WARNING):
        assert podresources.build("/var/lib/kubelet/pod-resources/kubelet.sock") is None
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(messages) == 1 and "grpc" in messages[0] and "'.[k8s]'" in messages[0]
