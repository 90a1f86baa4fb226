"""The training job and rank of each workload, from pods shaped like each scheduler's.

The pods below carry the labels and annotations each scheduler's controller writes (keys
confirmed against the schedulers' own source, see exporter/attribution/training.py). They
are read as the agent reads them on a node: listed and watched through the real
``kubernetes`` client from a local API server, joined to real processes in real pod
cgroups (and a Slurm task with its environment in a Slurm-shaped cgroup) on a faked NVML,
and rendered: the native and DCGM series, the snapshot JSON and table, the page, an
incident and the Kubernetes Event it posts. A pod of no job carries neither label.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from exporter.attribution import training
from exporter.attribution.cri import pods_from_containers
from exporter.attribution.procfs import parse_environ
from exporter.core.model import Workload
from exporter.output.spec import otel_attribute


class SchedulerPod(NamedTuple):
    scheduler: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    owner: tuple[str, str]
    job: str
    rank: str


JOBSET_TRAINER = {"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/replicatedjob-name": "node",
                  "jobset.sigs.k8s.io/job-index": "0", "jobset.sigs.k8s.io/job-global-index": "0",
                  "jobset.sigs.k8s.io/replicatedjob-replicas": "1", "batch.kubernetes.io/job-completion-index": "1"}
JOBSET_MNIST = {"jobset.sigs.k8s.io/jobset-name": "mnist", "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                "jobset.sigs.k8s.io/job-index": "1", "jobset.sigs.k8s.io/job-global-index": "1",
                "jobset.sigs.k8s.io/replicatedjob-replicas": "2", "batch.kubernetes.io/job-completion-index": "0"}

PODS = [
    # Kubeflow Trainer v2: a TrainJob's JobSet, its pods labelled with the TrainJob as well.
    SchedulerPod("trainer", "llama-node-0-1-x7k2p",
                 {"trainer.kubeflow.org/trainjob-name": "llama", "trainer.kubeflow.org/trainjob-ancestor-step": "trainer",
                  **JOBSET_TRAINER, "batch.kubernetes.io/job-name": "llama-node-0", "job-name": "llama-node-0",
                  "batch.kubernetes.io/controller-uid": "c0ffee00-0000-4000-8000-000000000001"},
                 {**JOBSET_TRAINER}, ("Job", "llama-node-0"), "llama", "node-0-1"),
    # Kubeflow training-operator: a PyTorchJob's worker 2 (pod bert-worker-2).
    SchedulerPod("training-operator", "bert-worker-2",
                 {"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/operator-name": "pytorchjob-controller",
                  "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "2"},
                 {}, ("PyTorchJob", "bert"), "bert", "worker-2"),
    # JobSet: replicated job "workers", its second Job, completion index 0.
    SchedulerPod("jobset", "mnist-workers-1-0-4bq9d",
                 {**JOBSET_MNIST, "batch.kubernetes.io/job-name": "mnist-workers-1"},
                 {**JOBSET_MNIST}, ("Job", "mnist-workers-1"), "mnist", "workers-1-0"),
    # Volcano, a release that writes the task index as an annotation only.
    SchedulerPod("volcano", "gpt-worker-3",
                 {"volcano.sh/job-name": "gpt", "volcano.sh/job-namespace": "ml", "volcano.sh/queue-name": "default",
                  "volcano.sh/task-spec": "worker"},
                 {"volcano.sh/job-name": "gpt", "volcano.sh/task-spec": "worker", "volcano.sh/task-index": "3",
                  "volcano.sh/queue-name": "default", "scheduling.k8s.io/group-name": "gpt-6f1c2a4e"},
                 ("Job", "gpt"), "gpt", "worker-3"),
    # LeaderWorkerSet: group 2, worker 1 (pod vllm-2-1).
    SchedulerPod("leaderworkerset", "vllm-2-1",
                 {"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/group-index": "2",
                  "leaderworkerset.sigs.k8s.io/worker-index": "1",
                  "leaderworkerset.sigs.k8s.io/template-revision-hash": "5c7d9f"},
                 {"leaderworkerset.sigs.k8s.io/size": "4"}, ("StatefulSet", "vllm-2"), "vllm", "2-1"),
    # KubeRay: a worker of a RayJob's cluster; Ray puts no rank on its pods.
    SchedulerPod("kuberay", "rl-raycluster-h2x9k-gpu-group-worker-8zq4w",
                 {"ray.io/cluster": "rl-raycluster-h2x9k", "ray.io/node-type": "worker", "ray.io/group": "gpu-group",
                  "ray.io/is-ray-node": "yes"},
                 {}, ("RayCluster", "rl-raycluster-h2x9k"), "rl-raycluster-h2x9k", ""),
    # A Deployment's pod: no job.
    SchedulerPod("none", "chat-7d9f8-abcde", {"app": "chat", "pod-template-hash": "7d9f8"}, {},
                 ("ReplicaSet", "chat-7d9f8"), "", ""),
]


@pytest.mark.parametrize("pod", PODS, ids=[p.scheduler for p in PODS])
def test_each_schedulers_pod_names_its_job_and_rank(pod: SchedulerPod) -> None:
    assert training.from_pod(pod.labels, pod.annotations) == (pod.job, pod.rank)


def test_volcano_releases_that_label_the_task_index_read_the_same() -> None:
    labels = {"volcano.sh/job-name": "gpt", "volcano.sh/task-spec": "worker", "volcano.sh/task-index": "3"}
    assert training.from_pod(labels, {}) == ("gpt", "worker-3")


def test_an_indexed_job_is_a_job_whose_completion_index_is_the_rank() -> None:
    labels = {"batch.kubernetes.io/job-name": "ddp", "job-name": "ddp", "batch.kubernetes.io/job-completion-index": "3"}
    assert training.from_pod(labels, {}) == ("ddp", "3")
    # before Kubernetes 1.28 the index is an annotation only
    assert training.from_pod({"job-name": "ddp"}, {"batch.kubernetes.io/job-completion-index": "3"}) == ("ddp", "3")
    # a Job that is not indexed (a CronJob's run) is no training job
    assert training.from_pod({"batch.kubernetes.io/job-name": "nightly-28571520"}, {}) == ("", "")


def test_a_pytorchjob_master_and_a_job_without_indices() -> None:
    assert training.from_pod({"training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type": "Master",
                              "training.kubeflow.org/replica-index": "0"}) == ("bert", "master-0")
    assert training.from_pod({"training.kubeflow.org/job-name": "bert"}) == ("bert", "")


def test_an_annotation_of_any_length_is_cut_and_a_rank_never_stands_without_its_job() -> None:
    job, rank = training.from_pod({"volcano.sh/job-name": "gpt"}, {"volcano.sh/task-index": "9" * 10_000})
    assert job == "gpt" and len(rank) == 253
    assert training.from_pod({"volcano.sh/task-index": "3", "leaderworkerset.sigs.k8s.io/worker-index": "1"}) == ("", "")


def test_slurm_rank_is_the_tasks_procid_from_the_allow_listed_environment() -> None:
    env = parse_environ(b"SLURM_JOB_ID=4242\0SLURM_PROCID=13\0SLURM_NODEID=1\0RANK=13\0WANDB_API_KEY=secret\0")
    assert env == {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "13"}  # nothing else is kept
    assert training.from_slurm("4242", env) == ("4242", "13")
    assert training.from_slurm("4242", {}) == ("4242", "")
    assert training.from_slurm("", env) == ("", "")


def test_the_cri_fallback_sees_only_what_the_runtime_shows() -> None:
    api = pytest.importorskip("exporter.attribution.cri_api_pb2", reason="protobuf is not installed")
    kubelet = {"io.kubernetes.pod.name": "bert-worker-2", "io.kubernetes.pod.namespace": "ml",
               "io.kubernetes.pod.uid": "u-1", "io.kubernetes.container.name": "pytorch"}
    # the kubelet labels a container with its pod's identity, not with the pod's own labels
    [plain] = pods_from_containers([api.Container(id="a" * 64, labels=kubelet,
                                                  annotations={"io.kubernetes.container.restartCount": "0"})])
    assert (plain.name, plain.training_job, plain.training_rank) == ("bert-worker-2", "", "")
    # where a runtime hook copied the scheduler's keys onto the container, they are read
    copied = {**kubelet, "io.kubernetes.pod.uid": "u-2", "training.kubeflow.org/job-name": "bert",
              "training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "2"}
    [hooked] = pods_from_containers([api.Container(id="b" * 64, labels=copied)])
    assert (hooked.training_job, hooked.training_rank) == ("bert", "worker-2")


def test_the_otlp_bridge_names_them_like_semantic_conventions() -> None:
    assert otel_attribute("training_job") == "training.job.name"
    assert otel_attribute("training_rank") == "training.job.rank"


def test_the_event_text_names_the_job_and_rank_of_the_pod_it_is_on() -> None:
    from exporter.incidents.engine import Incident
    from exporter.incidents.messages import event_messages

    rank = Workload(kind="kubernetes", namespace="ml", pod="bert-worker-2", container="pytorch",
                    training_job="bert", training_rank="worker-2")
    plain = Workload(kind="kubernetes", namespace="ml", pod="chat-7d9f8-abcde", container="chat")
    incident = Incident(node="n", gpu=3, uuid="GPU-3", gpu_instance="", kind="xid", time=1.0, xid=79,
                        action="reboot_node", caused_by=(rank,), affected=(plain,), detail="", cause_known=True,
                        cause_basis="kernel_log")
    [(_, _, caused), (_, _, affected)] = event_messages(incident)
    assert "this container's process (job bert, rank worker-2) raised it" in caused
    assert "job" not in affected.split("held it")[0] and "rank" not in affected


# ---- on a node: the API server's pods, real processes in real cgroups, a faked NVML ----

NODE = "gpu-node-1"
GiB = 2**30


def _node_parts():
    """What the node test needs, or a skip with the reason."""
    pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
    from cgroup_helpers import cgroup2_unwritable

    if cgroup2_unwritable():
        pytest.skip(cgroup2_unwritable())
    fake = pytest.importorskip("fakes.pynvml_fake", reason="the NVML fake is not available")
    nvml = pytest.importorskip("exporter.devices.nvml", reason="the NVML backend is not available")
    return fake, nvml


def _samples(text: str, name: str) -> list[dict[str, str]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def _xid_line(pid: int, seq: int) -> str:
    at = time.monotonic()  # the kernel log's clock: seconds since boot
    return (f"3,{seq},{int(at * 1e6)},-;NVRM: Xid (PCI:0000:3b:00): 31, pid={pid}, name=python3, Ch 00000008, "
            "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1e_00000000\n")


def test_every_schedulers_job_reaches_the_series_the_snapshot_the_page_and_the_event(tmp_path: Path, cgroups,
                                                                                      apiserver) -> None:
    import functools

    from cgroup_helpers import burstable_scope, container_id, kubeconfig, pod_uid
    from fakes.kubernetes_apiserver import make_pod
    from prometheus_client.exposition import generate_latest
    from waiting import wait_until

    from exporter.app.snapshot_cmd import format_table
    from exporter.app.wiring import build_registry
    from exporter.attribution import build_attributor
    from exporter.collect.collector import Collector
    from exporter.core.labels import label_schema
    from exporter.incidents.engine import IncidentConfig, IncidentTracker
    from exporter.incidents.events import EventSink, default_api_factory
    from exporter.incidents.kmsg import KernelLog
    from exporter.incidents.watch import IncidentWatch
    from exporter.output import catalogue as cat
    from exporter.output.dcgm.fields import default_selection
    from exporter.output.encode import Encoder
    from exporter.output.snapshot_json import snapshot_document
    from exporter.web.page import render_main

    F, nvml = _node_parts()
    procs: dict[str, int] = {}
    for pod in PODS:
        uid, cid = pod_uid(), container_id()
        procs[pod.scheduler] = cgroups.spawn(burstable_scope(uid, cid)).pid
        apiserver.add(make_pod(pod.name, "ml", uid, NODE, {"main": cid}, labels=pod.labels, owner=pod.owner,
                               annotations=pod.annotations))
    # srun's task 13 of job 4242 on this node, with the environment srun gives it
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_ID": "4242", "SLURM_PROCID": "13",
           "SLURM_NODEID": "1", "SLURM_LOCALID": "5", "RANK": "13", "WANDB_API_KEY": "never-exported"}
    task = subprocess.Popen(["sleep", "600"], env=env)
    cgroups.adopt(task, "system.slice/slurmstepd.scope/job_4242/step_0/user/task_5")
    procs["slurm"] = task.pid

    gpus = [F.FakeGpu(processes=[F.FakeProcess(pid=pid, used_memory=GiB)]) for pid in procs.values()]
    for gpu in gpus:
        gpu.bus_id = "00000000:3B:00.0"
    backend = nvml.NvmlBackend(nvml=F.FakeNvml(gpus=gpus), energy_counter_period=0)
    backend.open()
    args = argparse.Namespace(proc_root="/proc", kubernetes="on", kubeconfig=kubeconfig(tmp_path, apiserver),
                              pod_label=[])
    attributor = build_attributor(args, NODE)
    names, labeller = label_schema([])
    collector = Collector([backend], NODE, interval=1.0, attributor=attributor, labeller=labeller,
                          clock=time.monotonic)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    sink = EventSink(functools.partial(default_api_factory, kubeconfig(tmp_path, apiserver)), NODE)
    watch = IncidentWatch(NODE, labeller, names, kernel_log=KernelLog(str(kmsg)), events=sink,
                          tracker=IncidentTracker(NODE, IncidentConfig(xid_hold=0.0, clock_margin=0.0)))
    try:
        wait_until(lambda: len(attributor.pod_source.index) == len(PODS), what="the pods listed")
        snap = collector.collect_once()
        watch.observe(snap)
        everything = frozenset(spec.name for spec in cat.METRICS)
        text = Encoder(generate_latest).encode(build_registry(lambda: snap, everything, names).collect()).decode()

        # native workload series: the job and rank of each scheduler's pod, neither label for no job
        series = {s["pod"] or s["slurm_job_id"]: s for s in _samples(text, "container_gpu_memory_used_bytes")}
        assert len(series) == len(PODS) + 1
        for pod in PODS:
            labels = series[pod.name]
            assert (labels.get("training_job"), labels.get("training_rank")) == (pod.job or None, pod.rank or None)
        assert (series["4242"]["training_job"], series["4242"]["training_rank"]) == ("4242", "13")
        try:  # the OTLP bridge's attributes (where the OpenTelemetry SDK is installed)
            from bridge import convert
        except ImportError:
            convert = None
        if convert is not None:
            otlp = convert.attributes(series["bert-worker-2"])
            assert (otlp["training.job.name"], otlp["training.job.rank"]) == ("bert", "worker-2")
            assert not any(key.startswith("training.") for key in convert.attributes(series["chat-7d9f8-abcde"]))
        plain = [line for line in text.splitlines() if 'pod="chat-7d9f8-abcde"' in line]
        assert plain and not any("training_" in line for line in plain)  # absent, not empty
        ray = [line for line in text.splitlines() if 'pod="rl-raycluster' in line]
        assert ray and all('training_job="rl-raycluster-h2x9k"' in line and "training_rank" not in line
                           for line in ray)
        # per-process series too
        by_pid = {s["pid"]: s for s in _samples(text, "gpu_process_memory_used_bytes")}
        assert by_pid[str(procs["slurm"])]["training_rank"] == "13"
        assert "training_job" not in by_pid[str(procs["none"])]

        # the DCGM schema's per-pod series
        dcgm = Encoder(generate_latest).encode(
            build_registry(lambda: snap, frozenset(), (), default_selection()).collect()).decode()
        pods = {s["pod"]: s for s in _samples(dcgm, "DCGM_FI_DEV_FB_USED") if s.get("pod")}
        assert pods["bert-worker-2"]["training_rank"] == "worker-2" and "training_job" not in pods["chat-7d9f8-abcde"]

        # the snapshot JSON, the table and the page
        doc = snapshot_document(snap, names)
        entries = {w["pod"] or w["slurm_job_id"]: w for g in doc["gpus"] for w in g["workloads"]}
        assert (entries["gpt-worker-3"]["training_job"], entries["gpt-worker-3"]["training_rank"]) == ("gpt", "worker-3")
        assert entries["gpt-worker-3"]["owner"] == "ml/gpt-worker-3/main (job gpt, rank worker-3)"
        assert entries["4242"]["owner"].startswith("slurm job 4242 step 0 rank 13")
        assert entries["chat-7d9f8-abcde"]["training_job"] == "" and "job" not in entries["chat-7d9f8-abcde"]["owner"]
        table = format_table(snap)
        assert "ml/vllm-2-1/main (job vllm, rank 2-1)" in table
        assert "(job <b>llama</b>, rank <b>node-0-1</b>)" in render_main(doc)

        # an Xid raised by the Volcano rank: its incident and the Event on its pod
        with kmsg.open("a") as f:
            f.write(_xid_line(procs["volcano"], 1))
        watch.observe(collector.collect_once())
        [incident] = watch.recent_json()
        assert [(w["training_job"], w["training_rank"]) for w in incident["caused_by"]] == [("gpt", "worker-3")]
        event = wait_until(lambda: next((e for e in apiserver.core_events.values()
                                         if e["involvedObject"]["name"] == "gpt-worker-3"), None),
                           what="the Event on the Volcano rank's pod")
        assert "this container's process (job gpt, rank worker-3) raised it" in event["message"]
        assert event["reason"] == "GPUFaultCaused"
    finally:
        sink.close(timeout=5.0)
        watch.close()
        attributor.close()
        backend.close()
