"""Pod names from the container runtime's CRI socket, against a real gRPC server.

The server (tests/fakes/cri_runtime.py) is a grpcio server on a unix socket in a
temporary directory that implements ``runtime.v1.RuntimeService/ListContainers`` from the
agent's own ``cri_api.proto``, serving containers labelled the way the kubelet labels them.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (pip install '.[k8s]' in l9gpu's checkout)")
api = pytest.importorskip("exporter.attribution.cri_api_pb2", reason="protobuf is not installed")

from fakes.cri_runtime import FakeRuntime, container  # noqa: E402
from test_attribution import write_proc  # noqa: E402
from waiting import wait_until, within  # noqa: E402

from exporter.attribution import build_attributor, cri  # noqa: E402
from exporter.attribution.kubernetes import PodIndex, StaticPodSource  # noqa: E402
from exporter.attribution.resolver import ProcAttributor  # noqa: E402

UID = "8c1f2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b"
CID = "3f2a" + "0" * 58 + "19"
OTHER_UID = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
OTHER_CID = "b" * 64


def cgroup_line(uid: str, cid: str) -> str:
    return (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{cid}.scope\n")


@pytest.fixture
def runtime(sockdir: str) -> Iterator[FakeRuntime]:
    server = FakeRuntime(sockdir)
    yield server
    server.stop()


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = dict(proc_root="/proc", kubernetes="off", kubeconfig=None, pod_label=[],
                                   cri_socket="auto")
    base.update(kw)
    return argparse.Namespace(**base)


def test_pods_from_containers_uses_the_kubelet_labels_and_skips_the_rest() -> None:
    pods = cri.pods_from_containers([
        container(CID.upper(), UID, "vllm-0", "ml", "engine"),
        container("c" * 64, UID, "vllm-0", "ml", "sidecar"),
        api.Container(id="d" * 64, labels={"nerdctl/name": "not-a-pod"}),  # not the kubelet's
        api.Container(id="", labels={cri.POD_UID: OTHER_UID, cri.POD_NAME: "x", cri.POD_NAMESPACE: "y"}),
        # no container-name label: the CRI metadata name is used
        api.Container(id="e" * 64, metadata=api.ContainerMetadata(name="init"), labels={cri.POD_UID: OTHER_UID}),
    ])
    assert [(p.uid, p.name, p.namespace, dict(p.containers)) for p in pods] == [
        (UID, "vllm-0", "ml", {CID: "engine", "c" * 64: "sidecar"}),
        (OTHER_UID, "x", "y", {"e" * 64: "init"}),
    ]
    assert all((p.owner_kind, p.owner_name, p.labels) == ("", "", ()) for p in pods)  # not in CRI


def test_names_come_from_cri_when_the_api_server_is_off(tmp_path: Path, runtime: FakeRuntime) -> None:
    runtime.containers = [container(CID, UID, "vllm-6d8b94df7-q5z82", "ml", "engine")]
    write_proc(tmp_path, 10, cgroup_line(UID, CID))
    attributor = build_attributor(_args(proc_root=str(tmp_path), cri_socket=runtime.path), "node-a")
    try:
        assert isinstance(attributor, ProcAttributor) and attributor.pod_source is None
        w = attributor.resolve([10], 0.0)[10]
        assert (w.kind, w.namespace, w.pod, w.container, w.pod_uid, w.container_id) == (
            "kubernetes", "ml", "vllm-6d8b94df7-q5z82", "engine", UID, CID)
        assert (w.owner_kind, w.labels) == ("", ())
        assert attributor.statuses() == {"cri": True}
        # Only running containers are asked for.
        assert runtime.requests[0].filter.state.state == api.CONTAINER_RUNNING
    finally:
        attributor.close()


def test_an_unknown_container_is_listed_at_once_then_rate_limited(tmp_path: Path, runtime: FakeRuntime) -> None:
    now = [100.0]
    index = PodIndex()
    source = cri.CriPodSource(runtime.path, index, min_refresh=5.0, timeout=5.0, clock=lambda: now[0])
    attributor = ProcAttributor(str(tmp_path), index, fallback=source)
    try:
        source.refresh()  # the runtime has no containers yet
        write_proc(tmp_path, 10, cgroup_line(UID, CID))
        runtime.containers = [container(CID, UID, "job-1", "batch", "trainer")]
        now[0] += 6
        w = attributor.resolve([10], 0.0)[10]  # unknown id: listed in this pass, named in this pass
        assert (w.pod, w.container) == ("job-1", "trainer") and len(runtime.requests) == 2
        # A second unknown container 1 s later: within min_refresh, no listing; it keeps its UID.
        write_proc(tmp_path, 11, cgroup_line(OTHER_UID, OTHER_CID))
        runtime.containers.append(container(OTHER_CID, OTHER_UID, "job-2", "batch", "trainer"))
        now[0] += 1
        w = attributor.resolve([10, 11], 1.0)[11]
        assert (w.pod, w.pod_uid, len(runtime.requests)) == ("", OTHER_UID, 2)
        now[0] += 5  # past min_refresh: the next pass asks again and names it
        w = attributor.resolve([10, 11], 2.0)[11]
        assert (w.pod, len(runtime.requests)) == ("job-2", 3)
        # Known everywhere now: warm passes make no calls.
        now[0] += 60
        attributor.resolve([10, 11], 3.0)
        assert len(runtime.requests) == 3
    finally:
        attributor.close()


def test_a_container_without_a_pod_cgroup_is_named_through_cri(tmp_path: Path, runtime: FakeRuntime) -> None:
    """/k8s.io/<id> (kubelet --cgroups-per-qos=false) carries no pod UID: the runtime's
    listing names the pod by container id, asked at once for the id no one knew."""
    now = [100.0]
    index = PodIndex()
    source = cri.CriPodSource(runtime.path, index, min_refresh=5.0, timeout=5.0, clock=lambda: now[0])
    attributor = ProcAttributor(str(tmp_path), index, fallback=source)
    try:
        source.refresh()  # nothing running yet
        write_proc(tmp_path, 10, f"0::/k8s.io/{CID}\n")
        assert attributor.resolve([10], 0.0)[10].kind == "unknown"  # within min_refresh: not asked yet
        runtime.containers = [container(CID, UID, "embed-0", "search", "encoder")]
        now[0] += 6
        w = attributor.resolve([10], 1.0)[10]
        assert (w.kind, w.namespace, w.pod, w.container, w.pod_uid, w.container_id) == (
            "kubernetes", "search", "embed-0", "encoder", UID, CID)
        assert len(runtime.requests) == 2
    finally:
        attributor.close()


def test_api_data_wins_and_cri_only_adds_container_names(tmp_path: Path, runtime: FakeRuntime) -> None:
    new_cid = "c" * 64  # a container the watch has not reported yet (just restarted)
    runtime.containers = [container(CID, UID, "cri-says-this", "cri-ns", "cri-engine"),
                          container(new_cid, UID, "cri-says-this", "cri-ns", "worker")]
    index = PodIndex()
    StaticPodSource(index, [{
        "metadata": {"uid": UID, "name": "vllm-6d8b94df7-q5z82", "namespace": "ml", "labels": {"team": "inference",
                     "pod-template-hash": "6d8b94df7"},
                     "ownerReferences": [{"kind": "ReplicaSet", "name": "vllm-6d8b94df7", "controller": True}]},
        "status": {"containerStatuses": [{"name": "engine", "containerID": f"containerd://{CID}"}]}}])
    source = cri.build(runtime.path, index)
    assert source is not None
    write_proc(tmp_path, 10, cgroup_line(UID, CID))
    write_proc(tmp_path, 11, cgroup_line(UID, new_cid))
    attributor = ProcAttributor(str(tmp_path), index, fallback=source)
    try:
        owners = attributor.resolve([10, 11], 0.0)
        for w in owners.values():
            assert (w.namespace, w.pod, w.owner_kind, w.owner_name, dict(w.labels).get("team")) == (
                "ml", "vllm-6d8b94df7-q5z82", "Deployment", "vllm", "inference")
        assert (owners[10].container, owners[11].container) == ("engine", "worker")
        # The API relisting (replace) keeps the fallback's pods for pods it does not have.
        index.replace([])
        assert attributor.resolve([10], 1.0)[10].pod == "cri-says-this"
    finally:
        attributor.close()


def test_a_missing_socket_never_stalls_a_pass_and_is_unhealthy(tmp_path: Path, sockdir: str, caplog) -> None:
    write_proc(tmp_path, 10, cgroup_line(UID, CID))
    missing = os.path.join(sockdir, "crio.sock")
    with caplog.at_level(logging.WARNING):
        started = time.monotonic()
        attributor = build_attributor(_args(proc_root=str(tmp_path), cri_socket=missing), "node-a")
        try:
            w = attributor.resolve([10], 0.0)[10]
            # Two calls at most (the first listing, then the unknown container's), each
            # bounded by its deadline; far from gRPC's own 20 s connect timeout.
            assert time.monotonic() - started < within(2 * attributor.fallback.timeout, factor=2.0)
            assert (w.pod, w.pod_uid, w.container_id) == ("", UID, CID)
            assert attributor.statuses() == {"cri": False}
        finally:
            attributor.close()
    assert "CRI socket" in caplog.text and missing in caplog.text and "Traceback" not in caplog.text


def test_a_hung_runtime_costs_at_most_the_deadline(tmp_path: Path, runtime: FakeRuntime) -> None:
    runtime.containers = [container(CID, UID, "vllm-0", "ml", "engine")]
    runtime.hang.set()
    index = PodIndex()
    source = cri.CriPodSource(runtime.path, index, timeout=0.3, min_refresh=0.0)
    attributor = ProcAttributor(str(tmp_path), index, fallback=source)
    write_proc(tmp_path, 10, cgroup_line(UID, CID))
    try:
        started = time.monotonic()
        w = attributor.resolve([10], 0.0)[10]
        elapsed = time.monotonic() - started
        # It did ask, and gave up at the deadline, not when the runtime answers (10 s).
        assert 0.25 < elapsed < 5.0, elapsed
        assert (w.pod, w.pod_uid) == ("", UID)
        assert attributor.statuses() == {"cri": False} and source.last_code == "DEADLINE_EXCEEDED"
        # The runtime answers again: healthy, and the pod is named.
        runtime.hang.clear()
        runtime.release.set()
        # (asked again until a call beats the short deadline, should the machine be busy)
        wait_until(lambda: source.refresh() or source.healthy(), what="the runtime answering again")
        assert attributor.resolve([10], 1.0)[10].pod == "vllm-0"
    finally:
        attributor.close()


def test_the_background_thread_follows_the_runtime(tmp_path: Path, runtime: FakeRuntime) -> None:
    index = PodIndex()
    source = cri.CriPodSource(runtime.path, index, interval=0.05)
    source.start()
    try:
        runtime.containers = [container(CID, UID, "vllm-0", "ml", "engine")]
        wait_until(lambda: index.get(UID) is not None and source.healthy(), what="the pod listed")
        runtime.containers = []  # the pod went away
        wait_until(lambda: index.get(UID) is None, what="the pod gone from the index")
    finally:
        source.stop()


def test_malformed_entries_and_unknown_container_ids_are_harmless(tmp_path: Path, runtime: FakeRuntime) -> None:
    runtime.containers = [
        api.Container(id="not-hex", labels={cri.POD_UID: OTHER_UID, cri.POD_NAME: "odd", cri.CONTAINER_NAME: "x"}),
        api.Container(id=CID, labels={cri.POD_NAME: "no-uid"}),
        api.Container(),
        container("c" * 64, "\u00e9" * 10, "unicode", "ns", "c"),
    ]
    write_proc(tmp_path, 10, cgroup_line(UID, CID))  # its container is not among them
    write_proc(tmp_path, 11, "0::/kubepods.slice/kubepods-besteffort.slice/cri-containerd-zz.scope\n")
    attributor = build_attributor(_args(proc_root=str(tmp_path), cri_socket="unix://" + runtime.path), "n")
    try:
        owners = attributor.resolve([10, 11, 12], 0.0)
        assert (owners[10].kind, owners[10].pod, owners[10].pod_uid, owners[10].container_id) == (
            "kubernetes", "", UID, CID)
        assert owners[11].pod == "" and owners[12].pod == ""
        assert attributor.statuses() == {"cri": True}
    finally:
        attributor.close()


def test_the_flag_auto_detection_and_off(monkeypatch, sockdir: str, caplog) -> None:
    from exporter.app.cli import build_parser

    args = build_parser().parse_args(["snapshot", "--cri-socket", "off"])
    assert args.cri_socket == "off"
    assert build_parser().parse_args(["snapshot"]).cri_socket == "auto"

    server = FakeRuntime(sockdir)
    try:
        monkeypatch.setattr(cri, "CRI_SOCKETS", (os.path.join(sockdir, "absent.sock"), server.path))
        auto = build_attributor(_args(), "n")
        assert auto.statuses() == {"cri": True}
        auto.close()
        off = build_attributor(_args(cri_socket="off"), "n")
        assert off.statuses() == {} and off.fallback is None  # type: ignore[attr-defined]
        off.close()
        monkeypatch.setattr(cri, "CRI_SOCKETS", (os.path.join(sockdir, "absent.sock"),))
        nothing = build_attributor(_args(), "n")
        assert nothing.statuses() == {}
        nothing.close()
    finally:
        server.stop()

    # A socket that serves no CRI (Docker's containerd): auto quietly turns the fallback off.
    other = tempfile.mkdtemp(prefix="l9gpu-cri-")
    not_cri = FakeRuntime(other, serve_cri=False)
    try:
        monkeypatch.setattr(cri, "CRI_SOCKETS", (not_cri.path,))
        with caplog.at_level(logging.INFO):
            quiet = build_attributor(_args(), "n")
        assert quiet.statuses() == {}
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        quiet.close()
        # Asked for by path, the same socket is reported as unhealthy instead.
        explicit = build_attributor(_args(cri_socket=not_cri.path), "n")
        assert explicit.statuses() == {"cri": False}
        explicit.close()
    finally:
        not_cri.stop()
        shutil.rmtree(other, ignore_errors=True)


def test_without_grpcio_the_fallback_is_off_with_one_warning(monkeypatch, runtime: FakeRuntime, caplog) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "grpc", None)  # as if not installed
    with caplog.at_level(logging.WARNING):
        attributor = build_attributor(_args(cri_socket=runtime.path), "n")
    assert attributor.statuses() == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "grpc" in warnings[0] and "'.[k8s]'" in warnings[0]
    attributor.close()


def test_scraped_series_carry_cri_names_and_the_cri_collector_health(tmp_path: Path, runtime: FakeRuntime) -> None:
    """Through the real collector and renderer, with the NVML fake reporting a fixture PID."""
    pynvml_fake = pytest.importorskip("fakes.pynvml_fake", reason="the NVML fake is not available")
    nvml = pytest.importorskip("exporter.devices.nvml", reason="the NVML backend is not available")
    from agent import parse_metrics, pick
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.collect.collector import Collector
    from exporter.output.render import SnapshotCollector

    runtime.containers = [container(CID, UID, "notebook-0", "research", "jupyter")]
    write_proc(tmp_path, 4242, cgroup_line(UID, CID))
    fake = pynvml_fake.FakeNvml(gpus=[pynvml_fake.FakeGpu(processes=[
        pynvml_fake.FakeProcess(pid=4242, used_memory=2**30)])])
    backend = nvml.NvmlBackend(nvml=fake)
    backend.open()
    attributor = build_attributor(_args(proc_root=str(tmp_path), cri_socket=runtime.path), "node-a")
    collector = Collector([backend], "node-a", interval=1.0, attributor=attributor)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, None))

    def scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
        collector.collect_once()
        return parse_metrics(generate_latest(registry).decode())

    try:
        m = scrape()
        assert pick(m, "container_gpu_memory_used_bytes", namespace="research", pod="notebook-0",
                    container="jupyter", pod_uid=UID) == [2**30]
        assert pick(m, "l9gpu_collector_success", collector="cri") == [1.0]
        runtime.stop()  # the runtime goes away: names stay, health says so
        attributor.fallback.refresh()  # type: ignore[attr-defined]
        m = scrape()
        assert pick(m, "l9gpu_collector_success", collector="cri") == [0.0]
        assert pick(m, "container_gpu_memory_used_bytes", pod="notebook-0") == [2**30]
    finally:
        attributor.close()
        backend.close()
