"""The cgroup parser over real-world /proc/<pid>/cgroup files, and on arbitrary input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.attribution.cgroups import CgroupOwner, parse_cgroup_file, parse_path

CID = "3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a19"
UID = "8c1f2d3e-4b5a-4697-8a1b-2c3d4e5f6a7b"
UID_ = UID.replace("-", "_")

V1_SYSTEMD_CONTAINERD = f"""\
12:hugetlb:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
11:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
10:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope
0::/
"""

# What runc writes on a hybrid host (cgroup v1 hierarchies and the cgroup2 one) for a
# container that containerd 1.6 started without a cgroup parent, as for a kubelet with
# --cgroups-per-qos=false (seen with tests/test_containerd.py).
HYBRID_NO_POD_CGROUP = "".join(f"{n}:{c}:/k8s.io/{CID}\n" for n, c in (
    (9, "name=systemd"), (8, "pids"), (7, "blkio"), (6, "freezer"), (5, "devices"), (4, "memory"), (3, "cpuset"),
    (2, "cpuacct"), (1, "cpu"), (0, "")))

# (name, file text, expected owner fields)
CASES: list[tuple[str, str, dict[str, str]]] = [
    ("v2 systemd containerd burstable",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid=UID, qos="burstable")),
    ("v2 systemd containerd besteffort",
     f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid=UID, qos="besteffort")),
    ("v2 systemd containerd guaranteed (directly under kubepods.slice)",
     f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid=UID, qos="guaranteed")),
    ("v2 systemd CRI-O",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n",
     dict(kind="kubernetes", runtime="cri-o", container_id=CID, pod_uid=UID, qos="burstable")),
    ("v2 systemd CRI-O container running systemd inside",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope/init.scope\n",
     dict(kind="kubernetes", runtime="cri-o", container_id=CID, pod_uid=UID)),
    ("v2 systemd dockershim / cri-dockerd",
     f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope\n",
     dict(kind="kubernetes", runtime="docker", container_id=CID, pod_uid=UID, qos="besteffort")),
    ("v1 systemd containerd (one line per hierarchy)", V1_SYSTEMD_CONTAINERD,
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid=UID, qos="burstable")),
    ("v1 cgroupfs containerd / docker",
     f"11:memory:/kubepods/burstable/pod{UID}/{CID}\n4:pids:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n",
     dict(kind="kubernetes", runtime="", container_id=CID, pod_uid=UID, qos="burstable")),
    ("v1 cgroupfs guaranteed",
     f"11:memory:/kubepods/pod{UID}/{CID}\n",
     dict(kind="kubernetes", container_id=CID, pod_uid=UID, qos="guaranteed")),
    ("v2 cgroupfs CRI-O besteffort",
     f"0::/kubepods/besteffort/pod{UID}/crio-{CID}\n",
     dict(kind="kubernetes", runtime="cri-o", container_id=CID, pod_uid=UID, qos="besteffort")),
    ("k3s v2 cgroupfs",
     f"0::/kubepods/burstable/pod{UID}/{CID}\n",
     dict(kind="kubernetes", container_id=CID, pod_uid=UID, qos="burstable")),
    ("kind / minikube kubelet- prefix",
     f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid=UID, qos="besteffort")),
    ("kind nested in docker (v2, relative from the node container)",
     f"0::/system.slice/docker-{'a' * 64}.scope/kubelet.slice/kubelet-kubepods.slice/"
     f"kubelet-kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid=UID, qos="guaranteed")),
    ("relative path from the agent's cgroup namespace",
     f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid=UID, qos="besteffort")),
    ("relative cgroupfs path from a cgroup namespace",
     f"0::/../../../besteffort/pod{UID}/{CID}\n",
     dict(kind="kubernetes", container_id=CID, pod_uid=UID, qos="besteffort")),
    ("pod sandbox level (no container)",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice\n",
     dict(kind="kubernetes", container_id="", pod_uid=UID, qos="burstable")),
    ("hybrid host: v1 lines say / and the v2 line names the pod",
     f"9:name=systemd:/\n4:memory:/\n0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     dict(kind="kubernetes", container_id=CID, pod_uid=UID)),
    ("containerd without a pod cgroup (kubelet --cgroups-per-qos=false), v2",
     f"0::/k8s.io/{CID}\n",
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid="", qos="")),
    ("containerd without a pod cgroup, hybrid v1+v2", HYBRID_NO_POD_CGROUP,
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid="")),
    ("containerd without a pod cgroup, seen from the agent's cgroup namespace",
     f"4:memory:/../../k8s.io/{CID}\n0::/../k8s.io/{CID}\n",
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid="")),
    ("containerd without a pod cgroup, a sub-cgroup of the container",
     f"0::/k8s.io/{CID}/init.scope\n",
     dict(kind="kubernetes", runtime="containerd", container_id=CID, pod_uid="")),
    ("hybrid host: a line with the pod beats one without",
     f"4:memory:/k8s.io/{CID}\n0::/kubepods/burstable/pod{UID}/{CID}\n",
     dict(kind="kubernetes", container_id=CID, pod_uid=UID, qos="burstable")),
    ("containerd's default namespace (ctr, nerdctl) is not the kubelet's",
     f"0::/default/{CID}\n",
     dict(kind="host", container_id="")),
    ("k8s.io without a container id below it",
     "0::/k8s.io/not-a-container\n",
     dict(kind="host", container_id="")),
    ("k8s.io with a short id",
     f"0::/k8s.io/{CID[:12]}\n",
     dict(kind="host", container_id="")),
    ("Slurm v1",
     "12:memory:/slurm/uid_1001/job_4242/step_0/task_0\n7:devices:/slurm/uid_1001/job_4242/step_0\n5:freezer:/slurm/uid_1001/job_4242/step_0\n0::/\n",
     dict(kind="slurm", slurm_job_id="4242", slurm_step="0", slurm_uid="1001", slurm_task="0")),
    ("Slurm v1 batch step",
     "4:cpuset:/slurm/uid_0/job_17/step_batch\n",
     dict(kind="slurm", slurm_job_id="17", slurm_step="batch", slurm_uid="0")),
    ("Slurm v2",
     "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n",
     dict(kind="slurm", slurm_job_id="4242", slurm_step="0", slurm_uid="", slurm_task="0")),
    ("Slurm v2 with node-prefixed scope (multiple slurmd)",
     "0::/system.slice/gpu-node-07_slurmstepd.scope/job_99/step_interactive/user/task_1\n",
     dict(kind="slurm", slurm_job_id="99", slurm_step="interactive", slurm_task="1")),
    ("Slurm v2 extern step (sshd adopted into the job)",
     "0::/system.slice/slurmstepd.scope/job_99/step_extern/user/task_special\n",
     dict(kind="slurm", slurm_job_id="99", slurm_step="extern", slurm_task="special")),
    ("Slurm v2 batch step",
     "0::/system.slice/slurmstepd.scope/job_5/step_batch/user/task_0\n",
     dict(kind="slurm", slurm_job_id="5", slurm_step="batch")),
    ("Docker outside Kubernetes, systemd driver",
     f"0::/system.slice/docker-{CID}.scope\n",
     dict(kind="docker", runtime="docker", container_id=CID)),
    ("Docker outside Kubernetes, cgroupfs driver (v1)",
     f"11:memory:/docker/{CID}\n1:name=systemd:/docker/{CID}\n",
     dict(kind="docker", runtime="docker", container_id=CID)),
    ("Podman",
     f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container\n",
     dict(kind="docker", runtime="podman", container_id=CID)),
    ("systemd service",
     "0::/system.slice/ollama.service\n",
     dict(kind="systemd", unit="ollama.service")),
    ("systemd service, v1",
     "11:memory:/system.slice/nvidia-persistenced.service\n1:name=systemd:/system.slice/nvidia-persistenced.service\n",
     dict(kind="systemd", unit="nvidia-persistenced.service")),
    ("user login session",
     "0::/user.slice/user-1000.slice/session-3.scope\n",
     dict(kind="host")),
    ("host root",
     "0::/\n",
     dict(kind="host")),
    ("init.scope",
     "0::/init.scope\n",
     dict(kind="host")),
    ("job_ alone is not Slurm",
     "0::/system.slice/job_7\n",
     dict(kind="host")),
    ("empty file", "", dict(kind="unknown")),
    ("garbage only", "not a cgroup file\n\x00\x01", dict(kind="unknown")),
    ("garbage beside a good line",
     f"oops\n::\n5\n0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     dict(kind="kubernetes", container_id=CID, pod_uid=UID)),
    ("Windows line endings",
     f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\r\n",
     dict(kind="kubernetes", container_id=CID, pod_uid=UID)),
]


@pytest.mark.parametrize("text,expected", [(t, e) for _, t, e in CASES], ids=[n for n, _, _ in CASES])
def test_real_world_cgroup_files(text: str, expected: dict[str, str]) -> None:
    owner = parse_cgroup_file(text)
    for field, value in expected.items():
        assert getattr(owner, field) == value, (field, owner)


def test_pod_uid_has_dashes_and_container_id_is_exact() -> None:
    owner = parse_path(f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
                       f"cri-containerd-{CID}.scope")
    assert owner.pod_uid == UID
    assert owner.container_id == CID and len(owner.container_id) == 64


def test_short_or_non_hex_container_segment_is_not_a_container_id() -> None:
    owner = parse_path(f"/kubepods/burstable/pod{UID}/not-a-container")
    assert owner.kind == "kubernetes" and owner.container_id == ""


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_no_text_crashes_the_parser(text: str) -> None:
    assert isinstance(parse_cgroup_file(text), CgroupOwner)


_segment = st.one_of(
    st.sampled_from(["kubepods.slice", "kubepods", "burstable", "besteffort", "..", ".", "", "slurm",
                     "slurmstepd.scope", "job_12", "step_batch", "step_3", "uid_5", "task_0", "user",
                     f"kubepods-burstable-pod{UID_}.slice", f"pod{UID}", f"cri-containerd-{CID}.scope",
                     f"crio-{CID}", CID, "k8s.io", "default", "docker", f"docker-{CID}.scope", "x.service", "user@1.service"]),
    st.text(max_size=12),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=3), st.text(max_size=8), st.lists(_segment, max_size=8)), max_size=6))
def test_no_cgroup_shaped_file_crashes_the_parser(lines: list[tuple[str, str, list[str]]]) -> None:
    text = "\n".join(f"{h}:{c}:/" + "/".join(segs) for h, c, segs in lines)
    owner = parse_cgroup_file(text)
    assert owner.kind in ("kubernetes", "slurm", "docker", "systemd", "host", "unknown")
    if owner.kind == "kubernetes":
        # a pod UID, or (no pod cgroup) a container id to find the pod by
        assert ("_" not in owner.pod_uid and len(owner.pod_uid) == 36) or (
            owner.pod_uid == "" and len(owner.container_id) == 64)
