"""``make demo-report``: a week of the demo node's chargeback, as CSV, JSON and HTML.

Nothing to set up but Debian's ``prometheus`` package (prometheus and promtool). The
simulated node of ``make demo`` (8 H100s: an inference service, a training job, a shared
GPU with a notebook that computes nothing, a reserved GPU nobody uses) is played over the
past week by the agent's own collection pass on a simulated clock, one pass per ``--step``;
its chargeback counters, as /metrics would have served them, are written with their
timestamps and turned into TSDB blocks (`exporter.report.backfill`); the recording rules
of ``alerts/l9gpu-chargeback.rules.yaml`` are evaluated over them; then ``l9gpu report``
runs against a Prometheus on that history, once per format (from the agent's counters,
exact, each workload named), with a prices file written beside the reports. The command
prints where the files are, checks the report's GPU-hours against what the agent's
counters rose by, and the recording rules' figure against the report's::

    python -m exporter.report.demo [--output DIR] [--days 7] [--step 60] [--by namespace]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Sequence

from exporter.report.backfill import PrometheusServer, create_blocks, evaluate_rules, finish_blocks

__all__ = ["DemoFailed", "History", "main", "play_week", "run_demo"]

D, H = 86400, 3600
PRICES = """\
# The demo's prices (docs/CHARGEBACK.md#the-prices-file): what an H100 hour and a kWh cost.
currency: USD
gpu_hour:
  NVIDIA H100 80GB HBM3: 2.90
kwh: 0.15
"""
FORMATS = ("csv", "json", "html")


class DemoFailed(Exception):
    """A step of the demo that cannot go on: its message is the one line printed."""


@dataclass
class History:
    """What the played week left: its samples, and what each family rose by over it
    (the sum over series of last minus first value: the agent never restarts here)."""

    start: int
    end: int
    samples: int = 0
    rose: dict[str, float] = field(default_factory=dict)
    from_rules: dict[str, Any] | None = None   # the JSON report from the recording rules


def _families() -> frozenset[str]:
    """The families the report reads (its workload and device counters)."""
    from exporter.report.compute import COUNTERS, DEVICE_COUNTERS

    return frozenset(family for family, _ in (*COUNTERS.values(), *DEVICE_COUNTERS.values()))


def _line(name: str, labels: dict[str, str], value: float, t: float) -> str:
    """One OpenMetrics sample with its timestamp; empty labels are left out, as Prometheus
    stores them (label values here are the scenario's names, escaped all the same)."""
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    inner = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items() if v != "")
    return f"{name}{{{inner}}} {value:.17g} {t:.3f}\n"


def play_week(out: IO[str], scratch: Path, start: int, end: int, step: int) -> History:
    """The demo node's passes from ``start`` to ``end`` (Unix seconds), one every ``step``,
    written to ``out`` as OpenMetrics (each family contiguous: the later families wait in
    files under ``scratch``)."""
    from exporter.attribution import build_attributor
    from exporter.collect.collector import Collector
    from exporter.core.labels import label_schema
    from exporter.devices.simulated.backend import SimulatedBackend
    from exporter.output.render import families

    now = [float(start)]
    backend = SimulatedBackend(clock=lambda: now[0])
    backend.open()
    scenario = backend.scenario
    if scenario is None:  # open() sets it or raises
        raise DemoFailed("the simulated node has no scenario")
    attributor = build_attributor(argparse.Namespace(), scenario.node, scenario=scenario)
    extra, labeller = label_schema(["team"])
    collector = Collector([backend], scenario.node, interval=step, attributor=attributor,
                          labeller=labeller, clock=lambda: now[0], wall=lambda: now[0])
    wanted = _families()
    history = History(start, end)
    first: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    parts: dict[str, IO[str]] = {}
    try:
        while now[0] <= end:
            snapshot = collector.collect_once()
            for family in families(snapshot, wanted, extra, now=now[0]):
                if family.name not in parts:
                    parts[family.name] = open(scratch / f"{family.name}.om", "w+")
                    parts[family.name].write(f"# TYPE {family.name} {family.type}\n")
                part = parts[family.name]
                for sample in family.samples:
                    part.write(_line(sample.name, sample.labels, sample.value, now[0]))
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    first.setdefault(key, sample.value)
                    last[key] = sample.value
                    history.samples += 1
            now[0] += step
        for part in parts.values():
            part.seek(0)
            shutil.copyfileobj(part, out)
        out.write("# EOF\n")
    finally:
        attributor.close()
        backend.close()
        for part in parts.values():
            part.close()
    for (name, _), value in last.items():
        history.rose[name] = history.rose.get(name, 0.0) + value - first[(name, _)]
    return history


def _tools() -> tuple[str, str]:
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        raise DemoFailed("the demo report needs Debian's prometheus package (prometheus and promtool on PATH): "
                         "apt-get install prometheus")
    return prometheus, promtool


def run_demo(output: Path, days: int = 7, step: int = 60, by: str = "namespace",
             say=print) -> tuple[dict[str, Path], History]:
    """The week played, backfilled and reported: the report's files by format, and the history."""
    from exporter.report import rules

    prometheus, promtool = _tools()
    output.mkdir(parents=True, exist_ok=True)
    end = (int(time.time()) // H - 1) * H   # the last whole hour: the rules cover the week whole
    start = end - days * D
    retention = ["--storage.tsdb.retention.time=400d"]
    with tempfile.TemporaryDirectory(prefix="l9gpu-demo-report-") as tmp:
        work = Path(tmp)
        text = work / "history.om"
        t0 = time.monotonic()
        with open(text, "w") as out:
            history = play_week(out, work, start, end, step)
        say(f"played the demo node over {days} days, one pass every {step} s: {history.samples} samples "
            f"({time.monotonic() - t0:.0f} s)")
        (work / "data").mkdir()
        finish_blocks(create_blocks(promtool, text, work / "data"))
        text.unlink()
        ready = f"count(last_over_time(container_gpu_allocation_seconds_total[1h] @ {end}))"
        t0 = time.monotonic()
        # the per-model stages only split pods' time between the models they serve
        stages = rules.STAGES if by == "model" else rules.STAGES[:1]
        evaluate_rules(prometheus, promtool, work, [rules.rules_yaml(stage=stage) for stage in stages],
                       start, end, ready, args=retention)
        say(f"backfilled with promtool and evaluated the recording rules ({time.monotonic() - t0:.0f} s)")
        prices = output / "prices.yaml"
        prices.write_text(PRICES)
        files = {fmt: output / f"chargeback.{fmt}" for fmt in FORMATS}
        server = PrometheusServer(prometheus, work, [], args=retention).start()
        try:
            server.wait_for(ready)
            report = [sys.executable, "-m", "exporter", "report", "--prometheus", server.base, "--from", str(start),
                      "--to", str(end), "--by", by, "--prices", str(prices), "--quiet"]
            for fmt, path in files.items():  # the agent's counters, exact, with the workloads named
                _report(report + ["--source", "raw", "--format", fmt, "--output", str(path)])
            history.from_rules = json.loads(_report(report + ["--source", "rules", "--format", "json"]))
        finally:
            server.stop()
    return files, history


def _report(cmd: list[str]) -> str:
    """Run ``l9gpu report``; its standard output, or DemoFailed with its one-line error."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        flags = " ".join(arg for arg in cmd if arg.startswith("--source") or arg in ("raw", "rules", *FORMATS))
        raise DemoFailed(f"l9gpu report {flags} failed: {done.stderr.strip()}")
    return done.stdout


def check(files: dict[str, Path], history: History) -> str:
    """The report's GPU-hours against what the agent's counters rose by (exactly), and the
    recording rules' against the report's (within the rules' own error bound): a line
    saying all three, or DemoFailed where they differ."""
    doc = json.loads(files["json"].read_text())
    totals = doc["totals"]
    lines = []
    for key, family in (("gpu_hours_allocated", "container_gpu_allocation_seconds_total"),
                        ("gpu_hours_used", "container_gpu_usage_seconds_total")):
        counters = history.rose.get(family, 0.0) / H
        if abs(totals[key] - counters) > 1e-6 * max(1.0, counters):
            raise DemoFailed(f"the report's {key} {totals[key]:.6f} differs from what the agent's counters rose by "
                             f"({counters:.6f})")
        lines.append(f"{key} {totals[key]:.2f}")
    rules_doc = history.from_rules or {}
    bound = (rules_doc.get("source") or {}).get("error_bound_gpu_hours") or 0.0
    by_rules = (rules_doc.get("totals") or {}).get("gpu_hours_allocated", float("nan"))
    if not abs(by_rules - totals["gpu_hours_allocated"]) <= bound + 1e-6:
        raise DemoFailed(f"the recording rules give {by_rules} allocated GPU-hours, the counters "
                         f"{totals['gpu_hours_allocated']}: more apart than the rules' error bound ({bound})")
    return (f"{totals['groups']} groups, {totals['workloads']} workloads: " + ", ".join(lines)
            + f" (as the agent's counters rose); total charge {totals['total_cost']:,.2f} {doc['currency']}; "
            + f"the recording rules: {by_rules:.2f} GPU-hours allocated (error bound {bound:.2f})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exporter.report.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--output", "-o", default="demo-report", metavar="DIR",
                        help="folder for the reports and the prices file (default: demo-report)")
    parser.add_argument("--days", type=int, default=7, help="days of history (default: 7)")
    parser.add_argument("--step", type=int, default=60, help="seconds between the agent's passes (default: 60)")
    parser.add_argument("--by", default="namespace", help="the report's grouping (default: namespace)")
    args = parser.parse_args(argv)
    if not 1 <= args.days <= 30 or not 10 <= args.step <= 3600:
        print("demo report: --days must be 1 to 30 and --step 10 to 3600 seconds", file=sys.stderr)
        return 2
    try:
        files, history = run_demo(Path(args.output), args.days, args.step, args.by)
        summary = check(files, history)
    except (DemoFailed, RuntimeError, TimeoutError, OSError) as exc:
        print(f"demo report: {exc}", file=sys.stderr)
        return 1
    print(summary)
    print("the reports:")
    for fmt, path in files.items():
        print(f"  {fmt:>4}  {path.resolve()}")
    print(f"  prices {(Path(args.output) / 'prices.yaml').resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
