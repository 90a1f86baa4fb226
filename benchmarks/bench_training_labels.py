"""What the training job and rank labels cost a pass and a render, side by side with another checkout.

The busy node of bench_agent.py (8 GPUs, 64 containers, 256 processes), twice: as it is
(no pod is a rank of a training job, so no series gains a label) and with every pod a
worker of one PyTorchJob (every workload and process series carries ``training_job`` and
``training_rank``). On each, this checkout's agent and the one in ``--before`` (e.g.
``git archive REV | tar -x -C DIR``) take turns, round after round, each in a process of
its own: it collects the simulated node (warm passes first, then ``--passes`` timed) and
renders what a scrape gets (the catalogue's families, ``l9gpu serve``'s defaults,
encoded by the agent's `Encoder` in the text format) ``--renders`` times. Times are CPU
time (``time.process_time``), the medians of each run; printed: each checkout's median
over rounds, and the ratio of this checkout's to the other's.

Run: ``python benchmarks/bench_training_labels.py --before /tmp/before --rounds 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def training_scenario(plain: Path, path: Path) -> Path:
    """``plain``'s node with every pod a worker of the PyTorchJob ``llama`` (its labels as
    the training-operator writes them)."""
    doc = yaml.safe_load(plain.read_text())
    for proc in doc["processes"]:
        w = proc["workload"]
        index = w["pod"].split("-")[1]
        w["owner"] = {"kind": "PyTorchJob", "name": "llama"}
        w["labels"] = {**w.get("labels", {}), "training.kubeflow.org/job-name": "llama",
                       "training.kubeflow.org/replica-type": "worker",
                       "training.kubeflow.org/replica-index": index,
                       "training.kubeflow.org/operator-name": "pytorchjob-controller"}
    path.write_text(yaml.safe_dump(doc))
    return path


def child(scenario: str, passes: int, renders: int) -> dict[str, float]:
    """One run, in the checkout on sys.path: median CPU seconds of a pass and of a render."""
    import gc
    import logging
    import time

    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from exporter.app.cli import build_parser
    from exporter.app.wiring import build_collector, enabled_families, open_sources
    from exporter.output.encode import Encoder
    from exporter.output.render import SnapshotCollector

    logging.disable(logging.INFO)
    args = build_parser().parse_args(["snapshot", "--backend", "simulated", "--scenario", scenario])
    backends, attributor = open_sources(args)
    collector, extra = build_collector(args, backends, attributor)
    for _ in range(5):
        snap = collector.collect_once()
    gc.collect()
    gc.freeze()  # as `l9gpu serve` does after start-up
    pass_times = []
    for _ in range(passes):
        start = time.process_time()
        snap = collector.collect_once()
        pass_times.append(time.process_time() - start)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snap, enabled_families(build_parser().parse_args(["serve"])), extra))
    encoder = Encoder(generate_latest)
    body = encoder.encode(registry.collect())
    render_times = []
    for _ in range(renders):
        start = time.process_time()
        encoder.encode(registry.collect())
        render_times.append(time.process_time() - start)
    return {"pass": statistics.median(pass_times), "render": statistics.median(render_times),
            "bytes": float(len(body)), "training_series": float(body.count(b"training_job="))}


def run(tree: Path, scenario: Path, passes: int, renders: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(scenario),
                          "--passes", str(passes), "--renders", str(renders)],
                         cwd=tree, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _each(runs: list[dict[str, float]], key: str) -> str:
    return ", ".join(f"{r[key] * 1e3:.2f}" for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="another checkout, run in turn with this one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=40)
    parser.add_argument("--renders", type=int, default=100)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.child, opts.passes, opts.renders)))
        return
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_agent import scenario as busy_scenario

    trees = {"this checkout": REPO} | ({"before": opts.before.resolve()} if opts.before else {})
    with tempfile.TemporaryDirectory() as tmp:
        plain = busy_scenario(Path(tmp) / "busy.yaml")
        nodes = {"busy node, no job": plain,
                 "busy node, 64 ranks of one job": training_scenario(plain, Path(tmp) / "training.yaml")}
        for title, path in nodes.items():
            results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
            for _ in range(opts.rounds):
                for name, tree in trees.items():
                    results[name].append(run(tree, path, opts.passes, opts.renders))
            print(f"{title} ({opts.rounds} rounds, {opts.passes} passes and {opts.renders} renders a run):")
            medians = {}
            for name, runs in results.items():
                medians[name] = {key: statistics.median(r[key] for r in runs) for key in ("pass", "render")}
                last = runs[-1]
                print(f"  {name:<14} pass {medians[name]['pass'] * 1e3:7.2f} ms CPU "
                      f"(runs {_each(runs, 'pass')}), "
                      f"render {medians[name]['render'] * 1e3:6.2f} ms CPU "
                      f"(runs {_each(runs, 'render')}), "
                      f"{last['bytes'] / 1024:.0f} KiB, {last['training_series']:.0f} series with training_job")
            if "before" in medians:
                ours, theirs = medians["this checkout"], medians["before"]
                print(f"  this checkout / before: pass {ours['pass'] / theirs['pass']:.3f}, "
                      f"render {ours['render'] / theirs['render']:.3f}")


if __name__ == "__main__":
    main()
