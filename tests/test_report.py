"""`l9gpu report` against a real Prometheus holding 30 days of backfilled history.

The history (tests/chargeback_history.py) is made with known answers: an inference pod
busy 75% of the time on a node whose agent restarts mid-period (counters back to 0, 30
minutes unseen), a trainer whose StatefulSet pod moved to another node, a notebook that
holds its GPU for a month and computes for six hours, two Slurm jobs, a pod that began
before the period, and one that ended before it. Every expected figure below is written
out from that description, not computed by the code under test.
"""

from __future__ import annotations

import csv
import io
import json
import time
import urllib.request
from pathlib import Path

import pytest
from chargeback_history import Node, Workload, backfill
from conftest import need_tool
from promserver import PrometheusServer

from exporter.cli import main

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
        Node("gpu-a", H100, offset=0, down=[(s + 10 * D + 4 * H + 10 * 60, s + 10 * D + 4 * H + 40 * 60)]),
        # down across a step boundary (06:00), samples 17 s after the minute
        Node("gpu-b", H100, offset=17, down=[(s + 20 * D + 5 * H + 50 * 60 + 17, s + 20 * D + 6 * H + 20 * 60 + 17)]),
        Node("gpu-c", A100, offset=211),
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
    ]
    return nodes, workloads


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


def figures(*workloads: tuple[float, float, float, float]) -> dict[str, float]:
    allocated = sum(w[0] for w in workloads)
    used = sum(w[1] for w in workloads)
    return {"gpu_hours_allocated": allocated, "gpu_hours_used": used, "waste_gpu_hours": allocated - used,
            "zombie_hours": sum(w[2] for w in workloads), "energy_kwh": sum(w[3] for w in workloads)}


BY_NAMESPACE = {
    "ml-prod": figures(VLLM), "ml-research": figures(TRAIN), "data-science": figures(NOTEBOOK),
    "search": figures(EMBEDDER), "(none)": figures(JOB_4242, JOB_4243),
}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus on the backfilled history (no scrape targets)."""
    prometheus_bin, promtool = need_tool("prometheus"), need_tool("promtool")
    tmp = tmp_path_factory.mktemp("report")
    nodes, workloads = scenario()
    backfill(promtool, tmp / "data", nodes, workloads, START - D, END + 12 * H, STEP, tmp)
    server = PrometheusServer(prometheus_bin, tmp, [], args=["--storage.tsdb.retention.time=400d"]).start()
    try:
        server.wait_for(f'count(last_over_time(container_gpu_usage_seconds_total[40d] @ {END}))', timeout=60)
        yield server
    finally:
        server.stop()


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
    assert_figures(doc["totals"], figures(VLLM, TRAIN, NOTEBOOK, JOB_4242, JOB_4243, EMBEDDER))
    assert doc["period"]["hours"] == 720
    # the trainer that moved nodes is one workload; the notebook is the top waster of its group
    assert groups["ml-research"]["workloads"] == 1
    assert groups["data-science"]["top_waste"][0]["workload"] == "data-science/jupyter-alice-0/notebook"
    assert groups["data-science"]["top_waste"][0]["waste_gpu_hours"] == pytest.approx(720 - 0.5 - 3)
    assert [w["workload"] for w in groups["(none)"]["top_waste"]] == ["slurm job 4242 (bob)", "slurm job 4243 (alice)"]
    assert doc["currency"] is None and doc["totals"]["total_cost"] is None
    # resets inside a step (gpu-a's restart, the notebook starting to compute) were read sample by sample
    assert doc["source"]["raw_steps"] == 4
