"""Cost of the DCGM schema: one render of a snapshot to exposition bytes, per schema.

Collects passes of a simulated 8-GPU node in process, then renders the same snapshot
with the registry `l9gpu serve` builds for ``--metric-schema l9gpu``, ``dcgm`` and
``l9gpu,dcgm`` (text format, as a scrape without OpenMetrics gets it; the process and GC
collectors included) and reports the median and p99 CPU time of one render and the size
of the output; and, apart, the DCGM renderer's own share (building its families from the
snapshot, before prometheus_client encodes them). Two nodes: the demo node
(``exporter/devices/simulated/scenarios/default.yaml``: 8 GPUs, its pods and Slurm job) and the busy node
of bench_agent.py (8 GPUs, 64 containers, 256 processes).

Run: ``python benchmarks/bench_dcgm.py`` (``--renders`` to change the sample size).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def snapshot_of(scenario: str | None):  # type: ignore[no-untyped-def]
    from exporter.app.cli import build_parser
    from exporter.app.wiring import build_collector, open_sources
    from exporter.devices import close_backends

    argv = ["snapshot", "--backend", "simulated"] + (["--scenario", scenario] if scenario else [])
    args = build_parser().parse_args(argv)
    backends, attributor = open_sources(args)
    try:
        collector, extra = build_collector(args, backends, attributor)
        collector.collect_once()
        time.sleep(0.05)
        return collector.collect_once(), extra
    finally:
        attributor.close()
        close_backends(backends)


def registry_for(schema: str, snapshot, extra):  # type: ignore[no-untyped-def]
    from exporter.app.cli import build_parser
    from exporter.app.wiring import build_registry, enabled_families, select_dcgm_fields

    args = build_parser().parse_args(["serve", "--metric-schema", schema])
    return build_registry(lambda: snapshot, enabled_families(args), extra, select_dcgm_fields(args))


def measure(registry, renders: int) -> tuple[list[float], int]:  # type: ignore[no-untyped-def]
    from prometheus_client.exposition import generate_latest

    body = generate_latest(registry)
    gc.collect()
    times = []
    for _ in range(renders):
        start = time.process_time()
        generate_latest(registry)
        times.append(time.process_time() - start)
    return times, len(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=300)
    opts = parser.parse_args()
    import logging

    logging.disable(logging.INFO)
    from bench_agent import scenario as busy_scenario

    with tempfile.TemporaryDirectory() as tmp:
        nodes = [("demo node", None), ("busy node", str(busy_scenario(Path(tmp) / "busy.yaml")))]
        for title, path in nodes:
            snapshot, extra = snapshot_of(path)
            print(f"{title}: {len(snapshot.devices)} GPUs, {len(snapshot.workloads)} workload rows, "
                  f"{len(snapshot.processes)} processes")
            from exporter.output.dcgm.fields import default_selection
            from exporter.output.dcgm.render import DcgmRenderer

            renderer = DcgmRenderer(default_selection())
            build = []
            for _ in range(opts.renders):
                start = time.process_time()
                renderer.families(snapshot)
                build.append(time.process_time() - start)
            median = statistics.median(build) * 1e3
            print(f"  DCGM families from the snapshot (no encoding): median {median:.3f} ms CPU")
            for schema in ("l9gpu", "dcgm", "l9gpu,dcgm"):
                times, size = measure(registry_for(schema, snapshot, extra), opts.renders)
                ordered = sorted(times)
                p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
                print(f"  --metric-schema {schema:<11} render median {statistics.median(times) * 1e3:6.2f} ms CPU, "
                      f"p99 {p99 * 1e3:6.2f} ms, {size / 1024:6.1f} KiB (n={len(times)})")


if __name__ == "__main__":
    main()
