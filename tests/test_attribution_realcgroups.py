"""Real processes in real cgroups, a faked NVML reporting their real PIDs, and a local API server.

As root, the test creates Kubernetes- and Slurm-shaped cgroups under the cgroup2 mount at
/sys/fs/cgroup/unified (inside one throwaway parent, so a real node's hierarchy is never
touched), starts ``sleep`` children and moves them in. The agent's own collector then
reads /proc, parses the real cgroup files, lists and watches pods from a local HTTP
server speaking the Kubernetes protocol (with a dropped stream and a 410 Gone along the
way), and renders /metrics. Every cgroup and child is removed afterwards, even on failure.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")

from cgroup_helpers import (  # noqa: E402
    Cgroups,
    cgroup2_unwritable,
    container_id,
    kubeconfig,
    pod_uid,
    spawn_with_pid,
)
from fakes.kubernetes_apiserver import FakeApiServer, make_pod  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from waiting import wait_until, within  # noqa: E402

from exporter.attribution import build_attributor  # noqa: E402
from exporter.collect.collector import Collector  # noqa: E402
from exporter.core.labels import label_schema  # noqa: E402
from exporter.output import catalogue as cat  # noqa: E402
from exporter.output.render import SnapshotCollector  # noqa: E402

pynvml_fake = pytest.importorskip("fakes.pynvml_fake", reason="the NVML fake is not available")
nvml_backend = pytest.importorskip("exporter.devices.nvml", reason="the NVML backend is not available")

GiB = 2**30
NODE = "gpu-node-1"

pytestmark = pytest.mark.skipif(bool(cgroup2_unwritable()), reason=cgroup2_unwritable() or "ok")


def _scrape(collector: Collector, extra: tuple[str, ...]) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, cat.enabled_names(detail=True), extra))
    text = generate_latest(registry).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def _value(metrics, name: str, **labels: str) -> float:
    hits = [v for lab, v in metrics.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, metrics.get(name))
    return hits[0]


def test_pods_and_slurm_in_real_cgroups(tmp_path: Path, cgroups: Cgroups, apiserver: FakeApiServer, caplog) -> None:
    F = pynvml_fake
    uid_a, uid_b, uid_c = pod_uid(), pod_uid(), pod_uid()
    cid_a, cid_b, cid_c = container_id(), container_id(), container_id()
    ua, ub, uc = (u.replace("-", "_") for u in (uid_a, uid_b, uid_c))
    # Three pods time-sliced on GPU 0, in three different cgroup layouts.
    a = cgroups.spawn(f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{ua}.slice/"
                      f"cri-containerd-{cid_a}.scope")
    b = cgroups.spawn(f"kubepods/besteffort/pod{uid_b}/crio-{cid_b}")
    c = cgroups.spawn(f"kubepods.slice/kubepods-pod{uc}.slice/cri-containerd-{cid_c}.scope")
    slurm = cgroups.spawn("system.slice/slurmstepd.scope/job_77/step_0/user/task_0")
    host_pid = os.getpid()  # the test runner itself: a host process holding GPU memory
    assert f"cri-containerd-{cid_a}.scope" in Path(f"/proc/{a.pid}/cgroup").read_text()

    apiserver.add(make_pod("embedder-7c9f5-abcde", "search", uid_a, NODE, {"embedder": cid_a},
                           labels={"team": "search", "pod-template-hash": "7c9f5"},
                           owner=("ReplicaSet", "embedder-7c9f5")))
    apiserver.add(make_pod("reranker-0", "search", uid_b, NODE, {"reranker": cid_b}, labels={"team": "ranking"},
                           owner=("StatefulSet", "reranker")))
    apiserver.add(make_pod("elsewhere", "search", pod_uid(), "gpu-node-2", {"x": container_id()}))

    gpu0 = F.FakeGpu(energy_mj=1_000_000, processes=[
        F.FakeProcess(pid=a.pid, used_memory=1 * GiB), F.FakeProcess(pid=b.pid, used_memory=2 * GiB),
        F.FakeProcess(pid=c.pid, used_memory=3 * GiB), F.FakeProcess(pid=host_pid, used_memory=GiB // 2)])
    gpu1 = F.FakeGpu(energy_mj=5_000_000, processes=[F.FakeProcess(pid=slurm.pid, used_memory=4 * GiB)])
    fake = F.FakeNvml(gpus=[gpu0, gpu1])
    # The energy counter every pass: this test sets exact per-pass energy deltas.
    backend = nvml_backend.NvmlBackend(nvml=fake, energy_counter_period=0)
    backend.open()

    args = argparse.Namespace(proc_root="/proc", kubernetes="on", kubeconfig=kubeconfig(tmp_path, apiserver),
                              pod_label=["team"])
    attributor = build_attributor(args, NODE)
    attributor.pod_source.backoff = (0.05, 0.2)
    # the first list runs in the watch thread (start-up never waits on the API server)
    wait_until(lambda: attributor.pod_source.index.get(uid_a) is not None, what="the first pod list")
    extra, labeller = label_schema(["team"])
    clock = [100.0]
    collector = Collector([backend], NODE, interval=1.0, attributor=attributor, labeller=labeller,
                          clock=lambda: clock[0])
    stamp = [1_000_000]

    def run_pass(seconds: float, sm: dict[int, int], joules: dict[int, float]) -> dict:
        clock[0] += seconds
        stamp[0] += int(seconds * 1e6)
        for index, gpu in enumerate(fake.gpus):
            gpu.energy_mj += int(joules.get(index, 0.0) * 1000)
            pids = [p.pid for p in gpu.processes]
            fake.add_util_samples(index, [F.FakeUtilSample(pid, stamp[0], sm=sm.get(pid, 0)) for pid in pids])
            # The device's utilisation, as the driver reads the same activity (a GPU held
            # by one owner is not asked for its per-process samples).
            gpu.utilization_gpu = min(100, sum(sm.get(pid, 0) for pid in pids))
        collector.collect_once()
        return _scrape(collector, extra)

    try:
        run_pass(0, {}, {})
        m = run_pass(10, {a.pid: 10, b.pid: 30, c.pid: 50, slurm.pid: 80}, {0: 1000.0, 1: 2000.0})
        # Exact per-container values on the time-sliced GPU: each pod its own honest share.
        assert _value(m, "container_gpu_utilization_ratio", pod="embedder-7c9f5-abcde", container="embedder",
                      namespace="search", owner_kind="Deployment", owner_name="embedder", label_team="search",
                      pod_uid=uid_a, gpu="0") == pytest.approx(0.10)
        assert _value(m, "container_gpu_utilization_ratio", pod="reranker-0", container="reranker",
                      owner_kind="StatefulSet", label_team="ranking") == pytest.approx(0.30)
        # Pod C is not in the API yet: its series carry the pod UID from the cgroup path.
        assert _value(m, "container_gpu_utilization_ratio", pod_uid=uid_c, pod="", container="") == pytest.approx(0.5)
        assert _value(m, "container_gpu_memory_used_bytes", pod="embedder-7c9f5-abcde") == 1 * GiB
        assert _value(m, "container_gpu_memory_used_bytes", pod="reranker-0") == 2 * GiB
        assert _value(m, "container_gpu_memory_used_bytes", pod_uid=uid_c) == 3 * GiB
        assert _value(m, "gpu_unattributed_memory_used_bytes", gpu="0") == GiB // 2
        # Energy: busy 0.9 of 1000 J split 1:3:5 by SM; idle 100 J split by memory (1:2:3:0.5 of 6.5).
        idle = 100.0 / 6.5
        assert _value(m, "container_gpu_energy_joules_total", pod="embedder-7c9f5-abcde") == pytest.approx(100 + idle)
        assert _value(m, "container_gpu_energy_joules_total", pod="reranker-0") == pytest.approx(300 + 2 * idle)
        assert _value(m, "container_gpu_energy_joules_total", pod_uid=uid_c) == pytest.approx(500 + 3 * idle)
        assert _value(m, "gpu_unattributed_energy_joules_total", gpu="0") == pytest.approx(0.5 * idle)
        workload_energy = sum(v for lab, v in m["container_gpu_energy_joules_total"] if lab["gpu"] == "0")
        assert workload_energy + _value(m, "gpu_unattributed_energy_joules_total", gpu="0") == pytest.approx(1000.0)
        assert _value(m, "container_gpu_usage_seconds_total", pod="reranker-0") == pytest.approx(3.0)
        # The Slurm step on GPU 1.
        assert _value(m, "container_gpu_utilization_ratio", slurm_job_id="77", gpu="1") == pytest.approx(0.8)
        assert _value(m, "container_gpu_energy_joules_total", slurm_job_id="77") == pytest.approx(2000.0)
        assert _value(m, "l9gpu_host_pids_visible", node=NODE) == 1.0
        assert _value(m, "l9gpu_collector_success", collector="kubernetes") == 1.0
        assert _value(m, "l9gpu_unattributed_processes", node=NODE) == 1.0

        # A dropped stream and an expired resourceVersion (410 Gone), then pod C appears:
        # labelled within one interval of the watch event.
        lists = apiserver.count("list")
        apiserver.drop_watches()
        apiserver.expire()
        wait_until(lambda: apiserver.count("list") > lists, what="a relist after 410 Gone")
        wait_until(lambda: apiserver.count("watch") >= 3, what="the watch resumed")
        apiserver.add(make_pod("ocr-worker-0", "docs", uid_c, NODE, {"ocr": cid_c}, labels={"team": "docs"}))
        wait_until(lambda: attributor.index.get(uid_c) is not None, what="pod C from the watch")
        m = run_pass(1, {a.pid: 10, b.pid: 30, c.pid: 50}, {0: 100.0})
        assert _value(m, "container_gpu_memory_used_bytes", pod="ocr-worker-0", container="ocr", namespace="docs",
                      label_team="docs") == 3 * GiB

        # API server down: names stay, the kubernetes collector reports the failure.
        apiserver.stop()
        wait_until(lambda: not attributor.pod_source.healthy(), within(attributor.pod_source.outage_bound),
                   "the watch unhealthy once the API server is down")
        m = run_pass(1, {a.pid: 10, b.pid: 30, c.pid: 50}, {0: 100.0})
        assert _value(m, "l9gpu_collector_success", collector="kubernetes") == 0.0
        assert _value(m, "container_gpu_memory_used_bytes", pod="embedder-7c9f5-abcde") == 1 * GiB
        apiserver.start()
        wait_until(lambda: attributor.pod_source.healthy(), what="the watch healthy again")
        m = run_pass(1, {a.pid: 10, b.pid: 30, c.pid: 50}, {0: 100.0})
        assert _value(m, "l9gpu_collector_success", collector="kubernetes") == 1.0

        # PID reuse: pod A's process exits and a new process gets the same PID number in
        # the Slurm job's cgroup. The new owner, never the old one.
        before_reuse = _value(m, "container_gpu_energy_joules_total", pod="embedder-7c9f5-abcde")
        old_pid = a.pid
        a.kill()
        a.wait()
        reused = spawn_with_pid(old_pid)
        if reused is None:
            pytest.skip("could not get the same PID again (ns_last_pid not writable or PID taken)")
        cgroups.children.append(reused)
        cgroups.move(reused.pid, "system.slice/slurmstepd.scope/job_78/step_batch/user/task_0")
        m = run_pass(1, {old_pid: 60, b.pid: 30, c.pid: 10}, {0: 100.0})
        assert _value(m, "container_gpu_memory_used_bytes", slurm_job_id="78", gpu="0") == 1 * GiB
        # Pod A's counters stay for the grace period (no gauges), with nothing added.
        assert not [v for lab, v in m["container_gpu_processes"] if lab["pod"] == "embedder-7c9f5-abcde"]
        assert _value(m, "container_gpu_energy_joules_total", pod="embedder-7c9f5-abcde") == pytest.approx(
            before_reuse, rel=1e-9)
        owners = {row.pid: row.workload for row in collector.snapshot.processes}
        assert owners[old_pid].kind == "slurm" and owners[old_pid].slurm_step == "batch"
    finally:
        attributor.close()
        backend.close()
    assert "Traceback" not in caplog.text

