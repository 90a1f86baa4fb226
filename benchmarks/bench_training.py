"""The training-job rules (alerts/l9gpu-training.rules.yaml) over a simulated week of a fleet.

Detection: ``--jobs`` jobs (50) of 8 to 512 GPUs (8 GPUs a node, a fifth of them half
H100 and half A100) start at random times in ``--days`` days (7) and run 1 to 4 hours
each (the scale: a week of jobs running for days would be tens of millions of samples, too
many for a two-core machine in minutes; what the rules see of a job is the same). Each job
has some of these, at random times and never overlapping:

- ``wedge``: from its onset every rank's GPU is busy with no work; the agent's
  ``container_gpu_stalled`` reads 1 ``--stall-after`` later (300 s) on every rank but one,
  the odd rank out, which goes idle, vanishes (its pod deleted) or had an Xid; the job
  stays wedged until it is killed 30 to 60 minutes later;
- ``straggler``: one GPU slower in hardware for 30 to 90 minutes: thermal, power-brake or
  hardware slowdown (the throttle reason active, the clock down 30-50%), its clock alone
  down 20% (locked clocks), its PCIe link at x8 of x16, or 2 PCIe replays a second;
- ``checkpoint`` (2-8 minutes), ``evaluation`` (10-20 minutes, tensor activity low),
  ``data_stall`` (3-10 minutes, every rank starved): the GPUs idle or compute little, the
  agent calls none stalled;
- ``restart``: every pod deleted and recreated (new names, same ranks) after 1-3 minutes.

Around them: a per-GPU clock spread of up to 3%, temperatures 55-70 C by position, a power
cap that holds every GPU of a third of the jobs, short power-cap blips on single GPUs, a
stray PCIe replay now and then, the link generation trained down at idle.

The history is written as the agents' series every minute (nodes scraped at their own
offset in the minute), backfilled with ``promtool tsdb create-blocks-from openmetrics``,
and the rules evaluated over it every minute with ``promtool tsdb create-blocks-from
rules`` into a real Prometheus (Debian's), a pass per stage of rules that read other rules'
records (promtool lets no rule see another's results), the alerts as records of their
expressions with ``for`` applied here. That Prometheus runs with ``--query.lookback-delta=90s``
so that a record that ends is gone at the next evaluation, as the staleness marker of a
running Prometheus makes it (backfilled records have none). Printed: per kind, detection
latency, precision and recall against the goals of docs/TRAINING.md.

Cost: ``--cost-nodes`` nodes (1,000) of 8 GPUs in jobs, 25 minutes of their series scraped
every 30 s, backfilled up to now (Prometheus' lookback raised to 10 minutes so that the last
samples stay current while it loads and evaluates; the rules' results go to its head, which
takes no sample older than the newest block, so the history cannot reach into the future);
a real Prometheus loads the rules and evaluates them every
15 s; printed: the group's evaluation time (Prometheus' own
``prometheus_rule_group_last_duration_seconds``) and Prometheus' CPU seconds per evaluation.

    python benchmarks/bench_training.py [--jobs 50] [--days 7] [--cost-nodes 1000] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import training_history  # noqa: E402
from promserver import PrometheusServer, evaluate_rules  # noqa: E402
from training_history import GROUP, RULES, Event, Job, simulate, staged_rules, write_history  # noqa: E402

EVAL_S = 60
QUIET_KINDS = training_history.QUIET_KINDS
SIZES = training_history.SIZES

def seconds(duration: str) -> int:
    return sum(int(n) * {"s": 1, "m": 60, "h": 3600}[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def query_range(base: str, expr: str, start: int, end: int, step: int = EVAL_S) -> list[dict[str, Any]]:
    """A range query in parts of at most 10,000 steps."""
    out: dict[tuple, dict[str, Any]] = {}
    t = start
    while t <= end:
        stop = min(end, t + 10_000 * step)
        url = base + "/api/v1/query_range?" + urllib.parse.urlencode(
            {"query": expr, "start": t, "end": stop, "step": step})
        with urllib.request.urlopen(url, timeout=300) as resp:
            doc = json.load(resp)
        for series in doc["data"]["result"]:
            key = tuple(sorted(series["metric"].items()))
            out.setdefault(key, {"metric": series["metric"], "values": []})["values"] += series["values"]
        t = stop + step
    return list(out.values())


def firings(series: list[dict[str, Any]], wait_s: int) -> list[tuple[dict[str, str], int, int]]:
    """(labels, first firing time, last evaluation true) per firing episode: a run of
    consecutive evaluations true at least ``wait_s`` long (an alert's ``for``)."""
    out = []
    for s in series:
        times = [int(float(t)) for t, _ in s["values"]]
        run: list[int] = []
        for t in times + [None]:  # type: ignore[list-item]
            if run and (t is None or t - run[-1] > EVAL_S):
                if run[-1] - run[0] >= wait_s:
                    out.append((s["metric"], run[0] + wait_s, run[-1]))
                run = []
            if t is not None:
                run.append(t)
    return out


def score(jobs: list[Job], base: str, week_start: int, end_s: int, waits: dict[str, str],
          stall_after_s: int) -> dict[str, Any]:
    """Detection latency, precision and recall per kind."""
    hung = firings(query_range(base, "bench:L9gpuTrainingJobHung:pending", week_start, end_s),
                   seconds(waits["L9gpuTrainingJobHung"]))
    slow = firings(query_range(base, "bench:L9gpuTrainingJobStraggler:pending", week_start, end_s),
                   seconds(waits["L9gpuTrainingJobStraggler"]))
    suspects = query_range(base, "job_rank_gpu:l9gpu_training_suspect:info", week_start, end_s)
    by_name = {job.name: job for job in jobs}
    at = lambda m: week_start + 60 * m  # noqa: E731
    result: dict[str, Any] = {"jobs": len(jobs), "gpus": sum(j.size for j in jobs),
                              "job_hours": round(sum(j.end - j.start for j in jobs) / 60, 1)}
    # wedges: the first firing of the job's hang alert after the onset, and the odd rank named then
    wedges = [(job, e) for job in jobs for e in job.events if e.kind == "wedge"]
    latencies, named, missed = [], 0, []
    matched_hung = set()
    for job, e in wedges:
        first = [(i, f) for i, f in enumerate(hung)
                 if f[0]["training_job"] == job.name and at(e.start) <= f[1] <= at(e.end) + 300]
        if not first:
            missed.append(job.name)
            continue
        i, (labels, fired, _) = min(first, key=lambda x: x[1][1])
        matched_hung.update(j for j, _ in first)
        latencies.append(fired - at(e.start))
        names = {s["metric"]["training_rank"] for s in suspects if s["metric"]["training_job"] == job.name
                 and any(abs(float(t) - fired) < 1 for t, _ in s["values"])}
        named += str(e.rank) in names
    result["wedge"] = {"injected": len(wedges), "alerted": len(latencies), "missed": missed,
                       "odd_rank_named": named,
                       "latency_s": {"median": statistics.median(latencies) if latencies else None,
                                     "max": max(latencies) if latencies else None},
                       "goal_s": stall_after_s + 2 * EVAL_S,
                       "false_alerts": [f[0]["training_job"] for i, f in enumerate(hung) if i not in matched_hung]}
    # stragglers: a firing for the slow rank during the event (or within 10 minutes of its end)
    injected = [(job, e) for job in jobs for e in job.events if e.kind == "straggler"]
    found_by_cause: dict[str, list[int]] = {}
    matched = set()
    for job, e in injected:
        hits = [i for i, f in enumerate(slow) if f[0]["training_job"] == job.name
                and f[0]["training_rank"] == str(e.rank) and f[1] <= at(e.end) + 600 and f[2] >= at(e.start)]
        matched.update(hits)
        found_by_cause.setdefault(e.cause, []).append(int(bool(hits)))
    false = [f for i, f in enumerate(slow) if i not in matched]
    quiet: dict[str, int] = {}
    for labels, fired, last in false + [h for i, h in enumerate(hung) if i not in matched_hung]:
        job = by_name[labels["training_job"]]
        kinds = {e.kind for e in job.events if at(e.start) - 900 <= last and fired <= at(e.end) + 900}
        for kind in kinds or {"(none)"}:
            quiet[kind] = quiet.get(kind, 0) + 1
    found = sum(sum(v) for v in found_by_cause.values())
    result["straggler"] = {"injected": len(injected), "found": found,
                           "recall": round(found / len(injected), 3) if injected else None,
                           "by_cause": {k: f"{sum(v)}/{len(v)}" for k, v in sorted(found_by_cause.items())},
                           "false": len(false),
                           "false_per_1000_job_hours": round(1000 * len(false) / result["job_hours"], 2),
                           "false_reasons": sorted({f[0]["reason"] for f in false})}
    result["quiet_events"] = {kind: sum(1 for job in jobs for e in job.events if e.kind == kind)
                              for kind in QUIET_KINDS}
    result["alerts_near_quiet_events"] = quiet
    return result


def detection(args: argparse.Namespace, work: Path, prometheus: str, promtool: str) -> dict[str, Any]:
    rng = random.Random(args.seed)
    stall_after_m = args.stall_after // 60
    week_start = (int(time.time()) // 86400 - args.days - 2) * 86400
    jobs = simulate(args.jobs, args.days, args.stall_after, rng)
    began = time.perf_counter()
    text = work / "history.om"
    with open(text, "w") as out:
        samples = write_history(out, jobs, week_start, stall_after_m, args.seed)
    written = time.perf_counter() - began
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h", str(text),
                    str(work / "data")], check=True, stdout=subprocess.DEVNULL)
    text.unlink()
    backfilled = time.perf_counter() - began - written
    stages, waits = staged_rules()
    end_s = week_start + args.days * 86400
    pserver_args = ["--storage.tsdb.retention.time=400d", "--query.lookback-delta=90s"]
    began = time.perf_counter()
    evaluate_rules(prometheus, promtool, work, stages, week_start, end_s,
                   "count(gpu_up)" if False else f"count(last_over_time(gpu_up[{args.days + 1}d] @ {end_s}))",
                   pserver_args, timeout=600, eval_interval="1m")
    evaluated = time.perf_counter() - began
    server = PrometheusServer(prometheus, work, [], args=pserver_args).start()
    try:
        server.wait_for(f"count(last_over_time(gpu_up[{args.days + 1}d] @ {end_s}))", timeout=600)
        result = score(jobs, server.base, week_start, end_s, waits, args.stall_after)
    finally:
        server.stop()
    result["samples"] = samples
    result["seconds"] = {"write": round(written, 1), "backfill": round(backfilled, 1),
                         "rules_over_the_week": round(evaluated, 1), "stages": len(stages)}
    return result


def cost(args: argparse.Namespace, work: Path, prometheus: str, promtool: str) -> dict[str, Any]:
    """The 1-minute group evaluated by a real Prometheus over ``--cost-nodes`` nodes."""
    rng = random.Random(args.seed + 1)
    gpus = args.cost_nodes * 8
    sizes, total = [], 0
    while total < gpus:
        size = min(rng.choice([s for s, w in SIZES for _ in range(w)]), gpus - total)
        sizes.append(size)
        total += size
    now = int(time.time())
    minutes = 25
    jobs = [Job(f"job{i:03d}", "research", size, i % 5 == 0, 0, minutes, i % 3 == 0) for i, size in enumerate(sizes)]
    jobs[0].events.append(Event("straggler", 0, minutes, 3, "thermal"))
    # the history at 30 s: every minute's readings written twice, 30 s apart
    text = work / "cost.om"
    start = now - 60 * minutes - 30
    with open(text, "w") as out:
        samples = write_history(out, jobs, start, 5, args.seed)
    doubled = work / "cost2.om"
    with open(text) as src, open(doubled, "w") as dst:
        for line in src:
            if line.startswith("#"):
                dst.write(line)
                continue
            head, value, ts = line.rsplit(" ", 2)
            dst.write(line)
            dst.write(f"{head} {value} {int(ts) + 30}\n")
    text.unlink()
    data = work / "cost-data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(doubled), str(data)], check=True,
                   stdout=subprocess.DEVNULL)
    doubled.unlink()
    rules = work / "cost-rules.yaml"
    doc = yaml.safe_load(RULES.read_text())
    doc["groups"] = [dict(g, interval="15s") for g in doc["groups"] if g["name"] == GROUP]
    rules.write_text(yaml.safe_dump(doc, sort_keys=False))
    cost_dir = work / "cost"
    cost_dir.mkdir()
    data.rename(cost_dir / "data")
    server = PrometheusServer(prometheus, cost_dir, [], rules=rules,
                              args=["--storage.tsdb.retention.time=400d", "--query.lookback-delta=10m"])
    server.start()
    try:
        server.wait_for("count(gpu_up)", timeout=600)
        def metric(name: str) -> float | None:
            """Prometheus' own metric for the group, from its /metrics (it does not scrape itself here)."""
            with urllib.request.urlopen(server.base + "/metrics", timeout=60) as resp:
                for line in resp.read().decode().splitlines():
                    if (line.startswith(name + "{") and f';{GROUP}"' in line) or line.startswith(name + " "):
                        return float(line.rsplit(" ", 1)[1])
            return None

        ticks = os.sysconf("SC_CLK_TCK")
        def cpu() -> float:
            fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / ticks
        durations = []
        first_cpu, first_count = cpu(), None
        seen = None
        deadline = time.monotonic() + 240
        while len(durations) < 8 and time.monotonic() < deadline:
            stamp = metric("prometheus_rule_group_last_evaluation_timestamp_seconds")
            if stamp and stamp > 0 and stamp != seen:
                seen = stamp
                durations.append(metric("prometheus_rule_group_last_duration_seconds") or 0.0)
                if first_count is None:
                    first_cpu, first_count = cpu(), 1
            time.sleep(1)
        spent = cpu() - first_cpu
        evaluations = max(len(durations) - 1, 1)
        rules_doc = json.load(urllib.request.urlopen(server.base + "/api/v1/rules", timeout=60))
        per_rule = sorted(((r.get("name"), r.get("evaluationTime", 0.0))
                           for g in rules_doc["data"]["groups"] for r in g["rules"]), key=lambda x: -x[1])[:5]
        series = int(metric("prometheus_tsdb_head_series") or 0)  # the rules' records
        if not series:
            raise RuntimeError("the rules recorded nothing: the history was not current when they ran")
        stragglers = server.query("job_rank_gpu:l9gpu_training_straggler:reason")
    finally:
        server.stop()
    return {"nodes": args.cost_nodes, "gpus": gpus, "jobs": len(jobs), "samples": samples * 2,
            "group_duration_s": {"median": round(statistics.median(durations), 3), "max": round(max(durations), 3),
                                 "evaluations": len(durations)},
            "prometheus_cpu_s_per_evaluation": round(spent / evaluations, 3),
            "slowest_rules_s": [(name, round(t, 3)) for name, t in per_rule],
            "series_in_head": series,
            "stragglers_found": sorted({(s["metric"]["training_job"], s["metric"]["training_rank"],
                                         s["metric"]["reason"]) for s in stragglers})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--stall-after", type=int, default=300, metavar="SECONDS")
    parser.add_argument("--cost-nodes", type=int, default=1000, help="0: no cost measurement")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-detection", action="store_true")
    args = parser.parse_args(argv)
    prometheus, promtool = "/usr/bin/prometheus", "/usr/bin/promtool"
    for tool in (prometheus, promtool):
        if not Path(tool).exists():
            print(f"bench_training: {tool} is missing (Debian package prometheus)", file=sys.stderr)
            return 2
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "args": vars(args)}
    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        work = Path(tmp)
        if not args.skip_detection:
            report["detection"] = detection(args, work, prometheus, promtool)
            print(json.dumps({"detection": report["detection"]}, indent=1), flush=True)
        if args.cost_nodes:
            report["cost"] = cost(args, work, prometheus, promtool)
            print(json.dumps({"cost": report["cost"]}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
