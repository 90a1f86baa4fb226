"""Time of `l9gpu report` for 30 days of an N-node cluster (10 GPUs per node).

Builds the history the agent would have left in Prometheus (tests/chargeback_history.py):
``--nodes`` nodes (100 by default) with 10 GPUs each and their GPU series, one container
per GPU all month; on 3 GPUs of every node pods come and go every 5 days (new series),
10% of containers are idle holders (zombies), and one rollout restarts every agent on day
15 (a counter reset in every series, inside one step). The 700 long-running containers
per 100 nodes are vLLM replicas too (three models; the idle holders serve nothing). It
writes the history 100 nodes at a time with ``promtool tsdb create-blocks-from
openmetrics`` (``--keep DIR`` keeps the TSDB for the next run; ``--backfill-only`` stops
there), starts Debian's Prometheus on it, and times the real command line (a new process
each run, Python start-up included) with its peak RSS and ``--timings``:

    l9gpu report --prometheus URL --from START --to END --by namespace|model --prices FILE
      --source auto|raw|rules --format F

then checks the month's allocated GPU-hours against the history's own arithmetic (within
the stated error bound with the recording rules), and with ``--by model`` the tokens.
``--source rules`` first evaluates alerts/l9gpu-chargeback.rules.yaml over the history
(``promtool tsdb create-blocks-from rules``, once per kept TSDB, a pass per stage of the
served-model rules).

Figures are recorded in docs/PERFORMANCE.md and docs/CHARGEBACK.md.
"""

from __future__ import annotations

import argparse
import json
import os
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

from chargeback_history import Device, EngineCounters, Node, Workload, backfill  # noqa: E402

from exporter.report.backfill import PrometheusServer, evaluate_rules  # noqa: E402

D, H = 86400, 3600
GPUS, CHURNING = 10, 3
BACKFILL_NODES = 100  # nodes per backfill round: bounds the OpenMetrics text on disk
H100 = "NVIDIA H100 80GB HBM3"
PRICES = "currency: USD\ngpu_hour: {NVIDIA H100 80GB HBM3: 2.9}\nkwh: 0.15\n"


def cluster(start: int, end: int, interval: int, nodes_n: int) -> tuple[list[Node], list[Workload], float]:
    """The nodes (each with its GPU series), the workloads and the expected allocated
    GPU-hours over [start, end]."""
    restart = start + 15 * D + 2 * H
    nodes = [Node(f"node-{n:04d}", H100, offset=(n * 7) % interval, down=[],
                  devices=[Device(g) for g in range(GPUS)]) for n in range(nodes_n)]
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
    long_running = nodes_n * (GPUS - CHURNING) * (30 * D - lost)
    churning = nodes_n * CHURNING * (6 * (5 * D - interval) - lost)
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


def prepare(data: Path, promtool: str, nodes: list[Node], workloads: list[Workload], replicas: list[EngineCounters],
            start: int, end: int, interval: int, work: Path) -> None:
    """Backfill the history into ``data``, `BACKFILL_NODES` nodes at a time (each round's
    OpenMetrics text is converted and deleted before the next is written)."""
    t0 = time.perf_counter()
    samples = 0
    for first in range(0, len(nodes), BACKFILL_NODES):
        part = nodes[first:first + BACKFILL_NODES]
        names = {n.name for n in part}
        mine = [w for w in workloads if w.node in names]
        pods = {(w.labels["namespace"], w.labels["pod"]) for w in mine}
        engines = [e for e in replicas if (e.labels["namespace"], e.labels["pod"]) in pods]
        samples += backfill(promtool, data, part, mine, start - D, end + H, interval, work, parts=2, engines=engines)
    print(f"history: {len(nodes)} nodes, {len(workloads)} series per family, {len(replicas)} engines, "
          f"{samples / 1e6:.1f} M samples, written and backfilled in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    server = PrometheusServer(shutil.which("prometheus") or "prometheus", work, [],
                              args=["--storage.tsdb.retention.time=400d"])
    server.start()
    try:  # the rounds' blocks overlap in time: let Prometheus merge them before anything is timed
        deadline = time.monotonic() + 3600
        while overlapping(data) and time.monotonic() < deadline:
            time.sleep(5)
    finally:
        server.stop()
    print(f"blocks merged by Prometheus in {time.perf_counter() - t0:.0f} s")


def overlapping(data: Path) -> bool:
    """Whether two of the TSDB's blocks cover the same time."""
    spans = []
    for meta in data.glob("*/meta.json"):
        try:
            doc = json.loads(meta.read_text())
        except (OSError, ValueError):
            return True  # a block being written
        spans.append((doc["minTime"], doc["maxTime"]))
    spans.sort()
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


def timed(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` from the repository root; its wall time (s) and peak RSS (MiB)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return time.perf_counter() - t0, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100, help="nodes of 10 GPUs each (default: 100)")
    parser.add_argument("--interval", type=int, default=300, help="sample interval of the history, seconds")
    parser.add_argument("--runs", type=int, default=3, help="runs per format (median reported)")
    parser.add_argument("--formats", default="csv,json,html", help="formats to time (default: csv,json,html)")
    parser.add_argument("--keep", metavar="DIR", help="keep (or reuse) the backfilled TSDB here")
    parser.add_argument("--backfill-only", action="store_true", help="write the history (with --keep) and stop")
    parser.add_argument("--by", choices=("namespace", "model"), default="namespace",
                        help="model: the long-running containers are vLLM replicas, and the report is --by model")
    parser.add_argument("--query-log", action="store_true",
                        help="have Prometheus log each query's timings (global.query_log_file) and print where "
                             "the server's time went, by kind of query, over every report run")
    parser.add_argument("--source", choices=("auto", "raw", "rules"), default="auto",
                        help="the report's --source; rules: Prometheus evaluates alerts/l9gpu-chargeback.rules.yaml "
                             "over the history first (promtool tsdb create-blocks-from rules)")
    args = parser.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        print("needs Debian's prometheus package (prometheus, promtool)", file=sys.stderr)
        return 2
    end = (int(time.time()) // D - 1) * D
    start = end - 30 * D
    nodes, workloads, expected_allocated = cluster(start, end, args.interval, args.nodes)
    # the engines' counters are in every history; only --by model reads them
    replicas, expected_tokens, expected_idle = engines(nodes, workloads, start, end, args.interval)
    work = Path(tempfile.mkdtemp(prefix="bench-report-"))
    data = work / "data"  # where PrometheusServer points Prometheus
    if args.keep:
        kept = Path(args.keep).resolve() / f"tsdb-{start}-{args.interval}-{args.nodes}"
        kept.parent.mkdir(parents=True, exist_ok=True)
        data.symlink_to(kept, target_is_directory=True)
        data = kept
    try:
        if not data.exists():
            prepare(data, promtool, nodes, workloads, replicas, start, end, args.interval, work)
        if args.source == "rules":
            backfill_rules(data, promtool, start, end, work)
        if args.backfill_only:
            return 0
        return measure(args, prometheus, work, start, end, expected_allocated, expected_tokens, expected_idle)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def backfill_rules(data: Path, promtool: str, start: int, end: int, work: Path) -> None:
    """The chargeback recording rules evaluated over the history, as TSDB blocks (once per
    TSDB): one promtool pass per stage (`exporter.report.rules.STAGES`), the served-model
    rules reading the records of the stages before."""
    from exporter.report import rules

    marker = data / "l9gpu-chargeback-rules-staged"
    if marker.exists():
        return
    t0 = time.perf_counter()
    evaluate_rules(shutil.which("prometheus") or "prometheus", promtool, work,
                   [rules.rules_yaml(stage=stage) for stage in rules.STAGES], start - D, end,
                   f"count(last_over_time(container_gpu_allocation_seconds_total[1d] @ {end}))",
                   ["--storage.tsdb.retention.time=400d", "--query.timeout=30m"], timeout=600)
    marker.write_text("")
    print(f"recording rules evaluated over the history in {time.perf_counter() - t0:.0f} s "
          f"({len(rules.STAGES)} promtool passes)")


def measure(args: argparse.Namespace, prometheus: str, work: Path, start: int, end: int, expected_allocated: float,
            expected_tokens: float, expected_idle: float) -> int:
    prices = work / "prices.yaml"
    prices.write_text(PRICES)
    # a shared 2-core machine: Prometheus and the report get long query timeouts
    query_log = work / "query.log"
    server = PrometheusServer(prometheus, work, [], args=["--storage.tsdb.retention.time=400d", "--query.timeout=10m"],
                              settings={"query_log_file": str(query_log)} if args.query_log else None)
    server.start()
    try:
        server.wait_for(f"count(last_over_time(container_gpu_allocation_seconds_total[1d] @ {end}))", timeout=600)
        cmd = [sys.executable, "-m", "exporter", "report", "--prometheus", server.base, "--from", str(start),
               "--to", str(end), "--by", args.by, "--prices", str(prices), "--source", args.source,
               "--timeout", "10m", "--timings"]
        print("command: l9gpu " + " ".join(cmd[3:]).replace(str(prices), "prices.yaml") + " --format F")
        for fmt in args.formats.split(","):
            times, rss = [], []
            for _ in range(args.runs):
                out = work / f"report.{fmt}"
                took, peak = timed(cmd + ["--format", fmt, "--output", str(out)])
                times.append(took)
                rss.append(peak)
            print(f"{fmt:>4}: median {statistics.median(times):.2f} s, max {max(times):.2f} s over {args.runs} runs; "
                  f"peak RSS of the report {max(rss):.0f} MiB")
        if "json" not in args.formats.split(","):
            timed(cmd + ["--format", "json", "--output", str(work / "report.json")])
        doc = json.loads((work / "report.json").read_text())
        source = doc["source"]
        got = doc["totals"]["gpu_hours_allocated"]
        print(f"groups {doc['totals']['groups']}, workloads {doc['totals']['workloads']}, "
              f"queries {source['queries']}, steps of {source['step_seconds']} s, "
              f"raw steps {source.get('raw_steps')}, source {source.get('counters')}, "
              f"error bound {source.get('error_bound_gpu_hours')} GPU-hours")
        print(f"allocated GPU-hours {got:.3f} (history: {expected_allocated:.3f}); "
              f"total charge {doc['totals']['total_cost']:.2f} {doc['currency']}")
        bound = source.get("error_bound_gpu_hours") or 0.0
        if abs(got - expected_allocated) > 1e-3 + bound:
            print("MISMATCH between the report and the history", file=sys.stderr)
            return 1
        if args.by == "model":
            tokens = doc["totals"]["prompt_tokens"] + doc["totals"]["generated_tokens"]
            idle = doc["totals"]["idle_replica_hours"]
            print(f"tokens {tokens:.0f} (history: {expected_tokens:.0f}); idle replica hours {idle:.1f} (history: "
                  f"{expected_idle:.1f}, less the intervals around the rollout's gap); groups "
                  f"{sorted(g['group'] for g in doc['groups'])}")
            # the rules' hours at the period's two ends belong partly to the periods around it
            edges = 2 * H / (end - start) if source.get("counters") == "rules" else 0.0
            if abs(tokens - expected_tokens) > (1e-6 + edges) * expected_tokens:
                print("MISMATCH between the report's tokens and the history", file=sys.stderr)
                return 1
            if not expected_idle * (0.995 - edges) <= idle <= expected_idle * (1 + edges):
                print("MISMATCH between the report's idle replica hours and the history", file=sys.stderr)
                return 1
        if args.query_log:
            print_query_log(query_log)
    finally:
        server.stop()
    return 0


# What each of the report's queries asks, told apart by its PromQL (exporter.report.aggregate, compute)
QUERY_KINDS = (
    ("idle intervals (a subquery every 5 minutes)", lambda q, step: q.startswith("count_over_time((")),
    ("raw samples of flagged steps", lambda q, step: 'node=~"' in q),
    ("per-step sums by group", lambda q, step: q.startswith("sum by (")),
    ("falls (resets per step)", lambda q, step: q.startswith("resets(")),
    ("appearances per step (unless the step before)", lambda q, step: " unless last_over_time(" in q),
    ("values per step", lambda q, step: bool(step)),
    ("period totals (last and first values)", lambda q, step: True),
)


def print_query_log(path: Path) -> None:
    """Prometheus' query log summed by kind of query: execution seconds (the server's
    time, queries running side by side on its cores) and the count."""
    kinds: dict[str, list[float]] = {}
    total = 0.0
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        query, step = entry["params"]["query"], entry["params"].get("step", 0)
        seconds = float(entry.get("stats", {}).get("timings", {}).get("execTotalTime", 0.0))
        kind = next(name for name, match in QUERY_KINDS if match(query, step))
        kinds.setdefault(kind, []).append(seconds)
        total += seconds
    print(f"Prometheus' query log: {sum(len(v) for v in kinds.values())} queries, {total:.2f} s of execution")
    for kind, seconds in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {sum(seconds):7.2f} s  {len(seconds):3d} queries  {kind}")


if __name__ == "__main__":
    sys.exit(main())
