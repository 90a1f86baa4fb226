"""l9gpu's attribution against a real container runtime: Debian's containerd (1.6) and runc.

One private containerd for the module (own root, state, socket; cgroupfs driver; host
network; a busybox-static image imported once, also the sandbox image), driven over its
CRI socket as the kubelet drives it (tests/containerd_runtime.py). Each test creates its
pods and containers and removes them afterwards, failure or not, with the cgroups runc
leaves; the module removes the daemon, its mounts and its directories at the end.

The NVML fake reports the containers' real host PIDs as GPU processes; everything after
that is the agent's real path: /proc/<pid>/cgroup as runc wrote it, the CRI listing from
containerd, the API watch from a local API server where a test needs one.

Needs root, Debian's containerd (containerd, ctr, containerd-shim-runc-v2), runc and
busybox-static (`make test` installs them), and cgroups it may create; the cgroup
namespace test also needs util-linux's unshare. Without them the module skips with the
reason (in CI a missing package fails instead). The systemd cgroup driver needs systemd
as PID 1: its test skips elsewhere. About 6 s on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (pip install '.[k8s]' in l9gpu's checkout)")
pytest.importorskip("exporter.attribution.cri_api_pb2", reason="protobuf is not installed")

import containerd_runtime as runtime  # noqa: E402
import cri_runtime_api_pb2 as api  # noqa: E402
from agent import REPO  # noqa: E402
from fakes import pynvml_fake as F  # noqa: E402
from test_podresources import scrape as _scrape  # noqa: E402
from waiting import PATIENCE, wait_until, within  # noqa: E402

from exporter.attribution import build_attributor, cri  # noqa: E402
from exporter.attribution.cgroups import parse_cgroup_file  # noqa: E402
from exporter.attribution.kubernetes import PodIndex  # noqa: E402
from exporter.attribution.resolver import ProcAttributor  # noqa: E402
from exporter.collect.collector import Collector  # noqa: E402
from exporter.core.labels import label_schema  # noqa: E402
from exporter.devices.nvml import NvmlBackend  # noqa: E402

GiB = 2**30
NODE = "gpu-node-1"


def _skip_or_fail(reason: str) -> None:
    # A missing package is `make test`'s to install: in CI that is a failure, not a skip.
    if os.environ.get("CI") and "not installed" in reason:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def containerd() -> Iterator[runtime.Containerd]:
    reason = runtime.unavailable()
    if reason:
        _skip_or_fail(reason)
    base = Path(tempfile.mkdtemp(prefix="l9gpu-ctrd-", dir="/tmp"))  # short: unix socket paths
    snapshotter = "overlayfs" if runtime.overlay_works(base) else "native"
    daemon = runtime.Containerd(base, snapshotter)
    try:
        daemon.start()
        daemon.import_image(runtime.build_image(base / "image.tar"))
        yield daemon
    finally:
        log = daemon.log()
        problems = runtime.teardown_daemon(daemon)
    assert not problems, (problems, log[-4000:])


@pytest.fixture
def kubelet(containerd: runtime.Containerd) -> Iterator[runtime.Kubelet]:
    k = runtime.Kubelet(containerd, api, grpc)
    try:
        yield k
    finally:
        if not containerd.running:  # a test that stopped it and failed before starting it again
            containerd.start()
        problems = k.cleanup()
    assert not problems, problems


def _args(**kw: Any) -> argparse.Namespace:
    base: dict[str, Any] = dict(proc_root="/proc", kubernetes="off", kubeconfig=None, pod_label=[],
                                cri_socket="off", pod_resources_socket="off")
    base.update(kw)
    return argparse.Namespace(**base)


def _agent(containerd: runtime.Containerd, **cri_options: Any) -> ProcAttributor:
    """The agent's attributor with the CRI source on the daemon's socket, built as
    `build_attributor` builds it; ``cri_options`` (e.g. a shorter cadence) go to the source."""
    index = PodIndex()
    source = cri.build(containerd.socket, index, **cri_options)
    assert source is not None
    source.start()
    return ProcAttributor("/proc", index, None, fallback=source)


def _nvml(pids_memory: dict[int, int]) -> tuple[Any, NvmlBackend]:
    fake = F.FakeNvml(gpus=[F.FakeGpu(processes=[F.FakeProcess(pid=pid, used_memory=mem)
                                                 for pid, mem in pids_memory.items()])])
    backend = NvmlBackend(nvml=fake, energy_counter_period=0)
    backend.open()
    return fake, backend




def _value(metrics: dict, name: str, **labels: str) -> float:
    hits = [v for lab, v in metrics.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, metrics.get(name))
    return hits[0]


def _names(w: Any) -> tuple[str, str, str, str, str]:
    return (w.kind, w.namespace, w.pod, w.container, w.pod_uid)


def test_pods_of_every_qos_class_are_named_on_the_metrics(containerd, kubelet) -> None:
    """Burstable, Guaranteed and BestEffort pods as the cgroupfs driver lays them out: the
    cgroup files runc wrote parse to each pod's UID, QoS class and container id, and the
    scraped series carry the names the kubelet gave, read from containerd's CRI socket."""
    pods = {qos: kubelet.run_pod(f"vllm-{qos}-0", "inference", qos) for qos in runtime.QOS_CLASSES}
    cids = {qos: kubelet.start_container(pod, "engine") for qos, pod in pods.items()}
    pids = {qos: kubelet.pid(cid) for qos, cid in cids.items()}
    for qos, pod in pods.items():
        owner = parse_cgroup_file(runtime.read_cgroup(pids[qos]))
        assert (owner.kind, owner.pod_uid, owner.qos, owner.container_id, owner.runtime) == (
            "kubernetes", pod.uid, qos, cids[qos], ""), runtime.read_cgroup(pids[qos])
    memory = {pids["burstable"]: 1 * GiB, pids["guaranteed"]: 2 * GiB, pids["besteffort"]: 3 * GiB}
    _, backend = _nvml(memory)
    attributor = build_attributor(_args(cri_socket=containerd.socket), NODE)
    try:
        collector = Collector([backend], NODE, interval=1.0, attributor=attributor)
        collector.collect_once()
        m = _scrape(collector)
        for qos, pod in pods.items():
            assert _value(m, "container_gpu_memory_used_bytes", namespace="inference", pod=f"vllm-{qos}-0",
                          container="engine", pod_uid=pod.uid) == memory[pids[qos]]
        assert _value(m, "l9gpu_collector_success", collector="cri") == 1.0
        assert _value(m, "l9gpu_unattributed_processes", node=NODE) == 0.0
        rows = {row.pid: row.workload for row in collector.snapshot.processes}
        assert {rows[pids[q]].container_id for q in runtime.QOS_CLASSES} == set(cids.values())
    finally:
        attributor.close()
        backend.close()


def _pod_without_pod_cgroup(kubelet: runtime.Kubelet) -> tuple[runtime.Pod, str, int]:
    """A pod as a kubelet with --cgroups-per-qos=false makes it (no cgroup parent): containerd
    1.6 puts its container at /k8s.io/<id>, on every hierarchy."""
    pod = kubelet.run_pod("trainer-0", "research", "besteffort", pod_cgroup=False)
    cid = kubelet.start_container(pod, "pytorch")
    pid = kubelet.pid(cid)
    text = runtime.read_cgroup(pid)
    assert {line.split(":", 2)[2] for line in text.splitlines() if line} == {f"/k8s.io/{cid}"}, text
    owner = parse_cgroup_file(text)
    assert (owner.kind, owner.runtime, owner.container_id, owner.pod_uid) == ("kubernetes", "containerd", cid, "")
    return pod, cid, pid


def test_a_pod_without_a_pod_cgroup_is_named_through_cri(containerd, kubelet) -> None:
    """No pod UID in the path: the CRI listing names the container by its id (asked at once
    for the id no one knew); with no source at all it is unattributed, not a nameless workload."""
    pod, cid, pid = _pod_without_pod_cgroup(kubelet)
    attributor = _agent(containerd, min_refresh=0.0)
    try:
        w = attributor.resolve([pid], 0.0)[pid]
        assert (_names(w), w.container_id) == (("kubernetes", "research", "trainer-0", "pytorch", pod.uid), cid)
    finally:
        attributor.close()

    _, backend = _nvml({pid: 5 * GiB})
    attributor = build_attributor(_args(), NODE)  # no API, no CRI
    try:
        collector = Collector([backend], NODE, interval=1.0, attributor=attributor)
        collector.collect_once()
        m = _scrape(collector)
        assert "container_gpu_memory_used_bytes" not in m
        assert _value(m, "gpu_unattributed_memory_used_bytes", gpu="0") == 5 * GiB
        row = next(r for r in collector.snapshot.processes if r.pid == pid)
        assert (row.workload.kind, row.workload.container_id) == ("unknown", cid)
    finally:
        attributor.close()
        backend.close()


def test_a_pod_without_a_pod_cgroup_is_named_through_the_api_server(containerd, kubelet, tmp_path) -> None:
    """The API server alone (no CRI socket): the pod's status lists containerd://<id>, which
    names the container, its pod's owner and labels included."""
    pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
    from cgroup_helpers import kubeconfig
    from fakes.kubernetes_apiserver import FakeApiServer, make_pod

    pod, cid, pid = _pod_without_pod_cgroup(kubelet)
    apiserver = FakeApiServer()
    apiserver.start()
    apiserver.add(make_pod("trainer-0", "research", pod.uid, NODE, {"pytorch": cid}, labels={"team": "nlp"},
                           owner=("StatefulSet", "trainer")))
    _, backend = _nvml({pid: 5 * GiB})
    extra, labeller = label_schema(["team"])
    attributor = None
    try:
        attributor = build_attributor(_args(kubernetes="on", kubeconfig=kubeconfig(tmp_path, apiserver),
                                            pod_label=["team"]), NODE,
                                     wait_for_pods=PATIENCE)  # start-up does not wait for the first list
        collector = Collector([backend], NODE, interval=1.0, attributor=attributor, labeller=labeller)
        collector.collect_once()
        m = _scrape(collector, extra)
        assert _value(m, "container_gpu_memory_used_bytes", namespace="research", pod="trainer-0",
                      container="pytorch", pod_uid=pod.uid, owner_kind="StatefulSet", owner_name="trainer",
                      label_team="nlp") == 5 * GiB
    finally:
        if attributor is not None:
            attributor.close()
        backend.close()
        apiserver.stop()


def test_a_restarted_container_gets_a_new_id_and_keeps_its_names(containerd, kubelet) -> None:
    pod = kubelet.run_pod("embedder-7c9f5-abcde", "search", "burstable")
    first = kubelet.start_container(pod, "embedder")
    first_pid = kubelet.pid(first)
    attributor = _agent(containerd, min_refresh=0.0)
    try:
        w = attributor.resolve([first_pid], 0.0)[first_pid]
        assert (_names(w), w.container_id) == (("kubernetes", "search", "embedder-7c9f5-abcde", "embedder",
                                                 pod.uid), first)
        # The container dies; the kubelet starts attempt 1 in the same sandbox: a new id.
        kubelet.stop_container(first)
        wait_until(lambda: not os.path.exists(f"/proc/{first_pid}"), what="the first container's process gone")
        second = kubelet.start_container(pod, "embedder", attempt=1)
        second_pid = kubelet.pid(second)
        assert second != first
        owner = parse_cgroup_file(runtime.read_cgroup(second_pid))
        assert (owner.pod_uid, owner.container_id) == (pod.uid, second)
        owners = attributor.resolve([first_pid, second_pid], 1.0)
        assert (_names(owners[second_pid]), owners[second_pid].container_id) == (
            ("kubernetes", "search", "embedder-7c9f5-abcde", "embedder", pod.uid), second)
        assert owners[first_pid].kind == "unknown"  # gone
    finally:
        attributor.close()


def test_a_process_started_by_exec_belongs_to_its_container(containerd, kubelet) -> None:
    """ExecSync (kubectl exec) starts a process that outlives the call: it is in the
    container's cgroups, and the agent counts it with the container's main process."""
    pod = kubelet.run_pod("notebook-0", "lab", "guaranteed")
    cid = kubelet.start_container(pod, "jupyter")
    main_pid = kubelet.pid(cid)
    result = kubelet.exec_sync(cid, ["/bin/sh", "-c", f"sleep {runtime.SLEEP_FOREVER} </dev/null >/dev/null 2>&1 & "
                                                      "echo $!"])
    assert result.exit_code == 0, result.stderr
    in_container = int(result.stdout.decode().strip())
    exec_pid = wait_until(lambda: runtime.host_pid(in_container, cid), what="the exec'd process on the host")
    assert exec_pid != main_pid and runtime.read_cgroup(exec_pid) == runtime.read_cgroup(main_pid)
    _, backend = _nvml({main_pid: 1 * GiB, exec_pid: 3 * GiB})
    attributor = build_attributor(_args(cri_socket=containerd.socket), NODE)
    try:
        collector = Collector([backend], NODE, interval=1.0, attributor=attributor)
        collector.collect_once()
        m = _scrape(collector)
        labels = dict(namespace="lab", pod="notebook-0", container="jupyter", pod_uid=pod.uid)
        assert _value(m, "container_gpu_processes", **labels) == 2
        assert _value(m, "container_gpu_memory_used_bytes", **labels) == 4 * GiB
        assert attributor.comm(exec_pid) == "sleep"
    finally:
        attributor.close()
        backend.close()


def test_an_agent_in_its_own_cgroup_namespace_reads_the_host_proc(containerd, kubelet, tmp_path) -> None:
    """The agent as a DaemonSet runs it: in its own cgroup namespace (unshare -C) below a
    cgroup of its own, and in its own PID namespace with the host's /proc mounted elsewhere
    (--proc-root). It sees the containers' cgroup paths relative to its own cgroup, and
    still names every pod; with its own /proc it sees none of the GPU's PIDs."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount (Debian util-linux, mount)")
    pods = [kubelet.run_pod("ocr-worker-0", "docs", "burstable"),
            kubelet.run_pod("batch-0", "docs", "besteffort", pod_cgroup=False)]
    cids = [kubelet.start_container(pods[0], "ocr"), kubelet.start_container(pods[1], "batch")]
    pids = [kubelet.pid(c) for c in cids]
    agent_cgroup = f"l9gpu-agent-{uuid.uuid4().hex[:8]}"
    procs_files = [d / "cgroup.procs" for d in runtime.cgroup_dirs(agent_cgroup)]
    host_proc = tmp_path / "host-proc"
    host_proc.mkdir()
    seen = tmp_path / "seen-cgroup"
    launcher = [sys.executable, str(REPO / "tests" / "fakes" / "nvml_cli.py"), ",".join(map(str, pids)), "--",
                "snapshot", "--json", "--backend", "nvml", "--kubernetes", "off", "--pod-resources-socket", "off",
                "--cri-socket", containerd.socket, "--node-name", NODE]
    agent = " ".join(map(shlex.quote, launcher))
    # In the agent's namespaces: what it sees of a container's cgroup file, then the agent
    # with its own /proc, then with the host's.
    inner = (f"cat {host_proc}/{pids[0]}/cgroup > {seen} && "
             f"{agent} --proc-root /proc > {tmp_path}/own.json && "
             f"exec {agent} --proc-root {host_proc} > {tmp_path}/host.json")
    # A private mount namespace holds the host /proc's bind mount; the agent's shell joins
    # its own cgroup first, so that its cgroup namespace is rooted there.
    script = (f"set -e; for f in {' '.join(shlex.quote(str(f)) for f in procs_files)}; do echo $$ > \"$f\"; done; "
              f"mount --bind /proc {host_proc}; "
              f"exec unshare --cgroup --pid --fork --mount-proc sh -c {shlex.quote(inner)}")
    agent_dirs = runtime.make_cgroup(agent_cgroup)
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], env=env,
                              capture_output=True, timeout=4 * PATIENCE)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    finally:
        for d in agent_dirs:
            wait_until(lambda d=d: runtime.remove_cgroup(d), 30, f"{d} removed")
    # Relative to the agent's cgroup, on every hierarchy: /../kubepods/burstable/pod<uid>/<id>
    seen_lines = [line for line in seen.read_text().splitlines() if line]
    assert seen_lines and all(line.split(":", 2)[2] == f"/../kubepods/burstable/pod{pods[0].uid}/{cids[0]}"
                              for line in seen_lines), seen_lines
    document = json.loads((tmp_path / "host.json").read_text())
    processes = {p["pid"]: p for gpu in document["gpus"] for p in gpu["processes"]}
    for pid, pod, cid, name in zip(pids, pods, cids, ("ocr", "batch")):
        p = processes[pid]
        assert (p["kind"], p["namespace"], p["pod"], p["container"], p["pod_uid"], p["container_id"]) == (
            "kubernetes", "docs", pod.name, name, pod.uid, cid)
    own = json.loads((tmp_path / "own.json").read_text())
    assert all(p["kind"] == "unknown" and not p["pod"] for gpu in own["gpus"] for p in gpu["processes"])


def test_containerd_restarting_under_a_running_agent(containerd, kubelet) -> None:
    """containerd stops (its shims and containers keep running, as on a node where it is
    restarted): the CRI collector turns unhealthy within its promised bound, the names
    stay; containerd comes back: healthy again, the same containers listed, and a container
    started since is named."""
    pod = kubelet.run_pod("reranker-0", "search", "burstable")
    cid = kubelet.start_container(pod, "reranker")
    pid = kubelet.pid(cid)
    fake, backend = _nvml({pid: 2 * GiB})
    attributor = _agent(containerd, interval=0.2, min_refresh=0.0)
    source = attributor.fallback
    labels = dict(namespace="search", pod="reranker-0", container="reranker", pod_uid=pod.uid)
    try:
        collector = Collector([backend], NODE, interval=1.0, attributor=attributor)
        collector.collect_once()
        m = _scrape(collector)
        assert _value(m, "container_gpu_memory_used_bytes", **labels) == 2 * GiB
        assert _value(m, "l9gpu_collector_success", collector="cri") == 1.0

        containerd.stop()
        wait_until(lambda: not source.healthy(), within(source.outage_bound), "the CRI source unhealthy")
        assert os.path.exists(f"/proc/{pid}")  # the container runs on without its daemon
        collector.collect_once()
        m = _scrape(collector)
        assert _value(m, "l9gpu_collector_success", collector="cri") == 0.0
        assert _value(m, "container_gpu_memory_used_bytes", **labels) == 2 * GiB

        containerd.start()
        listings = source.listings
        wait_until(lambda: source.healthy() and source.listings > listings, what="the CRI source healthy again")
        collector.collect_once()
        m = _scrape(collector)
        assert _value(m, "l9gpu_collector_success", collector="cri") == 1.0
        assert _value(m, "container_gpu_memory_used_bytes", **labels) == 2 * GiB  # listed again after restart
        sidecar = kubelet.start_container(pod, "tokenizer")
        sidecar_pid = kubelet.pid(sidecar)
        fake.gpus[0].processes.append(F.FakeProcess(pid=sidecar_pid, used_memory=GiB))
        collector.collect_once()
        m = _scrape(collector)
        assert _value(m, "container_gpu_memory_used_bytes", **{**labels, "container": "tokenizer"}) == GiB
    finally:
        attributor.close()
        backend.close()


def test_systemd_cgroup_driver(containerd) -> None:
    comm = Path("/proc/1/comm").read_text().strip()
    if comm != "systemd":
        pytest.skip(f"the systemd cgroup driver (SystemdCgroup = true) needs systemd as PID 1; PID 1 here is "
                    f"{comm!r}: only the cgroupfs driver runs on this machine")
    base = Path(tempfile.mkdtemp(prefix="l9gpu-ctrd-sd-", dir="/tmp"))
    daemon = runtime.Containerd(base, containerd.snapshotter, systemd_cgroup=True)
    kubelet = runtime.Kubelet(daemon, api, grpc)
    slice_name = ""
    try:
        daemon.start()
        daemon.import_image(runtime.build_image(base / "image.tar"))
        uid = str(uuid.uuid4())
        # The kubelet's systemd driver names the pod's slice as the cgroup parent.
        slice_name = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        pod = kubelet.run_pod("vllm-0", "inference", "burstable", uid=uid, pod_cgroup=False, cgroup_parent=slice_name)
        cid = kubelet.start_container(pod, "engine")
        pid = kubelet.pid(cid)
        owner = parse_cgroup_file(runtime.read_cgroup(pid))
        assert (owner.runtime, owner.pod_uid, owner.qos, owner.container_id) == (
            "containerd", uid, "burstable", cid), runtime.read_cgroup(pid)
        attributor = _agent(daemon, min_refresh=0.0)
        try:
            assert _names(attributor.resolve([pid], 0.0)[pid]) == ("kubernetes", "inference", "vllm-0", "engine", uid)
        finally:
            attributor.close()
    finally:
        problems = kubelet.cleanup() if daemon.running else []
        if slice_name:
            subprocess.run(["systemctl", "stop", slice_name], capture_output=True, timeout=PATIENCE)
        problems += runtime.teardown_daemon(daemon)
    assert not problems, problems
