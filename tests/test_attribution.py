"""procfs reading, the (pid, start time) cache, the join with pod metadata, and the demo node."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest
from cgroup_helpers import spawn_with_pid
from waiting import wait_until

from exporter.attribution.kubernetes import PodIndex, StaticPodSource
from exporter.attribution.procfs import ProcCache, ProcFS, parse_environ, parse_start_time, parse_uid
from exporter.attribution.resolver import ProcAttributor
from exporter.core.model import HOST, UNKNOWN

CID = "d" * 64
UID = "11111111-2222-4333-8444-555555555555"
K8S_CGROUP = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
              f"cri-containerd-{CID}.scope\n")


def _stat(pid: int, comm: str, start: int) -> str:
    return f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 4 0 {start} 0 0 0\n"


def write_proc(root: Path, pid: int, cgroup: str, comm: str = "python", start: int = 500, uid: int = 1000,
               environ: bytes = b"") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(cgroup)
    (d / "comm").write_text(comm + "\n")
    (d / "stat").write_text(_stat(pid, comm, start))
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "environ").write_bytes(environ)


@pytest.mark.parametrize("line,expected", [
    (_stat(1, "python", 12345), 12345),
    (_stat(1, "my prog (v2) x", 777), 777),         # spaces and parentheses in comm
    (_stat(1, ") ) (", 42), 42),
    ("1 (python) S 1 2 3", None),                     # truncated
    ("garbage", None),
    (_stat(1, "x", 0).replace(" 0 0 0\n", " zz 0 0\n"), 0),
])
def test_start_time_is_field_22_counted_from_the_last_paren(line: str, expected: int | None) -> None:
    assert parse_start_time(line) == expected


def test_start_time_of_a_real_process_is_stable() -> None:
    fs = ProcFS("/proc")
    first = fs.start_time(os.getpid())
    assert first is not None and first == fs.start_time(os.getpid())


def test_uid_and_environ_allow_list() -> None:
    assert parse_uid("Name:\tx\nUid:\t1001\t1001\t1001\t1001\n") == 1001
    assert parse_uid("Name:\tx\n") is None
    env = parse_environ(b"SLURM_JOB_ID=7\0AWS_SECRET_ACCESS_KEY=s3cr3t\0SLURM_JOB_PARTITION=gpu\0"
                        b"SLURM_JOB_ACCOUNT=lab\0SLURM_JOB_USER=bob\0SLURM_STEP_ID=0\0junk\0\xff\xfe=1\0")
    assert env == {"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_ACCOUNT": "lab",
                   "SLURM_JOB_USER": "bob"}


def test_cache_rereads_a_reused_pid_and_forgets_gone_ones(tmp_path: Path) -> None:
    write_proc(tmp_path, 100, K8S_CGROUP, start=500)
    write_proc(tmp_path, 101, "0::/system.slice/ollama.service\n")
    cache = ProcCache(ProcFS(str(tmp_path)))
    first = cache.lookup([100, 101])
    assert first[100].cgroup.pod_uid == UID and cache.reads == 2
    generation = cache.generation
    cache.lookup([100, 101])
    assert cache.reads == 2  # warm: only stat was read
    # the same processes: names and starts answer as before, and the cache says so
    assert cache.generation == generation and cache.comm(100) == "python"
    # Same PID, new process (different start time): a new owner, never the old one.
    write_proc(tmp_path, 100, "0::/system.slice/slurmstepd.scope/job_9/step_0/user/task_0\n", start=900)
    again = cache.lookup([100])
    assert again[100].cgroup.kind == "slurm" and cache.reads == 3
    assert len(cache) == 1  # 101 was not asked for: forgotten
    assert cache.generation != generation
    generation = cache.generation
    (tmp_path / "100" / "stat").unlink()
    assert cache.lookup([100]) == {100: None} and len(cache) == 0
    assert cache.generation != generation


def _kept_open(kind: str) -> int:
    """How many of this process's descriptors are pidfds ("pidfd") or proc comm files ("comm")."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target == "anon_inode:[pidfd]" if kind == "pidfd" else target.endswith("/comm")
    return count


@pytest.mark.parametrize("pidfds", [True, False], ids=["pidfd", "kept-open-comm"])
def test_cache_on_the_real_proc_tells_exits_and_reused_pids_apart(pidfds: bool) -> None:
    """On the agent's own /proc a warm pass checks cached processes without reading their
    files (pidfds, or the comm files of another namespace's procfs): an exit is noticed,
    a zombie keeps its owner, and a PID given to a new process is read anew."""
    class SameTick(ProcFS):
        """/proc with start times coarsened to 1000 s: a new process that takes a PID
        starts "in the same clock tick" as the one that had it, as it can on a real node."""

        def start_time(self, pid: int) -> int | None:
            start = super().start_time(pid)
            return None if start is None else start // 100_000

    children = [subprocess.Popen(["sleep", "600"]) for _ in range(3)]
    cache = ProcCache(SameTick("/proc"), pidfds=pidfds)
    kind = "pidfd" if pidfds else "comm"
    before = _kept_open(kind)
    reused: subprocess.Popen | None = None
    try:
        pids = [c.pid for c in children]
        first = cache.lookup(pids)
        assert all(first[p] is not None and first[p].comm == "sleep" for p in pids)
        assert cache.reads == 3 and _kept_open(kind) == before + 3
        generation = cache.generation
        assert cache.lookup(pids) == first and cache.reads == 3  # warm: nothing read again
        assert cache.generation == generation

        zombie, gone, alive = children
        zombie.kill()  # exited, not yet reaped: still the same process, same start time
        wait_until(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][0] == "Z",
                   what="the child a zombie")
        assert cache.lookup(pids)[zombie.pid] == first[zombie.pid] and cache.reads == 3
        zombie.wait()  # reaped: gone
        assert cache.lookup(pids)[zombie.pid] is None and len(cache) == 2
        assert cache.generation != generation
        generation = cache.generation
        assert _kept_open(kind) == before + 2  # the gone process's descriptor is closed

        # A cached process exits and its PID is given to a new one before the next pass:
        # read anew, never the old entry.
        old = first[gone.pid]
        gone.kill()
        gone.wait()
        reused = spawn_with_pid(old.pid)
        if reused is None:
            pytest.skip("could not get the same PID again (ns_last_pid not writable or PID taken)")
        again = cache.lookup([old.pid, alive.pid])
        # read anew although it started "in the same clock tick" (the same start time)
        assert again[old.pid] is not None and again[old.pid] is not old and cache.reads == 4
        assert cache.generation != generation  # another process under the PID: names and starts asked again
        assert again[old.pid].start_time == old.start_time
        assert again[alive.pid] == first[alive.pid]
        assert _kept_open(kind) == before + 2
    finally:
        cache.close()
        for child in children + ([reused] if reused else []):
            child.kill()
            child.wait()
    assert _kept_open(kind) == before


def test_join_with_pod_metadata_and_names_filling_in_later(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, K8S_CGROUP)
    index = PodIndex()
    attributor = ProcAttributor(str(tmp_path), index)
    w = attributor.resolve([10], 0.0)[10]
    # No metadata yet (API server unreachable): the pod UID and container id still say whose it is.
    assert (w.kind, w.pod_uid, w.container_id, w.pod, w.namespace) == ("kubernetes", UID, CID, "", "")
    assert w.attributed
    StaticPodSource(index, [{
        "metadata": {"uid": UID, "name": "vllm-6d8b94df7-q5z82", "namespace": "ml",
                     "labels": {"team": "inference", "pod-template-hash": "6d8b94df7"},
                     "ownerReferences": [{"kind": "ReplicaSet", "name": "vllm-6d8b94df7", "controller": True}]},
        "status": {"containerStatuses": [{"name": "engine", "containerID": f"containerd://{CID}"}]}}])
    w = attributor.resolve([10], 1.0)[10]
    assert (w.namespace, w.pod, w.container, w.owner_kind, w.owner_name) == (
        "ml", "vllm-6d8b94df7-q5z82", "engine", "Deployment", "vllm")
    assert dict(w.labels)["team"] == "inference"
    assert attributor.comm(10) == "python"


def test_a_container_without_a_pod_cgroup_is_named_by_its_container_id(tmp_path: Path) -> None:
    """kubelet --cgroups-per-qos=false: containerd puts containers at /k8s.io/<id>, no pod UID
    in the path. The API's container statuses name the pod by container id; until they do,
    the process is unattributed, not a workload with no name at all."""
    other = "e" * 64
    write_proc(tmp_path, 40, f"0::/k8s.io/{CID}\n")
    write_proc(tmp_path, 41, f"4:memory:/k8s.io/{other}\n0::/k8s.io/{other}\n")
    index = PodIndex()
    attributor = ProcAttributor(str(tmp_path), index)
    owners = attributor.resolve([40, 41], 0.0)
    assert (owners[40].kind, owners[40].container_id, owners[40].pod_uid) == ("unknown", CID, "")
    assert owners[41].container_id == other
    assert not any(w.attributed for w in owners.values())  # two unknown containers are not one workload
    StaticPodSource(index, [{
        "metadata": {"uid": UID, "name": "trainer-0", "namespace": "research", "labels": {"team": "nlp"},
                     "ownerReferences": [{"kind": "StatefulSet", "name": "trainer", "controller": True}]},
        "status": {"containerStatuses": [{"name": "pytorch", "containerID": f"containerd://{CID}"}]}}])
    owners = attributor.resolve([40, 41], 1.0)
    w = owners[40]
    assert (w.kind, w.namespace, w.pod, w.container, w.pod_uid, w.container_id, w.owner_kind, w.owner_name) == (
        "kubernetes", "research", "trainer-0", "pytorch", UID, CID, "StatefulSet", "trainer")
    assert w.attributed and dict(w.labels) == {"team": "nlp"}
    assert (owners[41].kind, owners[41].container_id) == ("unknown", other)  # still no source knows it


def test_slurm_user_partition_account_and_nothing_else_from_environ(tmp_path: Path) -> None:
    env = b"SLURM_JOB_PARTITION=a100\0SLURM_JOB_ACCOUNT=nlp\0HF_TOKEN=hf_secret\0"
    write_proc(tmp_path, 20, "0::/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0\n",
               uid=1001, environ=env)
    write_proc(tmp_path, 21, "5:memory:/slurm/uid_0/job_7/step_3/task_0\n", uid=5)
    attributor = ProcAttributor(str(tmp_path), user_name=lambda uid: {1001: "bob"}.get(uid, str(uid)))
    owners = attributor.resolve([20, 21], 0.0)
    w = owners[20]
    assert (w.kind, w.slurm_job_id, w.slurm_step, w.slurm_user, w.slurm_partition, w.slurm_account) == (
        "slurm", "4242", "batch", "bob", "a100", "nlp")
    assert "hf_secret" not in repr(attributor.cache.lookup([20]))
    # v1 path names the job owner's uid, which wins over the process's uid.
    assert (owners[21].slurm_job_id, owners[21].slurm_step, owners[21].slurm_user) == ("7", "3", "0")


def test_host_service_docker_and_garbage(tmp_path: Path) -> None:
    write_proc(tmp_path, 30, "0::/user.slice/user-1000.slice/session-2.scope\n")
    write_proc(tmp_path, 31, "0::/system.slice/ollama.service\n")
    write_proc(tmp_path, 32, f"0::/system.slice/docker-{CID}.scope\n")
    write_proc(tmp_path, 33, "\x00\x01 not a cgroup file")
    owners = ProcAttributor(str(tmp_path)).resolve([30, 31, 32, 33, 34], 0.0)
    assert owners[30] == HOST
    assert (owners[31].kind, owners[31].unit) == ("systemd", "ollama.service")
    assert (owners[32].kind, owners[32].container_id) == ("docker", CID)
    assert owners[33] == UNKNOWN and owners[34] == UNKNOWN
    assert not any(w.attributed for w in owners.values())


def test_host_pids_not_visible_is_said_once_with_the_fix(tmp_path: Path, caplog) -> None:
    attributor = ProcAttributor(str(tmp_path))
    assert attributor.info() == {"host_pids_visible": 1.0}
    with caplog.at_level(logging.WARNING):
        attributor.resolve([4242, 4243], 0.0)
        attributor.resolve([4242, 4243], 1.0)
    assert attributor.info() == {"host_pids_visible": 0.0}
    warnings = [r for r in caplog.records if "hostPID" in r.getMessage()]
    assert len(warnings) == 1 and "--proc-root" in warnings[0].getMessage()
    write_proc(tmp_path, 4242, K8S_CGROUP)
    attributor.resolve([4242, 4243], 2.0)
    assert attributor.info() == {"host_pids_visible": 1.0}


def test_simulated_node_runs_the_real_attribution() -> None:
    import argparse

    from exporter.attribution import build_attributor
    from exporter.collect.collector import Collector
    from exporter.core.labels import label_schema
    from exporter.devices.simulated.backend import SimulatedBackend

    clock = [1000.0]
    backend = SimulatedBackend(clock=lambda: clock[0])
    backend.open()
    attributor = build_attributor(argparse.Namespace(proc_root="/proc", kubernetes="auto", kubeconfig=None),
                                  "sim-node-01", scenario=backend.scenario)
    root = attributor.procfs.root
    _, labeller = label_schema(["team"])
    collector = Collector([backend], "sim-node-01", attributor=attributor, labeller=labeller, clock=lambda: clock[0])
    try:
        collector.collect_once()
        clock[0] += 10
        snap = collector.collect_once()
    finally:
        attributor.close()
    assert not os.path.exists(root)  # the fixture tree goes with the attributor
    owners = {row.pid: row.workload for row in snap.processes}
    assert (owners[41001].namespace, owners[41001].pod, owners[41001].container) == (
        "ml-production", "vllm-llama3-70b-6d8b94df7-q5z82", "inference-engine")
    assert (owners[41001].owner_kind, owners[41001].owner_name) == ("Deployment", "vllm-llama3-70b")
    assert owners[52003].owner_kind == "Job" and owners[61001].owner_kind == "StatefulSet"
    assert (owners[63001].kind, owners[63001].slurm_job_id, owners[63001].slurm_user,
            owners[63001].slurm_partition, owners[63001].slurm_account) == (
        "slurm", "4242", "bob", "gpu-shared", "nlp-lab")
    assert owners[70001] == HOST
    assert {row.comm for row in snap.processes if row.pid == 63001} == {"pt_main_thread"}
    # Every pod process resolved: the only unattributed process is the host one.
    assert snap.info["unattributed_processes"] == 1.0 and snap.info["host_pids_visible"] == 1.0
    # Conservation per GPU: workload memory + unattributed memory = process memory.
    for device in snap.devices:
        total = sum(p.used_memory_bytes or 0 for p in device.processes)
        parts = sum(w.memory_used_bytes for w in snap.workloads if w.device_key == device.key)
        rest = next(u for u in snap.unattributed if u.device_key == device.key)
        assert parts + rest.memory_used_bytes == total
        energy = sum(w.energy_joules_total for w in snap.workloads if w.device_key == device.key)
        # Energy since the first pass (the device counter started at first_energy).
        assert energy + rest.energy_joules_total == pytest.approx(
            snap.device_energy_joules[device.key] - first_energy(device.index), rel=1e-9)
        assert snap.device_energy_joules[device.key] > first_energy(device.index)


def first_energy(index: int) -> float:
    """The simulated GPU's energy counter when the backend opens (joules)."""
    return 3.6e6 * (1 + index)
