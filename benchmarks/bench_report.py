"""Time of `l9gpu report` for 30 days of a 100-node, 1,000-container cluster.

Builds the history the agent would have left in Prometheus (tests/chargeback_history.py):
100 nodes with 10 GPUs each, one container per GPU all month (1,000 containers at any
time); on 3 GPUs of every node pods come and go every 5 days (new series), 10% of
containers are idle holders (zombies), and one rollout restarts every agent on day 15
(a counter reset in every series, inside one step). It writes the history with
``promtool tsdb create-blocks-from openmetrics``, starts Debian's Prometheus on it, and
times the real command line (a new process each run, Python start-up included):

    l9gpu report --prometheus URL --from START --to END --by namespace --prices FILE --format F

for CSV, JSON and HTML (the median of ``--runs`` runs each), then checks the month's
allocated GPU-hours against the history's own arithmetic.

``--by model``: the 700 long-running containers are vLLM replicas too (three models, their
token counters scraped with the agent's series; the idle holders serve nothing, idle
replicas), and the command is ``--by model``, which also reads every engine's token
counters and the idle intervals; the month's tokens are checked against the history's.

Run: ``python benchmarks/bench_report.py`` (``--interval`` sets the sample interval of
the history, 300 s by default; ``--keep DIR`` keeps the TSDB for the next run). Figures
are recorded in docs/PERFORMANCE.md and docs/CHARGEBACK.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from chargeback_history import EngineCounters, Node, Workload, backfill  # noqa: E402
from promserver import PrometheusServer  # noqa: E402

D, H = 86400, 3600
NODES, GPUS, CHURNING = 100, 10, 3
H100 = "NVIDIA H100 80GB HBM3"
PRICES = "currency: USD\ngpu_hour: {NVIDIA H100 80GB HBM3: 2.9}\nkwh: 0.15\n"


def cluster(start: int, end: int, interval: int) -> tuple[list[Node], list[Workload], float]:
    """The nodes, the workloads and the expected allocated GPU-hours over [start, end]."""
    restart = start + 15 * D + 2 * H
    nodes = [Node(f"node-{n:03d}", H100, offset=(n * 7) % interval, down=[]) for n in range(NODES)]
    for node in nodes:  # the rollout: each agent misses one sample
        first = restart + node.offset
        node.down.append((first, first + 2 * interval))
    workloads = []
    for n, node in enumerate(nodes):
        for g in range(GPUS):
            ns = f"team-{(n * GPUS + g) % 25:02d}"
            zombie = (n * GPUS + g) % 10 == 0
            sm, watts = (0.0, 70.0) if zombie else (0.35 + 0.06 * g, 180.0 + 40 * g)
            if g < CHURNING:  # a new pod every 5 days
                for p in range(6):
                    begin = start + p * 5 * D + node.offset
                    stop = begin + 5 * D - interval
                    labels = {"namespace": ns, "pod": f"job-{n}-{g}-{p}", "container": "main",
                              "pod_uid": f"u-{n}-{g}-{p}"}
                    workloads.append(Workload(node.name, g, labels, begin, stop, [(begin, sm, watts)]))
            else:
                begin = start - D + node.offset
                labels = {"namespace": ns, "pod": f"svc-{n}-{g}", "container": "main", "pod_uid": f"u-{n}-{g}"}
                workloads.append(Workload(node.name, g, labels, begin, end + H, [(begin, sm, watts)]))
    # expected: long-running containers hold their GPU all month less the restart's gap;
    # churning pods hold it 5 days less one interval each, and one of them loses the gap
    lost = 2 * interval  # the gap around each agent's restart
    long_running = NODES * (GPUS - CHURNING) * (30 * D - lost)
    churning = NODES * CHURNING * (6 * (5 * D - interval) - lost)
    return nodes, workloads, (long_running + churning) / H


MODELS = ("llama-3.1-70b", "llama-3.1-8b", "qwen2.5-7b")


def engines(nodes: list[Node], workloads: list[Workload], start: int, end: int, interval: int
            ) -> tuple[list[EngineCounters], float, float]:
    """vLLM token counters for the long-running containers (the churning pods run no
    engine), the month's expected tokens, and its expected idle replica hours (the replica
    on each node's last GPU serves nothing)."""
    offsets = {node.name: node.offset for node in nodes}
    out, tokens, idle_hours = [], 0.0, 0.0
    for w in workloads:
        if w.gpu < CHURNING:
            continue
        idle = w.gpu == GPUS - 1  # one replica per node serves nothing all month: an idle replica
        prompt, generated = (0.0, 0.0) if idle else (100.0 * (w.gpu + 1), 25.0 * (w.gpu + 1))
        labels = {"namespace": w.labels["namespace"], "pod": w.labels["pod"], "model_name": MODELS[w.gpu % 3]}
        out.append(EngineCounters(labels, "vllm:prompt_tokens", "vllm:generation_tokens", w.begin, w.end,
                                  [(w.begin, prompt, generated)], step=interval, offset=offsets[w.node]))
        tokens += (prompt + generated) * (end - start)
        idle_hours += (end - start) / H if idle else 0.0
    return out, tokens, idle_hours


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=int, default=300, help="sample interval of the history, seconds")
    parser.add_argument("--runs", type=int, default=3, help="runs per format (median reported)")
    parser.add_argument("--keep", metavar="DIR", help="keep (or reuse) the backfilled TSDB here")
    parser.add_argument("--by", choices=("namespace", "model"), default="namespace",
                        help="model: the long-running containers are vLLM replicas, and the report is --by model")
    args = parser.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        print("needs Debian's prometheus package (prometheus, promtool)", file=sys.stderr)
        return 2
    end = (int(time.time()) // D - 1) * D
    start = end - 30 * D
    nodes, workloads, expected_allocated = cluster(start, end, args.interval)
    replicas, expected_tokens, expected_idle = (engines(nodes, workloads, start, end, args.interval)
                                                if args.by == "model" else ([], 0.0, 0.0))
    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    data = work / "data"  # where PrometheusServer points Prometheus
    if args.keep:
        kept = Path(args.keep).resolve() / f"tsdb-{start}-{args.interval}-{args.by}"
        kept.parent.mkdir(parents=True, exist_ok=True)
        data.symlink_to(kept, target_is_directory=True)
        data = kept
    if not data.exists():
        t0 = time.perf_counter()
        samples = backfill(promtool, data, nodes, workloads, start - D, end + H, args.interval, work, parts=2,
                           engines=replicas)
        print(f"history: {len(workloads)} series per family, {len(replicas)} engines, {samples / 1e6:.1f} M "
              "samples, written and "
              f"backfilled in {time.perf_counter() - t0:.0f} s")
    prices = work / "prices.yaml"
    prices.write_text(PRICES)
    server = PrometheusServer(prometheus, work, [], args=["--storage.tsdb.retention.time=400d"])
    server.start()
    try:
        server.wait_for(f"count(last_over_time(container_gpu_allocation_seconds_total[1d] @ {end}))", timeout=300)
        cmd = [sys.executable, "-m", "exporter", "report", "--prometheus", server.base, "--from", str(start),
               "--to", str(end), "--by", args.by, "--prices", str(prices)]
        print("command: l9gpu " + " ".join(cmd[3:]).replace(str(prices), "prices.yaml") + " --format F")
        for fmt in ("csv", "json", "html"):
            times = []
            for _ in range(args.runs):
                out = work / f"report.{fmt}"
                t0 = time.perf_counter()
                subprocess.run(cmd + ["--format", fmt, "--output", str(out)], check=True, cwd=REPO)
                times.append(time.perf_counter() - t0)
            print(f"{fmt:>4}: median {statistics.median(times):.2f} s, max {max(times):.2f} s over {args.runs} runs")
        doc = json.loads((work / "report.json").read_text())
        got = doc["totals"]["gpu_hours_allocated"]
        print(f"groups {doc['totals']['groups']}, workloads {doc['totals']['workloads']}, "
              f"queries {doc['source']['queries']}, steps of {doc['source']['step_seconds']} s, "
              f"raw steps {doc['source']['raw_steps']}")
        print(f"allocated GPU-hours {got:.3f} (history: {expected_allocated:.3f}); "
              f"total charge {doc['totals']['total_cost']:.2f} {doc['currency']}")
        if abs(got - expected_allocated) > 1e-3:
            print("MISMATCH between the report and the history", file=sys.stderr)
            return 1
        if args.by == "model":
            tokens = doc["totals"]["prompt_tokens"] + doc["totals"]["generated_tokens"]
            idle = doc["totals"]["idle_replica_hours"]
            print(f"tokens {tokens:.0f} (history: {expected_tokens:.0f}); idle replica hours {idle:.1f} (history: "
                  f"{expected_idle:.1f}, less the intervals around the rollout's gap); groups "
                  f"{sorted(g['group'] for g in doc['groups'])}")
            if abs(tokens - expected_tokens) > 1e-6 * expected_tokens:
                print("MISMATCH between the report's tokens and the history", file=sys.stderr)
                return 1
            if not expected_idle * 0.995 <= idle <= expected_idle:
                print("MISMATCH between the report's idle replica hours and the history", file=sys.stderr)
                return 1
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
