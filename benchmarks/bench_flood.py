"""The agent under a connection flood: memory, scrape latency, attribution, log volume.

``l9gpu serve --backend simulated`` (12 GPU processes in pods, attributed through a
fixture /proc tree) runs with its open-file limit held at 1024 (soft and hard, as a
systemd unit without ``LimitNOFILE`` gives a service that cannot raise it), while
`tests/flood.Flood` holds 1100 silent connections and 400 unfinished requests of about
960 KB of headers each (no final CRLF) against it. Meanwhile a scraper asks for
``/metrics`` on a fresh connection every 50 ms. Reported:

* the agent's RSS before, its peak during the flood (``VmHWM``), and after;
* scrape latency p50/p99/max and failures during the flood;
* ``l9gpu_unattributed_processes`` and the attributed workload memory during the flood
  (the simulated node has 12 processes, all in pods);
* what the server did to the flood's connections, and how many log lines it wrote.

Two phases: **hold** (the flood opens its 1500 connections once) and **sustained** (every
connection the agent closes is opened again, at most ``--rate`` a second).

Run: ``python benchmarks/bench_flood.py`` (about a minute); ``--tree DIR`` runs another
checkout's agent (e.g. a release before these limits) under the same flood.
Figures are recorded in docs/SECURITY.md ("Measured under a flood").
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from processes import free_port  # noqa: E402


def rss(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Scraper(threading.Thread):
    """GET /metrics on a fresh connection every ``period`` seconds; latencies in ms."""

    def __init__(self, url: str, period: float = 0.05, timeout: float = 10.0):
        super().__init__(daemon=True)
        self.url, self.period, self.timeout = url, period, timeout
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.unattributed: list[float] = []
        self.workload_bytes: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout) as resp:
                    body = resp.read().decode()
                self.latencies.append((time.perf_counter() - started) * 1e3)
                self.unattributed.append(metric(body, "l9gpu_unattributed_processes"))
                self.workload_bytes.append(metric(body, "container_gpu_memory_used_bytes"))
            except Exception as exc:  # noqa: BLE001 - every failure is a result here
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self.stop.wait(max(0.0, self.period - (time.perf_counter() - started)))


def _limit_files(limit: int):  # type: ignore[no-untyped-def]
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return apply


_FLOOD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from flood import Flood
port, idle, heavy, size, reconnect, rate, seconds = sys.argv[2:9]
with Flood("127.0.0.1", int(port), idle=int(idle), heavy=int(heavy), header_bytes=int(size),
           reconnect=reconnect == "1", rate=float(rate)) as flood:
    print("started", flush=True)
    time.sleep(float(seconds))
    print(flood.stats.summary, flush=True)
"""


def phase(name: str, url: str, pid: int, port: int, args: argparse.Namespace, reconnect: bool) -> dict:
    """One phase: the flood from its own process (so that its 400 MB of sends do not hold
    up the scraper's thread), the scraper and the RSS sampling from this one."""
    before = rss(pid)[0]
    scraper = Scraper(url + "/metrics")
    flood = subprocess.Popen([sys.executable, "-c", _FLOOD, str(REPO / "tests"), str(port), str(args.idle),
                              str(args.heavy), str(args.header_bytes), "1" if reconnect else "0",
                              str(args.rate if reconnect else 0.0), str(args.seconds)],
                             stdout=subprocess.PIPE, text=True)
    assert flood.stdout is not None and flood.stdout.readline().strip() == "started"
    peak = 0.0
    scraper.start()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        peak = max(peak, rss(pid)[0])
        time.sleep(0.2)
    scraper.stop.set()
    scraper.join(30)
    stats = flood.communicate(timeout=120)[0].strip()
    time.sleep(1.0)
    lat = sorted(scraper.latencies)
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [float("nan")] * 99
    return {"phase": name, "rss_before": before, "rss_peak": max(peak, rss(pid)[0]), "rss_after": rss(pid)[0],
            "scrapes": len(lat), "failures": len(scraper.failures), "first_failure": scraper.failures[:1],
            "p50": statistics.median(lat) if lat else float("nan"), "p99": q[98], "max": lat[-1] if lat else 0,
            "unattributed_max": max(scraper.unattributed, default=float("nan")),
            "workload_gib_min": min(scraper.workload_bytes, default=0.0) / 2**30,
            "workload_gib_max": max(scraper.workload_bytes, default=0.0) / 2**30,
            "flood": stats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=1100)
    parser.add_argument("--heavy", type=int, default=400)
    parser.add_argument("--header-bytes", type=int, default=960_000)
    parser.add_argument("--nofile", type=int, default=1024, help="the agent's soft and hard open-file limit")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--rate", type=float, default=500.0, help="sustained phase: reconnects per second at most")
    parser.add_argument("--tree", default=str(REPO), help="checkout whose agent to run (default: this one)")
    args = parser.parse_args(argv)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("L9GPU_", "OTEL_"))}
    env["PYTHONPATH"] = args.tree
    with tempfile.NamedTemporaryFile("w+b", suffix=".log") as logfile:
        agent = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--backend", "simulated",
                                  "--listen", f"127.0.0.1:{port}", "--interval", "1s"], cwd=args.tree, env=env,
                                 stdout=logfile, stderr=subprocess.STDOUT, preexec_fn=_limit_files(args.nofile))
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(url + "/readyz", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline or agent.poll() is not None:
                        raise SystemExit("the agent did not start:\n" + Path(logfile.name).read_text()) from None
                    time.sleep(0.1)
            time.sleep(2.0)  # a few passes, the first renders done
            print(f"agent pid {agent.pid}, tree {args.tree}, open-file limit {args.nofile}; flood: {args.idle} idle + "
                  f"{args.heavy} x {args.header_bytes} header bytes; scrape every 50 ms on a fresh connection")
            for name, reconnect in (("hold", False), ("sustained", True)):
                lines_before = len(Path(logfile.name).read_bytes().splitlines())
                r = phase(name, url, agent.pid, port, args, reconnect)
                lines = len(Path(logfile.name).read_bytes().splitlines()) - lines_before
                print(f"\n[{r['phase']}] {args.seconds:g}s")
                print(f"  RSS MiB: before {r['rss_before']:.1f}, peak {r['rss_peak']:.1f}, after {r['rss_after']:.1f}")
                print(f"  scrapes: {r['scrapes']} ok, {r['failures']} failed {r['first_failure']}; latency ms "
                      f"p50 {r['p50']:.1f}, p99 {r['p99']:.1f}, max {r['max']:.1f}")
                print(f"  attribution: unattributed processes max {r['unattributed_max']:g}; workload memory "
                      f"{r['workload_gib_min']:.1f}-{r['workload_gib_max']:.1f} GiB")
                print(f"  flood: {r['flood']}")
                print(f"  agent log: {lines} line(s), {Path(logfile.name).stat().st_size} bytes in all")
            print("\nagent log (last 15 lines):")
            for line in Path(logfile.name).read_text(errors="replace").splitlines()[-15:]:
                print("  " + line[:200])
        finally:
            agent.terminate()
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
