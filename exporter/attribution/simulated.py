"""The simulated node's /proc and API server, so the demo runs the real attribution code.

`write_proc_tree` writes, for every scenario process, ``<root>/<pid>/cgroup`` (in the
formats real nodes use: systemd and cgroupfs drivers, containerd and CRI-O, cgroup v1
and v2, the ``kubelet-`` prefix of kind, Slurm v2), ``stat``, ``comm``, ``status`` and,
for Slurm steps, ``environ``. `scenario_pods` returns the pods as the Kubernetes API
would list them (UIDs, owner references, labels, container statuses with ids), which a
`StaticPodSource` puts into the same index the API watch fills. `scenario_allocations`
returns what the node's kubelet would list over pod-resources (each pod's container is
allocated the GPUs its processes run on, plus the scenario's ``allocations``: pods that
hold a GPU and run nothing), which a `podresources.StaticAllocationSource` serves to the
same join a real kubelet's list goes through. The attributor then reads that tree, that
index and those allocations exactly as it reads a real node.

Scenario ``workload`` mappings understood::

    workload: {namespace, pod, container, owner: {kind, name}, labels: {...}, qos}
    workload: {slurm: {job_id, step, user, uid, partition, account, rank}}
    workload: {systemd: ollama.service}
    workload: {host: true}            # or no workload at all: a host process
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

from exporter.attribution import training
from exporter.attribution.resolver import ProcAttributor
from exporter.core.model import Workload

if TYPE_CHECKING:
    from exporter.attribution.podresources import PodAllocation

_NAMESPACE = uuid.UUID("6f1d6c8e-2b1a-4d8e-9b7a-3c2d1e0f9a8b")

# Cgroup layouts the simulated pods cycle through, one per pod in scenario order.
LAYOUTS = ("v2-systemd-containerd", "v1-cgroupfs-crio", "v2-kind-containerd", "v2-cgroupfs-containerd",
           "v1-systemd-containerd", "v2-systemd-crio")


class ScenarioProcess(Protocol):
    """A scenario's process on one GPU, as its /proc entry and its pod are written."""

    @property
    def pid(self) -> int: ...
    @property
    def gpu(self) -> int: ...
    @property
    def name(self) -> str: ...  # its comm
    @property
    def workload(self) -> Mapping[str, Any]: ...  # the free-form mapping the module docstring lists


class ScenarioAllocation(Protocol):
    """A pod's container that holds GPUs through the device plugin and runs nothing there."""

    @property
    def gpus(self) -> Sequence[int]: ...
    @property
    def workload(self) -> Mapping[str, Any]: ...
    @property
    def resource(self) -> str: ...


class ScenarioGpu(Protocol):
    """A GPU of the simulated node, as the kubelet names it."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...


class SimulatedNode(Protocol):
    """What the simulated node's attribution reads of its scenario (the simulated backend's
    `exporter.devices.simulated.backend.Scenario`, handed over by the wiring)."""

    @property
    def processes(self) -> Sequence[ScenarioProcess]: ...
    @property
    def allocations(self) -> Sequence[ScenarioAllocation]: ...
    @property
    def gpus(self) -> Sequence[ScenarioGpu]: ...
    @property
    def replicas(self) -> Mapping[int, int]: ...  # GPU index -> its time-slicing replicas, where declared


def pod_uid(namespace: str, pod: str) -> str:
    """A stable pod UID for a simulated pod."""
    return str(uuid.uuid5(_NAMESPACE, f"{namespace}/{pod}"))


def container_id(namespace: str, pod: str, container: str) -> str:
    """A stable 64-hex container id for a simulated container."""
    return hashlib.sha256(f"{namespace}/{pod}/{container}".encode()).hexdigest()


def kubernetes_cgroup(layout: str, uid: str, cid: str, qos: str) -> str:
    """The text of /proc/<pid>/cgroup for a container in ``layout``."""
    u = uid.replace("-", "_")
    if qos == "guaranteed":
        slice_ = f"kubepods.slice/kubepods-pod{u}.slice"
        kind_slice = f"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{u}.slice"
        fs = f"kubepods/pod{uid}"
    else:
        slice_ = f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice"
        kind_slice = (f"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-{qos}.slice/"
                      f"kubelet-kubepods-{qos}-pod{u}.slice")
        fs = f"kubepods/{qos}/pod{uid}"
    if layout == "v2-systemd-containerd":
        return f"0::/{slice_}/cri-containerd-{cid}.scope\n"
    if layout == "v2-systemd-crio":
        return f"0::/{slice_}/crio-{cid}.scope\n"
    if layout == "v2-kind-containerd":
        return f"0::/{kind_slice}/cri-containerd-{cid}.scope\n"
    if layout == "v2-cgroupfs-containerd":
        return f"0::/{fs}/{cid}\n"
    path = f"/{fs}/crio-{cid}" if layout == "v1-cgroupfs-crio" else f"/{slice_}/cri-containerd-{cid}.scope"
    controllers = ["hugetlb", "memory", "cpu,cpuacct", "devices", "pids", "freezer", "cpuset", "blkio"]
    lines = [f"{12 - i}:{c}:{path}" for i, c in enumerate(controllers)]
    lines.append(f"1:name=systemd:{path}")
    lines.append("0::/")
    return "\n".join(lines) + "\n"


def _owner_reference(owner: Mapping[str, Any], pod: str) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """(ownerReference, extra pod labels) as the controllers would set them."""
    kind, name = str(owner.get("kind", "")), str(owner.get("name", ""))
    if not kind or not name:
        return None, {}
    extra: dict[str, str] = {}
    if kind == "Deployment":
        rest = pod[len(name) + 1:] if pod.startswith(name + "-") else ""
        template_hash = rest.split("-")[0] if "-" in rest else hashlib.sha256(pod.encode()).hexdigest()[:9]
        extra["pod-template-hash"] = template_hash
        kind, name = "ReplicaSet", f"{name}-{template_hash}"
    elif kind == "CronJob":
        kind, name = "Job", f"{name}-28571520"
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "controller": True,
            "uid": str(uuid.uuid5(_NAMESPACE, f"{kind}/{name}"))}, extra


def scenario_pods(processes: Iterable[ScenarioProcess], allocations: Iterable[ScenarioAllocation] = ()
                  ) -> list[dict[str, Any]]:
    """The scenario's pods as the API server lists them (JSON dicts).

    ``allocations`` (scenario `AllocationSpec`s) add the pods that run no process.
    """
    pods: dict[tuple[str, str], dict[str, Any]] = {}
    workloads = [p.workload for p in processes] + [a.workload for a in allocations]
    for w in workloads:
        if not w.get("pod"):
            continue
        namespace, name, container = str(w.get("namespace", "default")), str(w["pod"]), str(w.get("container", "main"))
        key = (namespace, name)
        if key not in pods:
            ref, extra = _owner_reference(w.get("owner") or {}, name)
            labels = {str(k): str(v) for k, v in (w.get("labels") or {}).items()}
            labels.update(extra)
            pods[key] = {
                "metadata": {"name": name, "namespace": namespace, "uid": pod_uid(namespace, name),
                             "labels": labels, "ownerReferences": [ref] if ref else [],
                             "resourceVersion": str(1000 + len(pods))},
                "spec": {"nodeName": "", "containers": []},
                "status": {"phase": "Running", "containerStatuses": []},
            }
        statuses = pods[key]["status"]["containerStatuses"]
        if not any(s["name"] == container for s in statuses):
            runtime = "cri-o" if "crio" in _layout_for(list(pods), key) else "containerd"
            statuses.append({"name": container, "ready": True,
                             "containerID": f"{runtime}://{container_id(namespace, name, container)}"})
            pods[key]["spec"]["containers"].append({"name": container})
    return list(pods.values())


def scenario_allocations(scenario: SimulatedNode) -> list[PodAllocation]:
    """What the simulated node's kubelet lists over pod-resources (`PodAllocation`s).

    Each pod's container is allocated the GPUs its processes run on, then come the
    scenario's ``allocations``. A GPU allocated to more than one container is shared by
    time-slicing, as the NVIDIA device plugin does it: each container gets a replica
    ``<uuid>::<n>``.
    """
    from exporter.attribution.podresources import PodAllocation

    wanted: dict[tuple[str, str, str, str], list[int]] = {}
    entries: list[tuple[Mapping[str, Any], tuple[int, ...], str]] = [
        (p.workload, (p.gpu,), "nvidia.com/gpu") for p in scenario.processes]
    entries += [(a.workload, tuple(a.gpus), a.resource) for a in scenario.allocations]
    for workload, gpus, resource in entries:
        if not workload.get("pod"):
            continue
        who = (str(workload.get("namespace", "default")), str(workload["pod"]),
               str(workload.get("container", "main")), resource)
        held = wanted.setdefault(who, [])
        held.extend(g for g in gpus if g not in held)
    replicas = _replicas(scenario, wanted.values())
    uuids = {g.index: g.uuid for g in scenario.gpus}
    replica: dict[int, int] = {}
    allocations = []
    for (namespace, pod, container, resource), held in wanted.items():
        for gpu in held:
            device_id = uuids[gpu]
            if gpu in replicas:
                n = replica.get(gpu, 0)
                if n >= replicas[gpu]:
                    continue  # more containers than replicas: the device plugin would not schedule it
                device_id += f"::{n}"
                replica[gpu] = n + 1
            allocations.append(PodAllocation(namespace, pod, container, resource, device_id))
    return allocations


def _replicas(scenario: SimulatedNode, held_lists: Iterable[list[int]]) -> dict[int, int]:
    """GPU index -> replicas: the scenario's ``time_slicing``, else one per sharing container."""
    declared = dict(scenario.replicas)
    if declared:
        return declared
    sharers: dict[int, int] = {}
    for held in held_lists:
        for gpu in held:
            sharers[gpu] = sharers.get(gpu, 0) + 1
    return {gpu: n for gpu, n in sharers.items() if n > 1}


def scenario_allocatable(scenario: SimulatedNode) -> list[tuple[str, str]]:
    """What the simulated kubelet answers to GetAllocatableResources: every GPU once, a
    time-sliced GPU once per replica (``<uuid>::0`` .. ``<uuid>::<N-1>``)."""
    allocations = scenario_allocations(scenario)
    shared: dict[str, int] = {}
    for allocation in allocations:
        base, _, n = allocation.device_id.partition("::")
        if n:
            shared[base] = shared.get(base, 0) + 1
    declared = dict(scenario.replicas)
    out = []
    for gpu in scenario.gpus:
        count = declared.get(gpu.index) or shared.get(gpu.uuid, 0)
        if count:
            out += [("nvidia.com/gpu", f"{gpu.uuid}::{n}") for n in range(count)]
        else:
            out.append(("nvidia.com/gpu", gpu.uuid))
    return out


def _layout_for(order: list[tuple[str, str]], key: tuple[str, str]) -> str:
    return LAYOUTS[order.index(key) % len(LAYOUTS)]


def _stat(pid: int, comm: str, start: int) -> str:
    # Fields 3-22 of proc(5) stat, starttime last; the rest are zeros.
    return f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 4 0 {start} 0 0 0 0 0 0 0\n"


def _status(comm: str, pid: int, uid: int) -> str:
    ids = "\t".join([str(uid)] * 4)
    return f"Name:\t{comm}\nState:\tS (sleeping)\nPid:\t{pid}\nUid:\t{ids}\nGid:\t{ids}\n"


def write_proc_tree(root: str, processes: Iterable[ScenarioProcess]) -> None:
    """Write a /proc-shaped tree for the scenario's processes under ``root``."""
    procs = list(processes)
    order: list[tuple[str, str]] = []
    for proc in procs:
        w = proc.workload
        if w.get("pod"):
            key = (str(w.get("namespace", "default")), str(w["pod"]))
            if key not in order:
                order.append(key)
    for proc in procs:
        w = proc.workload
        uid = 0
        environ = b""
        if w.get("pod"):
            namespace, name = str(w.get("namespace", "default")), str(w["pod"])
            layout = _layout_for(order, (namespace, name))
            qos = str(w.get("qos", "guaranteed" if order.index((namespace, name)) == 0 else "burstable"))
            cgroup = kubernetes_cgroup(layout, pod_uid(namespace, name),
                                       container_id(namespace, name, str(w.get("container", "main"))), qos)
            uid = 1000
        elif isinstance(w.get("slurm"), Mapping):
            s = w["slurm"]
            job, step = s.get("job_id", 1), s.get("step", 0)
            uid = int(s.get("uid", 1000))
            cgroup = f"0::/system.slice/slurmstepd.scope/job_{job}/step_{step}/user/task_0\n"
            env = {"HOME": f"/home/{s.get('user', uid)}", "PATH": "/usr/bin:/bin",
                   "SLURM_JOB_ID": str(job), "SLURM_JOB_USER": str(s.get("user", "")),
                   "SLURM_JOB_PARTITION": str(s.get("partition", "")),
                   "SLURM_JOB_ACCOUNT": str(s.get("account", "")), "SLURM_PROCID": str(s.get("rank", 0)),
                   "WANDB_API_KEY": "never-exported"}  # proves the allow-list holds in the demo
            environ = b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0"
        elif w.get("systemd"):
            cgroup = f"0::/system.slice/{w['systemd']}\n"
        else:
            cgroup = "0::/user.slice/user-1000.slice/session-2.scope\n"
            uid = 1000
        directory = os.path.join(root, str(proc.pid))
        os.makedirs(directory, exist_ok=True)
        files = {"cgroup": cgroup, "comm": proc.name + "\n", "stat": _stat(proc.pid, proc.name, 1_000_000 + proc.pid),
                 "status": _status(proc.name, proc.pid, uid)}
        for fname, text in files.items():
            with open(os.path.join(directory, fname), "w", encoding="utf-8") as fh:
                fh.write(text)
        with open(os.path.join(directory, "environ"), "wb") as fh:
            fh.write(environ)


def training_identity(labels: Iterable[tuple[str, str]]) -> tuple[str, str]:
    """(job, rank) of a simulated pod from its scheduler's labels, by the rule every pod's
    identity follows (`exporter.attribution.training.from_pod`); ("", "") for a pod of no job."""
    return training.from_pod(dict(labels))


class SimulatedAttributor(ProcAttributor):
    """The real attributor over the simulated node's fixture /proc and pods, whose training
    pods' workloads carry their job and rank (`training_identity`)."""

    def _kubernetes_workload(self, owner: Any) -> Workload:
        workload = super()._kubernetes_workload(owner)
        job, rank = training_identity(workload.labels)
        return replace(workload, training_job=job, training_rank=rank) if job else workload
