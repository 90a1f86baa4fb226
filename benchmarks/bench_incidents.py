"""What following each pass for incidents costs the collector thread.

On the benchmark node of bench_agent.py (8 GPUs, 64 containers, 256 processes), passes
of the simulated node one (simulated) second apart are collected once, then the incident
watch (`exporter.incidents.watch.IncidentWatch`: the peaks of every GPU and workload, the
tracker's memory of each PID and of each workload's memory over the last minute, the
kernel log's poll) follows them as `l9gpu serve` has it do after every pass: CPU time of
one `observe`, median and p99. With ``--kernel-log`` the watch polls a kmsg-format file
that gains nothing (the cost of an idle kernel log; `/dev/kmsg` is a read(2) as cheap).

Run: ``python benchmarks/bench_incidents.py`` (``--passes`` to change the sample size).
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


def snapshots(path: Path, passes: int) -> list:
    from exporter.attribution import build_attributor
    from exporter.collector import Collector
    from exporter.devices.simulated import SimulatedBackend
    from exporter.labels import label_schema

    now = [1000.0]
    backend = SimulatedBackend(path, clock=lambda: now[0])
    backend.open()
    attributor = build_attributor(argparse.Namespace(), [backend], backend.node_name())
    _, labeller = label_schema(["team"])
    collector = Collector([backend], backend.node_name(), attributor=attributor, labeller=labeller,
                          clock=lambda: now[0])
    out = []
    try:
        for _ in range(passes):
            out.append(collector.collect_once())
            now[0] += 1.0
    finally:
        attributor.close()
    return out


def bench(snaps: list, kernel_log: Path | None) -> list[float]:
    from exporter.incidents.engine import IncidentConfig, IncidentTracker
    from exporter.incidents.kmsg import KernelLog
    from exporter.incidents.watch import IncidentWatch
    from exporter.labels import label_schema

    names, labeller = label_schema(["team"])
    now = [1000.0]
    log = KernelLog(str(kernel_log)) if kernel_log is not None else None
    watch = IncidentWatch("bench", labeller, names, tracker=IncidentTracker("bench", IncidentConfig()),
                          kernel_log=log, clock=lambda: now[0])
    times = []
    for snap in snaps:
        start = time.process_time()
        watch.observe(snap)
        times.append(time.process_time() - start)
        now[0] += 1.0
    watch.close()
    return times[60:]  # after the first minute: the growth window is full


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=600, help="passes followed (the first 60 are not timed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = scenario(Path(tmp) / "node.yaml")
        snaps = snapshots(path, args.passes)
        kmsg = Path(tmp) / "kmsg"
        kmsg.write_text("6,1,1,-;an unrelated line\n")
        print(f"node: {GPUS} GPUs, {CONTAINERS} containers, {PROCESSES} processes; {args.passes} passes "
              "a second apart, the first 60 untimed")
        for title, log in (("incident watch, no kernel log", None), ("incident watch, idle kernel log", kmsg)):
            times = sorted(bench(snaps, log))
            p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
            print(f"  {title:<34} CPU per pass: median {statistics.median(times) * 1e3:.3f} ms, "
                  f"p99 {p99 * 1e3:.3f} ms (n={len(times)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
