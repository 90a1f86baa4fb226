"""Parse ``/proc/<pid>/cgroup`` into the owner the cgroup path names (pure, no I/O).

A process's cgroup path says who started it: the kubelet puts every container in a
cgroup named after its pod UID and container id, Slurm puts every task under its job
and step, systemd puts services in ``<name>.service`` and Docker containers in
``docker-<id>.scope``. This module turns the text of ``/proc/<pid>/cgroup`` into a
`CgroupOwner` saying which of those it is. Names (pod, namespace, container) are not in
the path; `exporter.attribution.kubernetes` looks them up by pod UID and container id.

Formats understood (see docs/ATTRIBUTION.md):

- cgroup v1 (one ``<id>:<controllers>:<path>`` line per hierarchy) and v2 (one
  ``0::<path>`` line), and hybrid hosts that list both.
- Kubernetes, systemd driver:
  ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope``
  (``crio-<id>.scope``, ``docker-<id>.scope``; Guaranteed pods sit directly under
  ``kubepods.slice``; kind and minikube prefix every name with ``kubelet-``).
- Kubernetes, cgroupfs driver: ``/kubepods/burstable/pod<uid>/<id>`` (CRI-O: ``crio-<id>``).
- Kubernetes without pod cgroups (kubelet ``--cgroups-per-qos=false``): the kubelet gives
  containerd no cgroup parent, and containerd puts every container at
  ``/k8s.io/<id>``, named after its CRI namespace. The path then has no pod UID: the pod
  is found by container id (`exporter.attribution.resolver`).
- Paths seen from inside a cgroup namespace, relative to the agent's own cgroup
  (``/../../kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope``): matching
  works on path segments, never on a prefix.
- Slurm v1 ``/slurm/uid_<U>/job_<J>/step_<S>/task_<N>`` and v2
  ``/system.slice/slurmstepd.scope/job_<J>/step_<S>/user/task_<N>`` (also
  ``<node>_slurmstepd.scope``); steps ``batch``, ``extern``, ``interactive`` or a number.
- Docker or Podman outside Kubernetes (``/docker/<id>``, ``docker-<id>.scope``,
  ``libpod-<id>.scope``), systemd services (``<name>.service``), and the rest: the host.

Malformed lines are skipped; nothing here raises on any input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KUBERNETES = "kubernetes"
SLURM = "slurm"
DOCKER = "docker"
SYSTEMD = "systemd"
HOST = "host"
UNKNOWN = "unknown"

# Higher wins when the lines of one file disagree (v1 hierarchies of a hybrid host can
# lag behind the v2 one, or name nothing at all, like ``pids:/``).
_RANK = {UNKNOWN: 0, HOST: 1, SYSTEMD: 2, DOCKER: 3, SLURM: 4, KUBERNETES: 5}

_HEX64 = r"[0-9a-f]{64}"
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"

# systemd driver pod slice: kubepods[-<qos>]-pod<uid>.slice, optionally kubelet- prefixed.
_POD_SLICE = re.compile(rf"^(?:kubelet-)?kubepods(?:-(besteffort|burstable|guaranteed))?-pod({_UID})\.slice$")
# cgroupfs driver pod directory: pod<uid>.
_POD_DIR = re.compile(rf"^pod({_UID})$")
# Container cgroup below the pod, by runtime.
_CONTAINER = (
    (re.compile(rf"^cri-containerd-({_HEX64})\.scope$"), "containerd"),
    (re.compile(rf"^crio-({_HEX64})\.scope$"), "cri-o"),
    (re.compile(rf"^crio-({_HEX64})$"), "cri-o"),
    (re.compile(rf"^docker-({_HEX64})\.scope$"), "docker"),
    (re.compile(rf"^cri-dockerd-({_HEX64})\.scope$"), "docker"),
    (re.compile(rf"^({_HEX64})$"), ""),  # cgroupfs driver: containerd or Docker, cannot tell
)
_QOS_SEGMENT = {"besteffort": "besteffort", "burstable": "burstable"}
# containerd's default cgroup for a container without a cgroup parent is /<namespace>/<id>;
# its CRI plugin (the kubelet's containers) works in the namespace "k8s.io".
_CRI_NAMESPACE = "k8s.io"
_CONTAINER_ID = re.compile(rf"^{_HEX64}$")

# Docker / Podman containers outside Kubernetes.
_STANDALONE = (
    (re.compile(rf"^docker-({_HEX64})\.scope$"), "docker"),
    (re.compile(rf"^libpod-({_HEX64})\.scope$"), "podman"),
)

_SLURM_JOB = re.compile(r"^job_(\d+)$")
_SLURM_STEP = re.compile(r"^step_(batch|extern|interactive|\d+(?:\.\d+)?)$")
_SLURM_UID = re.compile(r"^uid_(\d+)$")
_SLURM_TASK = re.compile(r"^task_(\d+|special)$")


@dataclass(frozen=True)
class CgroupOwner:
    """What a cgroup path says about a process's owner.

    Attributes:
        kind: "kubernetes", "slurm", "docker", "systemd", "host", or "unknown" (no
            parsable line at all).
        runtime: container runtime for containers: "containerd", "cri-o", "docker",
            "podman", or "" when the path does not say (cgroupfs driver).
        container_id: 64-hex container id (lower case), "" when not in a container.
        pod_uid: the pod UID with dashes (the systemd driver writes underscores); "" for a
            container without a pod cgroup (``/k8s.io/<id>``), whose pod only its id tells.
        qos: Kubernetes QoS class: "guaranteed", "burstable" or "besteffort".
        slurm_job_id: Slurm job id; slurm_step: "batch", "extern", "interactive" or a
            number; slurm_uid: the job owner's uid from the v1 path ("" on v2).
        slurm_task: the task number when the path names it.
        unit: the systemd unit for services ("ollama.service").
        path: the cgroup path the owner was read from.
    """

    kind: str = UNKNOWN
    runtime: str = ""
    container_id: str = ""
    pod_uid: str = ""
    qos: str = ""
    slurm_job_id: str = ""
    slurm_step: str = ""
    slurm_uid: str = ""
    slurm_task: str = ""
    unit: str = ""
    path: str = ""


UNKNOWN_OWNER = CgroupOwner()


def _segments(path: str) -> list[str]:
    # "." and ".." appear in paths seen from a cgroup namespace; they name nothing.
    return [s for s in path.split("/") if s and s not in (".", "..")]


def _kubernetes(segments: list[str], path: str) -> CgroupOwner | None:
    for i, seg in enumerate(segments):
        uid = ""
        qos = ""
        match = _POD_SLICE.match(seg)
        if match:
            qos = match.group(1) or "guaranteed"
            uid = match.group(2)
        else:
            match = _POD_DIR.match(seg)
            if match:
                uid = match.group(1)
                parent = segments[i - 1] if i > 0 else ""
                # cgroupfs: /kubepods/<qos>/pod<uid>; Guaranteed pods sit under /kubepods.
                qos = _QOS_SEGMENT.get(parent, "guaranteed" if parent in ("kubepods", "kubelet-kubepods") else "")
        if not uid:
            continue
        runtime = container_id = ""
        if i + 1 < len(segments):
            nxt = segments[i + 1]
            for pattern, name in _CONTAINER:
                cmatch = pattern.match(nxt)
                if cmatch:
                    runtime, container_id = name, cmatch.group(1)
                    break
        return CgroupOwner(kind=KUBERNETES, runtime=runtime, container_id=container_id,
                           pod_uid=uid.replace("_", "-"), qos=qos, path=path)
    # No pod segment: a container of containerd's CRI plugin without a cgroup parent.
    for i, seg in enumerate(segments[:-1]):
        if seg == _CRI_NAMESPACE and _CONTAINER_ID.match(segments[i + 1]):
            return CgroupOwner(kind=KUBERNETES, runtime="containerd", container_id=segments[i + 1], path=path)
    return None


def _slurm(segments: list[str], path: str) -> CgroupOwner | None:
    job = step = uid = task = ""
    marker = False
    for seg in segments:
        if seg == "slurm" or seg.startswith("slurm_") or seg.endswith("slurmstepd.scope"):
            marker = True
            continue
        match = _SLURM_JOB.match(seg)
        if match and not job:
            job = match.group(1)
            continue
        if not job:
            match = _SLURM_UID.match(seg)
            if match:
                uid = match.group(1)
            continue
        match = _SLURM_STEP.match(seg)
        if match and not step:
            step = match.group(1)
            continue
        match = _SLURM_TASK.match(seg)
        if match and step:
            task = match.group(1)
    # A job_<n> segment alone is too weak (any cgroup can be called that): require the
    # slurm marker or a step below the job.
    if not job or not (marker or step):
        return None
    return CgroupOwner(kind=SLURM, slurm_job_id=job, slurm_step=step, slurm_uid=uid, slurm_task=task, path=path)


def _standalone(segments: list[str], path: str) -> CgroupOwner | None:
    for i, seg in enumerate(segments):
        for pattern, runtime in _STANDALONE:
            match = pattern.match(seg)
            if match:
                return CgroupOwner(kind=DOCKER, runtime=runtime, container_id=match.group(1), path=path)
        if seg == "docker" and i + 1 < len(segments) and re.fullmatch(_HEX64, segments[i + 1]):
            return CgroupOwner(kind=DOCKER, runtime="docker", container_id=segments[i + 1], path=path)
    return None


def parse_path(path: str) -> CgroupOwner:
    """The owner named by one cgroup path (the third field of a cgroup line)."""
    segments = _segments(path.strip())
    if not segments:
        return CgroupOwner(kind=HOST, path=path)
    for parse in (_kubernetes, _slurm, _standalone):
        owner = parse(segments, path)
        if owner is not None:
            return owner
    services = [s for s in segments if s.endswith(".service") and not s.startswith("user@")]
    if services:
        return CgroupOwner(kind=SYSTEMD, unit=services[-1], path=path)
    return CgroupOwner(kind=HOST, path=path)


def parse_cgroup_file(text: str) -> CgroupOwner:
    """The owner named by the text of a ``/proc/<pid>/cgroup`` file.

    Every well-formed line (``<hierarchy-id>:<controllers>:<path>``) is read and the most
    specific owner wins (a Kubernetes container over a Slurm step over a container over a
    service over the host; among Kubernetes lines, one with a container id, then one with a
    pod UID), so hybrid v1+v2 hosts, where some hierarchies say only ``/``, give the right
    answer. Returns kind "unknown" when no line parses.
    """
    best = UNKNOWN_OWNER
    if not isinstance(text, str):
        return best
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, _controllers, path = parts
        if not hierarchy.strip().isdigit() or not path.startswith("/"):
            continue
        owner = parse_path(path)
        if _specificity(owner) > _specificity(best):
            best = owner
    return best


def _specificity(owner: CgroupOwner) -> tuple[int, bool, bool]:
    return _RANK[owner.kind], bool(owner.container_id), bool(owner.pod_uid)
