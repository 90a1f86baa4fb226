"""Where one pass and one scrape of the agent spend their CPU, stage by stage.

The agent as ``l9gpu serve`` builds it (collector, registry, incident watch, exposition:
health reads and the incident watch on, as by default), on the fake NVML node of
`fake_nvml_agent` (free calls, or ``--h200-costs``), without the HTTP listener: passes run
in this process, back to back or ``--sleep`` seconds apart, on the real clock (what is read
on a slow schedule, every 5-30 s, comes as often as that much time passes; a pass a second
apart also costs more than one right after the other, its working set out of the caches:
``--sleep 1`` is what ``serve`` at a 1 s interval pays).

Per pass, the process's CPU time (``time.process_time``) of each stage:

* **read**: the backends' reads through the bulkhead (NVML calls, their modelled cost
  included with ``--h200-costs``);
* **attribute**: PID -> workload, and the SM shares of GPUs several owners share;
* **derive**: `derive.step`;
* **health**: `health_stage.health_step`;
* **snapshot**: the rest of ``collect_once`` (process rows, the snapshot);
* **watch**: the incident watch's ``observe``;

and per scrape (the OpenMetrics text Prometheus asks for): **render** (the registry's
families), **encode** (bytes) and **gzip**.

Run: ``python benchmarks/profile_pass.py --node 256 --free --passes 300`` (``--cprofile N``
prints the N costliest functions by cumulative time over the passes as well).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import gzip
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

from bench_agent import PROMETHEUS, scenario  # noqa: E402
from bench_side_by_side import NODES  # noqa: E402
from processes import live_processes  # noqa: E402

STAGES = ("read", "attribute", "derive", "health", "snapshot", "watch")
SCRAPE = ("render", "encode", "gzip")


class _Timed:
    """Wraps a function, adding the process CPU time of each call to ``totals[name]``
    (the process's: a pass's reads run on the bulkhead's worker threads)."""

    def __init__(self, fn: Callable[..., Any], name: str, totals: dict[str, float]):
        self.fn, self.name, self.totals = fn, name, totals

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.totals[self.name] = self.totals.get(self.name, 0.0) + time.process_time() - started


def build(path: Path, h200_costs: bool, extra: list[str]) -> tuple[Any, Any, Any, Any]:
    """The agent's sources, collector, registry and incident watch on the fake node, as
    ``l9gpu serve`` wires them."""
    import fake_nvml_agent

    from exporter.app.cli import build_parser
    from exporter.app.wiring import (
        build_collector,
        build_incident_watch,
        build_registry,
        enabled_families,
        open_sources,
        select_dcgm_fields,
    )
    from exporter.incidents.watch import IncidentFamilies

    fake_nvml_agent.install(str(path), h200_costs)
    args = build_parser().parse_args(["serve", "--backend", "nvml", "--kubernetes", "off", "--interval", "1s",
                                      *extra])
    enabled = enabled_families(args)
    backends, attributor = open_sources(args)
    collector, extra_names = build_collector(args, backends, attributor)
    registry = build_registry(lambda: collector.snapshot, enabled, extra_names, select_dcgm_fields(args))
    watch = build_incident_watch(args, None, backends)
    registry.register(IncidentFamilies(watch, enabled, extra_names))
    return (backends, attributor), collector, registry, watch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", choices=sorted(NODES), default="256")
    parser.add_argument("--free", action="store_true", help="NVML calls cost nothing (default: H200 call costs)")
    parser.add_argument("--passes", type=int, default=200)
    parser.add_argument("--scrapes", type=int, default=30)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds between passes (as a 1 s interval)")
    parser.add_argument("--cprofile", type=int, default=0, metavar="N",
                        help="also print the N costliest functions of the passes (cumulative)")
    parser.add_argument("agent_args", nargs="*", help="more `l9gpu serve` flags (after --)")
    opts = parser.parse_args()
    containers, processes = NODES[opts.node]
    from exporter.collect import collector as collector_module
    from exporter.output.encode import Encoder, for_openmetrics

    totals: dict[str, float] = {}
    per_pass: dict[str, list[float]] = {name: [] for name in STAGES + ("pass CPU",)}
    collector_module.step = _Timed(collector_module.step, "derive", totals)  # type: ignore[assignment]
    collector_module.health_step = _Timed(collector_module.health_step, "health", totals)  # type: ignore
    with live_processes(processes) as pids, tempfile.TemporaryDirectory() as tmp:
        path = scenario(Path(tmp) / "node.yaml", containers=containers, processes_total=processes, pids=pids)
        (backends, attributor), collector, registry, watch = build(path, not opts.free, opts.agent_args)
        collector._read_devices = _Timed(collector._read_devices, "read", totals)
        collector._process_shares = _Timed(collector._process_shares, "attribute", totals)
        attributor.resolve = _Timed(attributor.resolve, "attribute", totals)
        collector.collect_once()
        watch.observe(collector.snapshot)
        gc.collect()
        gc.freeze()
        profiler = cProfile.Profile() if opts.cprofile else None
        try:
            for _ in range(opts.passes):
                totals.clear()
                started = time.process_time()
                if profiler is not None:
                    profiler.enable()
                snap = collector.collect_once()
                collected = time.process_time()
                watch.observe(snap)
                if profiler is not None:
                    profiler.disable()
                ended = time.process_time()
                for name in ("read", "attribute", "derive", "health"):
                    per_pass[name].append(totals.get(name, 0.0))
                per_pass["snapshot"].append(max(0.0, collected - started - sum(totals.values())))
                per_pass["watch"].append(ended - collected)
                per_pass["pass CPU"].append(ended - started)
                if opts.sleep:
                    time.sleep(opts.sleep)
            scrape: dict[str, list[float]] = {name: [] for name in SCRAPE}
            from prometheus_client.exposition import choose_encoder

            library, _ = choose_encoder(PROMETHEUS["Accept"])
            encoder = Encoder(library)
            for _ in range(opts.scrapes):
                collector.collect_once()
                watch.observe(collector.snapshot)
                started = time.thread_time()
                families = list(for_openmetrics(registry.collect(), encoder.escaping))
                rendered = time.thread_time()
                body = encoder.encode(families)
                encoded = time.thread_time()
                gzip.compress(body, compresslevel=5)
                zipped = time.thread_time()
                scrape["render"].append(rendered - started)
                scrape["encode"].append(encoded - rendered)
                scrape["gzip"].append(zipped - encoded)
        finally:
            attributor.close()
            watch.close()
            from exporter.devices import close_backends

            close_backends(backends)
    costs = "free calls" if opts.free else "H200 call costs (modelled)"
    print(f"node {opts.node}: 8 GPUs, {processes} processes in {containers} containers, {costs}; "
          f"{opts.passes} passes, {opts.scrapes} scrapes; /metrics body {len(body) / 1024:.0f} KiB")
    print(f"{'stage':<22}{'median ms':>11}{'mean ms':>10}")
    for name, values in list(per_pass.items()) + list(scrape.items()):
        print(f"{name:<22}{statistics.median(values) * 1e3:>11.3f}{statistics.fmean(values) * 1e3:>10.3f}")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(opts.cprofile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
