"""Inference economics against real components: a real Prometheus scraping the agent on the
simulated node and, beside it, real HTTP servers serving each engine's /metrics as the
engine writes it (tests/fakes/inference_engines.py), on the demo's pods: vLLM on the vLLM pod (GPUs
0-1), SGLang, Triton with TensorRT-LLM and an idle TGI on pods of the time-shared GPU 6, NIM
on the pod allocated GPU 7. Prometheus attaches namespace and pod by the relabelling
docs/INFERENCE.md gives. Every expected figure is written out from the engines' known
token rates, the scenario's GPU shares and the example prices.
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from agent import AgentProcess, ambient_setting
from conftest import need_tool
from fakes.inference_engines import SHARED_GPU6, app, demo_engines, scrape_jobs
from loopback_http import LoopbackServer
from promserver import PrometheusServer
from waiting import PATIENCE, wait_until

from exporter.app.cli import main
from exporter.inference.engines import load_engines
from exporter.inference.rules import rules_text

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "alerts" / "l9gpu.rules.yaml"
INFERENCE_RULES = REPO / "alerts" / "l9gpu-inference.rules.yaml"
PRICES = REPO / "alerts" / "prices.example.yaml"
PERIOD = 60  # seconds of report
H100, RESEARCH_H100 = 2.90, 1.80  # the example prices: list price, ml-research's reserved rate

VLLM = "meta-llama/Llama-3.1-70B-Instruct"
QWEN = "Qwen/Qwen2.5-7B-Instruct"
NIM = "meta/llama-3.1-8b-instruct"


def per_million(cost_per_hour: float, tokens_per_second: float) -> float:
    return cost_per_hour / 3600 / tokens_per_second * 1e6


# model -> (prompt tokens/s, generated tokens/s, GPUs held, price per GPU-hour); the Triton
# pod's share of GPU 6 is split 120:40 between its two models
EXPECTED = {
    VLLM: (2400, 600, 2.0, H100),
    QWEN: (150, 50, SHARED_GPU6, H100),
    "llama-3.1-8b": (90, 30, SHARED_GPU6 * 0.75, H100),
    "mistral-7b": (20, 20, SHARED_GPU6 * 0.25, H100),
    NIM: (100, 50, 1.0, RESEARCH_H100),
}


def test_the_shipped_rules_are_those_of_the_built_in_engines():
    """alerts/l9gpu-inference.rules.yaml is `l9gpu inference-rules` of the defaults, and valid."""
    assert INFERENCE_RULES.read_text() == rules_text(load_engines()), (
        "regenerate: l9gpu inference-rules -o alerts/l9gpu-inference.rules.yaml")
    check = subprocess.run([need_tool("promtool"), "check", "rules", str(INFERENCE_RULES)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The agent (100 ms passes), the five engine pods and Prometheus scraping all every second,
    with the rules and the example prices loaded; yields once it holds over a minute of data."""
    binary = need_tool("prometheus")
    tmp = tmp_path_factory.mktemp("inference")
    agent = AgentProcess(["--backend", "simulated", "--interval", "100ms"], log_path=tmp / "agent.log")
    agent.env = {k: v for k, v in agent.env.items() if not ambient_setting(k)}
    agent.start()
    engines = demo_engines()
    prices = tmp / "prices.rules.yaml"
    assert main(["prices", str(PRICES), "-o", str(prices)]) == 0
    with LoopbackServer(app(engines)) as server:
        prom = PrometheusServer(binary, tmp, [f"127.0.0.1:{agent.port}"], [RULES, INFERENCE_RULES, prices],
                                jobs=scrape_jobs(engines, server.base)).start()
        try:
            # every target up, and over a minute of samples of each (scraped every second)
            prom.wait_for("count(up == 1) == 6")
            wait_until(lambda: _min_samples(prom) >= PERIOD + 5, timeout=PERIOD + 2 * PATIENCE,
                       what=f"{PERIOD + 5} scrapes of every target", interval=0.5)
            yield prom
        finally:
            prom.stop()
            agent.stop()


def _min_samples(prom: PrometheusServer) -> float:
    result = prom.query("min(count_over_time(up[5m]))")
    return float(result[0]["value"][1]) if result else 0.0


@pytest.fixture(scope="module")
def period(cluster):
    """A minute that ends a second ago: the last scrape before its end is stored."""
    end = int(time.time()) - 1
    return end - PERIOD, end


def report(cluster, period, tmp_path, *extra: str, fmt: str = "json") -> str:
    out = tmp_path / f"report.{fmt}"
    start, end = period
    assert main(["report", "--prometheus", cluster.base, "--from", str(start), "--to", str(end), "--prices",
                 str(PRICES), "--by", "model", "-o", str(out), *extra]) == 0
    return out.read_text()


def test_report_by_model_prices_each_models_tokens_by_the_gpu_time_its_pods_held(cluster, period, tmp_path):
    doc = json.loads(report(cluster, period, tmp_path))
    groups = {g["group"]: g for g in doc["groups"]}
    assert doc["by"] == "model" and doc["currency"] == "USD"
    for model, (prompt, generated, gpus, price) in EXPECTED.items():
        g = groups[model]
        assert g["prompt_tokens"] == pytest.approx(prompt * PERIOD, rel=0.01), model
        assert g["generated_tokens"] == pytest.approx(generated * PERIOD, rel=0.01), model
        assert g["gpu_hours_allocated"] == pytest.approx(gpus * PERIOD / 3600, rel=0.01), model
        assert g["allocated_cost"] == pytest.approx(gpus * price * PERIOD / 3600, rel=0.01), model
        assert g["cost_per_million_tokens"] == pytest.approx(per_million(gpus * price, prompt + generated),
                                                             rel=0.01), model
        assert g["gpu_hours_per_million_tokens"] == pytest.approx(gpus / 3600 / (prompt + generated) * 1e6,
                                                                  rel=0.01), model
        assert g["replicas"] == 1 and g["idle_replica_hours"] == 0.0, model
    # a model on a time-shared GPU pays its pod's share (a fifth of what the Slurm job leaves),
    # not the whole GPU
    assert groups[QWEN]["cost_per_million_tokens"] == pytest.approx(per_million(SHARED_GPU6 * H100, 200), rel=0.01)
    assert groups[QWEN]["cost_per_million_tokens"] < 0.2 * per_million(H100, 200)
    # the Triton pod's two models: each token costs the same, the GPU time is split 3:1
    assert groups["llama-3.1-8b"]["gpu_hours_allocated"] == pytest.approx(
        3 * groups["mistral-7b"]["gpu_hours_allocated"], abs=4e-6)  # (figures have 6 decimals)
    # TGI writes no model label: the pod's l9gpu.io/model label names it (relabelling); it
    # served nothing, so its GPU time is an idle replica's with no cost per token
    reranker = groups["bge-reranker-v2"]
    assert reranker["prompt_tokens"] == 0 and reranker["cost_per_million_tokens"] is None
    assert reranker["gpu_hours_allocated"] == pytest.approx(SHARED_GPU6 * PERIOD / 3600, rel=0.01)
    assert reranker["idle_replica_hours"] <= round(PERIOD / 3600, 6)  # at most the period, in 6 decimals
    # the workloads that serve no model (the trainer, the notebook, the Slurm job, ...)
    assert groups["(none)"]["prompt_tokens"] == 0 and groups["(none)"]["gpu_hours_allocated"] > 0
    # the bill still adds up: groups plus the hours nobody held are the GPUs' hours
    totals = doc["totals"]
    assert totals["gpu_hours_allocated"] + totals["gpu_hours_unallocated"] == pytest.approx(
        totals["gpu_hours_capacity"], rel=1e-3)
    assert totals["gpu_hours_capacity"] == pytest.approx(8 * PERIOD / 3600, rel=0.01)
    assert totals["prompt_tokens"] == pytest.approx(sum(e[0] for e in EXPECTED.values()) * PERIOD, rel=0.01)
    assert doc["notes"] == []


def test_energy_per_million_tokens_is_the_workloads_energy_over_its_tokens(cluster, period, tmp_path):
    """kWh per million tokens: the vLLM pod's energy (its namespace's, in the same period) over its tokens."""
    by_model = {g["group"]: g for g in json.loads(report(cluster, period, tmp_path))["groups"]}
    start, end = period
    out = tmp_path / "namespaces.json"
    assert main(["report", "--prometheus", cluster.base, "--from", str(start), "--to", str(end), "-o", str(out)]) == 0
    namespaces = {g["group"]: g for g in json.loads(out.read_text())["groups"]}
    vllm = by_model[VLLM]
    assert vllm["energy_kwh"] == pytest.approx(namespaces["ml-production"]["energy_kwh"], rel=1e-6)
    assert vllm["energy_kwh"] > 0
    tokens = vllm["prompt_tokens"] + vllm["generated_tokens"]
    assert vllm["kwh_per_million_tokens"] == pytest.approx(vllm["energy_kwh"] / tokens * 1e6, rel=1e-4)


def test_report_by_model_as_csv_and_html(cluster, period, tmp_path):
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(report(cluster, period, tmp_path, fmt="csv")))}
    assert {VLLM, QWEN, "(none)", "(unallocated)", "(capacity)"} <= set(rows)
    prompt, generated, gpus, price = EXPECTED[VLLM]
    assert float(rows[VLLM]["cost_per_million_tokens"]) == pytest.approx(per_million(gpus * price, prompt + generated),
                                                                         rel=0.01)
    assert float(rows[VLLM]["prompt_tokens"]) == pytest.approx(prompt * PERIOD, rel=0.01)
    assert rows["(capacity)"]["cost_per_million_tokens"] == ""
    html = report(cluster, period, tmp_path, fmt="html")
    shown = dict(re.findall(r'<tr data-group="([^"]+)">.*?data-figure="cost_per_million_tokens" data-value="([^"]+)"',
                            html, re.S))
    assert float(shown[QWEN]) == pytest.approx(per_million(SHARED_GPU6 * H100, 200), rel=0.01)
    assert "Cost / M tokens" in html and "Idle replica h" in html


def test_the_recording_rules_give_the_same_cost_per_million_tokens(cluster):
    """The rules' 5-minute rates over the minute of data there is: the same figures within 5%."""
    def values(expr: str) -> dict[str, float]:
        return {r["metric"].get("model_name", ""): float(r["value"][1]) for r in cluster.query(expr)}

    cost = wait_until(lambda: values("model_name:l9gpu_inference_allocated_cost_per_million_tokens:rate5m"),
                      what="the cost per million tokens rule")
    for model, (prompt, generated, gpus, price) in EXPECTED.items():
        assert cost[model] == pytest.approx(per_million(gpus * price, prompt + generated), rel=0.05), model
    share = values('namespace_pod_model_name:l9gpu_inference_token_share:ratio{pod="ocr-worker-66f7d-klmno"}')
    assert share == pytest.approx({"llama-3.1-8b": 0.75, "mistral-7b": 0.25}, rel=0.02)
    kv = values("namespace_pod_model_name:l9gpu_inference_kv_cache_usage:ratio")
    assert kv == {VLLM: 0.62, QWEN: 0.35, "llama-3.1-8b": 0.2, "mistral-7b": 0.2, NIM: 0.1}
    # the idle TGI replica holds GPU time and served no token in the window (the alert's
    # condition; a 5-minute rate over a minute of data is no measure of the GPUs held)
    idle = cluster.query("namespace_pod:container_gpu_allocation_seconds:rate5m > 0 "
                         "and on (namespace, pod) namespace_pod:l9gpu_inference_tokens:rate5m == 0")
    assert [r["metric"]["pod"] for r in idle] == ["reranker-5b8d4-fghij"]


# ---- the engines file: additions, overrides, mistakes ----------------------------------------
def test_an_engines_file_adds_an_engine_and_overrides_a_field(tmp_path, capsys):
    path = tmp_path / "engines.yaml"
    path.write_text("engines:\n"
                    "  my-server:\n"
                    "    model_label: served_model\n"
                    "    prompt_tokens: 'my_server_input_tokens_total{phase=\"prefill\"}'\n"
                    "    generated_tokens: my_server_output_tokens_total\n"
                    "  nim:\n"
                    "    prompt_tokens: 'prompt_tokens_total{job=~\".*nim.*\"}'\n"
                    "  tgi: null\n")
    engines = {e.name: e for e in load_engines(path)}
    assert list(engines) == ["vllm", "sglang", "triton-trtllm", "nim", "my-server"]
    assert str(engines["nim"].selectors("prompt_tokens")[0]) == 'prompt_tokens_total{job=~".*nim.*"}'
    assert str(engines["nim"].selectors("generated_tokens")[0]) == "generation_tokens_total"  # kept
    out = tmp_path / "rules.yaml"
    assert main(["inference-rules", "--engines", str(path), "-o", str(out)]) == 0
    text = out.read_text()
    assert 'rate(my_server_input_tokens_total{phase="prefill", pod!=""}[5m])' in text
    assert '"model_name", "$1", "served_model", "(.+)"' in text and "tgi_request" not in text
    check = subprocess.run([need_tool("promtool"), "check", "rules", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert yaml.safe_load(text)["groups"][0]["name"] == "l9gpu-inference"


@pytest.mark.parametrize("text,message", [
    ("engines: {vllm: {prompt_tokens: 'rate(x[5m])'}}",
     "engines.vllm.prompt_tokens: 'rate(x[5m])' is not a series selector"),
    ("engines: {vllm: {prompt_tokens: 'x{a=b}'}}", "engines.vllm.prompt_tokens: 'x{a=b}': 'a=b' is not a label matcher"),
    ("engines: {vllm: {kv_cache_usage: ['a', 3]}}", "engines.vllm.kv_cache_usage: expected a series selector or a list"),
    ("engines: {mine: {prompt_tokens: a, generated_tokens: b}}", "engines.mine.model_label: required"),
    ("engines: {mine: {model_label: x, prompt_tokens: a}}", "engines.mine.generated_tokens: required"),
    ("engines: {vllm: {model_label: 'my-label'}}", "engines.vllm.model_label: 'my-label' is not a label name"),
    ("engines: {vllm: {kv_cache: a}}", "engines.vllm: unknown key 'kv_cache'"),
    ("engines: {Bad Name: {}}", "engines: 'Bad Name' is not an engine name"),
    ("engine: {}", "unknown key 'engine' (expected: engines)"),
    ("engines: {vllm: [1]}", "engines.vllm: expected a mapping"),
    ("engines: {a: 1\n", "not valid YAML (line 2)"),
    ('engines: {vllm: {prompt_tokens: "x{a=\\"b\\nc: d\\"}"}}', "a selector is one line without control characters"),
])
def test_mistakes_in_an_engines_file_are_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "engines.yaml"
    path.write_text(text)
    for args in (["inference-rules", "--engines", str(path)],
                 ["report", "--prometheus", "http://127.0.0.1:1", "--from", "1d", "--by", "model", "--engines",
                  str(path)]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert f": {path}: " in err and message in err, err


# ---- how the report reads token series (pure) --------------------------------------------------
def test_token_series_are_read_per_workload_and_model_first_engine_first():
    from exporter.report.compute import model_tokens

    def key(**labels: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(labels.items()))

    vllm = {key(namespace="a", pod="p", model_name="m", engine="0"): [10.0, 20.0],
            key(namespace="a", pod="p", model_name="m", engine="1"): [1.0, 2.0],   # data parallel: summed
            key(model_name="m", engine="0"): [5.0, 5.0]}                             # no pod: joins nothing
    nim = {key(namespace="a", pod="p", model_name="m"): [100.0, 100.0],             # the same pod: vLLM wins
           key(namespace="a", pod="q", model_name="n"): [3.0, 4.0]}
    triton = {key(namespace="b", pod="t", model="x", version="1"): [7.0, 0.0],
              key(namespace="b", pod="t", model="x", version="2"): [1.0, 1.0],      # versions summed
              key(namespace="b", pod="u"): [2.0, 2.0]}                               # no model at all
    rows, unjoined = model_tokens([("vllm", "model_name", "prompt_tokens", vllm),
                                   ("nim", "model_name", "prompt_tokens", nim),
                                   ("triton-trtllm", "model", "prompt_tokens", triton),
                                   ("triton-trtllm", "model", "generated_tokens", triton)], 2)
    got = {(r.namespace, r.pod, r.model): (r.engine, list(r.prompt), list(r.generated)) for r in rows}
    assert got == {("a", "p", "m"): ("vllm", [11.0, 22.0], [0.0, 0.0]),
                   ("a", "q", "n"): ("nim", [3.0, 4.0], [0.0, 0.0]),
                   ("b", "t", "x"): ("triton-trtllm", [8.0, 1.0], [8.0, 1.0]),
                   ("b", "u", "(unnamed)"): ("triton-trtllm", [2.0, 2.0], [2.0, 2.0])}
    assert unjoined == 1


def test_selectors_keep_their_matchers_and_take_more():
    from exporter.inference.engines import parse_selector
    from exporter.report.compute import with_matchers

    selector = parse_selector('nv_llm_input_token_len_sum{response_metric_type="total_input_tokens", a=~"x,y",}')
    assert selector.matchers == ('response_metric_type="total_input_tokens"', 'a=~"x,y"')
    assert selector.text('pod!=""') == ('nv_llm_input_token_len_sum{response_metric_type="total_input_tokens", '
                                        'a=~"x,y", pod!=""}')
    assert with_matchers(selector.text(), 'cluster="eu"').endswith(', cluster="eu"}')
    assert with_matchers("vllm:prompt_tokens_total", 'cluster="eu"') == 'vllm:prompt_tokens_total{cluster="eu"}'
    assert parse_selector('x{a="say \\"hi\\""}').matchers == ('a="say \\"hi\\""',)
    with pytest.raises(ValueError, match="not closed"):
        parse_selector('x{a="b}')
