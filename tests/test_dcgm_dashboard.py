"""NVIDIA's dcgm-exporter dashboard, unchanged, on a real Prometheus scraping the agent in
``--metric-schema l9gpu,dcgm`` on the simulated node: every panel query and variable
returns data, the values agree with the l9gpu schema scraped at the same instant, and the
time-shared GPU 6 shows each pod's own share."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml
from agent import AgentProcess, ambient_setting
from conftest import need_tool
from promserver import PrometheusServer

REPO = Path(__file__).resolve().parent.parent
QUERIES = json.loads((Path(__file__).resolve().parent / "data" / "dcgm-exporter-dashboard-queries.json").read_text())
SCENARIO = yaml.safe_load((REPO / "exporter" / "devices" / "simulated" / "scenarios" / "default.yaml").read_text())
NODE = SCENARIO["node"]
GPU6_PODS = {"jupyter-alice-0", "embedder-7c9f5-abcde", "reranker-5b8d4-fghij", "ocr-worker-66f7d-klmno"}


def grafana(expr: str, hostname: str = ".*", gpu: str = ".*") -> str:
    """The query as Grafana sends it with the dashboard's variables set (``.*`` is "All")."""
    expr = re.sub(r"\$Hostname\b", hostname, expr)
    expr = re.sub(r"\$gpu\b", gpu, expr)
    assert "$" not in expr, expr
    return expr


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """The agent serving both schemas (250 ms passes), scraped every second; ~8 s of data."""
    binary = need_tool("prometheus")
    tmp = tmp_path_factory.mktemp("dcgm-dashboard")
    agent = AgentProcess(["--backend", "simulated", "--interval", "250ms", "--metric-schema", "l9gpu,dcgm"],
                         log_path=tmp / "agent.log")
    agent.env = {k: v for k, v in agent.env.items() if not ambient_setting(k)}
    agent.start()
    server = PrometheusServer(binary, tmp, [f"127.0.0.1:{agent.port}"]).start()
    try:
        server.wait_for('count_over_time(DCGM_FI_DEV_GPU_TEMP{gpu="0"}[1m]) >= 8')
        yield server
    finally:
        server.stop()
        agent.stop()


def _values(server: PrometheusServer, expr: str, key: str = "gpu") -> dict[str, float]:
    return {r["metric"].get(key, ""): float(r["value"][1]) for r in server.query(expr)}


def test_every_panel_query_returns_data(prometheus):
    gpus = {str(i) for i in range(SCENARIO["gpus"]["count"])}
    for panel in QUERIES["panels"]:
        result = prometheus.query(grafana(panel["expr"]))
        assert result, f"{panel['title']}: no data"
        if " by (" in panel["expr"] and "by (gpu))" not in panel["expr"]:
            assert {r["metric"]["gpu"] for r in result} == gpus, panel["title"]
            assert all(r["metric"].get("Hostname") == NODE for r in result), panel["title"]
        one = prometheus.query(grafana(panel["expr"], hostname=NODE, gpu="6"))
        assert len(one) == 1, f"{panel['title']}: GPU 6 alone is one line on the panel, got {one}"


def test_the_dashboard_variables_find_the_node_and_its_gpus(prometheus):
    found = {}
    for variable in QUERIES["variables"]:
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"])
        assert match, variable
        result = prometheus.query(grafana(match.group(1)))
        found[variable["name"]] = {r["metric"][match.group(2)] for r in result}
    assert found == {"Hostname": {NODE}, "gpu": {str(i) for i in range(SCENARIO["gpus"]["count"])}}


# Each panel's query (variables at "All") against the l9gpu family it shows, in the panel's unit.
PANEL_EQUIVALENTS = {
    "GPU Temperature": "gpu_temperature_celsius",
    "GPU Power Usage": "gpu_power_watts",
    "GPU SM Clocks": "gpu_sm_clock_hertz",
    "GPU Framebuffer Mem Used": "gpu_memory_used_bytes / 2^20",
}


def test_panels_show_what_the_l9gpu_schema_shows(prometheus):
    for panel in QUERIES["panels"]:
        if panel["title"] not in PANEL_EQUIVALENTS:
            continue
        expr = f"({grafana(panel['expr'])}) - on (gpu) ({PANEL_EQUIVALENTS[panel['title']]})"
        differences = _values(prometheus, expr)
        assert len(differences) == 8, (panel["title"], differences)
        assert all(abs(d) < 1e-6 for d in differences.values()), (panel["title"], differences)
    total = prometheus.query(grafana(next(p["expr"] for p in QUERIES["panels"] if p["title"] == "GPU Power Total"))
                             + " - scalar(sum(gpu_power_watts))")
    assert abs(float(total[0]["value"][1])) < 1e-6
    for title in ("GPU Utilization", "Tensor Core Utilization"):
        values = _values(prometheus, grafana(next(p["expr"] for p in QUERIES["panels"] if p["title"] == title)))
        assert all(0.0 <= v <= 1.0 for v in values.values()), (title, values)
    busy = _values(prometheus, 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{pod="", hpc_job=""} - on (gpu) gpu_utilization_ratio')
    assert len(busy) == 8  # the simulated graphics engine is active whenever a kernel runs
    assert all(abs(d) < 1e-3 for d in busy.values()), busy


# DCGM series (device series: no pod, no hpc_job) against l9gpu's, same scrape, same instant.
DEVICE_EQUIVALENTS = [
    ("DCGM_FI_DEV_FB_USED * 2^20", "gpu_memory_used_bytes"),
    ("DCGM_FI_DEV_FB_FREE * 2^20", "gpu_memory_total_bytes - gpu_memory_used_bytes"),
    ("DCGM_FI_DEV_GPU_UTIL / 100", "gpu_utilization_ratio"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL / 100", "gpu_memory_utilization_ratio"),
    ("DCGM_FI_DEV_GPU_TEMP", "gpu_temperature_celsius"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gpu_memory_temperature_celsius"),
    ("DCGM_FI_DEV_POWER_USAGE", "gpu_power_watts"),
    ("DCGM_FI_DEV_SM_CLOCK * 1e6", "gpu_sm_clock_hertz"),
    ("DCGM_FI_DEV_MEM_CLOCK * 1e6", "gpu_memory_clock_hertz"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION / 1000", "gpu_energy_joules_total"),
]


def test_device_series_agree_with_the_l9gpu_schema(prometheus):
    for dcgm_expr, l9gpu_expr in DEVICE_EQUIVALENTS:
        name, _, scale = dcgm_expr.partition(" ")
        expr = (f'abs(({name}{{pod="", hpc_job=""}} {scale}) - on (gpu) ({l9gpu_expr})) '
                f'/ on (gpu) clamp_min(abs({l9gpu_expr}), 1)')
        differences = _values(prometheus, expr)
        assert len(differences) == 8, (expr, differences)
        assert all(d <= 1e-12 for d in differences.values()), (expr, differences)
    exact = _values(prometheus, 'DCGM_FI_DEV_FB_USED{pod="", hpc_job=""} * 2^20 - on (gpu) gpu_memory_used_bytes')
    assert set(exact.values()) == {0.0}
    labels = prometheus.query('DCGM_FI_DEV_GPU_TEMP{gpu="3"}')[0]["metric"]
    assert {k: v for k, v in labels.items() if k not in ("instance", "job", "__name__")} == {
        "gpu": "3", "UUID": "GPU-1b849e72-0003-4c1d-9a3e-5f0c2d7b0003", "pci_bus_id": "00000000:48:00.0",
        "device": "nvidia3", "modelName": SCENARIO["gpus"]["model"], "Hostname": NODE,
        "DCGM_FI_DRIVER_VERSION": SCENARIO["gpus"]["driver_version"]}


def test_prometheus_sees_dcgms_types(prometheus):
    with urllib.request.urlopen(prometheus.base + "/api/v1/metadata", timeout=5) as resp:
        metadata = json.load(resp)["data"]
    assert metadata["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0]["type"] == "counter"
    assert metadata["DCGM_FI_DEV_PCIE_TX_THROUGHPUT"][0]["type"] == "counter"
    assert metadata["DCGM_FI_DEV_FB_USED"][0] == {"type": "gauge", "help": "Framebuffer memory used (in MiB).",
                                                  "unit": ""}


def test_time_shared_gpu_shows_each_pods_own_share(prometheus):
    """GPU 6: four pods and a Slurm job, each with its own memory, SM share, graphics-engine
    share and energy; the parts add up to the device (memory: plus the driver's reserve)."""
    reserve_mib = SCENARIO["gpus"]["reserved_memory_mib"]
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
        pods = _values(prometheus, f'{name}{{gpu="6", pod!=""}}', key="pod")
        assert set(pods) == GPU6_PODS, name
        assert len(set(pods.values())) >= 3, f"{name}: each pod its own value, not a copy: {pods}"
        job = _values(prometheus, f'{name}{{gpu="6", hpc_job!=""}}', key="hpc_job")
        assert set(job) == {"4242"}, name
        # device minus the parts, in one query (one instant, one scrape)
        rest = prometheus.query(f'{name}{{gpu="6", pod="", hpc_job=""}} - on (gpu) '
                                f'sum by (gpu) ({name}{{gpu="6", pod!=""}} or {name}{{gpu="6", hpc_job!=""}})')
        expected = reserve_mib if name == "DCGM_FI_DEV_FB_USED" else 0.0
        assert float(rest[0]["value"][1]) == pytest.approx(expected, abs=1e-6), name
    memory = _values(prometheus, 'DCGM_FI_DEV_FB_USED{gpu="6", pod!=""} * 2^20 - on (pod) '
                                 'container_gpu_memory_used_bytes{gpu="6"}', key="pod")
    assert set(memory) == GPU6_PODS and set(memory.values()) == {0.0}
    assert _values(prometheus, 'DCGM_FI_DEV_GPU_UTIL{gpu="6", pod="embedder-7c9f5-abcde"}')["6"] == pytest.approx(45.0)
    # energy: the workloads' increase plus the unattributed energy is the device's increase
    device = _values(prometheus, 'increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="6", pod="", hpc_job=""}[6s])')
    parts = prometheus.query('sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="6", pod!=""}[6s])) + '
                             'sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="6", hpc_job!=""}[6s])) + '
                             'sum(increase(gpu_unattributed_energy_joules_total{gpu="6"}[6s])) * 1000')
    assert device["6"] > 0
    assert float(parts[0]["value"][1]) == pytest.approx(device["6"], rel=0.05)


def test_a_dcgm_exporter_query_by_pod(prometheus):
    """``sum by (pod)(DCGM_FI_DEV_FB_USED)``, as docs/MIGRATING-FROM-DCGM.md describes it: each
    pod gets the memory its processes hold on all its GPUs; the series without a pod label
    (devices, Slurm jobs) fall into one group with pod=""."""
    by_pod = _values(prometheus, "sum by (pod) (DCGM_FI_DEV_FB_USED)", key="pod")
    native = _values(prometheus, 'sum by (pod) (container_gpu_memory_used_bytes{pod!=""}) / 2^20', key="pod")
    assert {pod: v for pod, v in by_pod.items() if pod} == pytest.approx(native)
    assert len(native) == 7  # every pod of the scenario, the one with an allocated GPU and no process included
    rest = prometheus.query('sum by (pod) (DCGM_FI_DEV_FB_USED) - on (pod) '
                            '(sum(DCGM_FI_DEV_FB_USED{pod="", hpc_job=""}) + sum(DCGM_FI_DEV_FB_USED{hpc_job!=""}))')
    assert len(rest) == 1 and float(rest[0]["value"][1]) == 0.0
    # a device field has no pod series; the documented join finds the pod's GPU
    assert prometheus.query('DCGM_FI_DEV_GPU_TEMP{pod="embedder-7c9f5-abcde"}') == []
    joined = prometheus.query('DCGM_FI_DEV_GPU_TEMP and on (gpu, Hostname) DCGM_FI_DEV_FB_USED{pod="embedder-7c9f5-abcde"}')
    assert [r["metric"]["gpu"] for r in joined] == ["6"]
    # the node's total, as a dcgm-exporter dashboard on unshared GPUs computes it, needs pod=""
    node = prometheus.query('sum(DCGM_FI_DEV_FB_USED{pod="", hpc_job=""}) * 2^20 - sum(gpu_memory_used_bytes)')
    assert float(node[0]["value"][1]) == 0.0
