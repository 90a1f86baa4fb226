"""End to end: the real agent as a subprocess on the simulated node, scraped over HTTP.

The values are checked against the default scenario (exporter/devices/simulated/scenarios/default.yaml)
and the whole exposition is linted with `promtool check metrics`, like node_exporter's
end-to-end test.
"""

import subprocess

import pytest
from agent import pick
from conftest import need_tool
from waiting import wait_until

GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from agent import AgentProcess

    agent = AgentProcess(["--backend", "simulated", "--interval", "250ms", "--process-metrics"],
                         log_path=tmp_path_factory.mktemp("e2e") / "agent.log")
    agent.start()
    yield agent
    agent.stop()


def test_device_values_match_the_scenario(demo):
    m = demo.samples()
    assert sorted(int(lab["gpu"]) for lab, _ in m["gpu_up"]) == list(range(8))
    assert {lab["node"] for lab, _ in m["gpu_up"]} == {"sim-node-01"}
    assert set(pick(m, "gpu_memory_total_bytes", model=H100)) == {80 * GIB}
    assert pick(m, "gpu_utilization_ratio", gpu="7") == [0.0]
    assert pick(m, "gpu_power_watts", gpu="7") == [72.0]
    assert pick(m, "gpu_power_limit_watts", gpu="0") == [700.0]
    assert pick(m, "gpu_utilization_ratio", gpu="2") == [0.92]
    assert pick(m, "gpu_power_watts", gpu="2") == [pytest.approx(72 + 628 * 0.92)]
    assert pick(m, "gpu_clock_throttle_active", gpu="7", reason="gpu_idle") == [1.0]
    assert pick(m, "gpu_clock_throttle_active", gpu="2", reason="gpu_idle") == []  # not active: no series
    assert pick(m, "gpu_sm_clock_hertz", gpu="2") == [1.98e9]
    info = [lab for lab, _ in m["gpu_info"] if lab["gpu"] == "0"][0]
    assert info["vendor"] == "nvidia" and info["driver_version"] == "550.54.15" and info["uuid"].startswith("GPU-")
    # the zombie notebook: 70 GiB held at 0% SM on the time-sliced GPU 6
    assert pick(m, "gpu_process_memory_used_bytes", gpu="6", pid="61001") == [70 * GIB]
    assert pick(m, "gpu_process_utilization_ratio", gpu="6", pid="61001") == [0.0]
    assert pick(m, "gpu_process_utilization_ratio", gpu="6", pid="62001") == [0.45]
    assert pick(m, "gpu_process_utilization_ratio", gpu="6", pid="62101") == [0.2]
    assert pick(m, "l9gpu_build_info")
    assert pick(m, "l9gpu_collector_success", collector="simulated") == [1.0]
    assert "process_resident_memory_bytes" in m  # prometheus_client's process metrics


def test_the_idle_reservation_holds_gpu_7_and_uses_nothing(demo):
    m = demo.samples()
    reserved = dict(gpu="7", namespace="ml-research", pod="idle-reservation-0", container="trainer")
    assert pick(m, "container_gpu_allocated", **reserved) == [1.0]
    assert pick(m, "container_gpu_memory_used_bytes", **reserved) == [0.0]
    assert pick(m, "container_gpu_usage_seconds_total", **reserved) == []  # it has never computed there
    assert pick(m, "container_gpu_energy_joules_total", **reserved) == [0.0]
    assert [lab["owner_kind"] for lab, _ in m["container_gpu_allocated"] if lab["gpu"] == "7"] == ["StatefulSet"]
    # GPU 6 is time-sliced between four pods: one allocated series each
    assert pick(m, "container_gpu_allocated", gpu="6") == [1.0] * 4
    assert pick(m, "l9gpu_collector_success", collector="pod_resources") == [1.0]


def test_values_change_between_passes(demo):
    first = demo.samples()
    e1 = pick(first, "gpu_energy_joules_total", gpu="0")[0]
    # a few passes later (250 ms apart): energy has grown and the utilisation wave moved on
    def moved_on():  # type: ignore[no-untyped-def]
        m = demo.samples()
        changed = pick(m, "gpu_utilization_ratio", gpu="0") != pick(first, "gpu_utilization_ratio", gpu="0")
        return m if pick(m, "gpu_energy_joules_total", gpu="0")[0] > e1 and changed else None

    second = wait_until(moved_on, what="new values from later passes")
    # fresh: a pass every 250 ms, so the snapshot is a fraction of a second old (a stalled
    # collector would let it grow without bound; 20 intervals allow for a busy machine)
    assert pick(second, "l9gpu_snapshot_age_seconds")[0] < 5.0


def test_openmetrics_and_gzip_are_negotiated(demo):
    status, headers, body = demo.get("/metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.decode().rstrip().endswith("# EOF")
    status, headers, body = demo.get("/metrics", {"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip" and body[:2] == b"\x1f\x8b"


def test_promtool_accepts_the_exposition(demo):
    promtool = need_tool("promtool")
    text = demo.scrape()
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def test_health_endpoints(demo):
    assert demo.get("/healthz")[0] == 200
    assert demo.get("/readyz")[0] == 200
    assert b"/metrics" in demo.get("/")[2]


def test_gpm_activity_per_gpu_and_for_the_one_workload_on_it(demo):
    def with_gpm():  # type: ignore[no-untyped-def]
        samples = demo.samples()
        return samples if "gpu_sm_active_ratio" in samples else None

    m = wait_until(with_gpm, what="GPM activity (it needs a second pass)")
    trainer = dict(namespace="ml-research", pod="llm-finetune-worker-0", container="trainer")
    assert pick(m, "gpu_tensor_active_ratio", gpu="2") == [pytest.approx(0.85 * 0.92)]
    assert pick(m, "container_gpu_tensor_active_ratio", gpu="2", **trainer) == [pytest.approx(0.85 * 0.92)]
    # the rank stuck in a collective on GPU 5: SMs busy, tensor cores idle
    assert pick(m, "container_gpu_sm_active_ratio", gpu="5", **trainer) == [pytest.approx(0.93 * 0.92)]
    assert pick(m, "container_gpu_tensor_active_ratio", gpu="5", **trainer) == [0.0]
    # GPU 6 is time-sliced, GPU 1 also runs a host tool: device series only
    assert len(pick(m, "gpu_tensor_active_ratio", gpu="6")) == 1
    assert pick(m, "container_gpu_tensor_active_ratio", gpu="6") == []
    assert pick(m, "container_gpu_tensor_active_ratio", gpu="1") == []
    assert len(pick(m, "container_gpu_tensor_active_ratio", gpu="0", pod="vllm-llama3-70b-6d8b94df7-q5z82")) == 1
    # GPU 7 is reserved and idle: zero activity, and no workload uses it
    assert pick(m, "gpu_sm_active_ratio", gpu="7") == [0.0]
    assert pick(m, "container_gpu_sm_active_ratio", gpu="7") == []
