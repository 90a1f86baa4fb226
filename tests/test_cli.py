"""The command line as a user meets it: clear errors, env vars, snapshot, clean shutdown."""

import json
import signal
import time

import pytest
from agent import AgentProcess, run_cli


@pytest.mark.parametrize("args,message", [
    (["serve", "--interval", "fast"], "invalid duration 'fast'"),
    (["serve", "--interval", "0s"], "greater than zero"),
    (["serve", "--listen", "9835"], "use HOST:PORT"),
    (["serve", "--log-format", "xml"], "invalid choice: 'xml'"),
    (["serve", "--bogus"], "unrecognized arguments: --bogus"),
    (["serve", "--backend", "cuda"], "unknown backend 'cuda'"),
    (["serve", "--backend", "simulated", "--disable-metric", "gpu_nope"], "unknown metric 'gpu_nope'"),
    (["snapshot", "--backend", "simulated", "--scenario", "/nonexistent.yaml"], "cannot read scenario"),
    (["snapshot", "--backend", "simulated", "--proc-root", "/nonexistent"], "--proc-root /nonexistent is not a proc"),
    # a negative value is read as the flag's value, whichever way it is written
    (["serve", "--interval", "-1s"], "argument --interval: invalid duration '-1s': a negative duration is not allowed"),
    (["serve", "--interval=-1s"], "argument --interval: invalid duration '-1s': a negative duration is not allowed"),
    (["serve", "--workload-grace", "-5m"], "invalid duration '-5m': a negative duration is not allowed"),
    # a key no pod can carry, named with the grammar (not exported as label_bad_label_)
    (["serve", "--backend", "simulated", "--pod-label", "bad label!"],
     "argument --pod-label: invalid pod label key 'bad label!': a Kubernetes label key is a name of at most 63"),
    (["serve", "--backend", "simulated", "--pod-label", "example.com/"], "invalid pod label key 'example.com/'"),
    (["serve", "--backend", "simulated", "--pod-label", "Bad_Prefix/team"], "invalid pod label key 'Bad_Prefix/team'"),
    (["serve", "--backend", "simulated", "--pod-label", "x" * 64], "invalid pod label key"),
])
def test_bad_flags_exit_2_with_one_clear_line(args, message):
    result = run_cli(args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_bad_environment_value_names_the_variable():
    result = run_cli(["serve", "--backend", "simulated"], env={"L9GPU_INTERVAL": "soon"})
    assert result.returncode == 2
    assert "L9GPU_INTERVAL" in result.stderr and "invalid duration" in result.stderr


def test_pod_label_keys_kubernetes_allows_are_taken():
    result = run_cli(["snapshot", "--backend", "simulated", "--json", "--pod-label", "team",
                      "--pod-label", "app.kubernetes.io/name", "--pod-label", "A-b_c.9"])
    assert result.returncode == 0, result.stderr


def test_a_bad_pod_label_in_the_environment_names_the_variable():
    result = run_cli(["serve", "--backend", "simulated"], env={"L9GPU_POD_LABEL": "team,bad label!"})
    assert result.returncode == 2
    assert "L9GPU_POD_LABEL" in result.stderr and "invalid pod label key 'bad label!'" in result.stderr


def test_auto_without_gpus_points_to_the_demo():
    result = run_cli(["snapshot", "--backend", "auto"], env={"PATH": "/nonexistent"})
    assert result.returncode == 2
    assert "--backend simulated" in result.stderr


def test_snapshot_table_and_json():
    table = run_cli(["snapshot", "--backend", "simulated", "--node-name", "gpu-node-7"])
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("node gpu-node-7 (simulated: its scenario replayed from the start")
    assert "NVIDIA H100 80GB HBM3" in table.stdout and "pid 61001" in table.stdout
    doc = json.loads(run_cli(["snapshot", "--backend", "simulated", "--json"]).stdout)
    assert doc["node"] == "sim-node-01"  # the scenario's node when no name is given
    assert len(doc["gpus"]) == 8
    zombie = [p for g in doc["gpus"] for p in g["processes"] if p["pid"] == 61001][0]
    assert zombie["memory_used_bytes"] == 70 * 2**30 and zombie["sm_utilization_ratio"] == 0.0


def test_flags_come_from_the_environment(agent_factory):
    agent = agent_factory("--backend", "simulated", env={"L9GPU_NODE_NAME": "env-node", "L9GPU_PROCESS_METRICS": "true",
                                                         "L9GPU_DISABLE_METRIC": "gpu_fan_speed_ratio,gpu_power_watts"})
    m = agent.samples()
    assert {lab["node"] for lab, _ in m["gpu_up"]} == {"env-node"}
    assert "gpu_process_memory_used_bytes" in m
    assert "gpu_power_watts" not in m


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_shut_down_cleanly_without_waiting_for_the_next_pass(tmp_path, sig):
    # With a 30 s interval the collector sleeps between passes: shutdown must not wait
    # that out (it takes well under a second on an idle machine).
    agent = AgentProcess(["--backend", "simulated", "--interval", "30s"], log_path=tmp_path / "a.log")
    agent.start()
    started = time.monotonic()
    code = agent.stop(sig)
    assert time.monotonic() - started < 15.0
    assert code == 0, agent.log()
    assert "Traceback" not in agent.log()


def test_port_in_use_is_a_clear_error(agent_factory):
    first = agent_factory("--backend", "simulated")
    result = run_cli(["serve", "--backend", "simulated", "--listen", f"127.0.0.1:{first.port}"])
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{first.port}" in result.stderr


def test_json_logs_are_one_object_per_line(tmp_path):
    agent = AgentProcess(["--backend", "simulated", "--log-format", "json", "--node-name", "n1"],
                         log_path=tmp_path / "a.log")
    agent.start()
    agent.stop()
    lines = [json.loads(line) for line in agent.log().splitlines() if line.strip()]
    serving = [e for e in lines if "serving node n1" in e["message"]]
    assert serving and serving[0]["level"] == "info" and serving[0]["logger"] == "l9gpu"
    assert {"time", "level", "logger", "message"} <= set(serving[0])


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_lines_hold_no_raw_control_character_and_forge_no_line(fmt, capsys):
    """Text from others in a log record (a server's error, a name) cannot start a log line
    of its own or drive the reader's terminal; a traceback keeps its lines, escaped."""
    import logging

    from exporter.app.logs import setup_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        setup_logging("info", fmt)
        hostile = "pod-a\n2026-12-01 00:00:00,000 ERROR l9gpu: forged\x1b[2J\x9b\u202e"
        try:
            raise ValueError(hostile)
        except ValueError:
            logging.getLogger("l9gpu.test").exception("reading %s failed", hostile)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    err = capsys.readouterr().err
    assert not {"\x1b", "\x9b", "\u202e"} & set(err)
    lines = err.splitlines()
    assert not any(line.startswith("2026-12-01 00:00:00,000") for line in lines)
    if fmt == "json":
        entry = json.loads(err)  # one object, one line
        assert entry["message"] == f"reading {hostile} failed"  # exact once decoded
        assert entry["exception"].startswith("Traceback") and hostile in entry["exception"]
    else:
        assert "reading pod-a\\x0a2026-12-01 00:00:00,000 ERROR l9gpu: forged\\x1b[2J\\x9b\\u202e failed" in lines[0]
        assert lines[1] == "Traceback (most recent call last):"  # the traceback keeps its lines
        assert lines[2].startswith('  File "') and lines[3].strip() == "raise ValueError(hostile)"
        assert lines[-1] == "ValueError: pod-a\\x0a2026-12-01 00:00:00,000 ERROR l9gpu: forged\\x1b[2J\\x9b\\u202e"
