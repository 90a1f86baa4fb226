"""``l9gpu report``: stalled GPU-hours beside waste and zombie hours, and ``--by job``.

A real Prometheus on a backfilled history (tests/chargeback_history.py): a training job
``llama`` of two ranks on two H100s whose GPUs are stalled (busy with no work) for 90
minutes, a one-rank Slurm job ``4242`` on an A100 stalled for 30, and a notebook of no job
stalled for 20 minutes, then idle. The report reads them from the agent's series (--source
raw) and from the hourly recording rules (--source rules, evaluated over the history with
promtool as for rules added to a running Prometheus); per job and per namespace the totals
are the same."""

from __future__ import annotations

import json

import pytest
from agent import REPO
from chargeback_history import Device, Node, Workload, backfill
from conftest import need_tool
from promserver import PrometheusServer, evaluate_rules

from exporter.app.cli import main
from exporter.report import rules

H = 3600
START = 1_790_000_000 // H * H  # a whole hour, some Sunday in 2026
END = START + 8 * H
STEP = 60
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def scenario() -> tuple[list[Node], list[Workload]]:
    nodes = [Node("n1", H100, devices=[Device(0), Device(1)]), Node("n2", A100, devices=[Device(0), Device(1)])]

    def rank(gpu: int, r: int) -> Workload:
        return Workload("n1", gpu, {"namespace": "train", "pod": f"llama-{r}", "container": "main",
                                    "training_job": "llama", "training_rank": str(r)},
                        START, END, [(START, 0.9, 600.0)], stalled=[(START + 2 * H, START + 2 * H + 90 * 60)])

    slurm = Workload("n2", 1, {"slurm_job_id": "4242", "training_job": "4242", "training_rank": "0"},
                     START, END, [(START, 0.8, 350.0)], stalled=[(START + 5 * H, START + 5 * H + 30 * 60)])
    notebook = Workload("n2", 0, {"namespace": "lab", "pod": "notebook-0", "container": "main"}, START, END,
                        [(START, 0.5, 200.0), (START + 3 * H, 0.0, 60.0)], stalled=[(START + H, START + H + 20 * 60)])
    return nodes, [rank(0, 0), rank(1, 1), slurm, notebook]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    prometheus_bin, promtool = need_tool("prometheus"), need_tool("promtool")
    tmp = tmp_path_factory.mktemp("report-jobs")
    nodes, workloads = scenario()
    backfill(promtool, tmp / "data", nodes, workloads, START - H, END + H, STEP, tmp)
    args = ["--storage.tsdb.retention.time=400d"]
    evaluate_rules(prometheus_bin, promtool, tmp, [rules.rules_yaml(stage=1)], START - H, END + H,
                   f"count(last_over_time(container_gpu_stalled[1h] @ {END}))", args, timeout=60)
    server = PrometheusServer(prometheus_bin, tmp, [], args=args).start()
    try:
        server.wait_for(f"count(last_over_time(l9gpu:chargeback_rules:evaluations[1h] @ {END}))", timeout=60)
        yield server
    finally:
        server.stop()


def report(prometheus, tmp_path, *extra: str) -> dict:
    out = tmp_path / "report.json"
    assert main(["report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END), "-q",
                 "--output", str(out), *extra]) == 0
    return json.loads(out.read_text())


def groups(doc: dict, figure: str) -> dict[str, float]:
    return {g["group"]: g[figure] for g in doc["groups"]}


@pytest.mark.parametrize("source", ["raw", "rules"])
def test_stalled_gpu_hours_per_job_and_per_namespace_add_up(prometheus, tmp_path, source):
    by_job = report(prometheus, tmp_path, "--by", "job", "--source", source)
    by_namespace = report(prometheus, tmp_path, "--source", source)
    assert by_job["by"] == "training_job" and by_job["source"]["counters"] == source
    # 2 GPUs x 90 minutes; 1 GPU x 30 minutes; the notebook, of no job, 20 minutes
    assert groups(by_job, "stalled_gpu_hours") == pytest.approx({"llama": 3.0, "4242": 0.5, "(none)": 1 / 3})
    assert groups(by_namespace, "stalled_gpu_hours") == pytest.approx({"train": 3.0, "(none)": 0.5, "lab": 1 / 3})
    # the stalled GPU-hours come from one hourly record whatever the grouping: equal
    assert by_job["totals"]["stalled_gpu_hours"] == by_namespace["totals"]["stalled_gpu_hours"]
    assert sum(groups(by_job, "stalled_gpu_hours").values()) == pytest.approx(by_namespace["totals"]["stalled_gpu_hours"])
    # the rest: exact from the raw counters; from the rules each grouping's record is evaluated
    # at its own offset in the hour, so the hours at the period's ends differ within the bound
    # each report states
    bound = by_job["source"]["error_bound_gpu_hours"] + by_namespace["source"]["error_bound_gpu_hours"]
    assert (bound == 0) == (source == "raw")
    for figure in ("gpu_hours_allocated", "gpu_hours_used", "zombie_hours", "energy_kwh"):
        total = by_namespace["totals"][figure]
        assert by_job["totals"][figure] == pytest.approx(total, abs=bound + 1e-6), figure
        assert sum(groups(by_job, figure).values()) == pytest.approx(by_job["totals"][figure], abs=1e-6), figure
    if source == "raw":  # held: 8 hours of each of the four GPUs; zombie: the notebook's 5 hours at 0% SM
        assert groups(by_job, "gpu_hours_allocated") == pytest.approx({"llama": 16.0, "4242": 8.0, "(none)": 8.0})
        assert groups(by_job, "zombie_hours") == pytest.approx({"llama": 0.0, "4242": 0.0, "(none)": 5.0}, abs=0.02)


def test_the_csv_and_the_html_report_show_stalled_gpu_hours(prometheus, tmp_path):
    csv_path, html_path = tmp_path / "r.csv", tmp_path / "r.html"
    for path in (csv_path, html_path):
        assert main(["report", "--prometheus", prometheus.base, "--from", str(START), "--to", str(END), "-q",
                     "--by", "job", "--source", "raw", "--output", str(path)]) == 0
    header, *rows = csv_path.read_text().splitlines()
    columns = header.split(",")
    assert columns.index("stalled_gpu_hours") == columns.index("zombie_hours") + 1
    llama = next(row for row in rows if row.startswith('"llama"')).split(",")
    assert float(llama[columns.index("stalled_gpu_hours")]) == pytest.approx(3.0)
    html = html_path.read_text()
    assert 'data-figure="stalled_gpu_hours"' in html and "Stalled GPU-h" in html


def test_the_rules_file_holds_the_job_group(prometheus):
    text = (REPO / "alerts" / "l9gpu-chargeback.rules.yaml").read_text()
    assert f"name: {rules.JOB_GROUP}" in text
    assert "record: namespace_training_job_model:l9gpu_gpu_stalled_seconds:increase1h" in text
