"""``make demo-report``: a week of the demo node's chargeback, from nothing but the checkout.

The target's command (``python -m exporter.report.demo``) runs as users run it: the demo
node played over the past week by the agent's own pass, backfilled with Debian's promtool,
the recording rules evaluated, a real Prometheus, ``l9gpu report`` three times. The three
files must say the same, add up (the groups and the unallocated time are the GPUs' week),
tell the demo's story (a GPU reserved and never used, a notebook computing nothing), and
the HTML must open in Chromium with its charts drawn.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser import dump_dom, need_chromium

from exporter.report.demo import FORMATS

REPO = Path(__file__).resolve().parent.parent
WEEK_H = 7 * 24
FIGURES = ("gpu_hours_used", "gpu_hours_allocated", "waste_gpu_hours", "zombie_hours", "energy_kwh",
           "allocated_cost", "effective_cost", "waste_cost", "energy_cost", "total_cost")


def _need_prometheus() -> None:
    import shutil

    if not (shutil.which("prometheus") and shutil.which("promtool")):
        pytest.skip("Debian's prometheus package is not installed (`make test` installs it)")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    _need_prometheus()
    out = tmp_path_factory.mktemp("demo") / "demo-report"
    done = subprocess.run([sys.executable, "-m", "exporter.report.demo", "--output", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, out


def test_the_demo_prints_where_its_three_files_are(demo):
    done, out = demo
    for fmt in FORMATS:
        path = out / f"chargeback.{fmt}"
        assert re.search(rf"^\s+{fmt}\s+{re.escape(str(path.resolve()))}$", done.stdout, re.M), done.stdout
        assert path.stat().st_size > 0
    assert f"prices {(out / 'prices.yaml').resolve()}" in done.stdout
    # the check it made: the report is what the agent's counters rose by, the rules agree
    assert "(as the agent's counters rose)" in done.stdout and "the recording rules:" in done.stdout


def test_the_week_adds_up_and_tells_the_demo_nodes_story(demo):
    doc = json.loads((demo[1] / "chargeback.json").read_text())
    assert doc["period"]["hours"] == WEEK_H and doc["source"]["counters"] == "raw"
    totals = doc["totals"]
    groups = {g["group"]: g for g in doc["groups"]}
    assert totals["gpu_hours_capacity"] == pytest.approx(8 * WEEK_H)  # eight H100s all week
    assert sum(g["gpu_hours_allocated"] for g in groups.values()) + totals["gpu_hours_unallocated"] == \
        pytest.approx(totals["gpu_hours_capacity"], abs=1e-4)
    # the training job's four GPUs and the reservation on GPU 7, which never computed
    assert groups["ml-research"]["gpu_hours_allocated"] == pytest.approx(5 * WEEK_H)
    waste = {w["workload"]: w for w in groups["ml-research"]["top_waste"]}
    reserved = waste["ml-research/idle-reservation-0/trainer"]
    assert (reserved["gpu_hours_used"], reserved["zombie_hours"]) == (0.0, pytest.approx(WEEK_H))
    # the notebook holding 70 GiB of the time-sliced GPU 6 at 0% SM: a zombie all week
    assert groups["data-science"]["gpu_hours_used"] == 0.0
    assert groups["data-science"]["zombie_hours"] == pytest.approx(WEEK_H)
    assert groups["ml-production"]["gpu_hours_allocated"] == pytest.approx(2 * WEEK_H)
    assert "(none)" in groups  # the Slurm job on GPU 6 has no namespace
    assert totals["total_cost"] == pytest.approx(totals["allocated_cost"] + totals["energy_cost"])
    assert doc["currency"] == "USD" and totals["allocated_cost"] == pytest.approx(2.90 * totals["gpu_hours_allocated"])


def test_csv_and_html_say_what_the_json_says(demo):
    out = demo[1]
    doc = json.loads((out / "chargeback.json").read_text())
    groups = {g["group"]: g for g in doc["groups"]}
    rows = {row["group"]: row for row in csv.DictReader((out / "chargeback.csv").open())}
    assert set(groups) <= set(rows) and set(rows) - set(groups) == {"(unallocated)", "(capacity)"}
    for name, group in groups.items():
        for key in FIGURES:
            assert float(rows[name][key]) == pytest.approx(group[key], abs=1e-5), (name, key)
        assert int(rows[name]["workloads"]) == group["workloads"]
    assert float(rows["(capacity)"]["gpu_hours_allocated"]) == pytest.approx(doc["totals"]["gpu_hours_capacity"])
    need_chromium()
    page = out / "chargeback.html"
    dom = dump_dom(page.as_uri(), out.parent)
    assert dom.returncode == 0, dom.stderr[-2000:]
    cards = dict(re.findall(r'data-figure="(\w+)" data-value="([^"]+)"', dom.stdout))
    for key in FIGURES:
        assert float(cards[key]) == pytest.approx(doc["totals"][key], abs=1e-5), key
    assert re.findall(r'<tr data-group="([^"]+)">', dom.stdout) == [g["group"] for g in doc["groups"]]
    # the chart is drawn: a bar per group and day of the week (where it was charged), and
    # the legend's swatch per group, in inline SVG
    timeline = doc["timeline"]
    assert len(timeline["bins"]) == 7 and timeline["bin_seconds"] == 86400
    bars = sum(1 for values in timeline["groups"].values() for v in values if v > 0)
    assert bars >= 5 * 7  # the five namespaces every day
    assert dom.stdout.count("<svg") == 1
    assert dom.stdout.count("<rect") == bars + len(timeline["groups"])
