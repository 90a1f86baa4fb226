"""The "l9gpu / Training jobs" dashboard on a real Prometheus holding a history of training jobs.

Two jobs written as the agents' series (tests/training_history.py) and backfilled with promtool:
``llama`` (16 GPUs on two nodes) wedges at 40 minutes with rank 5 idle, the odd rank out;
``gpt`` (8 GPUs) has rank 3 thermally throttled from 10 to 80 minutes. The training rules are
evaluated over the history every minute (``promtool tsdb create-blocks-from rules``, a pass
per stage), then every expression of the dashboard and its variables answers, at 65 minutes,
with the hung job, its suspect and the straggler; the alerts link to the dashboard with the
job selected."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest
import yaml
from agent import REPO
from conftest import need_tool
from promserver import PrometheusServer, evaluate_rules
from test_dashboards import _panels, substitute
from training_history import RULES, Event, Job, staged_rules, write_history

DASHBOARD = REPO / "dashboards" / "l9gpu-training.json"
MINUTES = 90
AT = 65  # minutes into the history: llama hung (stalled from 45), gpt's rank 3 slow


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    prometheus_bin, promtool = need_tool("prometheus"), need_tool("promtool")
    tmp = tmp_path_factory.mktemp("training-dashboard")
    start = (int(time.time()) // 3600 - 4) * 3600
    llama = Job("llama", "train", 16, False, 0, MINUTES, False, [Event("wedge", 40, MINUTES, 5, "idle")])
    gpt = Job("gpt", "research", 8, False, 0, MINUTES, True, [Event("straggler", 10, 80, 3, "thermal")])
    text = tmp / "history.om"
    with open(text, "w") as out:
        write_history(out, [llama, gpt], start, 5, seed=7)
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(tmp / "data")], check=True,
                   capture_output=True)
    stages, _ = staged_rules()
    # a record that ends is gone at the next evaluation, as a running Prometheus' staleness marker makes it
    args = ["--storage.tsdb.retention.time=400d", "--query.lookback-delta=90s"]
    end = start + 60 * MINUTES
    evaluate_rules(prometheus_bin, promtool, tmp, stages, start, end, f"count(last_over_time(gpu_up[2h] @ {end}))",
                   args, timeout=120, eval_interval="1m")
    server = PrometheusServer(prometheus_bin, tmp, [], args=args).start()
    try:
        server.wait_for(f"count(last_over_time(job:l9gpu_training_gpus:count[2h] @ {end}))", timeout=120)
        yield server, start + 60 * AT
    finally:
        server.stop()


def query(server: PrometheusServer, expr: str, at: int) -> list[dict[str, Any]]:
    url = server.base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": at})
    with urllib.request.urlopen(url, timeout=60) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", (expr, doc)
    return doc["data"]["result"]


def test_every_expression_of_the_training_dashboard_answers(history):
    server, at = history
    doc = json.loads(DASHBOARD.read_text())
    empty = []
    for panel in _panels(doc):
        for target in panel.get("targets", []):
            if not query(server, substitute(target["expr"]), at):
                empty.append(f"{panel['title']}: {target['expr']}")
    assert not empty, "no data for:\n" + "\n".join(empty)
    for var in doc["templating"]["list"]:
        if var["type"] != "query":
            continue
        selector, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"]).groups()
        values = {s["metric"].get(label) for s in query(server, substitute(selector), at)}
        assert values >= ({"llama", "gpt"} if var["name"] == "job" else {"train", "research"}), var["name"]


def test_the_dashboard_shows_the_hung_job_its_suspect_and_the_straggler(history):
    server, at = history
    hung = query(server, "job:l9gpu_training_hung:ratio", at)
    assert [(s["metric"]["training_job"], float(s["value"][1])) for s in hung] == [("llama", pytest.approx(15 / 16))]
    suspects = query(server, "job_rank_gpu:l9gpu_training_suspect:info", at)
    assert [(s["metric"]["training_rank"], s["metric"]["reason"]) for s in suspects] == [("5", "not_stalled")]
    slow = query(server, "job_rank_gpu:l9gpu_training_straggler:reason", at)
    assert {(s["metric"]["training_job"], s["metric"]["training_rank"], s["metric"]["reason"]) for s in slow} == {
        ("gpt", "3", "sm_clock"), ("gpt", "3", "throttle_hw_thermal_slowdown"), ("gpt", "3", "temperature")}
    # the ranks' tensor activity: llama's ranks at 0 in the wedge, gpt's computing
    tensor = {(s["metric"]["training_job"], s["metric"]["training_rank"]): float(s["value"][1]) for s in
              query(server, substitute(_target("Tensor-core activity, per rank")), at)}
    assert len(tensor) == 16 + 8
    assert all(v == 0 for (job, _), v in tensor.items() if job == "llama")
    assert all(v >= 0.4 for (job, _), v in tensor.items() if job == "gpt")


def _target(title: str) -> str:
    doc = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in _panels(doc) if p["title"] == title]
    return panel["targets"][0]["expr"]


def test_the_alerts_link_to_the_dashboard_with_the_job_selected():
    doc = json.loads(DASHBOARD.read_text())
    variables = {var["name"] for var in doc["templating"]["list"]}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            link = rule["annotations"]["dashboard"]
            assert link.startswith(f"/d/{doc['uid']}/"), rule["alert"]
            assert set(re.findall(r"var-(\w+)=", link)) == {"namespace", "job"} <= variables
