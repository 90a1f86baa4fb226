"""A long run with churn: processes, PIDs and pods come and go; the agent's state stays bounded.

Thousands of passes on a node where every pass some training workers exit and new ones
start (new PIDs, new pods), some PIDs are reused by other pods, and the pod index is
updated as the API watch would. What the agent remembers must track what is alive (plus
the grace period for counters), or a long-running DaemonSet would grow without end.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

from exporter.attribution.kubernetes import PodIndex, pod_meta
from exporter.attribution.resolver import ProcAttributor
from exporter.attribution.simulated import container_id, pod_uid, scenario_pods, write_proc_tree
from exporter.collect.collector import Collector
from exporter.core.labels import label_schema
from exporter.core.model import DeviceSample, ProcessSample
from exporter.devices.base import Backend
from exporter.output import catalogue as cat
from exporter.output.render import families

GPUS = 4
LIVE = 24  # processes alive at any time
GRACE = 30.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class ChurningNode(Backend):
    """A backend whose processes turn over: each pass two workers exit and two start."""

    name = "churn"

    def __init__(self, root: str, index: PodIndex):
        self.root = root
        self.index = index
        self.generation = 0
        self.alive: dict[int, SimpleNamespace] = {}
        self.next_pid = 1000
        self.reused: set[int] = set()

    def open(self) -> None:
        for _ in range(LIVE):
            self._spawn()

    def close(self) -> None:
        return None

    def _spawn(self, pid: int | None = None) -> None:
        self.generation += 1
        if pid is None:
            pid, self.next_pid = self.next_pid, self.next_pid + 1
        else:
            self.reused.add(pid)
        proc = SimpleNamespace(pid=pid, name="python3", gpu=pid % GPUS, workload={
            "namespace": f"team-{self.generation % 5}", "pod": f"worker-{self.generation}", "container": "main",
            "owner": {"kind": "Job", "name": f"job-{self.generation}"}})
        # A fresh start time, as the kernel gives a new process (also when the PID is reused).
        write_proc_tree(self.root, [proc])
        with open(f"{self.root}/{pid}/stat") as fh:
            fields = fh.read().split(" ")
        fields[21] = str(5_000_000 + self.generation)
        with open(f"{self.root}/{pid}/stat", "w") as fh:
            fh.write(" ".join(fields))
        for pod in scenario_pods([proc]):
            meta = pod_meta(pod)
            assert meta is not None
            self.index.upsert(meta)
        self.alive[pid] = proc

    def _exit(self, pid: int) -> None:
        proc = self.alive.pop(pid)
        w = proc.workload
        self.index.delete(pod_uid(w["namespace"], w["pod"]))
        for name in ("cgroup", "comm", "stat", "status"):
            try:
                os.unlink(f"{self.root}/{pid}/{name}")
            except FileNotFoundError:
                pass

    def churn(self, step: int) -> None:
        oldest = list(self.alive)[:2]  # the two that started first
        for pid in oldest:
            self._exit(pid)
        self._spawn()
        # every third pass, a new pod's process gets a PID that was just freed
        self._spawn(pid=oldest[0] if step % 3 == 0 else None)

    def sample(self, now: float) -> list[DeviceSample]:
        return [DeviceSample(index=g, uuid=f"GPU-{g}", model="H100", energy_joules=1000.0 * now,
                             processes=tuple(ProcessSample(p.pid, 2**30, 0.1) for p in self.alive.values()
                                             if p.gpu == g))
                for g in range(GPUS)]


def test_state_tracks_what_is_alive_through_thousands_of_passes(tmp_path):
    index = PodIndex()
    node = ChurningNode(str(tmp_path), index)
    node.open()
    attributor = ProcAttributor(str(tmp_path), index, None)
    clock = Clock()
    names, labeller = label_schema([])
    collector = Collector([node], "n", interval=1.0, attributor=attributor, labeller=labeller,
                          grace_seconds=GRACE, clock=clock, wall=clock)
    enabled = cat.enabled_names()
    for step in range(2000):
        clock.t = float(step)
        node.churn(step)
        snap = collector.collect_once()
        if step % 250 == 249:
            assert len(attributor.cache) == LIVE  # gone PIDs are forgotten
            assert len(attributor._workloads) == LIVE  # noqa: SLF001
            assert len(index) == LIVE
            # live workloads plus those inside the grace period: two exits a pass
            assert len(collector._state.workloads) <= LIVE + 2 * (GRACE + 1)  # noqa: SLF001
            live = [u for u in snap.workloads if u.present]
            assert len(live) == LIVE and sum(u.processes for u in live) == LIVE
            # each live series names a live pod: none kept a dead pod's identity
            assert {u.workload.pod for u in live} == {p.workload["pod"] for p in node.alive.values()}
            assert all(u.memory_used_bytes == 2**30 for u in live)
            # every live process is attributed, including the ones on reused PIDs
            assert snap.info["unattributed_processes"] == 0.0
            rendered = {f.name: f for f in families(snap, enabled, names)}
            series = rendered["container_gpu_memory_used_bytes"].samples
            assert len(series) == LIVE
    # a reused PID names its new pod, never the one that had the number before
    assert node.reused & set(node.alive), "the run should end with processes on reused PIDs alive"
    for proc in node.alive.values():
        owner = attributor.resolve([proc.pid], clock.t)[proc.pid]
        assert owner.pod == proc.workload["pod"]
        assert owner.container_id == container_id(proc.workload["namespace"], proc.workload["pod"], "main")
