"""How soon the agent listens when the Kubernetes API server hangs.

``l9gpu serve --backend nvml`` on the tests' NVML fake (tests/fakes/nvml_node.py) with
``--kubernetes on``, pointed at the tests' local API server (tests/fakes/kubernetes_apiserver.py)
that answers normally, or accepts the pod list and never answers (``stall``). For each,
``--runs`` starts; reported: seconds from the process start to ``/healthz`` answering
200, and to ``/readyz`` answering 200 (the first pass published), median and max.

Run: ``python benchmarks/bench_startup.py`` (about half a minute). Figures are recorded
in docs/SECURITY.md ("Measured").
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

from cgroup_helpers import kubeconfig  # noqa: E402
from fakes.kubernetes_apiserver import FakeApiServer  # noqa: E402
from processes import free_port  # noqa: E402


def _until_ok(url: str, proc: subprocess.Popen, started: float, limit: float = 120.0) -> float:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() - started > limit:
            raise SystemExit(f"the agent did not answer {url}")
        time.sleep(0.01)


def one_start(tmp: Path, server: FakeApiServer, tree: str) -> tuple[float, float]:
    port = free_port()
    processes = tmp / "gpu-processes"
    processes.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("L9GPU_", "OTEL_"))}
    env["PYTHONPATH"] = tree
    harness = Path(tree) / "tests" / "fakes" / "nvml_node.py"  # the tree's own
    if not harness.exists():  # a checkout from before tests/fakes/
        harness = Path(tree) / "tests" / "fake_nvml_node.py"
    cmd = [sys.executable, str(harness), str(processes), "--", "serve",
           "--listen", f"127.0.0.1:{port}", "--node-name", "gpu-node-1", "--kubernetes", "on",
           "--kubeconfig", kubeconfig(tmp, server), "--cri-socket", "off", "--pod-resources-socket", "off"]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        live = _until_ok(f"http://127.0.0.1:{port}/healthz", proc, started)
        ready = _until_ok(f"http://127.0.0.1:{port}/readyz", proc, started)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return live, ready


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree", default=str(REPO),
                        help="checkout whose agent to run, with its tests/fakes/nvml_node.py (default: this one)")
    args = parser.parse_args(argv)
    for name, hang in (("API server answering", False), ("API server hung (accepts, never answers)", True)):
        server = FakeApiServer()
        server.start()
        if hang:
            server.stall()
        lives, readies = [], []
        try:
            with tempfile.TemporaryDirectory(prefix="l9gpu-bench-startup-") as tmp:
                for _ in range(args.runs):
                    live, ready = one_start(Path(tmp), server, args.tree)
                    lives.append(live)
                    readies.append(ready)
        finally:
            server.stop()
        print(f"{name}: /healthz after median {statistics.median(lives):.2f}s (max {max(lives):.2f}s), "
              f"/readyz after median {statistics.median(readies):.2f}s (max {max(readies):.2f}s), {args.runs} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
