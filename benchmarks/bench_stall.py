"""What following each pass for stalls costs the collector thread, and a scrape its families.

On the benchmark node of bench_agent.py (8 GPUs, 64 containers, 256 processes), passes of
the simulated node one (simulated) second apart are collected once (bench_incidents.py's
`snapshots`), then the stall watch (`exporter.stall.watch.StallWatch`: each GPU's signature,
the tracker's hold, the PCIe counter window) follows them as `l9gpu serve` has it do after
every pass: CPU time of one `observe`, median and p99; and the CPU time of one collect of
its families (`StallFamilies`: gpu_stalled and gpu_stalled_seconds_total per GPU,
container_gpu_stalled per workload), which each render of /metrics adds.

Run: ``python benchmarks/bench_stall.py`` (``--passes`` to change the sample size).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_agent import CONTAINERS, GPUS, PROCESSES, scenario  # noqa: E402
from bench_incidents import snapshots  # noqa: E402


def _report(title: str, times: list[float]) -> None:
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    print(f"  {title:<40} CPU: median {statistics.median(times) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms "
          f"(n={len(times)})")


def main() -> int:
    from exporter.core.labels import label_schema
    from exporter.output import catalogue as cat
    from exporter.stall.watch import StallFamilies, StallWatch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=300, help="passes followed (the first 30 are not timed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        snaps = snapshots(scenario(Path(tmp) / "node.yaml"), args.passes)
    names, _ = label_schema(["team"])
    watch = StallWatch("bench", 300.0, names)
    families = StallFamilies(watch, cat.enabled_names(), names)
    observe: list[float] = []
    collect: list[float] = []
    for snap in snaps:
        start = time.process_time()
        watch.observe(snap)
        observe.append(time.process_time() - start)
        start = time.process_time()
        series = sum(len(f.samples) for f in families.collect())
        collect.append(time.process_time() - start)
    print(f"node: {GPUS} GPUs, {CONTAINERS} containers, {PROCESSES} processes; {args.passes} passes a second "
          f"apart, the first 30 untimed; {series} stall series")
    _report("stall watch, one observe", observe[30:])
    _report("stall families, one collect", collect[30:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
