"""A real Prometheus server scrapes the agent; promtool checks and unit-tests the rules."""

import subprocess
from pathlib import Path

import pytest
from conftest import need_tool
from promserver import PrometheusServer

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "alerts" / "l9gpu.rules.yaml"


def test_rules_are_valid_and_their_unit_tests_pass():
    promtool = need_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([promtool, "test", "rules", "alerts_test.yaml"], cwd=REPO / "tests",
                          capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout + unit.stderr


@pytest.fixture
def prometheus(tmp_path, agent_factory):
    agent = agent_factory("--backend", "simulated", "--interval", "250ms")
    server = PrometheusServer(need_tool("prometheus"), tmp_path, [f"127.0.0.1:{agent.port}"], RULES).start()
    yield server.wait_for
    server.stop()


def test_prometheus_scrapes_the_agent_and_queries_back(prometheus):
    up = prometheus('up{job="l9gpu"} == 1')
    assert up[0]["value"][1] == "1"
    total = prometheus('gpu_memory_total_bytes{gpu="0"}')
    assert total[0]["value"][1] == str(80 * 2**30)
    assert total[0]["metric"]["model"] == "NVIDIA H100 80GB HBM3"
    assert total[0]["metric"]["node"] == "sim-node-01"
    assert prometheus("count(gpu_up == 1)")[0]["value"][1] == "8"
    # the counter rises between scrapes: rate() sees the idle GPU's 72 W. Scrapes and
    # passes are not aligned, and on a busy machine a pass can lag its interval, so each
    # end of the window may be off by a pass or two: a 16 s window keeps that within 25%
    # (a unit slip, W for kW or J for mJ, is off by a factor of 1000).
    prometheus('count_over_time(gpu_energy_joules_total{gpu="7"}[16s]) >= 12')
    raw = prometheus('gpu_energy_joules_total{gpu="7"}[16s]')[0]["values"]
    (t0, v0), (t1, v1) = raw[0], raw[-1]
    assert (float(v1) - float(v0)) / (t1 - t0) == pytest.approx(72.0, rel=0.25)
