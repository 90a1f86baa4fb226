"""`make demo-training-fleet`: one training job across simulated nodes, seen by Prometheus.

Starts ``--nodes`` agents (2), each playing one node of the simulated training job
(``--scenario training``, docs/TRAINING.md: ranks 0-7 on the first node, 8-15 on the next,
...), and Debian's Prometheus scraping them every 5 s with alerts/l9gpu-training.rules.yaml
loaded, then prints where to look and follows what the rules find:

- from about two minutes: a hardware straggler, the thermally throttled GPU 3 of the last
  node (``job_rank_gpu:l9gpu_training_straggler:reason``: its SM clock, its throttle reason
  and its temperature against the job's median);
- the job wedges at ``--wedge-at`` (3m, at the end of the ranks' phase then): every rank but
  rank worker-5 waits in a collective, and ``--stall-after`` (1m) later the agents call their
  GPUs stalled; at the next evaluation of the rules (every minute) ``L9gpuTrainingJobHung``
  fires, naming worker-5 (and the throttled GPU, which the agent does not call stalled while
  its clocks are held down: it is unlike the rest).

The job's ranks compute for minutes at a time here (the built-in scenario's two-minute cycle
checkpoints too often for a GPU to look busy over the straggler rules' 10 minutes).
Prometheus listens on LISTEN's port and the agents on the ports after it; everything stops on
Ctrl-C (or after ``--duration``)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "l9gpu-training.rules.yaml"
SCENARIO = REPO / "exporter" / "devices" / "simulated" / "scenarios" / "training.yaml"
# Minutes of compute between a 20 s checkpoint and a 15 s evaluation.
PHASES = [{"name": "compute", "for": "170s", "utilization": 0.98, "tensor": 0.85},
          {"name": "checkpoint", "for": "20s", "utilization": 0.0},
          {"name": "compute", "for": "100s", "utilization": 0.98, "tensor": 0.85},
          {"name": "evaluate", "for": "15s", "utilization": 0.45, "tensor": 0.4}]


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def query(base: str, expr: str) -> list[dict[str, Any]]:
    try:
        return get(base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]
    except OSError:
        return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:9835",
                        help="Prometheus' address; the agents take the next ports (default 127.0.0.1:9835)")
    parser.add_argument("--nodes", type=int, default=2, help="agents, 8 ranks each (default 2)")
    parser.add_argument("--wedge-at", default="3m")
    parser.add_argument("--stall-after", default="1m")
    parser.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: at Ctrl-C)")
    parser.add_argument("--until-hung", action="store_true", help="stop once the hang alert has fired")
    args = parser.parse_args(argv)
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("demo-training-fleet: prometheus is missing: make system-deps (Debian package prometheus)",
              file=sys.stderr)
        return 2
    host, _, port_text = args.listen.rpartition(":")
    port = int(port_text)
    l9gpu = str(Path(sys.executable).with_name("l9gpu"))
    work = Path(tempfile.mkdtemp(prefix="l9gpu-demo-training-fleet-"))
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["training"]["phases"] = PHASES
    (work / "training.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))
    procs: list[subprocess.Popen[bytes]] = []
    agents = []
    try:
        for n in range(args.nodes):
            node = f"sim-train-{n + 1:02d}"
            env = {**os.environ, "L9GPU_TRAINING_NODE": node, "L9GPU_TRAINING_RANKS": f"{8 * n}-{8 * n + 7}",
                   "L9GPU_TRAINING_ODD_RANK": "5", "L9GPU_TRAINING_WEDGE_AT": args.wedge_at,
                   "L9GPU_TRAINING_THROTTLED_GPU": "3" if n == args.nodes - 1 else "none"}
            address = f"{host}:{port + 1 + n}"
            agents.append((node, address))
            procs.append(subprocess.Popen(
                [l9gpu, "serve", "--backend", "simulated", "--scenario", str(work / "training.yaml"),
                 "--stall-after", args.stall_after, "--listen", address],
                env=env, stdout=open(work / f"{node}.log", "wb"), stderr=subprocess.STDOUT))
        (work / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "5s", "evaluation_interval": "15s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "l9gpu", "static_configs": [{"targets": [a for _, a in agents]}]}]}))
        procs.append(subprocess.Popen(
            [prometheus, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address={args.listen}"], stdout=open(work / "prometheus.log", "wb"),
            stderr=subprocess.STDOUT))
        base = f"http://{host}:{port}"
        print(f"l9gpu demo: one training job (llama-pretrain, {8 * args.nodes} ranks) on {args.nodes} simulated "
              f"nodes, wedging at {args.wedge_at}; --stall-after {args.stall_after}")
        for node, address in agents:
            print(f"  agent {node}: http://{address}/")
        print(f"  Prometheus with the training rules: {base}/alerts")
        print(f"    stragglers: {base}/graph?g0.expr=job_rank_gpu%3Al9gpu_training_straggler%3Areason")
        print(f"    suspects:   {base}/graph?g0.expr=job_rank_gpu%3Al9gpu_training_suspect%3Ainfo")
        print(f"    stalled:    {base}/graph?g0.expr=job%3Al9gpu_training_gpus_stalled%3Aratio&g0.tab=0")
        print("  the dashboard: dashboards/l9gpu-training.json in Grafana on this Prometheus (Ctrl-C to stop)")
        return follow(base, procs, args, time.monotonic())
    except KeyboardInterrupt:
        return 0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(work, ignore_errors=True)


def follow(base: str, procs: list[subprocess.Popen[bytes]], args: argparse.Namespace, began: float) -> int:
    """Print what the rules find as they find it; stop at the end of ``--duration``, once the
    hang alert fired with ``--until-hung``, or when a process died."""
    said: set[str] = set()
    while not args.duration or time.monotonic() - began < args.duration:
        for proc in procs:
            if proc.poll() is not None:
                print(f"demo-training-fleet: {proc.args[0]} exited with {proc.returncode}", file=sys.stderr)
                return 1
        elapsed = f"{(time.monotonic() - began) / 60:4.1f} min"
        for s in query(base, "job_rank_gpu:l9gpu_training_straggler:reason"):
            m = s["metric"]
            line = f"straggler: rank {m['training_rank']} ({m['node']} GPU {m['gpu']}): {m['reason']}"
            if line not in said:
                said.add(line)
                print(f"[{elapsed}] {line} = {float(s['value'][1]):.3g}", flush=True)
        try:
            alerts = get(base + "/api/v1/alerts")["data"]["alerts"]
        except OSError:
            alerts = []
        for alert in alerts:
            if alert["state"] != "firing":
                continue
            line = f"{alert['labels']['alertname']}: {alert['annotations'].get('summary', '')}"
            if line not in said:
                said.add(line)
                print(f"[{elapsed}] FIRING {line}\n           {alert['annotations'].get('description', '')}",
                      flush=True)
                if args.until_hung and alert["labels"]["alertname"] == "L9gpuTrainingJobHung":
                    return 0
        time.sleep(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
