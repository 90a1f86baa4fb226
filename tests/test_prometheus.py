"""A real Prometheus server scrapes the agent; promtool checks and unit-tests the rules."""

import subprocess
from pathlib import Path

import pytest
from conftest import need_tool
from promserver import PrometheusServer

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "alerts" / "l9gpu.rules.yaml"


@pytest.mark.parametrize("rules, unit_tests", [(RULES, "alerts_test.yaml"),
                                               (REPO / "alerts" / "l9gpu-training.rules.yaml",
                                                "training_rules_test.yaml")])
def test_rules_are_valid_and_their_unit_tests_pass(rules: Path, unit_tests: str):
    promtool = need_tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([promtool, "test", "rules", unit_tests], cwd=REPO / "tests", capture_output=True, text=True)
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


def test_a_time_shared_gpu_bills_its_time_once_as_prometheus_sees_it(prometheus):
    """GPU 6 of the simulated node: 5 time-slicing replicas, four held by pods, and a Slurm
    job outside the device plugin holding 1.5 of the 78.5 GiB held there. Per GPU, the
    holders' allocation seconds plus the unallocated seconds are the GPU's capacity."""
    prometheus('gpu_capacity_seconds_total{gpu="6"} > 2')
    gap = prometheus('max(abs(sum by (gpu) (container_gpu_allocation_seconds_total) '
                     '+ on (gpu) sum by (gpu) (gpu_unallocated_seconds_total) '
                     '- on (gpu) sum by (gpu) (gpu_capacity_seconds_total)))')
    assert float(gap[0]["value"][1]) < 1e-6
    shares = prometheus('container_gpu_allocation_seconds_total{gpu="6"} '
                        '/ on (gpu) group_left gpu_capacity_seconds_total{gpu="6"}')
    got = {s["metric"].get("pod") or "job " + s["metric"]["slurm_job_id"]: float(s["value"][1]) for s in shares}
    job = 1.5 / 78.5
    assert got.pop("job 4242") == pytest.approx(job)
    assert sorted(got) == ["embedder-7c9f5-abcde", "jupyter-alice-0", "ocr-worker-66f7d-klmno",
                           "reranker-5b8d4-fghij"]
    assert list(got.values()) == pytest.approx([(1 - job) / 5] * 4)
    free = prometheus('gpu_unallocated_seconds_total{gpu="6"} / on (gpu) gpu_capacity_seconds_total{gpu="6"}')
    assert float(free[0]["value"][1]) == pytest.approx((1 - job) / 5)
    # every other GPU has one holder (or none: GPU 7 is allocated to a pod that runs nothing)
    whole = prometheus('sum by (gpu) (container_gpu_allocation_seconds_total{gpu!="6"}) '
                       '/ on (gpu) gpu_capacity_seconds_total')
    assert sorted(float(s["value"][1]) for s in whole) == pytest.approx([1.0] * 7)


def test_prometheus_sees_each_gpus_health_verdict_and_its_signals(prometheus):
    """The simulated node's GPU 4 has a row remap pending (degraded, reset the GPU), GPU 3 a
    PCIe link at x8 of x16; the others are healthy."""
    degraded = prometheus('gpu_health{state="degraded"} == 1')
    assert "4" in {s["metric"]["gpu"] for s in degraded}
    states = prometheus('sum by (gpu) (gpu_health)')
    assert {s["metric"]["gpu"]: s["value"][1] for s in states} == {str(g): "1" for g in range(8)}  # one state each
    action = prometheus('gpu_health_action{gpu="4"} == 1')
    assert [s["metric"]["action"] for s in action] == ["reset_gpu"]
    reason = prometheus('gpu_health_reason{gpu="4"}')
    assert [s["metric"]["reason"] for s in reason] == ["row_remap_pending"]
    assert prometheus('gpu_row_remap_pending{gpu="4"}')[0]["value"][1] == "1"
    width = prometheus('gpu_pcie_link_width{gpu="3"}')
    assert width[0]["value"][1] == "8"
    assert prometheus('gpu_pcie_link_width_max{gpu="3"}')[0]["value"][1] == "16"
    # GPU 3's width counts once it lasts three health reads: healthy until then
    assert prometheus('count(gpu_health{state="healthy"} == 1)')[0]["value"][1] in {"6", "7"}


SPIKE_SCENARIO = """
node: sim-spike-01
gpus: {count: 1, memory_gib: 80}
processes:
  - {name: python3, gpus: [0], pid: 41001, memory_gib: 10, utilization: 0.5,
     workload: {namespace: ml, pod: server-0, container: main}}
  # a batch step that takes 30 GiB for 2 s, between two scrapes 15 s apart
  - {name: python3, gpus: [0], pid: 42001, memory_gib: 30, utilization: 0.9, from: 25s, until: 27s,
     workload: {namespace: ml, pod: batch-0, container: step}}
"""


def test_a_spike_between_two_15s_scrapes_is_in_prometheus_as_the_peak_from_the_next_scrape(tmp_path, agent_factory):
    import json
    import time

    from waiting import wait_until

    gib = 2**30
    scenario = tmp_path / "spike.yaml"
    scenario.write_text(SPIKE_SCENARIO)
    agent = agent_factory("--backend", "simulated", "--scenario", str(scenario), "--interval", "1s",
                          "--enable-metric", "gpu_memory_peak_bytes")
    server = PrometheusServer(need_tool("prometheus"), tmp_path, [f"127.0.0.1:{agent.port}"],
                              scrape={"scrape_interval": "15s"}).start()
    try:
        # when the spike is on and off, by the agent's own passes (its snapshot's timestamps)
        seen: dict[str, float] = {}

        def spike_over() -> bool:
            doc = json.loads(agent.get("/api/v1/snapshot")[2])
            spiking = doc["gpus"][0]["memory_used_bytes"] > 30 * gib
            if spiking:
                seen.setdefault("on", doc["timestamp"])
            elif "on" in seen:
                seen.setdefault("off", doc["timestamp"])
            time.sleep(0.1)
            return "off" in seen

        wait_until(spike_over, timeout=120, what="the 2 s spike, 25 s after the agent started")
        spike_used = 0.5 * gib + 40 * gib  # the driver's 512 MiB, the server's 10 GiB and the step's 30 GiB

        def scraped_after_the_spike() -> list | None:
            raw = server.query('gpu_memory_peak_bytes{gpu="0"}[3m]')
            values = raw[0]["values"] if raw else []
            return values if any(t > seen["off"] for t, _ in values) else None

        peaks = wait_until(scraped_after_the_spike, timeout=120, what="a scrape after the spike ended")
        used = {t: float(v) for t, v in server.query('gpu_memory_used_bytes{gpu="0"}[3m]')[0]["values"]}
        # the first scrape a pass after the spike began has it, as the peak; the used memory
        # it scraped (after the spike ended) does not
        first = next((t, float(v)) for t, v in peaks if t >= seen["on"] + 1.0)
        assert first[1] == spike_used, (seen, peaks)
        assert all(float(v) < spike_used for t, v in peaks if t < seen["on"])
        after = [t for t, _ in peaks if t > seen["off"]][0]
        assert used[after] == 10.5 * gib
        step = server.query('max_over_time(container_gpu_memory_peak_bytes{pod="batch-0"}[3m])')
        assert [float(s["value"][1]) for s in step] == [30 * gib]
    finally:
        server.stop()
