"""`l9gpu report` against a real Prometheus holding 30 days of backfilled history.

The history (tests/chargeback_history.py) is made with known answers: an inference pod
busy 75% of the time on a node whose agent restarts mid-period (counters back to 0, 30
minutes unseen), a trainer whose StatefulSet pod moved to another node, a notebook that
holds its GPU for a month and computes for six hours, two Slurm jobs, a pod that began
before the period, and one that ended before it; a GPU time-shared as 4 replicas (a pod
with 2 of them all month, another with 1 for ten days), a GPU in MIG mode (a 3g instance
held by a pod, a 1g instance and 3 slices held by nobody), and a GPU that leaves its node
half-way. Beside them, inference engines' token counters: vLLM in the inference pod (idle
two hours on day 5, its engine restarting on day 20), SGLang in the pod on the time-shared
GPU, and Triton serving two models on the MIG instance. Every expected figure below is
written out from that description, not computed by the code under test.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from agent import REPO, ambient_setting
from chargeback_history import Device, EngineCounters, Node, Workload, backfill
from conftest import need_tool
from loopback_http import LoopbackServer
from promserver import PrometheusServer, evaluate_rules

from exporter.app.cli import main
from exporter.report import rules

H, D = 3600, 86400
STEP = 300
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"

# The period: the 30 whole days (UTC) that ended at the last midnight but one, so the
# history is always recent enough for Prometheus and entirely in the past.
END = (int(time.time()) // D - 1) * D
START = END - 30 * D


def pod(namespace: str, name: str, container: str, team: str, uid: str) -> dict[str, str]:
    return {"namespace": namespace, "pod": name, "container": container, "pod_uid": uid, "label_team": team}


def slurm(job: str, user: str, account: str) -> dict[str, str]:
    return {"slurm_job_id": job, "slurm_user": user, "slurm_account": account}


def scenario() -> tuple[list[Node], list[Workload]]:
    s = START
    nodes = [
        Node("gpu-a", H100, offset=0, down=[(s + 10 * D + 4 * H + 10 * 60, s + 10 * D + 4 * H + 40 * 60)],
             devices=[Device(0), Device(1)]),
        # down across a step boundary (06:00), samples 17 s after the minute
        Node("gpu-b", H100, offset=17, down=[(s + 20 * D + 5 * H + 50 * 60 + 17, s + 20 * D + 6 * H + 20 * 60 + 17)],
             devices=[Device(0), Device(1)]),
        # GPU 3 leaves the node on day 15
        Node("gpu-c", A100, offset=211, devices=[Device(0), Device(1), Device(2), Device(3, end=s + 15 * D + 211)]),
        # GPU 0 time-shared as 4 replicas; GPU 1 in MIG mode: a 3g and a 1g instance, 3 slices in none
        Node("gpu-d", H100, offset=101, devices=[Device(0), Device(1, capacity=3 / 7),
                                                 Device(1, capacity=3 / 7, gpu_instance="1"),
                                                 Device(1, capacity=1 / 7, gpu_instance="2")]),
    ]
    before, after = s - D, END + 12 * H
    workloads = [
        # 1. inference: the whole history at 75% SM and 500 W on gpu-a (its agent restarts on day 10)
        Workload("gpu-a", 0, pod("ml-prod", "vllm-0", "engine", "inference", "u1"), before, after,
                 [(before, 0.75, 500.0)]),
        # 2. a trainer (StatefulSet pod train-0) on gpu-a from day 1 to day 5 at 100% and 700 W...
        Workload("gpu-a", 1, pod("ml-research", "train-0", "trainer", "research", "u2"), s + D, s + 5 * D,
                 [(s + D, 1.0, 700.0)]),
        # ... rescheduled to gpu-b an hour later, at 90% and 650 W until day 12
        Workload("gpu-b", 0, pod("ml-research", "train-0", "trainer", "research", "u3"), s + 5 * D + H + 17,
                 s + 12 * D + 17, [(s + 5 * D + H + 17, 0.9, 650.0)]),
        # 3. a notebook on gpu-b for the whole history at 0% and 60 W, computing 50% at 300 W
        #    on day 2 from 06:00 to 12:00
        Workload("gpu-b", 1, pod("data-science", "jupyter-alice-0", "notebook", "research", "u4"), before, after,
                 [(before, 0.0, 60.0), (s + 2 * D + 6 * H + 17, 0.5, 300.0), (s + 2 * D + 12 * H + 17, 0.0, 60.0)]),
        # 4. and 5. Slurm jobs on gpu-c (A100): 48 h at 60% and 400 W; 24 h at 25% and 250 W
        Workload("gpu-c", 0, slurm("4242", "bob", "nlp-lab"), s + 15 * D + 211, s + 17 * D + 211,
                 [(s + 15 * D + 211, 0.6, 400.0)]),
        Workload("gpu-c", 1, slurm("4243", "alice", "nlp-lab"), s + 20 * D + 211, s + 21 * D + 211,
                 [(s + 20 * D + 211, 0.25, 250.0)]),
        # 6. began half a day before the period, ran two days into it at 50% and 300 W
        Workload("gpu-c", 2, pod("search", "embedder-0", "embedder", "search", "u5"), s - 12 * H + 211,
                 s + 2 * D + 211, [(s - 12 * H + 211, 0.5, 300.0)]),
        # 7. ended before the period: must not appear
        Workload("gpu-c", 3, pod("old", "gone-0", "x", "old", "u6"), s - D + 211, s - 14 * H + 211,
                 [(s - D + 211, 1.0, 700.0)]),
        # 8. and 9. the time-shared GPU: 2 of 4 replicas all along at 30% and 200 W; 1 of 4 on
        #    days 3 to 13 at 20% and 100 W
        Workload("gpu-d", 0, pod("shared", "embed-a", "embedder", "platform", "u7"), before, after,
                 [(before, 0.3, 200.0)], share=2 / 4),
        Workload("gpu-d", 0, pod("shared", "rerank-b", "reranker", "platform", "u8"), s + 3 * D + 101,
                 s + 13 * D + 101, [(s + 3 * D + 101, 0.2, 100.0)], share=1 / 4),
        # 10. the 3g MIG instance, all along: 3/7 of the GPU, computing 20% of the GPU's SM time
        #     at 150 W
        Workload("gpu-d", 1, pod("mig", "infer-0", "server", "platform", "u9"), before, after,
                 [(before, 0.2, 150.0)], share=3 / 7, gpu_instance="1"),
    ]
    return nodes, workloads


def engines() -> list[EngineCounters]:
    s = START
    before, after = s - D, END + 12 * H
    return [
        # vLLM in ml-prod/vllm-0 (gpu-a GPU 0): 1200 prompt and 300 generated tokens a second,
        # none on day 5 from 00:00 to 02:00; its engine crashes on day 20 right after the
        # 12:00 scrape and is back, its counters at 0, at the 12:10 scrape
        EngineCounters({"namespace": "ml-prod", "pod": "vllm-0", "model_name": "llama-3.1-70b", "engine": "0"},
                       "vllm:prompt_tokens", "vllm:generation_tokens", before, after,
                       [(before, 1200, 300), (s + 5 * D, 0, 0), (s + 5 * D + 2 * H, 1200, 300)],
                       down=[(s + 20 * D + 12 * H, s + 20 * D + 12 * H + 10 * 60)]),
        # SGLang in shared/embed-a (2 of the time-shared GPU's 4 replicas): 200 and 50 a second
        EngineCounters({"namespace": "shared", "pod": "embed-a", "model_name": "qwen2.5-7b"},
                       "sglang:prompt_tokens", "sglang:generation_tokens", before, after, [(before, 200, 50)],
                       offset=101),
        # Triton with TensorRT-LLM in mig/infer-0 (the 3g instance), two models: 300 and 100
        # tokens a second for llama-3.1-8b, 50 and 50 for mistral-7b (80% and 20% of the tokens)
        *(EngineCounters({"namespace": "mig", "pod": "infer-0", "model": model, "version": "1",
                          "response_metric_type": "total_input_tokens"}, "nv_llm_input_token_len",
                         "nv_llm_output_token_len", before, after, [(before, prompt, generated)], histogram=True,
                         offset=101, generated_labels={"namespace": "mig", "pod": "infer-0", "model": model,
                                                       "version": "1", "response_metric_type": "total_output_tokens"})
          for model, prompt, generated in (("llama-3.1-8b", 300, 100), ("mistral-7b", 50, 50))),
    ]


# ---- the hand-computed answers --------------------------------------------------------------
# (allocated h, used h, zombie h, kWh) per workload over the 30 days
VLLM = (720 - 0.5, 0.75 * (720 - 0.5), 0.0, 0.5 * (720 - 0.5))               # restart: 30 min unseen
TRAIN = (96 + 167, 96 * 1.0 + 167 * 0.9, 0.0, 96 * 0.7 + 167 * 0.65)          # gpu-a 4 days, gpu-b 167 h
NOTEBOOK = (720 - 0.5, 6 * 0.5, 720 - 0.5 - 6, (720 - 0.5 - 6) * 0.06 + 6 * 0.3)  # gpu-b restart: 30 min
JOB_4242 = (48, 48 * 0.6, 0.0, 48 * 0.4)
JOB_4243 = (24, 24 * 0.25, 0.0, 24 * 0.25)
# The embedder's samples fall 89 s before START and 211 s after: the rise between them
# counts in the period (each rise belongs to the period of its later sample), so the
# period sees 48 h and 5 minutes of it.
EMBEDDER = (48 + 5 / 60, (48 + 5 / 60) * 0.5, 0.0, (48 + 5 / 60) * 0.3)
# A share of a GPU: 2 of 4 replicas is half the GPU's time; SM time and energy are its own.
EMBED_A = (720 / 2, 720 * 0.3, 0.0, 720 * 0.2)
RERANK_B = (240 / 4, 240 * 0.2, 0.0, 240 * 0.1)
MIG_POD = (720 * 3 / 7, 720 * 0.2, 0.0, 720 * 0.15)
# The GPU-hours that existed: gpu-a's and gpu-b's GPUs less their agents' 30 unseen
# minutes, gpu-c's GPU 3 for 15 days (and the 5 minutes before START that its first
# sample in the period closes, as for the embedder), gpu-d's two GPUs (the MIG one:
# 3/7 + 3/7 + 1/7)
CAPACITY_H100 = 2 * (720 - 0.5) + 2 * (720 - 0.5) + 720 + 720
CAPACITY_A100 = 3 * 720 + 360 + 5 / 60
ALL = (VLLM, TRAIN, NOTEBOOK, JOB_4242, JOB_4243, EMBEDDER, EMBED_A, RERANK_B, MIG_POD)


def figures(*workloads: tuple[float, float, float, float]) -> dict[str, float]:
    allocated = sum(w[0] for w in workloads)
    used = sum(w[1] for w in workloads)
    return {"gpu_hours_allocated": allocated, "gpu_hours_used": used, "waste_gpu_hours": allocated - used,
            "zombie_hours": sum(w[2] for w in workloads), "energy_kwh": sum(w[3] for w in workloads)}


BY_NAMESPACE = {
    "ml-prod": figures(VLLM), "ml-research": figures(TRAIN), "data-science": figures(NOTEBOOK),
    "search": figures(EMBEDDER), "(none)": figures(JOB_4242, JOB_4243), "shared": figures(EMBED_A, RERANK_B),
    "mig": figures(MIG_POD),
}


def serve_history(tmp_path_factory, *args: str):
    """A real Prometheus on the backfilled history (no scrape targets), with ``args``."""
    prometheus_bin, promtool = need_tool("prometheus"), need_tool("promtool")
    tmp = tmp_path_factory.mktemp("report")
    nodes, workloads = scenario()
    backfill(promtool, tmp / "data", nodes, workloads, START - D, END + 12 * H, STEP, tmp, engines=engines())
    server = PrometheusServer(prometheus_bin, tmp, [], args=["--storage.tsdb.retention.time=400d", *args]).start()
    try:
        server.wait_for(f'count(last_over_time(container_gpu_usage_seconds_total[1h] @ {END}))', timeout=60)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus on the backfilled history (no scrape targets)."""
    yield from serve_history(tmp_path_factory)


def run(*args: str, capsys=None) -> tuple[int, str, str]:
    status = main(list(args))
    out, err = capsys.readouterr() if capsys is not None else ("", "")
    return status, out, err


def report_json(prometheus, tmp_path, *extra: str) -> dict:
    out = tmp_path / "report.json"
    assert main(["report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END),
                 "--output", str(out), *extra]) == 0
    return json.loads(out.read_text())


def assert_figures(got: dict, want: dict[str, float]) -> None:
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key


def test_json_by_namespace_equals_the_hand_computed_figures(prometheus, tmp_path):
    doc = report_json(prometheus, tmp_path)
    groups = {g["group"]: g for g in doc["groups"]}
    assert set(groups) == set(BY_NAMESPACE)  # "old" ended before the period
    for name, want in BY_NAMESPACE.items():
        assert_figures(groups[name], want)
    assert_figures(doc["totals"], figures(*ALL))
    assert doc["period"]["hours"] == 720
    # the trainer that moved nodes is one workload; the notebook is the top waster of its group
    assert groups["ml-research"]["workloads"] == 1
    assert groups["data-science"]["top_waste"][0]["workload"] == "data-science/jupyter-alice-0/notebook"
    assert groups["data-science"]["top_waste"][0]["waste_gpu_hours"] == pytest.approx(720 - 0.5 - 3)
    assert [w["workload"] for w in groups["(none)"]["top_waste"]] == ["slurm job 4242 (bob)", "slurm job 4243 (alice)"]
    assert doc["currency"] is None and doc["totals"]["total_cost"] is None
    # steps with a fall were read sample by sample: gpu-a's restart inside a step (3 workload
    # counters, the busy pod's idle time stays 0, and its GPUs' capacity and unallocated time)
    # and the notebook starting to compute (idle time), each with the step after (a fall is
    # looked for over two steps), and gpu-b's restart at a step boundary (6)
    assert doc["source"]["raw_steps"] == 2 * 5 + 2 * 1 + 6
    assert doc["notes"] == []


# ---- prices --------------------------------------------------------------------------------
PRICES = """\
currency: EUR
gpu_hour:
  NVIDIA H100 80GB HBM3: 2.50
  NVIDIA A100-SXM4-80GB: 1.50
kwh: 0.20
overrides:
  - match: {namespace: ml-research}        # reserved H100s
    gpu_hour: {NVIDIA H100 80GB HBM3: 1.00}
  - match: {slurm_account: nlp-lab}        # a grant: one price for every model, cheaper power
    gpu_hour: 1.20
    kwh: 0.10
"""


def costs(want: dict[str, float], gpu_hour: float, kwh: float) -> dict[str, float]:
    allocated = want["gpu_hours_allocated"] * gpu_hour
    energy = want["energy_kwh"] * kwh
    return {**want, "allocated_cost": allocated, "effective_cost": want["gpu_hours_used"] * gpu_hour,
            "waste_cost": want["waste_gpu_hours"] * gpu_hour, "energy_cost": energy, "total_cost": allocated + energy}


PRICED = {
    "ml-prod": costs(BY_NAMESPACE["ml-prod"], 2.50, 0.20),
    "ml-research": costs(BY_NAMESPACE["ml-research"], 1.00, 0.20),
    "data-science": costs(BY_NAMESPACE["data-science"], 2.50, 0.20),
    "search": costs(BY_NAMESPACE["search"], 1.50, 0.20),
    "(none)": costs(BY_NAMESPACE["(none)"], 1.20, 0.10),
    "shared": costs(BY_NAMESPACE["shared"], 2.50, 0.20),
    "mig": costs(BY_NAMESPACE["mig"], 2.50, 0.20),
}
PRICED_TOTALS = {key: sum(g[key] for g in PRICED.values()) for key in PRICED["ml-prod"]}
# What the GPUs cost at their models' prices, and what the overrides took off: ml-research's
# trainer paid 1.00 instead of 2.50 on H100s, the nlp-lab jobs 1.20 instead of 1.50 on A100s.
CAPACITY_COST = CAPACITY_H100 * 2.50 + CAPACITY_A100 * 1.50
OVERRIDES_COST = TRAIN[0] * (2.50 - 1.00) + (JOB_4242[0] + JOB_4243[0]) * (1.50 - 1.20)
RECONCILIATION = ("(unallocated)", "(price overrides)", "(capacity)")


@pytest.fixture
def prices_file(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(PRICES)
    return path


def test_csv_with_prices_equals_the_hand_computed_costs(prometheus, tmp_path, prices_file):
    out = tmp_path / "report.csv"
    assert main(["report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END),
                 "--prices", str(prices_file), "--output", str(out)]) == 0
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(out.read_text()))}
    assert set(rows) == set(PRICED) | set(RECONCILIATION)
    for name, want in PRICED.items():
        for key, value in want.items():
            assert float(rows[name][key]) == pytest.approx(value, abs=1e-5), (name, key)
    # groups come most expensive first, then the lines that make the bill add up
    assert list(rows) == sorted(PRICED, key=lambda g: -PRICED[g]["total_cost"]) + list(RECONCILIATION)
    assert float(rows["(capacity)"]["allocated_cost"]) == pytest.approx(CAPACITY_COST, abs=0.005)
    assert float(rows["(price overrides)"]["allocated_cost"]) == pytest.approx(OVERRIDES_COST, abs=0.005)
    above = sum(float(r["allocated_cost"]) for name, r in rows.items() if name != "(capacity)")
    assert above == pytest.approx(CAPACITY_COST, abs=0.005)
    hours = sum(float(r["gpu_hours_allocated"]) for name, r in rows.items() if name != "(capacity)")
    assert hours == pytest.approx(CAPACITY_H100 + CAPACITY_A100, abs=1e-4)
    assert rows["data-science"]["top_waste"] == f"data-science/jupyter-alice-0/notebook={720 - 0.5 - 3:g}h"
    assert float(rows["ml-prod"]["waste_ratio"]) == pytest.approx(0.25)


PODS = (VLLM, TRAIN, NOTEBOOK, EMBEDDER, EMBED_A, RERANK_B, MIG_POD)


@pytest.mark.parametrize("by,want", [
    ("label_team", {"inference": figures(VLLM), "research": figures(TRAIN, NOTEBOOK), "search": figures(EMBEDDER),
                    "(none)": figures(JOB_4242, JOB_4243), "platform": figures(EMBED_A, RERANK_B, MIG_POD)}),
    ("slurm_account", {"nlp-lab": figures(JOB_4242, JOB_4243), "(none)": figures(*PODS)}),
    ("slurm_user", {"bob": figures(JOB_4242), "alice": figures(JOB_4243), "(none)": figures(*PODS)}),
])
def test_grouping_by_pod_label_and_slurm_owner(prometheus, tmp_path, by, want):
    doc = report_json(prometheus, tmp_path, "--by", by)
    groups = {g["group"]: g for g in doc["groups"]}
    assert set(groups) == set(want)
    for name, figs in want.items():
        assert_figures(groups[name], figs)


def test_one_day_with_an_agent_restart_inside_a_step(prometheus, tmp_path):
    """Day 10: gpu-a's agent is down 04:10-04:40, longer than a 15-minute step: the step where
    its series come back is read sample by sample (4 counters)."""
    day = time.strftime("%Y-%m-%d", time.gmtime(START + 10 * D))
    next_day = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(START + 11 * D))
    out = tmp_path / "day.json"
    assert main(["report", "--prometheus", prometheus.base, "--from", day, "--to", next_day, "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["source"]["step_seconds"] == 900 and doc["source"]["raw_steps"] == 6
    groups = {g["group"]: g for g in doc["groups"]}
    assert set(groups) == {"ml-prod", "ml-research", "data-science", "shared", "mig"}
    assert_figures(groups["shared"], figures((12 + 6, 24 * 0.3 + 24 * 0.2, 0.0, 24 * 0.2 + 24 * 0.1)))
    # that day's GPUs: gpu-a's two less its 30 unseen minutes, and the eight others
    assert doc["totals"]["gpu_hours_capacity"] == pytest.approx(2 * 23.5 + 8 * 24)
    assert_figures(groups["ml-prod"], figures((23.5, 0.75 * 23.5, 0.0, 0.5 * 23.5)))
    assert_figures(groups["ml-research"], figures((24, 24 * 0.9, 0.0, 24 * 0.65)))
    assert_figures(groups["data-science"], figures((24, 0.0, 24, 24 * 0.06)))


def test_relative_times_cover_the_whole_history(prometheus, tmp_path):
    """--from 90d --to now: every workload's whole life, the one that ended before START included."""
    doc = report_json(prometheus, tmp_path, "--from", "90d", "--to", "now")
    # the history runs from a day before START to 12 h after END: 756 h
    groups = {g["group"]: g for g in doc["groups"]}
    assert_figures(groups["ml-prod"], figures((756 - 0.5, 0.75 * (756 - 0.5), 0.0, 0.5 * (756 - 0.5))))
    # gpu-b samples at :17 past: its first is 17 s after the history starts, its last 283 s before it ends
    life = 756 - 5 / 60 - 0.5
    assert_figures(groups["data-science"], figures((life, 3.0, life - 6, (life - 6) * 0.06 + 1.8)))
    assert_figures(groups["search"], figures((60, 30, 0.0, 60 * 0.3)))
    assert_figures(groups["old"], figures((10, 10, 0.0, 7)))


def test_json_to_stdout_and_html_need_no_network(prometheus, tmp_path, prices_file, capsys):
    assert main(["report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END),
                 "--prices", str(prices_file), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["currency"] == "EUR"
    for key, value in PRICED_TOTALS.items():
        assert doc["totals"][key] == pytest.approx(value, abs=1e-5), key
    assert len(doc["timeline"]["bins"]) == 30
    # the chart's daily costs add up to the total charge, and beside them what nobody held
    timeline = dict(doc["timeline"]["groups"])
    unallocated = timeline.pop("(unallocated)")
    daily = sum(sum(values) for values in timeline.values())
    assert daily == pytest.approx(PRICED_TOTALS["total_cost"], abs=1e-4)
    assert sum(unallocated) == pytest.approx(doc["totals"]["unallocated_cost"], abs=1e-4)


def _chromium(args: list[str], profile: Path) -> str:
    import subprocess

    binary = need_tool("chromium")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}"]
    done = subprocess.run([binary, *flags, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_html_report_in_a_real_browser_shows_the_totals(prometheus, tmp_path, prices_file):
    import os
    import re

    page = tmp_path / "chargeback.html"
    assert main(["report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END),
                 "--prices", str(prices_file), "--output", str(page)]) == 0
    html = page.read_text()
    # one self-contained file: nothing to fetch
    assert not re.search(r"""(src|href)\s*=|url\(|@import|<script""", html, re.I)
    dom = _chromium(["--dump-dom", page.as_uri()], tmp_path / "profile-dom")
    cards = dict(re.findall(r'data-figure="(\w+)" data-value="([^"]+)"', dom))
    for key in ("total_cost", "allocated_cost", "effective_cost", "waste_cost", "energy_cost"):
        assert float(cards[key]) == pytest.approx(PRICED_TOTALS[key], abs=1e-5), key
    for key in ("gpu_hours_allocated", "gpu_hours_used", "waste_gpu_hours", "zombie_hours", "energy_kwh"):
        assert float(cards[key]) == pytest.approx(PRICED_TOTALS[key], abs=1e-5), key
    shown = re.search(r'data-figure="total_cost".*?<div class="value">([^<]+)</div>', dom, re.S).group(1)
    assert shown == f"{PRICED_TOTALS['total_cost']:,.2f} EUR"
    assert "Waste</b> is allocated minus used" in dom
    assert dom.count("<rect") > 30 and "<svg" in dom
    rows = re.findall(r'<tr data-group="([^"]+)">', dom)
    assert rows == sorted(PRICED, key=lambda g: -PRICED[g]["total_cost"])
    # what the GPUs cost, and the lines under the groups that add up to it
    assert float(cards["gpu_hours_capacity"]) == pytest.approx(CAPACITY_H100 + CAPACITY_A100, abs=1e-5)
    assert f"costing {CAPACITY_COST:,.2f} EUR" in dom
    assert re.findall(r'<tr class="[^"]*reconcile" data-group="([^"]+)">', dom) == list(RECONCILIATION)
    artefacts = Path(os.environ.get("TEST_ARTEFACTS") or tmp_path)
    artefacts.mkdir(parents=True, exist_ok=True)
    shot = artefacts / "chargeback-report.png"
    _chromium([f"--screenshot={shot}", "--window-size=1280,1900", "--hide-scrollbars", page.as_uri()],
              tmp_path / "profile-shot")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


# ---- per served model: tokens from the engines' counters ------------------------------------
# vLLM served the month less its two idle hours and the ten minutes its engine was down
VLLM_SERVING_S = (720 - 2 - 10 / 60) * H
VLLM_IDLE_H = 2 + 10 / 60  # it held its GPU meanwhile: an idle replica


def part(workload: tuple[float, float, float, float], share: float) -> tuple[float, float, float, float]:
    return tuple(x * share for x in workload)  # type: ignore[return-value]


# model -> (prompt tokens, generated tokens, its part of its pod's figures); the Triton pod's
# GPU time is split 400:100 between its two models
MODELS = {
    "llama-3.1-70b": (1200 * VLLM_SERVING_S, 300 * VLLM_SERVING_S, VLLM),
    "qwen2.5-7b": (200 * 720 * H, 50 * 720 * H, EMBED_A),
    "llama-3.1-8b": (300 * 720 * H, 100 * 720 * H, part(MIG_POD, 0.8)),
    "mistral-7b": (50 * 720 * H, 50 * 720 * H, part(MIG_POD, 0.2)),
}
NO_MODEL = figures(TRAIN, NOTEBOOK, JOB_4242, JOB_4243, EMBEDDER, RERANK_B)


def test_report_by_model_prices_tokens_read_exactly_through_an_engine_restart(prometheus, tmp_path, prices_file):
    doc = report_json(prometheus, tmp_path, "--by", "model", "--prices", str(prices_file))
    groups = {g["group"]: g for g in doc["groups"]}
    assert set(groups) == set(MODELS) | {"(none)"}
    for model, (prompt, generated, workload) in MODELS.items():
        g = groups[model]
        assert g["prompt_tokens"] == pytest.approx(prompt, rel=1e-9), model
        assert g["generated_tokens"] == pytest.approx(generated, rel=1e-9), model
        assert_figures(g, figures(workload))
        tokens = prompt + generated
        assert g["allocated_cost"] == pytest.approx(workload[0] * 2.50, abs=1e-5), model
        assert g["cost_per_million_tokens"] == pytest.approx(workload[0] * 2.50 / tokens * 1e6, rel=1e-5), model
        assert g["effective_cost_per_million_tokens"] == pytest.approx(workload[1] * 2.50 / tokens * 1e6,
                                                                       rel=1e-5), model
        assert g["kwh_per_million_tokens"] == pytest.approx(workload[3] / tokens * 1e6, rel=1e-5), model
        assert g["gpu_hours_per_million_tokens"] == pytest.approx(workload[0] / tokens * 1e6, rel=1e-5), model
        assert g["replicas"] == 1
    # the shared GPU's model pays its pod's half of the GPU, not the whole GPU
    assert groups["qwen2.5-7b"]["allocated_cost"] == pytest.approx(720 / 2 * 2.50)
    # idle: vLLM held its GPU two hours without traffic and ten minutes with its engine down
    assert groups["llama-3.1-70b"]["idle_replica_hours"] == pytest.approx(VLLM_IDLE_H, abs=1e-6)
    assert groups["llama-3.1-70b"]["idle_gpu_hours"] == pytest.approx(VLLM_IDLE_H, abs=1e-6)
    for model in ("qwen2.5-7b", "llama-3.1-8b", "mistral-7b"):
        assert groups[model]["idle_replica_hours"] == 0 and groups[model]["idle_gpu_hours"] == 0
    # everything else serves no model; the bill reconciles as by namespace
    assert_figures(groups["(none)"], NO_MODEL)
    assert groups["(none)"]["cost_per_million_tokens"] is None and groups["(none)"]["replicas"] == 0
    totals = doc["totals"]
    assert_figures(totals, figures(*ALL))
    assert totals["gpu_hours_allocated"] + totals["gpu_hours_unallocated"] == pytest.approx(
        CAPACITY_H100 + CAPACITY_A100, abs=1e-5)
    assert round(totals["allocated_cost"] + totals["unallocated_cost"] + totals["price_overrides_cost"], 2) == \
        round(CAPACITY_COST, 2)
    assert totals["prompt_tokens"] == pytest.approx(sum(m[0] for m in MODELS.values()), rel=1e-9)
    assert doc["notes"] == []


def test_report_by_model_figures_do_not_depend_on_the_step(prometheus, tmp_path):
    default = {g["group"]: g for g in report_json(prometheus, tmp_path, "--by", "model")["groups"]}
    hourly = {g["group"]: g for g in report_json(prometheus, tmp_path, "--by", "model", "--step", "1h")["groups"]}
    assert set(default) == set(hourly)
    for name, g in default.items():
        for key in ("prompt_tokens", "generated_tokens", "gpu_hours_allocated", "kwh_per_million_tokens",
                    "gpu_hours_per_million_tokens", "idle_replica_hours", "idle_gpu_hours"):
            want = g[key] if g[key] is None else pytest.approx(g[key], rel=1e-6, abs=1e-6)
            assert hourly[name][key] == want, (name, key)


def test_values_read_in_slices_of_steps_give_the_same_report(prometheus, tmp_path, monkeypatch):
    """A fleet's series are read a few steps per query: here one step per query."""
    from exporter.report import compute

    whole = report_json(prometheus, tmp_path, "--by", "model")
    monkeypatch.setattr(compute, "FIRST_SLICE_STEPS", 1)
    monkeypatch.setattr(compute, "VALUES_PER_ANSWER", 1)
    sliced = report_json(prometheus, tmp_path, "--by", "model")
    assert sliced["source"]["queries"] > whole["source"]["queries"] + 100
    assert sliced["groups"] == whole["groups"] and sliced["totals"] == whole["totals"]
    assert sliced["timeline"] == whole["timeline"]


def test_one_day_by_model_across_the_engine_restart(prometheus, tmp_path):
    """Day 20: the vLLM engine restarts at 12:00 (counters back to 0, ten minutes unseen)."""
    day = START + 20 * D
    doc = report_json(prometheus, tmp_path, "--by", "model", "--from", str(day), "--to", str(day + D))
    vllm = {g["group"]: g for g in doc["groups"]}["llama-3.1-70b"]
    serving = (24 - 10 / 60) * H
    assert vllm["prompt_tokens"] == pytest.approx(1200 * serving, rel=1e-9)
    assert vllm["generated_tokens"] == pytest.approx(300 * serving, rel=1e-9)
    assert vllm["idle_replica_hours"] == pytest.approx(10 / 60, abs=1e-6)
    assert vllm["gpu_hours_allocated"] == pytest.approx(24)


def test_report_by_model_csv_has_the_model_columns(prometheus, tmp_path, prices_file):
    out = tmp_path / "models.csv"
    assert main(["report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END), "--by", "model",
                 "--prices", str(prices_file), "-o", str(out)]) == 0
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(out.read_text()))}
    assert set(rows) == set(MODELS) | {"(none)"} | set(RECONCILIATION)
    prompt, generated, workload = MODELS["qwen2.5-7b"]
    assert float(rows["qwen2.5-7b"]["cost_per_million_tokens"]) == pytest.approx(
        workload[0] * 2.50 / (prompt + generated) * 1e6, rel=1e-5)
    assert float(rows["llama-3.1-70b"]["idle_replica_hours"]) == pytest.approx(VLLM_IDLE_H, abs=1e-6)
    assert rows["(none)"]["cost_per_million_tokens"] == "" and rows["(capacity)"]["prompt_tokens"] == ""


# ---- mistakes: one line, the right exit status, nothing written ---------------------------
@pytest.mark.parametrize("text,message", [
    ("gpu_hour: {NVIDIA H100 80GB HBM3: cheap}", "gpu_hour['NVIDIA H100 80GB HBM3']: a price must be a number >= 0, "
                                                 "got 'cheap'"),
    ("gpu_hour: {H100: -1}", "gpu_hour['H100']: a price must be a number >= 0, got -1"),
    ("kwh: 0.2", "gpu_hour is required"),
    ("gpu_hour: 2\nkwhh: 0.2", "unknown key 'kwhh' (expected one of: currency, gpu_hour, kwh, carbon, overrides)"),
    ("gpu_hour: 2\noverrides: [{match: {namespace: a}}]", "overrides[0]: set gpu_hour and/or kwh"),
    ("gpu_hour: 2\noverrides: [{match: {team-x: a}, kwh: 1}]", "overrides[0].match: 'team-x' is not a Prometheus "
                                                               "label name"),
    ("gpu_hour: 2\noverrides: [{match: {}, kwh: 1}]", "overrides[0].match: expected a mapping of label to value"),
    ("gpu_hour: [1, 2]", "gpu_hour: expected a mapping of GPU model to price per hour, or one number"),
    ("gpu_hour: {a: 1\n", "not valid YAML (line 2)"),
    ("- 1", "expected a mapping with gpu_hour"),
])
def test_bad_prices_files_say_what_is_wrong_in_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    out = tmp_path / "report.csv"
    status = main(["report", "--prometheus", "http://127.0.0.1:1", "--from", "7d", "--prices", str(path),
                   "-o", str(out)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"l9gpu report: {path}: ") and message in err, err
    assert not out.exists()


def test_a_model_without_a_price_is_named(prometheus, tmp_path, capsys):
    path = tmp_path / "prices.yaml"
    path.write_text("gpu_hour: {NVIDIA H100 80GB HBM3: 2.5}\n")
    out = tmp_path / "report.csv"
    status = main(["report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END),
                   "--prices", str(path), "-o", str(out)])
    err = capsys.readouterr().err
    assert status == 2 and not out.exists()
    assert err == (f"l9gpu report: {path}: no price for GPU model 'NVIDIA A100-SXM4-80GB' "
                   "(add it under gpu_hour, or set gpu_hour.default)\n")


# At most this many samples in memory per query: the idle-interval query of a month by
# model is more (Prometheus refuses it whole), each of the other queries less.
SMALL_MAX_SAMPLES = 20_000


@pytest.fixture(scope="module")
def small_prometheus(tmp_path_factory):
    """The same history on a Prometheus that loads fewer samples per query than a month's
    report by model needs at once (as a default Prometheus under a 1,000-node month)."""
    yield from serve_history(tmp_path_factory, f"--query.max-samples={SMALL_MAX_SAMPLES}")


def test_a_query_too_large_for_the_server_is_asked_in_parts_with_the_same_figures(prometheus, small_prometheus,
                                                                                   tmp_path, capsys):
    whole = report_json(prometheus, tmp_path, "--by", "model")
    capsys.readouterr()
    parts = report_json(small_prometheus, tmp_path, "--by", "model")
    err = capsys.readouterr().err
    assert re.search(r"note: \d+ range queries were more than Prometheus evaluates at once .* asked again in "
                     r"shorter ranges", err), err
    assert parts["groups"] == whole["groups"] and parts["totals"] == whole["totals"]
    assert {g["group"]: g["idle_replica_hours"] for g in parts["groups"]}["llama-3.1-70b"] == \
        pytest.approx(VLLM_IDLE_H, abs=1e-6)


@pytest.mark.parametrize("args,status,message", [
    (["--from", "last tuesday"], 2, "--from: invalid time 'last tuesday'"),
    (["--from", "2026-13-01"], 2, "--from: invalid time '2026-13-01'"),
    (["--from", "1d", "--to", "2d"], 2, "must be after --from"),
    (["--from", "1d", "--by", "team"], 2,
     "--by 'team': use namespace, model, job, label_<key>, slurm_account or slurm_user"),
    (["--from", "1d", "--step", "10s"], 2, "--step must be at least 1m"),
    (["--from", "1d", "--password", "x"], 2, "--password needs --username"),
    (["--from", "1d", "--ca-file", "/nonexistent/ca.pem"], 2, "--ca-file /nonexistent/ca.pem: no such file"),
    (["--from", "1d", "-o", "/nonexistent/dir/r.csv"], 2, "directory /nonexistent/dir does not exist"),
    (["--from", "1d", "--selector", "{{bad"], 1, "Prometheus refused a query (HTTP 400, bad_data)"),
])
def test_bad_flags_and_refused_queries(prometheus, capsys, args, status, message):
    assert main(["report", "--prometheus", prometheus.base, *args]) == status
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_unreachable_or_wrong_url(prometheus, capsys):
    from agent import free_port

    assert main(["report", "--prometheus", f"http://127.0.0.1:{free_port()}", "--from", "1d"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("l9gpu report: cannot reach Prometheus at http://127.0.0.1:") and err.count("\n") == 1
    assert main(["report", "--prometheus", prometheus.base + "/graph", "--from", "1d"]) == 1
    err = capsys.readouterr().err
    assert "not a Prometheus API answer" in err and err.count("\n") == 1
    assert main(["report", "--prometheus", "prometheus:9090", "--from", "1d"]) == 2
    assert "expected an http:// or https:// URL" in capsys.readouterr().err


def test_prices_become_rules_that_promtool_accepts(tmp_path, prices_file, capsys):
    import subprocess

    rules = tmp_path / "prices.rules.yaml"
    assert main(["prices", str(prices_file), "-o", str(rules)]) == 0
    text = rules.read_text()
    assert 'labels: {model: "NVIDIA H100 80GB HBM3"}' in text and "expr: vector(2.5)" in text
    assert 'labels: {namespace: "ml-research", model: "NVIDIA H100 80GB HBM3"}' in text
    assert "#   slurm_account=nlp-lab" in text  # not a namespace override: report only, and said so
    check = subprocess.run([need_tool("promtool"), "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu_hour: {x: y}")
    assert main(["prices", str(bad)]) == 2
    assert capsys.readouterr().err == f"l9gpu prices: {bad}: gpu_hour['x']: a price must be a number >= 0, got 'y'\n"


# ---- authentication and TLS, as Prometheus users set them up -------------------------------
@pytest.fixture(scope="module")
def secure_prometheus(tmp_path_factory):
    """Prometheus itself serving TLS with basic auth (--web.config.file), on two days of history."""
    import ssl
    import urllib.request

    import yaml
    from test_webconfig import basic, htpasswd_hash, make_pki

    prometheus_bin, promtool = need_tool("prometheus"), need_tool("promtool")
    tmp = tmp_path_factory.mktemp("secure")
    pki = make_pki(tmp / "pki")
    nodes = [Node("gpu-a", H100)]
    workloads = [Workload("gpu-a", 0, pod("ml-prod", "vllm-0", "engine", "inference", "u1"), END - 2 * D, END,
                          [(END - 2 * D, 0.5, 400.0)])]
    backfill(promtool, tmp / "data", nodes, workloads, END - 2 * D, END, STEP, tmp)
    web = tmp / "web.yml"
    web.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": str(pki.server_cert),
                                                         "key_file": str(pki.server_key)},
                                   "basic_auth_users": {"finance": htpasswd_hash("s3cret")}}))
    server = PrometheusServer(prometheus_bin, tmp, [], args=["--storage.tsdb.retention.time=400d",
                                                             f"--web.config.file={web}"]).start()
    server.base = server.base.replace("http://", "https://")
    context = ssl.create_default_context(cafile=str(pki.ca))
    deadline = time.monotonic() + 60
    while True:
        try:
            request = urllib.request.Request(server.base + "/-/ready", headers=basic("finance", "s3cret"))
            with urllib.request.urlopen(request, context=context, timeout=5):
                break
        except OSError:
            if time.monotonic() > deadline or server.proc.poll() is not None:
                raise RuntimeError("prometheus did not start:\n" + server.log()) from None
            time.sleep(0.25)
    try:
        yield server, pki
    finally:
        server.stop()


def test_tls_and_basic_auth(secure_prometheus, tmp_path, capsys):
    server, pki = secure_prometheus
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    base = ["report", "--prometheus", server.base, "--from", str(END - 2 * D), "--to", str(END), "--format", "json"]
    assert main([*base, "--ca-file", str(pki.ca), "--username", "finance", "--password-file", str(password)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert_figures(doc["totals"], figures((48, 24, 0.0, 48 * 0.4)))
    assert main([*base, "--ca-file", str(pki.ca), "--username", "finance", "--password", "wrong"]) == 1
    assert "refused the credentials (HTTP 401)" in capsys.readouterr().err
    assert main([*base, "--username", "finance", "--password", "s3cret"]) == 1  # the system CAs do not know it
    err = capsys.readouterr().err
    assert err.startswith(f"l9gpu report: TLS with {server.base} failed: ") and "--ca-file" in err
    assert err.count("\n") == 1
    assert main([*base, "--insecure-skip-verify", "--username", "finance", "--password", "s3cret"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["gpu_hours_allocated"] == pytest.approx(48)
    # credentials in the URL work as basic auth and stay out of the report
    userinfo = server.base.replace("https://", "https://finance:s3cret@")
    assert main(["report", "--prometheus", userinfo, *base[3:], "--ca-file", str(pki.ca)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["prometheus"] == server.base and "s3cret" not in json.dumps(doc)


def test_bearer_token_through_an_auth_proxy(prometheus, tmp_path, capsys):
    """A bearer token as an authenticating proxy in front of Prometheus (kube-rbac-proxy and the like) wants it."""
    import asyncio
    import threading

    import aiohttp
    from aiohttp import web

    async def forward(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer t0ken":
            return web.Response(status=401, text="Unauthorized")
        async with aiohttp.ClientSession() as session:
            async with session.post(prometheus.base + request.path, data=await request.read(),
                                    headers={"Content-Type": request.headers["Content-Type"]}) as upstream:
                return web.Response(status=upstream.status, body=await upstream.read(),
                                    content_type="application/json")

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/{tail:.*}", forward)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port the OS chose
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        token = tmp_path / "token"
        token.write_text("t0ken\n")
        base = ["report", "--prometheus", f"http://127.0.0.1:{port}", "--from", str(START), "--to", str(END),
                "--format", "json"]
        assert main([*base, "--bearer-token-file", str(token)]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert_figures(doc["totals"], figures(*ALL))
        assert main([*base, "--bearer-token", "nope"]) == 1
        assert "refused the credentials (HTTP 401)" in capsys.readouterr().err
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_the_bill_reconciles_with_what_the_gpus_cost(prometheus, tmp_path, prices_file):
    """Capacity cost is GPUs x hours x price to the cent; the groups, the unallocated hours and
    the overrides' discounts add up to it, in GPU-hours and in money."""
    doc = report_json(prometheus, tmp_path, "--prices", str(prices_file))
    totals = doc["totals"]
    assert totals["gpu_hours_capacity"] == pytest.approx(CAPACITY_H100 + CAPACITY_A100, abs=1e-6)
    assert round(totals["capacity_cost"], 2) == round(CAPACITY_COST, 2)
    # nobody held: gpu-a GPU 1 but for the trainer's 4 days, gpu-b GPU 0 but for its 167 h,
    # gpu-c's GPUs but for the jobs and the embedder, a quarter of the shared GPU (half while
    # rerank-b was away) and 4/7 of the MIG GPU
    unallocated_h100 = ((720 - 0.5 - 96) + (720 - 0.5 - 167) + (720 * 2 / 4 - 240 / 4) + 720 * 4 / 7)
    unallocated_a100 = (720 - 48) + (720 - 24) + (720 - 48 - 5 / 60) + 360 + 5 / 60
    assert totals["gpu_hours_unallocated"] == pytest.approx(unallocated_h100 + unallocated_a100, abs=1e-6)
    assert totals["unallocated_cost"] == pytest.approx(unallocated_h100 * 2.5 + unallocated_a100 * 1.5, abs=1e-5)
    assert totals["price_overrides_cost"] == pytest.approx(OVERRIDES_COST, abs=1e-5)
    assert totals["gpu_hours_allocated"] + totals["gpu_hours_unallocated"] == pytest.approx(
        totals["gpu_hours_capacity"], abs=1e-5)
    assert round(totals["allocated_cost"] + totals["unallocated_cost"] + totals["price_overrides_cost"], 2) == \
        round(totals["capacity_cost"], 2)
    # a shared GPU's hour is paid once: its holders' hours never exceed the GPU's
    groups = {g["group"]: g for g in doc["groups"]}
    assert groups["shared"]["gpu_hours_allocated"] == pytest.approx(360 + 60)
    assert groups["mig"]["allocated_cost"] == pytest.approx(720 * 3 / 7 * 2.5)
    # without prices the hours still reconcile, and the costs are absent
    plain = report_json(prometheus, tmp_path)["totals"]
    assert plain["gpu_hours_capacity"] == totals["gpu_hours_capacity"] and plain["capacity_cost"] is None


def test_a_period_spanning_agents_that_billed_each_tenant_the_whole_gpu_is_flagged(tmp_path_factory, capsys):
    """Counters from agents before 0.2: a time-shared GPU's tenants each count the whole GPU and
    there is no capacity series; the report says so instead of presenting a bill that cannot add up."""
    prometheus_bin, promtool = need_tool("prometheus"), need_tool("promtool")
    tmp = tmp_path_factory.mktemp("upgrade")
    old_agent = Node("gpu-x", H100)
    new_agent = Node("gpu-y", H100, devices=[Device(0)])
    workloads = [Workload(node, 0, pod("shared", f"p{n}", "c", "t", f"u{n}-{node}"), END - 2 * D, END,
                          [(END - 2 * D, 0.2, 100.0)], share=1.0 if node == "gpu-x" else 0.5)
                 for node in ("gpu-x", "gpu-y") for n in range(2)]
    backfill(promtool, tmp / "data", [old_agent], workloads[:2], END - 2 * D, END, STEP, tmp)
    server = PrometheusServer(prometheus_bin, tmp, [], args=["--storage.tsdb.retention.time=400d"]).start()
    try:
        server.wait_for(f'count(last_over_time(container_gpu_usage_seconds_total[3d] @ {END}))', timeout=60)
        base = ["report", "--prometheus", server.base, "--from", str(END - 2 * D), "--to", str(END), "--format", "json"]
        assert main(base) == 0
        captured = capsys.readouterr()
        doc = json.loads(captured.out)
        assert doc["totals"]["gpu_hours_allocated"] == pytest.approx(96) and doc["totals"]["gpu_hours_capacity"] is None
        assert doc["notes"] and "predate l9gpu 0.2" in doc["notes"][0]
        assert "note: no gpu_capacity_seconds_total series" in captured.err
    finally:
        server.stop()
    tmp2 = tmp_path_factory.mktemp("upgraded")
    backfill(promtool, tmp2 / "data", [old_agent, new_agent], workloads, END - 2 * D, END, STEP, tmp2)
    server = PrometheusServer(prometheus_bin, tmp2, [], args=["--storage.tsdb.retention.time=400d"]).start()
    try:
        server.wait_for(f'count(last_over_time(gpu_capacity_seconds_total[3d] @ {END}))', timeout=60)
        assert main(["report", "--prometheus", server.base, "--from", str(END - 2 * D), "--to", str(END),
                     "--format", "json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        # gpu-y's two tenants hold half each: 48 h in all; gpu-x's old agent billed 96 h for 48
        assert doc["totals"]["gpu_hours_capacity"] == pytest.approx(48)
        assert doc["notes"] and "differ from the capacity by +-96.0000" not in doc["notes"][0]
        assert "differ from the capacity by -96.0000 GPU-hours" in doc["notes"][0]
    finally:
        server.stop()


def test_tenant_headers_and_path_prefixes_of_multi_tenant_backends(prometheus, tmp_path, capsys):
    """A gateway in front of the real Prometheus, shaped like the multi-tenant backends:
    Grafana Mimir (and Cortex) under /prometheus, wanting X-Scope-OrgID (401 without it);
    VictoriaMetrics cluster under /select/<tenant>/prometheus, the tenant in the path."""
    import aiohttp
    from aiohttp import web
    from loopback_http import LoopbackServer

    async def forward(request: web.Request, tail: str) -> web.Response:
        async with aiohttp.ClientSession() as session:
            async with session.post(prometheus.base + "/" + tail, data=await request.read(),
                                    headers={"Content-Type": request.headers["Content-Type"]}) as upstream:
                return web.Response(status=upstream.status, body=await upstream.read(),
                                    content_type="application/json")

    async def mimir(request: web.Request) -> web.Response:
        if request.headers.get("X-Scope-OrgID") != "team-a":
            return web.Response(status=401, text="no org id")
        return await forward(request, request.match_info["tail"])

    async def victoria(request: web.Request) -> web.Response:
        if request.match_info["tenant"] != "7":
            return web.Response(status=400, text="unknown tenant")
        return await forward(request, request.match_info["tail"])

    app = web.Application()
    app.router.add_post("/prometheus/{tail:api/v1/.*}", mimir)
    app.router.add_post("/select/{tenant}/prometheus/{tail:api/v1/.*}", victoria)
    want = figures(*ALL)
    with LoopbackServer(app) as gateway:
        base = ["report", "--from", str(START), "--to", str(END), "--format", "json"]
        assert main([*base, "--prometheus", gateway.base + "/prometheus", "--header", "X-Scope-OrgID: team-a"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert_figures(doc["totals"], want)
        assert doc["source"]["prometheus"] == gateway.base + "/prometheus"
        assert doc["source"]["headers"] == ["X-Scope-OrgID"]
        queries = [headers for _, path, headers in gateway.requests if path.startswith("/prometheus/")]
        assert len(queries) == doc["source"]["queries"]
        assert all(headers.get("X-Scope-OrgID") == "team-a" for headers in queries)
        assert main([*base, "--prometheus", gateway.base + "/prometheus"]) == 1
        err = capsys.readouterr().err
        assert "refused the credentials (HTTP 401)" in err and "--header" in err
        assert main([*base, "--prometheus", gateway.base + "/select/7/prometheus"]) == 0
        assert_figures(json.loads(capsys.readouterr().out)["totals"], want)


def test_consecutive_periods_add_up_to_the_whole(prometheus, tmp_path):
    """No extrapolation: days 0-10 plus days 10-30 (a restart and a reset in each) equal the month."""
    def by_group(start: int, end: int) -> dict[str, dict]:
        out = tmp_path / f"{start}.json"
        assert main(["report", "--prometheus", prometheus.base, "--from", str(start), "--to", str(end),
                     "-o", str(out)]) == 0
        return {g["group"]: g for g in json.loads(out.read_text())["groups"]}

    first, second, whole = by_group(START, START + 10 * D + 4321), by_group(START + 10 * D + 4321, END), \
        by_group(START, END)
    for name, group in whole.items():
        for key in ("gpu_hours_used", "gpu_hours_allocated", "zombie_hours", "energy_kwh"):
            parts = first.get(name, {}).get(key, 0.0) + second.get(name, {}).get(key, 0.0)
            assert parts == pytest.approx(group[key], abs=1e-5), (name, key)


def test_connection_flags_from_the_environment(prometheus, tmp_path, monkeypatch, capsys):
    """Like every l9gpu flag, --prometheus and --from can come from L9GPU_* variables."""
    assert main(["report", "--from", "1d"]) == 2
    assert capsys.readouterr().err == "l9gpu report: --prometheus is required\n"
    monkeypatch.setenv("L9GPU_PROMETHEUS", prometheus.base)
    monkeypatch.setenv("L9GPU_FROM", str(START))
    assert main(["report", "--to", str(END), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["totals"]["gpu_hours_allocated"] == pytest.approx(figures(*ALL)["gpu_hours_allocated"], abs=1e-6)


def test_the_step_changes_the_queries_not_the_figures(prometheus, tmp_path):
    default = report_json(prometheus, tmp_path)
    hourly = report_json(prometheus, tmp_path, "--step", "1h")
    assert hourly["source"]["step_seconds"] == 3600 and default["source"]["step_seconds"] == 21600
    for a, b in zip(default["groups"], hourly["groups"]):
        assert a["group"] == b["group"]
        for key in ("gpu_hours_used", "gpu_hours_allocated", "zombie_hours", "energy_kwh"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), (a["group"], key)



def report_with_stderr(base: str, *extra: str, terminal: bool, env: dict[str, str] | None = None,
                       watch: Any = None) -> tuple[int, bytes, bytes]:
    """`python -m exporter report --format json` over the whole history from the Prometheus
    at ``base``, in a subprocess whose standard error is a real pseudo-terminal
    (``terminal``) or a pipe; its exit status, standard output and everything written to
    standard error. ``watch`` is called with what the terminal showed so far, as it grows."""
    full_env = {k: v for k, v in os.environ.items() if not ambient_setting(k)}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "exporter", "report", "--prometheus", base, "--from", str(START),
           "--to", str(END), "--format", "json", *extra]
    if not terminal:
        done = subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, timeout=120)
        return done.returncode, done.stdout, done.stderr
    controller, terminal_fd = pty.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 120 columns
    seen = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the last holder of the terminal side closed it
                return
            if not chunk:
                return
            seen.extend(chunk)
            if watch is not None:
                watch(bytes(seen))

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        proc = subprocess.Popen(cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=terminal_fd,
                                stdin=subprocess.DEVNULL)
        os.close(terminal_fd)
        out, _ = proc.communicate(timeout=120)
        reader.join(timeout=30)
    finally:
        os.close(controller)
    return proc.returncode, out, bytes(seen)


def held(prometheus, release: threading.Event) -> Any:
    """Prometheus behind a proxy that answers no query before ``release`` is set."""
    import asyncio

    import aiohttp
    from aiohttp import web

    async def forward(request: web.Request) -> web.Response:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        async with aiohttp.ClientSession() as session:
            async with session.post(prometheus.base + request.path, data=await request.read(),
                                    headers={"Content-Type": request.headers["Content-Type"]}) as upstream:
                return web.Response(status=upstream.status, body=await upstream.read(),
                                    content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", forward)
    return LoopbackServer(app)


def test_progress_on_a_terminal_and_nothing_when_piped_or_quiet(prometheus):
    """On a terminal the report shows the phase, the queries answered of those asked and the
    time elapsed, which moves on while the queries are unanswered; piped, or with --quiet
    (or L9GPU_QUIET), standard error has no progress; standard output is the same bytes
    every way."""
    status, piped_out, piped_err = report_with_stderr(prometheus.base, terminal=False)
    assert status == 0
    queries = json.loads(piped_out)["source"]["queries"]
    assert queries > 10
    assert b"queries" not in piped_err and b"\r" not in piped_err and b"\x1b" not in piped_err

    # every query held until the terminal has shown them asked, none answered, a second on
    release = threading.Event()
    waiting = re.compile(rb"l9gpu report: reading counters, 0/[1-9]\d* queries \[00:0[1-9]\]")
    with held(prometheus, release) as proxy:
        status, out, shown = report_with_stderr(
            proxy.base, terminal=True, watch=lambda seen: waiting.search(seen) and release.set())
    assert release.is_set(), shown
    assert status == 0 and out.replace(proxy.base.encode(), prometheus.base.encode()) == piped_out
    text = shown.decode()
    # once every answer is in: all the queries asked, answered
    assert f"l9gpu report: summarising, {queries}/{queries} queries [" in text, text
    assert "l9gpu report: writing json" in text, text
    # --by model asks for the idle intervals too, and says so
    status, _, shown = report_with_stderr(prometheus.base, "--by", "model", terminal=True)
    assert status == 0
    assert re.search(r"l9gpu report: reading counters and idle intervals, \d+/\d+ queries", shown.decode())

    for extra, env in ((("--quiet",), None), (("-q",), None), ((), {"L9GPU_QUIET": "true"})):
        status, out, shown = report_with_stderr(prometheus.base, *extra, terminal=True, env=env)
        assert status == 0 and out == piped_out, (extra, env)
        assert b"queries" not in shown and b"\r" not in shown, (extra, env, shown)


# Periods that put every case of the counter rule on a step: the month (restarts inside a
# step, churn, a GPU leaving), a day around gpu-a's 30-minute outage read in 5-minute steps
# (its series come back after whole steps without samples), the days around gpu-b's restart
# across a step boundary in 1-hour steps, and a period that ends in a short step.
PERIODS = [
    (START, END, 21600, True),
    (START + 10 * D, START + 11 * D, 300, True),
    (START + 19 * D + 7 * H, START + 21 * D + 1234, 3600, True),
    (START + 3 * D + 17, START + 9 * D + 5 * H + 41, 7200, False),
]


@pytest.mark.parametrize("start, end, step, resets", PERIODS)
def test_the_server_sums_equal_the_per_series_computation(prometheus, start, end, step, resets):
    """Per series and per group and step, every counter the server sums equals the report's
    per-series reading of the same history, to the GPU-second (joule, for energy)."""
    import asyncio

    from exporter.report import aggregate, compute
    from exporter.report.prom import Prometheus, config_from_args

    group_by = ["namespace", "model", "label_team"]
    families = [family for family, _ in (*compute.COUNTERS.values(), *compute.DEVICE_COUNTERS.values())]

    async def both() -> list[tuple[dict, Any, int]]:
        async with Prometheus(config_from_args(prometheus.base)) as prom:
            grid = compute.Grid(start * 1000, end * 1000, step * 1000)
            out = []
            for family in families:
                stats = compute.FetchStats()
                per_series = await compute._counter(prom, family, grid, "", stats)
                summed = await aggregate.increases(prom, family, grid, "", group_by, stats)
                out.append((per_series, summed, stats.raw_steps))
            return out

    flagged = 0
    for family, (per_series, summed, raw_steps) in zip(families, asyncio.run(both())):
        flagged += raw_steps
        totals = {key: sum(steps) for key, steps in per_series.items() if any(steps)}
        assert set(totals) <= set(summed.totals), family
        for key, total in summed.totals.items():
            assert total == pytest.approx(totals.get(key, 0.0), abs=1e-6), (family, dict(key))
        by_group: dict = {}
        for key, steps in per_series.items():
            row = by_group.setdefault(aggregate.group_key(dict(key), group_by), [0.0] * len(steps))
            for k, value in enumerate(steps):
                row[k] += value
        for key in set(by_group) | set(summed.steps):
            want = by_group.get(key) or [0.0] * len(next(iter(by_group.values())))
            got = summed.steps.get(key) or [0.0] * len(want)
            assert got == pytest.approx(want, abs=1e-6), (family, dict(key))
    assert bool(flagged) == resets  # restarts, outages: the sample-by-sample path was taken


CHARGEBACK_RULES = REPO / "alerts" / "l9gpu-chargeback.rules.yaml"
# The rules are evaluated over eight days: vLLM's two hours without a token (day 5) and
# gpu-a's restart (day 10)
RULES_FROM, RULES_TO = START + 4 * D, START + 12 * D


@pytest.fixture(scope="module")
def rules_prometheus(tmp_path_factory):
    """The same history, with the chargeback recording rules evaluated over it hour by hour
    (``promtool tsdb create-blocks-from rules``, as for rules added to a running Prometheus)."""
    prometheus_bin, promtool = need_tool("prometheus"), need_tool("promtool")
    tmp = tmp_path_factory.mktemp("report-rules")
    nodes, workloads = scenario()
    backfill(promtool, tmp / "data", nodes, workloads, START - D, END + 12 * H, STEP, tmp, engines=engines())
    args = ["--storage.tsdb.retention.time=400d"]
    # the served-model rules read the ones before them: one pass each
    stages = [rules.rules_yaml(stage=stage) for stage in rules.STAGES]
    evaluate_rules(prometheus_bin, promtool, tmp, stages, RULES_FROM - 2 * H, RULES_TO + 2 * H,
                   f'count(last_over_time(container_gpu_usage_seconds_total[40d] @ {END}))', args, timeout=60)
    server = PrometheusServer(prometheus_bin, tmp, [], args=args).start()
    try:
        server.wait_for(f"count(last_over_time(l9gpu:chargeback_rules:evaluations[1d] @ {RULES_TO}))", timeout=60)
        yield server
    finally:
        server.stop()


def test_chargeback_rules_pass_their_promtool_unit_tests():
    done = subprocess.run([need_tool("promtool"), "test", "rules", "chargeback_rules_test.yaml"],
                          cwd=REPO / "tests", capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_chargeback_rules_file_is_the_generated_one_and_its_stages_hold_every_rule_once():
    import yaml

    assert CHARGEBACK_RULES.read_text() == rules.rules_yaml()  # `make docs` writes it

    def records(text: str) -> list[str]:
        return [rule["record"] for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]

    whole = records(rules.rules_yaml())
    staged = [records(rules.rules_yaml(stage=stage)) for stage in rules.STAGES]
    assert [r for stage in staged for r in stage] == whole and len(set(whole)) == len(whole)
    # a rule reads only records of the stages before its own (promtool evaluates a stage at once)
    seen: set[str] = set()
    for stage, text in zip(staged, (rules.rules_yaml(stage=k) for k in rules.STAGES)):
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                read = set(re.findall(r"[a-z_]+:l9gpu_[a-z_]+:[a-z0-9]+", rule["expr"]))
                read |= {rules.TOKENS.format(field=f) for f in ("prompt_tokens", "generated_tokens")
                         if "(prompt|generated)_tokens" in rule["expr"]}
                assert read <= seen, (rule["record"], read - seen)
        seen |= set(stage)


def test_the_report_from_the_recording_rules_is_within_its_stated_bound(rules_prometheus, tmp_path):
    """--source rules reads a few series per namespace; every figure is the raw report's,
    within the error bound it states (the hours at the ends and the hours with a restart)."""
    period = ("--from", str(RULES_FROM), "--to", str(RULES_TO))
    raw = report_json(rules_prometheus, tmp_path, *period, "--source", "raw")
    ruled = report_json(rules_prometheus, tmp_path, *period, "--source", "rules")
    auto = report_json(rules_prometheus, tmp_path, *period)
    assert raw["source"]["counters"] == "raw" and raw["source"]["error_bound_gpu_hours"] == 0
    assert ruled["source"]["counters"] == auto["source"]["counters"] == "rules"
    assert ruled["source"]["rules_hours_evaluated"] == 8 * 24
    bound = ruled["source"]["error_bound_gpu_hours"]
    assert 0 < bound < 24  # two hours of this history's GPUs
    assert "recording rules" in ruled["notes"][0] and f"{bound:g}" in ruled["notes"][0]
    want = {g["group"]: g for g in raw["groups"]}
    assert {g["group"] for g in ruled["groups"]} == set(want)
    restarts = 2  # the hours around gpu-a's restart: increase() there
    for group in ruled["groups"]:
        for key in ("gpu_hours_allocated", "gpu_hours_used", "zombie_hours"):
            assert group[key] == pytest.approx(want[group["group"]][key], abs=bound + restarts), (group["group"], key)
    assert ruled["totals"]["gpu_hours_allocated"] == pytest.approx(raw["totals"]["gpu_hours_allocated"],
                                                                   abs=bound + restarts)
    assert ruled["totals"]["gpu_hours_capacity"] == pytest.approx(raw["totals"]["gpu_hours_capacity"],
                                                                  abs=bound + restarts)
    assert raw["groups"][0]["top_waste"] and not ruled["groups"][0]["top_waste"]  # no workload is named


def test_the_report_by_model_from_the_recording_rules_is_the_raw_report_split_hour_by_hour(rules_prometheus,
                                                                                            tmp_path):
    """--by model --source rules: the rules split each pod's hour between its models by their
    tokens, as the raw report does step by step; read at a one-hour step, every group's
    hours, kWh and tokens are the raw report's, within the bound stated."""
    period = ("--from", str(RULES_FROM), "--to", str(RULES_TO), "--by", "model")
    raw = report_json(rules_prometheus, tmp_path, *period, "--source", "raw", "--step", "1h")
    ruled = report_json(rules_prometheus, tmp_path, *period, "--source", "rules")
    assert report_json(rules_prometheus, tmp_path, *period)["source"]["counters"] == "rules"  # auto
    assert ruled["source"]["counters"] == "rules" and ruled["source"]["rules_hours_evaluated"] == 8 * 24
    assert "served model" in ruled["notes"][0]
    bound = ruled["source"]["error_bound_gpu_hours"]
    restarts = 2  # the hours around gpu-a's restart: increase() there
    want = {g["group"]: g for g in raw["groups"]}
    # the vLLM replica, the embedder, Triton's two models (80% and 20% of one pod's tokens)
    # and the workloads serving nothing
    assert {g["group"] for g in ruled["groups"]} == set(want) == {
        "llama-3.1-70b", "qwen2.5-7b", "llama-3.1-8b", "mistral-7b", "(none)"}
    for group in ruled["groups"]:
        name = group["group"]
        for key in ("gpu_hours_allocated", "gpu_hours_used", "zombie_hours", "energy_kwh", "idle_gpu_hours"):
            assert group[key] == pytest.approx(want[name][key], abs=bound + restarts), (name, key)
        for key in ("prompt_tokens", "generated_tokens", "idle_replica_hours"):  # no engine restarts here
            assert group[key] == pytest.approx(want[name][key], rel=1e-9), (name, key)
        assert group["replicas"] == want[name]["replicas"], name  # one pod per model all along
    mig = {g["group"]: g for g in ruled["groups"]}
    # vLLM's replica served nothing on day 5 from 00:00 to 02:00: two hours of one GPU
    assert mig["llama-3.1-70b"]["idle_replica_hours"] == mig["llama-3.1-70b"]["idle_gpu_hours"] == pytest.approx(2)
    assert mig["llama-3.1-8b"]["gpu_hours_allocated"] == pytest.approx(
        4 * mig["mistral-7b"]["gpu_hours_allocated"], rel=1e-6)
    assert ruled["totals"]["gpu_hours_allocated"] == pytest.approx(raw["totals"]["gpu_hours_allocated"],
                                                                   abs=bound + restarts)


def test_which_source_the_report_reads(rules_prometheus, prometheus, tmp_path, capsys):
    # rules keep namespace and model only: other groupings read the agent's counters
    period = ("--from", str(RULES_FROM), "--to", str(RULES_TO))
    assert report_json(rules_prometheus, tmp_path, *period, "--by", "label_team")["source"]["counters"] == "raw"
    # rules that cover only part of the period: auto reads the counters
    assert report_json(rules_prometheus, tmp_path)["source"]["counters"] == "raw"
    status, _, err = run("report", "--prometheus", rules_prometheus.base, *period,
                         "--by", "label_team", "--source", "rules", capsys=capsys)
    assert status == 2 and err == ("l9gpu report: --source rules: --by label_team: the rules are per namespace, "
                                   "training job, served model and GPU model; use --source raw\n")
    # the served-model rules read the built-in engines: an engines file reads the counters
    engines_file = tmp_path / "engines.yaml"
    engines_file.write_text('engines:\n  myengine:\n    model_label: model\n    prompt_tokens: "my_prompt_total"\n'
                            '    generated_tokens: "my_generated_total"\n')
    by_model = (*period, "--by", "model", "--engines", str(engines_file))
    assert report_json(rules_prometheus, tmp_path, *by_model)["source"]["counters"] == "raw"
    status, _, err = run("report", "--prometheus", rules_prometheus.base, *by_model, "--source", "rules",
                         capsys=capsys)
    assert status == 2 and err == ("l9gpu report: --source rules: --engines: the rules read the built-in engines; "
                                   "use --source raw\n")
    # a Prometheus without the rules: auto reads the counters, rules is refused
    assert report_json(prometheus, tmp_path)["source"]["counters"] == "raw"
    status, _, err = run("report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END),
                         "--source", "rules", capsys=capsys)
    assert status == 1 and "no chargeback recording rules in this period" in err


def _carbon_prices(tmp_path: Path, carbon: str) -> str:
    path = tmp_path / "carbon.yaml"
    path.write_text("currency: EUR\ngpu_hour: {default: 2.0}\n" + carbon)
    return str(path)


def test_carbon_per_group_is_its_energy_times_the_grid_intensity(prometheus, tmp_path):
    """A constant intensity and a PUE: gCO2e = kWh x PUE x g/kWh, per group and in total;
    without a carbon section there is no carbon figure."""
    plain = report_json(prometheus, tmp_path)
    assert plain["totals"]["carbon_gco2e"] is None
    doc = report_json(prometheus, tmp_path, "--prices",
                      _carbon_prices(tmp_path, "carbon: {gco2e_per_kwh: 350, pue: 1.25}\n"))
    for group in doc["groups"]:
        assert group["carbon_gco2e"] == pytest.approx(group["energy_kwh"] * 1.25 * 350, abs=1e-2), group["group"]
    assert doc["totals"]["carbon_gco2e"] == pytest.approx(doc["totals"]["energy_kwh"] * 1.25 * 350, abs=1e-2)
    assert doc["totals"]["carbon_gco2e"] > 0
    # the same intensity as a Prometheus series gives the same figures
    queried = report_json(prometheus, tmp_path, "--prices", _carbon_prices(tmp_path, "carbon: {pue: 1.25, label: x}\n"),
                          "--carbon-intensity-query", "vector(350)")
    assert queried["totals"]["carbon_gco2e"] == pytest.approx(doc["totals"]["carbon_gco2e"], abs=1e-2)
    out = tmp_path / "carbon.csv"
    assert main(["report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END), "-o", str(out),
                 "--prices", _carbon_prices(tmp_path, "carbon: {gco2e_per_kwh: 350, pue: 1.25}\n")]) == 0
    rows = {r["group"]: r for r in csv.DictReader(io.StringIO(out.read_text()))}
    for group in doc["groups"]:
        assert float(rows[group["group"]]["carbon_gco2e"]) == group["carbon_gco2e"]


def test_carbon_intensity_per_node_pool(prometheus, tmp_path):
    """Intensity by the value of a label (here ``node``): each node's energy at its grid's rate."""
    rates = {"gpu-a": 100.0, "gpu-b": 300.0}
    carbon = "carbon:\n  label: node\n  gco2e_per_kwh: {gpu-a: 100, gpu-b: 300, default: 500}\n"
    doc = report_json(prometheus, tmp_path, "--prices", _carbon_prices(tmp_path, carbon))
    want: dict[str, float] = {}
    for node in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"):
        part = report_json(prometheus, tmp_path, "--selector", f'node="{node}"')
        for group in part["groups"]:
            want[group["group"]] = want.get(group["group"], 0.0) + group["energy_kwh"] * rates.get(node, 500.0)
    got = {g["group"]: g["carbon_gco2e"] for g in doc["groups"]}
    assert got == pytest.approx(want, abs=1e-2)


def test_carbon_is_integrated_step_by_step_not_a_monthly_average(prometheus, tmp_path):
    """A grid that turns dirty half-way (0 g/kWh, then 1,000): only the energy after the turn
    counts, which a monthly average intensity would spread over the whole month."""
    turn = START + 15 * D + 3 * H  # inside a 6-hour step
    doc = report_json(prometheus, tmp_path, "--carbon-intensity-query", f"vector(1000 * (time() > bool {turn}))")
    after = report_json(prometheus, tmp_path, "--from", str(turn))  # later flags win
    later = report_json(prometheus, tmp_path, "--from", str(START + 15 * D + 6 * H))
    low, high = later["totals"]["energy_kwh"] * 1000, (after["totals"]["energy_kwh"] + 1e-9) * 1000 * 1.1
    assert low <= doc["totals"]["carbon_gco2e"] <= high
    average = doc["totals"]["energy_kwh"] * 1000 * (END - turn) / (END - START)
    assert abs(doc["totals"]["carbon_gco2e"] - average) > 0.01 * average


def test_an_intensity_query_with_several_series_is_one_line(prometheus, capsys):
    status, _, err = run("report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END),
                         "--carbon-intensity-query", 'label_replace(vector(1), "a", "x", "", "") or vector(2)',
                         capsys=capsys)
    assert status == 1 and err.startswith("l9gpu report: --carbon-intensity-query returned several series")
    assert err.count("\n") == 1


def test_timings_say_how_long_the_server_and_the_report_took(prometheus, tmp_path, capsys):
    status, _, err = run("report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END),
                         "-o", str(tmp_path / "r.json"), "--timings", capsys=capsys)
    assert status == 0
    assert re.search(r"^l9gpu report: timings: \d+ queries read in \d+\.\d\d s, summarised in \d+\.\d\d s$", err,
                     re.MULTILINE), err
