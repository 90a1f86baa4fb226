"""What the backend pays to keep the agent's series: series per GPU, bytes per scrape, and a
real Prometheus's head memory, by schema and flag set.

Nodes: the simulated node (8 H100s and the demo's workloads, ``--backend simulated``), an
8-GPU node of the NVML fake (the same scenario through the real NVML backend,
benchmarks/fake_nvml_agent.py), and that node on an HGX board (18 NVLinks per GPU). Each
node runs the real agent; its /metrics is scraped once every family has its series (GPM
values come one ``--gpm-interval`` after start).

* Series per GPU: the series that carry a ``gpu`` label over the node's GPUs (the agent's
  node-level series, its own process and the Python runtime are left out, in both schemas).
* Bytes per scrape: the text exposition, plain and gzip (what Prometheus asks for).
* Head memory: a real Prometheus (Debian ``prometheus``) scrapes N simulated agents, each
  under R ``replica`` labels (R nodes' worth of distinct series per agent), every
  ``--scrape-interval`` for ``--duration``; ``prometheus_tsdb_head_series`` and the server's
  resident memory, less what the same Prometheus holds with no target, per 1,000 series;
  then what a 1,000-node fleet of 8-GPU nodes holds at that rate.

Usage::

    python benchmarks/bench_series.py                      # both parts
    python benchmarks/bench_series.py --no-prometheus      # series and bytes only
    python benchmarks/bench_series.py --agents 4 --replicas 25 --duration 120
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from agent import AgentProcess  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

SCENARIO = REPO / "exporter" / "devices" / "simulated" / "scenarios" / "default.yaml"
# node -> (launcher, the agent's own flags)
NODES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "simulated": (("-m", "exporter"), ("--backend", "simulated")),
    "fake-nvml-8": (("benchmarks/fake_nvml_agent.py", str(SCENARIO), "--"), ()),
}
# more nodes the benchmark measures (not the budget test): the same 8 fake GPUs on an HGX
# board, 18 NVLinks each, where per-link detail costs most
MORE_NODES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fake-nvml-8-hgx": (("benchmarks/fake_nvml_agent.py", str(SCENARIO), "--nvlinks", "18", "--"), ()),
}
# flag set -> the flags
FLAG_SETS: dict[str, tuple[str, ...]] = {
    "l9gpu (default)": (),
    "l9gpu --detail": ("--detail",),
    "dcgm (default counters)": ("--metric-schema", "dcgm"),
}
# a family every GPU has once the first GPM window is over, in each schema
SETTLED = {"l9gpu": "gpu_graphics_active_ratio", "dcgm": "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}


@dataclass(frozen=True)
class Count:
    """What one scrape of a node holds, in one schema."""

    series: int  # every series of the scrape
    gpu_series: int  # those with a gpu label (in the schema counted)
    gpus: int
    text_bytes: int
    gzip_bytes: int

    @property
    def per_gpu(self) -> float:
        return self.gpu_series / self.gpus if self.gpus else 0.0


def count(text: str, schema: str) -> Count:
    """Series of ``schema`` ("l9gpu": names not starting ``DCGM_``; "dcgm": those) in a scrape."""
    total = gpu_series = 0
    gpus: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            total += 1
            if "gpu" in sample.labels and sample.name.startswith("DCGM_") == (schema == "dcgm"):
                gpu_series += 1
                gpus.add(sample.labels["gpu"])
    return Count(total, gpu_series, len(gpus), len(text.encode()), len(gzip.compress(text.encode(), 6)))


def settled_scrape(agent: AgentProcess, schemas: tuple[str, ...], timeout: float = 120.0) -> str:
    """A scrape once every GPU has its GPM series in each of ``schemas`` and the series count
    held still over two passes (polled: the agent publishes a pass at a time)."""
    deadline = time.monotonic() + timeout
    last: tuple[int, ...] | None = None
    while time.monotonic() < deadline:
        text = agent.scrape()
        counts = tuple(count(text, schema).gpu_series for schema in schemas)
        ready = all(f"\n{SETTLED[schema]}{{" in text for schema in schemas)
        if ready and counts == last:
            return text
        last = counts if ready else None
        time.sleep(1.2)  # past the next pass (1 s interval), so two equal counts are two passes
    raise TimeoutError(f"the agent's series did not settle in {timeout:g}s:\n{agent.log()[-2000:]}")


def schemas_of(flags: tuple[str, ...]) -> tuple[str, ...]:
    """The schemas an agent started with ``flags`` serves (``--metric-schema``, default l9gpu)."""
    chosen = flags[flags.index("--metric-schema") + 1] if "--metric-schema" in flags else "l9gpu"
    return tuple(schema for schema in ("l9gpu", "dcgm") if schema in chosen.split(","))


def node_counts(node: str, flags: tuple[str, ...], log_dir: Path) -> dict[str, Count]:
    """Start the agent of ``node`` with ``flags``, scrape it settled, count each schema it serves."""
    launcher, own = {**NODES, **MORE_NODES}[node]
    schemas = schemas_of(flags)
    agent = AgentProcess([*own, *flags], launcher=launcher, log_path=log_dir / f"{node}.log")
    agent.env = {k: v for k, v in agent.env.items() if not k.startswith(("L9GPU_", "OTEL_"))}
    agent.start()
    try:
        text = settled_scrape(agent, schemas)
    finally:
        agent.stop()
    return {schema: count(text, schema) for schema in schemas}


def series_table(log_dir: Path) -> Iterator[dict[str, object]]:
    """One row per node and flag set."""
    for node in [*NODES, *MORE_NODES]:
        for name, flags in FLAG_SETS.items():
            for schema, got in node_counts(node, flags, log_dir).items():
                yield {"node": node, "flags": name, "schema": schema, **asdict(got), "per_gpu": round(got.per_gpu, 2)}


# ---- Prometheus head memory -------------------------------------------------------------


def _prometheus_metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    wanted = {"prometheus_tsdb_head_series", "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes",
              "prometheus_tsdb_head_chunks"}
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in wanted}


def _prometheus(binary: str, workdir: Path, targets: list[tuple[str, str]], interval: str) -> tuple[object, str]:
    import subprocess

    from agent import free_port

    port = free_port()
    config = {"global": {"scrape_interval": interval, "scrape_timeout": "10s"},
              "scrape_configs": [{"job_name": "l9gpu", "static_configs": [
                  {"targets": [address], "labels": {"replica": replica}} for address, replica in targets]}]}
    (workdir / "prometheus.yml").write_text(json.dumps(config))
    log = open(workdir / "prometheus.log", "wb")
    proc = subprocess.Popen([binary, f"--config.file={workdir / 'prometheus.yml'}",
                             f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return proc, base
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("prometheus did not become ready")


def head_memory(flags: tuple[str, ...], agents: int, replicas: int, duration: float, interval: str,
                binary: str, workdir: Path) -> dict[str, float]:
    """Prometheus's head series and memory scraping ``agents`` simulated agents x ``replicas``."""
    workdir.mkdir(parents=True, exist_ok=True)
    started = []
    try:
        for i in range(agents):
            agent = AgentProcess(["--backend", "simulated", "--node-name", f"sim-node-{i:02d}", *flags],
                                 log_path=workdir / f"agent-{i}.log")
            agent.env = {k: v for k, v in agent.env.items() if not k.startswith(("L9GPU_", "OTEL_"))}
            agent.start()
            started.append(agent)
        targets = [(f"127.0.0.1:{a.port}", str(r)) for a in started for r in range(replicas)]
        proc, base = _prometheus(binary, workdir, targets, interval)
        try:
            time.sleep(duration)  # a benchmark's run time, not a test's wait
            got = _prometheus_metrics(base)
        finally:
            proc.terminate()  # type: ignore[attr-defined]
            proc.wait(30)  # type: ignore[attr-defined]
    finally:
        for agent in started:
            agent.stop()
    return got


def baseline_memory(duration: float, interval: str, binary: str, workdir: Path) -> dict[str, float]:
    """The same Prometheus with no target: what it holds for itself."""
    workdir.mkdir(parents=True, exist_ok=True)
    proc, base = _prometheus(binary, workdir, [], interval)
    try:
        time.sleep(duration)
        return _prometheus_metrics(base)
    finally:
        proc.terminate()  # type: ignore[attr-defined]
        proc.wait(30)  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-prometheus", action="store_true", help="series and bytes per scrape only")
    parser.add_argument("--agents", type=int, default=4, help="simulated agents Prometheus scrapes (default 4)")
    parser.add_argument("--replicas", type=int, default=25,
                        help="times each agent is scraped under its own replica label (default 25)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds Prometheus scrapes (default 120)")
    parser.add_argument("--scrape-interval", default="10s", help="Prometheus's scrape interval (default 10s)")
    parser.add_argument("--json", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)

    out: dict[str, object] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory(prefix="bench-series-") as tmp:
        rows = list(series_table(Path(tmp)))
    out["series"] = rows
    print("node         flags                     schema  series  gpu-series  GPUs  per GPU  text KB  gzip KB")
    for r in rows:
        print(f"{r['node']:<12} {r['flags']:<25} {r['schema']:<6} {r['series']:>7} {r['gpu_series']:>11} "
              f"{r['gpus']:>5} {r['per_gpu']:>8.2f} {int(r['text_bytes']) / 1024:>8.1f} "  # type: ignore[call-overload]
              f"{int(r['gzip_bytes']) / 1024:>8.1f}")  # type: ignore[call-overload]
    for node in [*NODES, *MORE_NODES]:
        per = {(r["flags"]): r["per_gpu"] for r in rows if r["node"] == node}
        dcgm = float(per["dcgm (default counters)"])  # type: ignore[arg-type]
        print(f"{node}: default / DCGM = {float(per['l9gpu (default)']) / dcgm:.2f}x, "  # type: ignore[arg-type]
              f"--detail / DCGM = {float(per['l9gpu --detail']) / dcgm:.2f}x")  # type: ignore[arg-type]

    binary = shutil.which("prometheus")
    if not args.no_prometheus and binary:
        memory: dict[str, object] = {"agents": args.agents, "replicas": args.replicas, "duration_s": args.duration,
                                     "scrape_interval": args.scrape_interval}
        with tempfile.TemporaryDirectory(prefix="bench-series-prom-") as tmp:
            base = baseline_memory(min(args.duration, 60.0), args.scrape_interval, binary, Path(tmp) / "empty")
            memory["baseline"] = base
            print(f"\nPrometheus with no target: {base['prometheus_tsdb_head_series']:.0f} head series, "
                  f"RSS {base['process_resident_memory_bytes'] / 2**20:.1f} MiB")
            print(f"{args.agents} simulated agents x {args.replicas} replica labels, {args.duration:g} s, "
                  f"scrape interval {args.scrape_interval}:")
            print("flags                     head series  RSS MiB  heap MiB  KiB RSS / 1k series  KiB heap / 1k series")
            for name, flags in FLAG_SETS.items():
                got = head_memory(flags, args.agents, args.replicas, args.duration, args.scrape_interval, binary,
                                  Path(tmp) / name.split()[0].strip("(") / name.split()[-1].strip("()-"))
                series = got["prometheus_tsdb_head_series"] - base["prometheus_tsdb_head_series"]
                rss = got["process_resident_memory_bytes"] - base["process_resident_memory_bytes"]
                heap = got["go_memstats_heap_inuse_bytes"] - base["go_memstats_heap_inuse_bytes"]
                per_k_rss, per_k_heap = rss / 1024 / (series / 1000), heap / 1024 / (series / 1000)
                memory[name] = {**got, "series": series, "kib_rss_per_1k_series": per_k_rss,
                                "kib_heap_per_1k_series": per_k_heap}
                print(f"{name:<25} {series:>11.0f} {got['process_resident_memory_bytes'] / 2**20:>8.1f} "
                      f"{got['go_memstats_heap_inuse_bytes'] / 2**20:>9.1f} {per_k_rss:>20.1f} {per_k_heap:>21.1f}")
        out["prometheus"] = memory
        print("\nA 1,000-node fleet of 8-GPU simulated nodes (series of one node x 1,000, at the measured rate):")
        for name in FLAG_SETS:
            node_series = next(int(r["series"]) for r in rows  # type: ignore[call-overload]
                               if r["node"] == "simulated" and r["flags"] == name)
            fleet = node_series * 1000
            rate = memory[name]["kib_rss_per_1k_series"]  # type: ignore[index]
            print(f"{name:<25} {fleet / 1e6:>5.2f} M series  ~{fleet / 1000 * rate / 2**20:>5.2f} GiB RSS "
                  f"({fleet / 8000:.0f} series per GPU incl. node-level)")
    elif not args.no_prometheus:
        print("\nno prometheus binary: head memory skipped")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
