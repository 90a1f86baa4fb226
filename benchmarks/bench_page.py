"""Cost of the agent's page (/) and its JSON (/api/v1/snapshot), and whether they slow /metrics.

On the benchmark node of bench_agent.py (8 GPUs, 64 containers, 256 processes):

* in process: building the snapshot document, rendering the page from it, and encoding
  the JSON (what one request costs the first time it meets a new snapshot; later requests
  for the same snapshot get cached bytes);
* against `l9gpu serve` at a 1 s interval over loopback: the latency of one client on
  /metrics (gzip, as Prometheus asks) alone, while 5 other clients scrape /metrics back to
  back (the baseline for any load), and while 5 browsers load / back to back; and of one
  client on / alone and while 5 scrapers request /metrics back to back.

Run: ``python benchmarks/bench_page.py`` (``--renders``, ``--seconds`` to change the sample
sizes). Figures are recorded in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import tempfile
import time
from pathlib import Path

from bench_agent import CONTAINERS, GPUS, PROCESSES, fmt, request_back_to_back, scenario, start_simulated_agent

GZIP = {"Accept-Encoding": "gzip"}


def bench_render(path: Path, renders: int) -> tuple[dict[str, list[float]], int, int, int]:
    from exporter.app.cli import build_parser
    from exporter.app.wiring import build_collector, open_sources
    from exporter.devices import close_backends
    from exporter.output.snapshot_json import document_json, snapshot_document
    from exporter.web.page import render_page

    args = build_parser().parse_args(["snapshot", "--backend", "simulated", "--scenario", str(path)])
    backends, attributor = open_sources(args)
    collector, names = build_collector(args, backends, attributor)
    collector.collect_once()
    snap = collector.collect_once()
    attributor.close()
    close_backends(backends)
    times: dict[str, list[float]] = {"snapshot document": [], "page from the document": [],
                                     "compact JSON (/api/v1/snapshot)": [], "indented JSON (snapshot --json)": []}
    for _ in range(renders):
        start = time.perf_counter()
        doc = snapshot_document(snap, names)
        mid = time.perf_counter()
        page = render_page(doc, snap.node, 1.0, ["/metrics"])
        end = time.perf_counter()
        text = document_json(doc, pretty=False)
        done = time.perf_counter()
        document_json(doc, pretty=True)
        times["snapshot document"].append(mid - start)
        times["page from the document"].append(end - mid)
        times["compact JSON (/api/v1/snapshot)"].append(done - end)
        times["indented JSON (snapshot --json)"].append(time.perf_counter() - done)
    assert sum(len(g["workloads"]) for g in doc["gpus"]) == CONTAINERS
    body = page.encode()
    return times, len(body), len(gzip.compress(body, 5)), len(text.encode())


async def _measure(measured: str, background: str | None, seconds: float) -> list[float]:
    """Latency of one client on ``measured`` while 5 clients request ``background`` back to back."""
    times: list[float] = []
    others: list[float] = []
    jobs = [request_back_to_back(measured, 1, seconds, GZIP, times)]
    if background is not None:
        jobs.append(request_back_to_back(background, 5, seconds, GZIP, others))
    await asyncio.gather(*jobs)
    return times


def bench_http(path: Path, seconds: float) -> dict[str, list[float]]:
    proc, port = start_simulated_agent(path)
    base = f"http://127.0.0.1:{port}"
    try:
        metrics, page = base + "/metrics", base + "/"
        return {
            "/metrics alone": asyncio.run(_measure(metrics, None, seconds)),
            "/metrics while 5 other scrapers request it": asyncio.run(_measure(metrics, metrics, seconds)),
            "/metrics while 5 browsers load / back to back": asyncio.run(_measure(metrics, page, seconds)),
            "/ alone": asyncio.run(_measure(page, None, seconds)),
            "/ while 5 scrapers request /metrics back to back": asyncio.run(_measure(page, metrics, seconds)),
        }
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each HTTP measurement runs")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = scenario(Path(tmp) / "bench.yaml")
        renders, page_size, page_gz, json_size = bench_render(path, opts.renders)
        http = bench_http(path, opts.seconds)
    print(f"node: {GPUS} GPUs, {CONTAINERS} containers, {PROCESSES} processes; page {page_size / 1024:.0f} KiB "
          f"({page_gz / 1024:.0f} KiB gzipped), JSON {json_size / 1024:.0f} KiB")
    for name, times in renders.items():
        print(f"{'render: ' + name:<58}{fmt(times)}")
    for name, times in http.items():
        print(f"{'gzip, ' + name:<58}{fmt(times)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
