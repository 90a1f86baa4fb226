"""End to end: `l9gpu serve --backend gaudi` with the stand-in hl-smi and real processes.

Real child processes hold ``/dev/accel/accel<N>`` open, so the agent's fd scan of the real
/proc finds them exactly as on a Gaudi node. Without Gaudi hardware there is no
/dev/accel; as root the test creates the two device paths as plain files for its
duration (and removes them after). Where /dev/accel already exists (a real Gaudi node) or
the test is not root, it skips with the reason.

The pod test also puts one holder into a real Kubernetes-shaped cgroup (see
cgroup_helpers) and serves its pod from a local API server (fakes.kubernetes_apiserver), so
the agent's whole attribution path (PID -> /proc/<pid>/cgroup -> pod) runs unchanged
for Gaudi, and checks the pod-labelled series it serves.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from cgroup_helpers import burstable_scope, cgroup2_unwritable, cgroup_tree, container_id, kubeconfig, pod_uid
from prometheus_client.parser import text_string_to_metric_families
from waiting import PATIENCE

REPO = Path(__file__).resolve().parent.parent
FAKE_HL_SMI = str(Path(__file__).parent / "fakes" / "hl-smi")
ACCEL = Path("/dev/accel")
MiB = 2**20
HOST_SESSION = "user.slice/user-0.slice/session-3.scope"

HEALTHY = (
    "0, 01P0-HL2080A0-15-TNF0A8-03-07-02, AM43000131, HL-225, 0000:33:00.0, 1.17.0-e3a4b6f, 17, 2048, 98304, 215, 34\n"
    "1, 01P0-HL2080A0-15-TNF0A8-03-07-05, AM43000162, HL-225, 0000:9a:00.0, 1.17.0-e3a4b6f, 0, 768, 98304, 98, N/A\n"
)


@pytest.fixture
def accel_nodes():
    """/dev/accel/accel0 and accel1 as plain files, for real processes to hold open."""
    if os.geteuid() != 0:
        pytest.skip("creating /dev/accel fixture nodes needs root")
    if ACCEL.exists():
        pytest.skip("/dev/accel exists (a real accelerator node); not touching it")
    try:
        ACCEL.mkdir()
    except OSError as exc:
        pytest.skip(f"/dev is not writable here: {exc}")
    try:
        for n in (0, 1):
            (ACCEL / f"accel{n}").write_bytes(b"")
            (ACCEL / f"accel_controlD{n}").write_bytes(b"")
        yield ACCEL
    finally:
        shutil.rmtree(ACCEL, ignore_errors=True)


def _holder(*paths: str) -> subprocess.Popen:
    """A real process that opens ``paths`` and sleeps."""
    code = ("import sys, time\nfiles = [open(p, 'rb') for p in sys.argv[1:]]\n"
            "print('ready', flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, *paths], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _values(samples, name: str, **labels: str) -> list[float]:  # type: ignore[no-untyped-def]
    return [v for lab, v in samples.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]


def _wait_for(url: str, check, timeout: float = PATIENCE):  # type: ignore[no-untyped-def]
    """Scrape until ``check(samples)`` holds; return the samples."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            samples = _scrape(url)
            if check(samples):
                return samples
            last = samples
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout}s; last: {last!r}"[:4000])


@pytest.fixture
def agent(tmp_path):
    started: list[tuple[subprocess.Popen, Path]] = []

    def start(*args: str, env: dict[str, str]) -> str:
        port = _free_port()
        log = tmp_path / f"agent-{port}.log"
        full_env = {**os.environ, **env, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}", *args],
            cwd=REPO, env=full_env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )
        started.append((proc, log))
        return f"http://127.0.0.1:{port}/metrics"

    yield start
    for proc, _log in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_serve_gaudi_end_to_end(tmp_path, accel_nodes, agent):
    output = tmp_path / "hl-smi.csv"
    output.write_text(HEALTHY)
    sleep_file = tmp_path / "hl-smi.sleep"
    holders = [_holder("/dev/accel/accel0"), _holder("/dev/accel/accel1"),
               _holder("/dev/accel/accel1", "/dev/accel/accel_controlD0")]
    monitor = _holder("/dev/accel/accel_controlD1")  # a monitoring tool: not a GPU process
    try:
        url = agent("--backend", "gaudi", "--hl-smi", FAKE_HL_SMI, "--hl-smi-timeout", "3s",
                    "--proc-root", "/proc", "--interval", "200ms", "--node-name", "gaudi-node-1",
                    "--process-metrics",
                    env={"FAKE_HL_SMI_OUTPUT_FILE": str(output), "FAKE_HL_SMI_SLEEP_FILE": str(sleep_file)})
        samples = _wait_for(url, lambda s: _values(s, "gpu_up", gpu="1") == [1.0])

        info = {lab["gpu"]: lab for lab, _ in samples["gpu_info"]}
        assert info["0"]["vendor"] == "gaudi" and info["0"]["serial"] == "AM43000131"
        assert info["1"]["pci_bus_id"] == "0000:9a:00.0" and info["1"]["model"] == "HL-225"
        assert info["0"]["node"] == "gaudi-node-1"
        assert _values(samples, "gpu_utilization_ratio", gpu="0") == [pytest.approx(0.17)]
        assert _values(samples, "gpu_memory_used_bytes", gpu="0") == [2048 * MiB]
        assert _values(samples, "gpu_memory_total_bytes", gpu="1") == [98304 * MiB]
        assert _values(samples, "gpu_power_watts", gpu="0") == [215.0]
        assert _values(samples, "gpu_temperature_celsius", gpu="0") == [34.0]
        assert _values(samples, "gpu_temperature_celsius", gpu="1") == []  # N/A: omitted, not 0

        # Each (process, device) holding a compute node is a GPU process: holder 0 on GPU 0,
        # holders 1 and 2 on GPU 1. Holder 2's control node on GPU 0 and the monitoring
        # tool's control node do not count. Without pod attribution they are unattributed.
        assert _values(samples, "l9gpu_unattributed_processes", node="gaudi-node-1") == [3.0]

        # A malformed line for one device: that device goes down, the other keeps exporting.
        output.write_text(HEALTHY.splitlines()[0] + "\n1, 01P0, AM43000162, HL-225, 0000:9a:00.0, garbled\n")
        samples = _wait_for(url, lambda s: _values(s, "gpu_up", gpu="1") == [0.0])
        assert _values(samples, "gpu_up", gpu="0") == [1.0]
        assert _values(samples, "gpu_power_watts", gpu="0") == [215.0]
        assert _values(samples, "l9gpu_backend_errors_total", backend="gaudi", reason="malformed_line")[0] >= 1

        # A hung hl-smi: killed after the timeout, the backend collector fails, the agent serves on.
        output.write_text(HEALTHY)
        sleep_file.write_text("30")
        samples = _wait_for(url, lambda s: (_values(s, "l9gpu_backend_errors_total", backend="gaudi", reason="timeout")
                                            or [0])[0] >= 1)
        samples = _wait_for(url, lambda s: _values(s, "l9gpu_collector_success", collector="gaudi") == [0.0])
        assert _values(samples, "gpu_up", gpu="0") == [0.0]
        sleep_file.write_text("0")
        _wait_for(url, lambda s: _values(s, "gpu_up", gpu="0") == [1.0]
                  and _values(s, "l9gpu_collector_success", collector="gaudi") == [1.0])
    finally:
        for proc in [*holders, monitor]:
            proc.kill()
            proc.wait()


def test_serve_gaudi_attributes_accel_holders_to_pods(tmp_path, accel_nodes, agent):
    """A process of a pod holding accel0 gets pod-labelled series; a host process on accel1 does not."""
    reason = cgroup2_unwritable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
    from fakes.kubernetes_apiserver import FakeApiServer, make_pod

    node = "gaudi-node-1"
    uid, cid = pod_uid(), container_id()
    output = tmp_path / "hl-smi.csv"
    output.write_text(HEALTHY)
    apiserver = FakeApiServer()
    apiserver.start()
    try:
        with cgroup_tree() as cgroups:
            # Moved before the agent starts: a process's cgroup is read once per lifetime,
            # and a container's processes start in their cgroup.
            cgroups.adopt(_holder("/dev/accel/accel0"), burstable_scope(uid, cid))
            # A host login session (not a pod, not a Slurm job), wherever the runner lives.
            cgroups.adopt(_holder("/dev/accel/accel1"), HOST_SESSION)
            apiserver.add(make_pod("trainer-5d8f7b9c4-x2k9q", "ml", uid, node, {"trainer": cid},
                                   labels={"team": "vision", "pod-template-hash": "5d8f7b9c4"},
                                   owner=("ReplicaSet", "trainer-5d8f7b9c4")))
            apiserver.add(make_pod("elsewhere", "ml", pod_uid(), "gaudi-node-2", {"x": container_id()}))

            url = agent("--backend", "gaudi", "--hl-smi", FAKE_HL_SMI, "--proc-root", "/proc",
                        "--kubeconfig", kubeconfig(tmp_path, apiserver), "--kubernetes", "on",
                        "--pod-label", "team", "--interval", "250ms", "--node-name", node, "--detail",
                        env={"FAKE_HL_SMI_OUTPUT_FILE": str(output)})
            pod = {"namespace": "ml", "pod": "trainer-5d8f7b9c4-x2k9q", "container": "trainer", "pod_uid": uid,
                   "owner_kind": "Deployment", "owner_name": "trainer", "label_team": "vision",
                   "gpu": "0", "uuid": "01P0-HL2080A0-15-TNF0A8-03-07-02", "model": "HL-225", "node": node}
            samples = _wait_for(url, lambda s: _values(s, "container_gpu_processes", **pod) == [1.0]
                                and _values(s, "container_gpu_allocation_seconds_total", **pod) != [0.0])

            # Exactly one workload series, on GPU 0, carrying the pod's full identity.
            (labels, _), = samples["container_gpu_processes"]
            assert labels == {**pod, "gpu_instance": "", "slurm_job_id": "", "slurm_user": "", "slurm_account": ""}
            # hl-smi has no per-process memory or utilisation: omitted, not 0, and so is what
            # derives from them (idle time, SM-time integral).
            for family in ("container_gpu_memory_used_bytes", "container_gpu_utilization_ratio",
                           "container_gpu_idle_seconds", "container_gpu_usage_seconds_total"):
                assert samples.get(family, []) == [], (family, samples.get(family))
            # The device's energy goes to the pod holding it (the only holder of accel0).
            assert len(_values(samples, "container_gpu_energy_joules_total", **pod)) == 1
            assert _values(samples, "gpu_unattributed_energy_joules_total", gpu="0") == [0.0]
            # The host process on accel1 is the node's one unattributed GPU process.
            assert _values(samples, "l9gpu_unattributed_processes", node=node) == [1.0]
            assert _values(samples, "l9gpu_collector_success", collector="kubernetes") == [1.0]
            assert _values(samples, "l9gpu_host_pids_visible", node=node) == [1.0]

            # Allocation time grows while the pod holds the device.
            first = _values(samples, "container_gpu_allocation_seconds_total", **pod)[0]
            later = _wait_for(url, lambda s: (_values(s, "container_gpu_allocation_seconds_total", **pod)
                                              or [0.0])[0] > first + 0.2)
            assert _values(later, "container_gpu_processes", **pod) == [1.0]
    finally:
        apiserver.stop()
