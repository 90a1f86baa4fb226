"""AMD GPUs through the attribution path: real processes in real cgroups, a stand-in amdsmi.

The amdsmi stand-in (fakes/amdsmi_fake) reports the real PIDs of three child processes:
one in a Kubernetes pod's cgroup, one in a Slurm step's cgroup, one in a host login
session's cgroup. The real `ProcAttributor` (built from the CLI flags by
`build_attributor`) reads their /proc/<pid>/cgroup files and joins the pod with a local
API server (fakes.kubernetes_apiserver); the real `Collector` derives the counters and
`render` turns the snapshot into Prometheus text. So the PID -> cgroup -> pod path runs
unchanged for AMD, with per-process VRAM and GFX engine time, and the per-GPU memory and
energy add up. Skips with the reason where cgroups cannot be created (not root, no
writable cgroup2 mount) or the kubernetes client is missing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cgroup_helpers import (
    Cgroups,
    burstable_scope,
    cgroup2_unwritable,
    container_id,
    kubeconfig,
    pod_uid,
)
from fakes.amdsmi_fake import FakeAmdSmi, FakeGpu, FakeProcess
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.attribution import build_attributor
from exporter.collect.collector import Collector
from exporter.core.labels import label_schema
from exporter.devices.amd.backend import AmdBackend
from exporter.output import catalogue as cat
from exporter.output.render import SnapshotCollector

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
pytestmark = pytest.mark.skipif(bool(cgroup2_unwritable()), reason=cgroup2_unwritable() or "ok")

from fakes.kubernetes_apiserver import FakeApiServer, make_pod  # noqa: E402

GiB = 2**30
NODE = "mi300-node-1"
JOB = "4242"
RESOLUTION_UJ = 15.3  # the fake's energy counter resolution, microjoules per tick


Samples = dict[str, list[tuple[dict[str, str], float]]]


def _render(collector: Collector, extra: tuple[str, ...]) -> Samples:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, cat.enabled_names(detail=True), extra))
    out: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _values(samples: Samples, name: str, **labels: str) -> list[float]:
    return [v for lab, v in samples.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]


def _value(samples: Samples, name: str, **labels: str) -> float:
    hits = _values(samples, name, **labels)
    assert len(hits) == 1, (name, labels, samples.get(name))
    return hits[0]


@pytest.mark.parametrize("process_api", ["dicts", "handles"])
def test_amd_processes_attributed_to_pod_and_slurm_job(tmp_path: Path, cgroups: Cgroups,
                                                       apiserver: FakeApiServer, process_api: str) -> None:
    uid, cid = pod_uid(), container_id()
    pod_proc = cgroups.spawn(burstable_scope(uid, cid))
    job_proc = cgroups.spawn(f"system.slice/slurmstepd.scope/job_{JOB}/step_0/user/task_0")
    host_proc = cgroups.spawn("user.slice/user-0.slice/session-3.scope")  # a host login session
    apiserver.add(make_pod("llm-serve-6b7c8d9f5-q4w2e", "inference", uid, NODE, {"vllm": cid},
                           labels={"team": "llm", "pod-template-hash": "6b7c8d9f5"},
                           owner=("ReplicaSet", "llm-serve-6b7c8d9f5")))

    vram = {pod_proc.pid: 6 * GiB, job_proc.pid: 10 * GiB, host_proc.pid: 1 * GiB}
    procs = {pid: FakeProcess(pid=pid, vram_bytes=b, gfx_ns=1_000_000_000) for pid, b in vram.items()}
    gpu = FakeGpu(vram_used_bytes=sum(vram.values()) + GiB, processes=list(procs.values()))
    backend = AmdBackend(amdsmi=FakeAmdSmi([gpu], process_api=process_api))
    backend.open()
    args = argparse.Namespace(proc_root="/proc", kubernetes="on", kubeconfig=kubeconfig(tmp_path, apiserver),
                              pod_label=["team"])
    attributor = build_attributor(args, NODE, wait_for_pods=30.0)  # names from the first pass on
    extra, labeller = label_schema(["team"])
    clock = [1000.0]
    collector = Collector([backend], NODE, interval=10.0, attributor=attributor, labeller=labeller,
                          clock=lambda: clock[0])
    pod = {"namespace": "inference", "pod": "llm-serve-6b7c8d9f5-q4w2e", "container": "vllm", "pod_uid": uid,
           "owner_kind": "Deployment", "owner_name": "llm-serve", "label_team": "llm", "slurm_job_id": "",
           "gpu": "0", "uuid": gpu.uuid, "node": NODE}
    job = {"slurm_job_id": JOB, "pod": "", "pod_uid": "", "namespace": "", "gpu": "0"}
    try:
        collector.collect_once()
        first = _render(collector, extra)
        # First sight: memory is known, GFX shares are not yet (no interval): omitted, not 0.
        assert _value(first, "container_gpu_memory_used_bytes", **pod) == 6 * GiB
        assert first.get("container_gpu_utilization_ratio", []) == []

        # Ten seconds later: engine time grew by 2.5 s (pod), 5 s (job), 0.5 s (host).
        clock[0] += 10.0
        for pid, seconds in ((pod_proc.pid, 2.5), (job_proc.pid, 5.0), (host_proc.pid, 0.5)):
            procs[pid].gfx_ns += int(seconds * 1e9)
        ticks = 100_000_000  # 1530 J at 15.3 µJ per tick
        gpu.energy_ticks += ticks
        collector.collect_once()
        m = _render(collector, extra)

        assert _value(m, "container_gpu_memory_used_bytes", **pod) == vram[pod_proc.pid]
        assert _value(m, "container_gpu_utilization_ratio", **pod) == pytest.approx(0.25)
        assert _value(m, "container_gpu_usage_seconds_total", **pod) == pytest.approx(2.5)
        assert _value(m, "container_gpu_processes", **pod) == 1.0
        assert _value(m, "container_gpu_memory_used_bytes", **job) == vram[job_proc.pid]
        assert _value(m, "container_gpu_utilization_ratio", **job) == pytest.approx(0.5)
        assert _value(m, "gpu_unattributed_memory_used_bytes", gpu="0") == vram[host_proc.pid]
        assert _value(m, "l9gpu_unattributed_processes", node=NODE) == 1.0
        assert _value(m, "l9gpu_collector_success", collector="kubernetes") == 1.0
        assert _value(m, "gpu_info", gpu="0", vendor="amd") == 1.0

        # Conservation on the GPU: workloads plus the unattributed part are the whole.
        workload_memory = sum(_values(m, "container_gpu_memory_used_bytes", gpu="0"))
        assert workload_memory + _value(m, "gpu_unattributed_memory_used_bytes", gpu="0") == sum(vram.values())
        delta = _value(m, "gpu_energy_joules_total", gpu="0") - _value(first, "gpu_energy_joules_total", gpu="0")
        assert delta == pytest.approx(ticks * RESOLUTION_UJ / 1e6)
        workload_energy = sum(_values(m, "container_gpu_energy_joules_total", gpu="0"))
        assert workload_energy + _value(m, "gpu_unattributed_energy_joules_total", gpu="0") == pytest.approx(delta)
        # Busy 0.8 of it split by GFX share, idle 0.2 by VRAM (6:10:1).
        assert _value(m, "container_gpu_energy_joules_total", **pod) == pytest.approx(
            delta * 0.25 + delta * 0.2 * 6 / 17)
    finally:
        attributor.close()
        backend.close()
