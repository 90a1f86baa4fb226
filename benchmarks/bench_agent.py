"""What the agent costs a user: CPU per interval, pass time, scrape latency, memory.

Nodes, each with 8 GPUs, every process attributed through the real code (a fixture /proc
tree in real cgroup layouts, the pods in the index, the kubelet's allocations joined):

* 8 GPUs x 16 processes (16 containers, two per GPU), the same 16 processes in 8 containers
  (one per GPU: a GPU held by one owner is not asked for per-process samples), and 8 GPUs
  x 256 processes (64 containers);
* read through the NVML backend on the tests' NVML fake, once answering for free and once
  charging every call what it cost on a real H200 (``fakes.pynvml_fake.H200_COSTS``: CPU burnt
  with the GIL released, blocking calls sleep) - the figures a real driver gives;
* cached processes checked as on a real /proc (``fake_nvml_agent.install``); the
  simulated node's row checks them by path, as its fixture tree requires.

For each it reports:

* **collection pass**, in process: median and p99 wall and CPU time of one pass;
* **agent CPU per interval**: ``l9gpu serve --backend nvml --interval 1s`` in its own
  process, scraped like Prometheus (OpenMetrics with gzip every 15 s); after two scrape
  periods, the process's CPU time over ``--seconds`` (collector, rendering, event loop,
  everything) divided by the number of intervals;

and, on the simulated 8 x 256 node (as before), ``/metrics`` latency serially and with 20
concurrent clients, and the agent's RSS.

Run: ``python benchmarks/bench_agent.py`` (about 8 minutes; ``--seconds 20`` for a
quicker look). Figures are recorded in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from processes import cpu_seconds, free_port, live_processes  # noqa: E402

GPUS, CONTAINERS, PROCESSES = 8, 64, 256
PROMETHEUS = {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
              "Accept-Encoding": "gzip"}


def scenario(path: Path, containers: int = CONTAINERS, processes_total: int = PROCESSES,
             pids: list[int] | None = None) -> Path:
    """Write a benchmark node's scenario file (8 GPUs, containers spread over them).

    ``pids``: the processes' PIDs (live processes, so that the agent can watch them as on
    a real node; see `processes.live_processes`); made-up ones by default.
    """
    per_container = processes_total // containers
    processes = []
    for c in range(containers):
        gpu = c % GPUS
        for p in range(per_container):
            processes.append({
                "name": f"worker{p}",
                "gpus": [gpu],
                "pid": pids[len(processes)] if pids else 100000 + c * 1000 + p,
                "memory_gib": min(2.0, 64.0 * GPUS / processes_total),  # at most 64 GiB per GPU
                "utilization": {"wave": {"min": 0.0, "max": 0.03 * 64 / containers, "period": f"{20 + c}s"}},
                "workload": {"namespace": f"team-{c % 8}", "pod": f"job-{c}-abcde", "container": "main",
                             "owner": {"kind": "Deployment", "name": f"job-{c}"}, "labels": {"team": f"t{c % 8}"}},
            })
    doc = {"node": "bench-node", "gpus": {"count": GPUS, "model": "NVIDIA H100 80GB HBM3", "memory_gib": 80},
           "processes": processes}
    path.write_text(yaml.safe_dump(doc))
    return path


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def fmt(values: list[float]) -> str:
    median, p99 = statistics.median(values) * 1e3, percentile(values, 0.99) * 1e3
    return f"median {median:.2f} ms, p99 {p99:.2f} ms (n={len(values)})"


def bench_cycle(path: Path, passes: int) -> list[float]:
    """Wall time of warm passes on the simulated node (reads cost nothing there)."""
    from exporter.app.cli import build_parser
    from exporter.app.wiring import build_collector, open_sources
    from exporter.devices import close_backends

    args = build_parser().parse_args(["snapshot", "--backend", "simulated", "--scenario", str(path)])
    backends, attributor = open_sources(args)
    collector, _ = build_collector(args, backends, attributor)
    collector.collect_once()  # warm the attribution cache
    gc.collect()
    gc.freeze()  # as `l9gpu serve` does after start-up
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        snap = collector.collect_once()
        times.append(time.perf_counter() - start)
    assert len(snap.workloads) == CONTAINERS and len(snap.processes) == PROCESSES
    attributor.close()
    close_backends(backends)
    return times


def bench_render(path: Path, renders: int = 50) -> dict[str, list[float]]:
    """CPU time of one /metrics render of the simulated node, per encoder (OpenMetrics,
    what Prometheus asks for): the agent's and prometheus_client's, both from the same
    registry (families built from the snapshot, then encoded)."""
    from prometheus_client.exposition import choose_encoder

    from exporter.app import cli, wiring
    from exporter.output.encode import Encoder

    args = cli.build_parser().parse_args(["serve", "--backend", "simulated", "--scenario", str(path)])
    from exporter.devices import close_backends
    backends, attributor = wiring.open_sources(args)
    collector, extra = wiring.build_collector(args, backends, attributor)
    collector.collect_once()
    registry = wiring.build_registry(lambda: collector.snapshot, wiring.enabled_families(args), extra)
    library, _ = choose_encoder(PROMETHEUS["Accept"])
    encoder = Encoder(library)
    results: dict[str, list[float]] = {"prometheus_client": [], "l9gpu": []}
    try:
        for _ in range(renders):
            for name, encode in (("prometheus_client", lambda: library(registry)),
                                 ("l9gpu", lambda: encoder.encode(registry.collect()))):
                started = time.thread_time()
                encode()
                results[name].append(time.thread_time() - started)
    finally:
        attributor.close()
        close_backends(backends)
    return results


def _health_args(health_interval: str | None) -> list[str]:
    """``--health-interval`` for the agent; None leaves the agent's default."""
    return [] if health_interval is None else ["--health-interval", health_interval]


def bench_nvml_pass(path: Path, h200_costs: bool, passes: int,
                    health_interval: str | None = None) -> tuple[list[float], list[float], int]:
    """Wall and CPU time of warm passes through the NVML backend on the fake node."""
    import fake_nvml_agent

    from exporter.app.cli import build_parser
    from exporter.app.wiring import build_collector, open_sources
    from exporter.attribution import procfs
    from exporter.devices import close_backends

    saved = sys.modules.get("pynvml")
    plain_init = procfs.ProcCache.__init__
    fake_nvml_agent.install(str(path), h200_costs)
    try:
        args = build_parser().parse_args(["snapshot", "--backend", "nvml", "--kubernetes", "off",
                                          *_health_args(health_interval)])
        backends, attributor = open_sources(args)
        collector, _ = build_collector(args, backends, attributor)
        collector.collect_once()
        gc.collect()
        walls, cpus = [], []
        for i in range(passes):
            start, cpu = time.perf_counter(), time.process_time()
            snap = collector.collect_once()
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu)
            time.sleep(0.01 if i % 10 else 0.0)
        attributor.close()
        close_backends(backends)
    finally:
        procfs.ProcCache.__init__ = plain_init  # type: ignore[method-assign]
        if saved is None:
            sys.modules.pop("pynvml", None)
        else:
            sys.modules["pynvml"] = saved
    return walls, cpus, len(snap.processes)


def _agent_cpu_seconds(proc: subprocess.Popen) -> float:
    seconds = cpu_seconds(proc.pid)
    if seconds is None:
        raise RuntimeError(f"the agent exited with status {proc.poll()}")
    return seconds


def _wait_ready(port: int, proc: subprocess.Popen, path: str = "/readyz") -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the agent did not become ready") from None
            time.sleep(0.1)


def bench_serve_cpu(path: Path, h200_costs: bool | None, seconds: float,
                    scrape_every: float = 15.0, repo: Path = REPO,
                    peer: Path | None = None, health_interval: str | None = None) -> tuple[float, int, float]:
    """The agent process's CPU per 1 s interval while Prometheus scrapes every 15 s.

    Args:
        repo: the checkout whose agent runs (another revision, to compare under the same load).
        peer: instead of the agent, nvitop-exporter from this directory (``pip install
            --target``), on the same fake node (`fake_nvml_peer`), collecting every 1 s.

    Returns (CPU milliseconds per interval, scrapes made, median pass wall time in ms as
    the agent reports it: ``l9gpu_collector_duration_seconds`` of nvml plus attribution).
    """
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(repo))
    serve = ["serve", "--listen", f"127.0.0.1:{port}", "--interval", "1s", "--log-level", "warning"]
    if peer is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(peer)])
        argv = [sys.executable, str(REPO / "benchmarks" / "fake_nvml_peer.py"), str(path)]
        if h200_costs:
            argv.append("--h200-costs")
        argv += ["--", "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1.0"]
    elif h200_costs is None:  # the simulated backend: reading the devices costs next to nothing
        argv = [sys.executable, "-m", "exporter"] + serve + ["--backend", "simulated", "--scenario", str(path)]
    else:
        argv = [sys.executable, str(repo / "benchmarks" / "fake_nvml_agent.py"), str(path)]
        if h200_costs:
            argv.append("--h200-costs")
        argv += ["--"] + serve + ["--kubernetes", "off", *_health_args(health_interval)]
    proc = subprocess.Popen(argv, env=env, cwd=repo, stderr=subprocess.DEVNULL if peer is not None else None)
    url = f"http://127.0.0.1:{port}/metrics"
    pass_ms: list[float] = []

    def scrape() -> None:
        request = urllib.request.Request(url, headers=PROMETHEUS)
        with urllib.request.urlopen(request, timeout=10) as resp:
            body = resp.read()
            text = (gzip.decompress(body) if resp.headers.get("Content-Encoding") == "gzip" else body).decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith("l9gpu_collector_duration_seconds{") and (
                    'collector="nvml"' in line or 'collector="simulated"' in line
                    or 'collector="attribution"' in line):
                total += float(line.rsplit(" ", 1)[1])
        pass_ms.append(total * 1e3)

    try:
        _wait_ready(port, proc, "/metrics" if peer is not None else "/readyz")
        # Prometheus scrapes from the start; the window opens after two periods, once the
        # agent knows the scrape period (as it does for all of a real agent's life but the
        # first minute).
        next_scrape = time.monotonic()
        start = next_scrape + 2 * scrape_every - 0.5
        start_cpu = None
        while True:
            now = time.monotonic()
            if start_cpu is None and now >= start:
                start_cpu, start = _agent_cpu_seconds(proc), now
                pass_ms.clear()
            if start_cpu is not None and now - start >= seconds:
                break
            if now >= next_scrape:
                scrape()
                next_scrape += scrape_every
            time.sleep(0.05)
        cpu = _agent_cpu_seconds(proc) - start_cpu
        elapsed = time.monotonic() - start
        return cpu / elapsed * 1e3, len(pass_ms), statistics.median(pass_ms) if pass_ms else float("nan")
    finally:
        proc.terminate()
        proc.wait(10)


async def request_back_to_back(url: str, clients: int, seconds: float, headers: dict[str, str],
                               times: list[float]) -> None:
    """``clients`` clients send GET ``url`` back to back for ``seconds``; each request's
    latency is appended to ``times``."""
    import aiohttp

    async def client(session: aiohttp.ClientSession) -> None:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            async with session.get(url, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
            times.append(time.perf_counter() - start)

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))


async def _concurrent(url: str, clients: int, seconds: float, headers: dict[str, str]) -> list[float]:
    """Latency of every request ``clients`` clients send back to back for ``seconds``.

    Several seconds, so the requests meet several collection passes (a pass and the
    pre-rendering after it are what a request can queue behind), not a lucky 0.1 s.
    """
    times: list[float] = []
    await request_back_to_back(url, clients, seconds, headers, times)
    return times


GZIP = {"Accept-Encoding": "gzip"}  # what Prometheus sends


def _serial(url: str, requests: int, headers: dict[str, str]) -> list[float]:
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as resp:
            resp.read()
        times.append(time.perf_counter() - start)
    return times


def start_simulated_agent(path: Path, nvml: bool = False, repo: Path = REPO) -> tuple[subprocess.Popen, int]:
    """`l9gpu serve` on the scenario at a 1 s interval, once /readyz answers: (process, port).

    ``nvml``: through the NVML backend on the fake node (free calls) instead of the
    simulated backend; ``repo``: the checkout whose agent runs.
    """
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(repo))
    serve = ["serve", "--listen", f"127.0.0.1:{port}", "--interval", "1s", "--log-level", "warning"]
    if nvml:
        argv = [sys.executable, str(repo / "benchmarks" / "fake_nvml_agent.py"), str(path), "--"] + serve + [
            "--kubernetes", "off"]
    else:
        argv = [sys.executable, "-m", "exporter"] + serve + ["--backend", "simulated", "--scenario", str(path)]
    proc = subprocess.Popen(argv, env=env, cwd=repo)
    try:
        _wait_ready(port, proc)
    except BaseException:
        proc.terminate()
        proc.wait(10)
        raise
    return proc, port


def bench_scrapes(path: Path, requests: int, concurrent_seconds: float, nvml: bool = False,
                  repo: Path = REPO) -> tuple[dict[str, list[float]], int, int, int]:
    proc, port = start_simulated_agent(path, nvml, repo)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        size = len(urllib.request.urlopen(url).read())
        gz_size = len(urllib.request.urlopen(urllib.request.Request(url, headers=GZIP)).read())
        results = {
            "serial, plain text": _serial(url, requests, {}),
            "serial, gzip": _serial(url, requests, GZIP),
            "20 concurrent clients, plain text": asyncio.run(_concurrent(url, 20, concurrent_seconds, {})),
            "20 concurrent clients, gzip": asyncio.run(_concurrent(url, 20, concurrent_seconds, GZIP)),
        }
        rss_kib = 0
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
        return results, rss_kib, size, gz_size
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=200, help="in-process passes per node")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each agent's CPU is measured")
    parser.add_argument("--requests", type=int, default=1000, help="serial requests per encoding")
    parser.add_argument("--concurrent-seconds", type=float, default=5.0,
                        help="how long the 20 concurrent clients run per encoding")
    parser.add_argument("--no-nvml", action="store_true", help="only the simulated node")
    parser.add_argument("--health-interval", metavar="DURATION|off", default=None,
                        help="the NVML agent's --health-interval (off: no health reads; default: the agent's)")
    opts = parser.parse_args()
    rows = []
    with live_processes(16 + PROCESSES) as pids, tempfile.TemporaryDirectory() as tmp:
        nodes = {
            "8 GPUs x 16 processes": scenario(Path(tmp) / "n16.yaml", containers=16, processes_total=16,
                                              pids=pids[:16]),
            # each GPU held by one container of two processes: no per-process samples read
            "8 GPUs x 16 processes, one owner per GPU": scenario(Path(tmp) / "n16-one.yaml", containers=8,
                                                                 processes_total=16, pids=pids[:16]),
            "8 GPUs x 256 processes": scenario(Path(tmp) / "n256.yaml", pids=pids[16:]),
        }
        for label, path in nodes.items():
            for costs in (() if opts.no_nvml else (False, True)):
                name = f"{label}, {'H200 call costs' if costs else 'free calls'}"
                walls, cpus, procs = bench_nvml_pass(path, costs, opts.passes, opts.health_interval)
                cpu_ms, scrapes, agent_pass_ms = bench_serve_cpu(path, costs, opts.seconds,
                                                                 health_interval=opts.health_interval)
                rows.append((name, procs, walls, cpus, cpu_ms, agent_pass_ms, scrapes))
                print(f"{name}: pass wall {fmt(walls)}; pass CPU {fmt(cpus)}; agent CPU {cpu_ms:.2f} ms per 1 s "
                      f"interval over {opts.seconds:.0f} s ({scrapes} scrapes)", flush=True)
        path = nodes["8 GPUs x 256 processes"]
        sim_cpu_ms, _, sim_pass_ms = bench_serve_cpu(path, None, opts.seconds)
        print(f"simulated 8 GPUs x 256 processes: agent CPU {sim_cpu_ms:.2f} ms per 1 s interval "
              f"(pass as the agent reports it: {sim_pass_ms:.2f} ms)", flush=True)
        cycle = bench_cycle(path, opts.passes)
        renders = bench_render(path)
        scrapes, rss_kib, size, gz_size = bench_scrapes(path, opts.requests, opts.concurrent_seconds)
    print()
    print(f"{'node (NVML fake)':<62}{'pass wall med/p99 ms':>22}{'pass CPU med ms':>17}{'agent CPU ms/interval':>23}")
    for name, _procs, walls, cpus, cpu_ms, _agent_pass, _ in rows:
        print(f"{name:<62}{statistics.median(walls) * 1e3:>11.2f} /{percentile(walls, 0.99) * 1e3:>8.2f}"
              f"{statistics.median(cpus) * 1e3:>17.2f}{cpu_ms:>23.2f}")
    print()
    print(f"simulated node: {GPUS} GPUs, {CONTAINERS} containers, {PROCESSES} processes; "
          f"/metrics body {size / 1024:.0f} KiB ({gz_size / 1024:.0f} KiB gzipped)")
    print(f"{'collection pass (warm)':<45}{fmt(cycle)}")
    print(f"{'agent CPU per 1 s interval (scraped every 15 s)':<45}{sim_cpu_ms:.2f} ms")
    for name, times in renders.items():
        print(f"{'render (OpenMetrics), ' + name:<45}{fmt(times)}")
    for name, times in scrapes.items():
        print(f"{'/metrics, ' + name:<45}{fmt(times)}")
    print(f"{'agent RSS':<45}{rss_kib / 1024:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
