"""Run `l9gpu serve --backend nvml` on an NVML fake whose GPU processes a test sets while it runs.

Usage (what `Node` starts as the agent's command)::

    python tests/fakes/nvml_node.py PROCESSES_FILE -- serve --listen 127.0.0.1:PORT ...

The fake has one GPU. Its processes are read from PROCESSES_FILE every 50 ms, one
``PID BYTES`` per line (written by the test, atomically by rename); the PIDs are those
of real processes, so the agent attributes them as on a real node: through their
/proc/<pid>/cgroup, pidfds, and the pods of the API server it is pointed at. Should the
file not be readable (the agent out of descriptors), the last list stays.

`Node` is the tests' side: it starts the agent on this harness, puts real ``sleep``
children into pod cgroups, names their pods in the local API server and writes the file.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

GiB = 2**30
NODE = "gpu-node-1"


class Node:
    """The agent on the NVML fake, its GPU processes, and the pods that own them."""

    def __init__(self, tmp_path: Path, cgroups: Any, apiserver: Any) -> None:
        self.tmp_path, self.cgroups, self.apiserver = tmp_path, cgroups, apiserver
        self.processes_file = tmp_path / "gpu-processes"
        self.processes_file.write_text("")
        self.gpu: dict[int, int] = {}  # pid -> bytes
        self.agent: Any = None  # agent.AgentProcess, once started

    def add_gpu_process(self, pod: str, gib: int = 1) -> subprocess.Popen:
        """A `sleep` in a new pod's container cgroup, holding ``gib`` GiB of the GPU."""
        from cgroup_helpers import burstable_scope, container_id, pod_uid

        uid, cid = pod_uid(), container_id()
        child = self.cgroups.spawn(burstable_scope(uid, cid))
        if self.apiserver is not None:
            from fakes.kubernetes_apiserver import make_pod

            self.apiserver.add(make_pod(pod, "ml", uid, NODE, {"main": cid}))
        self.gpu[child.pid] = gib * GiB
        staged = self.processes_file.with_suffix(".new")
        staged.write_text("".join(f"{pid} {used}\n" for pid, used in self.gpu.items()))
        staged.rename(self.processes_file)
        return child

    def start(self, *args: str, open_files: int | None = None, wait_ready: bool = True) -> Any:
        from agent import AgentProcess
        from cgroup_helpers import kubeconfig

        kube = (["--kubernetes", "on", "--kubeconfig", kubeconfig(self.tmp_path, self.apiserver)]
                if self.apiserver is not None else ["--kubernetes", "off"])
        self.agent = AgentProcess(["--node-name", NODE, "--interval", "250ms", "--cri-socket", "off",
                                   "--pod-resources-socket", "off", *kube, *args],
                                  launcher=[__file__, str(self.processes_file), "--"], open_files=open_files,
                                  log_path=self.tmp_path / f"agent-{time.monotonic_ns()}.log")
        self.agent.start(wait_ready=wait_ready)
        return self.agent

    def pod_memory(self, pod: str) -> list[float]:
        from agent import pick

        assert self.agent is not None
        return pick(self.agent.samples(), "container_gpu_memory_used_bytes", pod=pod)


def _follow(path: Path, gpu, stop: threading.Event) -> None:  # type: ignore[no-untyped-def]
    from fakes import pynvml_fake as F

    last = None
    while not stop.wait(0.05):
        try:
            text = path.read_text()
        except OSError:
            continue
        if text == last:
            continue
        last = text
        procs = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) == 2:
                procs.append(F.FakeProcess(pid=int(fields[0]), used_memory=int(fields[1])))
        gpu.memory_used = sum(p.used_memory or 0 for p in procs)
        gpu.live_sm = {p.pid: 20 for p in procs}
        gpu.processes = procs


def main(argv: list[str]) -> int:
    from fakes import pynvml_fake as F

    if "--" not in argv or argv.index("--") != 1:
        raise SystemExit("usage: nvml_node.py PROCESSES_FILE -- serve ...")
    path, rest = Path(argv[0]), argv[2:]
    gpu = F.FakeGpu(name="NVIDIA H100 80GB HBM3", processes=[], live_sm={})
    fake = F.FakeNvml([gpu])
    fake.record_calls = False  # a long run: keep no call log
    sys.modules["pynvml"] = fake
    threading.Thread(target=_follow, args=(path, gpu, threading.Event()), daemon=True).start()
    from exporter.app.cli import main as l9gpu_main

    return l9gpu_main(rest + ["--backend", "nvml"])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
