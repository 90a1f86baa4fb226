"""`l9gpu snapshot` shows names chosen by a node's users as text, never as terminal control.

A real process renames itself with prctl(PR_SET_NAME) to a string that would retitle and
clear the operator's terminal; the NVML fake reports it holding a GPU; `l9gpu snapshot`
runs in a child process as an operator runs it, and its stdout bytes are checked: the
escape bytes never reach them, their visible escapes do. In a real Slurm-shaped cgroup,
the job's user (from the job's environment) is checked the same way. ``--json`` stays
exact JSON: the names come back unchanged when parsed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent import REPO
from cgroup_helpers import cgroup2_unwritable, cgroup_tree
from waiting import PATIENCE, wait_until

pytest.importorskip("fakes.pynvml_fake", reason="the NVML fake is not available")

TESTS = Path(__file__).resolve().parent
# ESC ] 0 ; PWN BEL retitles an xterm, ESC [ 2 J clears it: 12 bytes, under comm's 15.
HOSTILE_COMM = "\x1b]0;PWN\x07\x1b[2J"
VISIBLE_COMM = "\\x1b]0;PWN\\x07\\x1b[2J"
HOSTILE_USER = "bob\x1b]0;PWN\x07\u202e"
VISIBLE_USER = "bob\\x1b]0;PWN\\x07\\u202e"

# A process that takes the hostile name, says so, and sleeps.
RENAMED = f"""
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(15, ctypes.c_char_p({HOSTILE_COMM.encode()!r}), 0, 0, 0) != 0:  # PR_SET_NAME
    sys.exit("prctl failed: errno %d" % ctypes.get_errno())
print("renamed", flush=True)
time.sleep(600)
"""

# `l9gpu snapshot` over the NVML fake, whose one GPU is held by the PIDs in argv[1].
SNAPSHOT = f"""
import json, sys
sys.path.insert(0, {str(TESTS)!r})
from fakes import pynvml_fake as F
pids = json.loads(sys.argv[1])
sys.modules["pynvml"] = F.FakeNvml(gpus=[F.FakeGpu(processes=[F.FakeProcess(pid=p, used_memory=2 * 2**30)
                                                               for p in pids])])
from exporter.app.cli import main
sys.exit(main(sys.argv[2:]))
"""


def start_renamed(env: dict[str, str] | None = None) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", RENAMED], stdout=subprocess.PIPE,
                             env={**os.environ, **(env or {})})
    assert child.stdout is not None and child.stdout.readline() == b"renamed\n"
    assert Path(f"/proc/{child.pid}/comm").read_bytes() == HOSTILE_COMM.encode() + b"\n"
    return child


def snapshot(pids: list[int], *flags: str) -> bytes:
    """stdout of `l9gpu snapshot FLAGS` with the fake GPU held by ``pids``, as raw bytes."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", SNAPSHOT, json.dumps(pids), "snapshot", "--backend", "nvml",
                             "--kubernetes", "off", "--gpm-interval", "off", "--node-name", "n1", *flags],
                            cwd=REPO, env=env, capture_output=True, timeout=PATIENCE)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout


def assert_no_control(out: bytes) -> None:
    controls = sorted({chr(b) for b in out if b < 0x20 and b != 0x0A or b == 0x7F})
    assert not controls, f"control characters reached the terminal: {controls!r}"
    assert "\u202e" not in out.decode()


def test_a_process_name_with_terminal_escapes_is_printed_escaped():
    child = start_renamed()
    try:
        out = snapshot([child.pid])
        assert_no_control(out)
        line = [x for x in out.decode().splitlines() if f"pid {child.pid} " in x]
        assert len(line) == 1, out
        assert VISIBLE_COMM in line[0] and line[0].rstrip().endswith("host")
        doc = json.loads(snapshot([child.pid], "--json"))  # exact JSON, escaped by JSON itself
        (proc,) = doc["gpus"][0]["processes"]
        assert proc["pid"] == child.pid and proc["comm"] == HOSTILE_COMM
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(bool(cgroup2_unwritable()), reason=cgroup2_unwritable() or "ok")
def test_slurm_fields_with_terminal_escapes_are_printed_escaped():
    """A Slurm job's user comes from the job's environment, which the job's owner sets."""
    with cgroup_tree() as cgroups:
        child = start_renamed({"SLURM_JOB_ID": "77", "SLURM_JOB_USER": HOSTILE_USER,
                               "SLURM_JOB_ACCOUNT": "=HYPERLINK(\"http://x\")\x1b[2J"})
        cgroups.adopt(child, "system.slice/slurmstepd.scope/job_77/step_0/user/task_0")
        out = snapshot([child.pid])
        assert_no_control(out)
        line = [x for x in out.decode().splitlines() if f"pid {child.pid} " in x]
        assert len(line) == 1, out
        assert VISIBLE_COMM in line[0] and line[0].rstrip().endswith(f"slurm job 77 step 0 ({VISIBLE_USER})")
        raw = snapshot([child.pid], "--json")
        assert b"\x1b" not in raw and b"\x07" not in raw  # \u001b, \u0007 in the JSON text
        (workload,) = json.loads(raw)["gpus"][0]["workloads"]
        assert workload["slurm_user"] == HOSTILE_USER and workload["owner"] == f"slurm job 77 step 0 ({HOSTILE_USER})"


def test_pod_namespace_and_container_names_are_printed_escaped(tmp_path):
    """Every user-chosen field of the table: namespace, pod and container too."""
    scenario = tmp_path / "hostile.yaml"
    scenario.write_text(json.dumps({  # JSON is YAML, and writes the escapes exactly
        "node": "n1", "gpus": {"count": 1, "model": "NVIDIA H100 80GB HBM3", "memory_gib": 80},
        "processes": [{"name": "ok\x1b[31mred", "gpus": [0], "pid": 41001, "memory_gib": 1, "utilization": 0.5,
                       "workload": {"namespace": "ns\x1b[2J", "pod": "pod\x07\x08\x08\x08", "container": "c\u202eexe",
                                    "labels": {"team": "\x1b]0;PWN\x07"}}}],
    }))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-m", "exporter", "snapshot", "--backend", "simulated",
                             "--scenario", str(scenario), "--pod-label", "team"],
                            cwd=REPO, env=env, capture_output=True, timeout=PATIENCE)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert_no_control(result.stdout)
    text = result.stdout.decode()
    assert "ok\\x1b[31mred" in text and "ns\\x1b[2J/pod\\x07\\x08\\x08\\x08/c\\u202eexe" in text


def test_escaping_for_the_terminal():
    from exporter.core.escape import for_terminal

    assert for_terminal("vllm-0 naïve 模型 C:\\path") == "vllm-0 naïve 模型 C:\\path"  # unchanged
    assert for_terminal("a\tb\nc\rd\x00\x7f\x9b\u2028\u2066") == "a\\x09b\\x0ac\\x0dd\\x00\\x7f\\x9b\\u2028\\u2066"


def strict_loads(text: str | bytes) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


NAN_POWER = """
node: n1
gpus: {count: 1, model: NVIDIA H100 80GB HBM3, memory_gib: 80,
       power: {idle_watts: .nan, max_watts: 700, limit_watts: 700}}
processes:
  - {name: p, gpus: [0], pid: 41001, memory_gib: 1, utilization: 0.5,
     workload: {namespace: ns, pod: p-0, container: c}}
"""


def test_snapshot_json_and_the_api_are_strict_json_with_nan_values(tmp_path, agent_factory):
    """A NaN power (here from a scenario; a driver can give one too) is null in both
    `l9gpu snapshot --json` and /api/v1/snapshot, never the NaN no JSON parser accepts."""
    scenario = tmp_path / "nan.yaml"
    scenario.write_text(NAN_POWER)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-m", "exporter", "snapshot", "--backend", "simulated", "--json",
                             "--scenario", str(scenario)], cwd=REPO, env=env, capture_output=True, timeout=PATIENCE)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    gpu = strict_loads(result.stdout)["gpus"][0]
    assert gpu["power_watts"] is None and gpu["memory_total_bytes"] == 80 * 2**30
    agent = agent_factory("--backend", "simulated", "--scenario", str(scenario))
    status, _, body = wait_until(lambda: (r := agent.get("/api/v1/snapshot"))[0] == 200 and r,
                                 what="a snapshot on /api/v1/snapshot")
    served = strict_loads(body)
    assert served["gpus"][0]["power_watts"] is None and served["gpus"][0]["workloads"][0]["pod"] == "p-0"


def test_strict_json_is_the_plain_encoding_when_every_value_is_finite():
    from exporter.core.escape import strict_json
    from exporter.output.snapshot_json import document_json

    doc = {"a": [1.5, -2.0, {"b": None, "c": "\x1b"}], "d": 3}
    assert document_json(doc) == json.dumps(doc, indent=2) + "\n"
    assert document_json(doc, pretty=False) == json.dumps(doc, separators=(",", ":")) + "\n"
    assert strict_json({"x": float("nan"), "y": (float("inf"), -float("inf"), 1.0)}) == \
        '{"x": null, "y": [null, null, 1.0]}'


def test_the_simulated_node_table_has_a_process_header_and_calls_out_what_needs_a_look():
    from agent import run_cli

    result = run_cli(["snapshot", "--backend", "simulated", "--incidents-from", "off"])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split()[-4:] == ["HEALTH", "(1", "PASS)", "PROCESSES"]  # no agent: this pass's verdicts
    assert lines[2].split() == ["PID", "COMMAND", "MEMORY", "SM", "OWNER"]
    gpu4 = next(line for line in lines if line.startswith("4 "))
    assert gpu4.split()[-2:] == ["degraded", "1"]
    look = lines[lines.index("needs a look:") + 1:]
    assert "  GPU 4 is degraded (action: reset gpu): a memory row waits for a GPU reset to be remapped" in look
    assert ("  allocated, unused: ml-research/idle-reservation-0/trainer has GPU 7 allocated and runs nothing on it"
            in look)
    assert any(line.startswith("  idle holder: data-science/jupyter-alice-0/notebook holds 70.0 GiB on GPU 6 "
                               "at 0% SM") for line in look)
    # the healthy, busy GPUs are not called out
    assert not any("GPU 0" in line for line in look)


def test_attention_names_down_gpus_and_sm_busy_without_tensor_cores():
    from exporter.app.snapshot_cmd import format_attention

    doc = {"gpus": [
        {"index": 0, "up": False, "error": "GPU is lost", "workloads": []},
        {"index": 1, "up": True, "gpm": {"sm_active": 0.8, "tensor_active": 0.0}, "workloads": []},
        {"index": 2, "up": True, "gpm": {"sm_active": 0.8, "tensor_active": 0.4}, "workloads": []},
        {"index": 3, "up": True, "gpm": {"sm_active": 0.2, "tensor_active": 0.0}, "workloads": []},
        {"index": 4, "up": True, "gpu_instance": "1", "workloads": [
            {"owner": "ns/pod/\x1b[2Jc", "zombie": True, "memory_used_bytes": 2 * 2**30}]},
    ]}
    text = format_attention(doc)
    assert text.splitlines() == [
        "needs a look:",
        "  GPU 0 is down: GPU is lost",
        "  busy without tensor cores: GPU 1 SM active 80%, tensor 0% (FP32 where TF32 or BF16 would do?)",
        "  idle holder: ns/pod/\\x1b[2Jc holds 2.0 GiB on GPU 4 MIG 1 at 0% SM in this pass",
    ]
    assert format_attention({"gpus": [{"index": 0, "up": True, "workloads": []}]}) == ""


def test_the_json_timestamp_is_also_rfc3339():
    from datetime import datetime

    from agent import run_cli

    result = run_cli(["snapshot", "--backend", "simulated", "--json"])
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["timestamp_rfc3339"].endswith("Z")
    parsed = datetime.fromisoformat(doc["timestamp_rfc3339"].replace("Z", "+00:00"))
    assert abs(parsed.timestamp() - doc["timestamp"]) < 0.001


def test_the_table_names_who_was_on_a_gpu_when_it_went_down():
    from exporter.app.snapshot_cmd import format_table
    from exporter.collect.derive import DeriveState, step
    from exporter.core.model import DeviceSample, ProcessSample, Snapshot, Workload

    owners = {7: Workload(kind="kubernetes", namespace="search", pod="embedder-0", container="e", pod_uid="u")}
    up = DeviceSample(index=3, uuid="GPU-3", model="H100", processes=(ProcessSample(7, 2**30, 0.5),))
    state, _ = step(DeriveState(), 0.0, "n", [up], owners)
    lost = up.down("GPU is lost")
    _, derived = step(state, 1.0, "n", [lost], owners)
    table = format_table(Snapshot(seq=2, node="n", timestamp=0.0, devices=(lost,), workloads=derived.workloads))
    assert table.splitlines()[3:] == ["3    H100                         DOWN: GPU is lost",
                                      "       was on it when it went down: search/embedder-0/e"]
