"""Cost of attribution per collection pass: 256 GPU processes in 64 containers.

Writes a fixture /proc tree (cgroup files in the six layouts the simulated node uses:
systemd and cgroupfs drivers, containerd and CRI-O, v1 and v2, kind) and fills the pod
index with the 64 pods, then times `ProcAttributor.resolve` over all 256 PIDs:

* cold cache: a fresh attributor each time (every PID's stat, cgroup, comm and status
  read and parsed, as on the first pass or after every process restarted);
* warm cache: the same attributor pass after pass (one ``stat`` read per PID to check
  the start time, then the join with the pod index).

Then, on the real ``/proc``, the check every warm pass makes that each of 256 live
processes (``sleep`` children) is still the one cached: by path (open, read and parse
``stat``, as for a fixture tree), with one ``pread`` of each process's kept-open ``comm``
(as the agent does on a procfs of another PID namespace), and through pidfds, one
``epoll_wait`` for all (as the agent does on its own ``/proc``), back to back and a second
apart (as passes run).

Run: ``python benchmarks/bench_attribution.py`` (``--passes N``). Figures are recorded
in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from processes import live_processes  # noqa: E402

from exporter.attribution.kubernetes import PodIndex, StaticPodSource  # noqa: E402
from exporter.attribution.resolver import ProcAttributor  # noqa: E402
from exporter.attribution.simulated import scenario_pods, write_proc_tree  # noqa: E402
from exporter.devices.simulated.backend import parse_scenario  # noqa: E402

CONTAINERS, PROCESSES, GPUS = 64, 256, 8


def scenario():  # type: ignore[no-untyped-def]
    per_container = PROCESSES // CONTAINERS
    processes = []
    for c in range(CONTAINERS):
        processes.append({
            "name": f"worker-{c}", "gpus": [(c + i) % GPUS for i in range(per_container)],
            "pid": 100000 + c * 10, "memory_gib": 0.1, "utilization": 0.01,
            "workload": {"namespace": f"team-{c % 8}", "pod": f"svc-{c}-6d8b94df7-abcde", "container": "main",
                         "owner": {"kind": "Deployment", "name": f"svc-{c}"}, "labels": {"team": f"t{c % 8}"}},
        })
    return parse_scenario({"node": "bench", "gpus": {"count": GPUS, "memory_gib": 80}, "processes": processes})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=200)
    args = parser.parse_args()
    sc = scenario()
    pids = sorted(p.pid for p in sc.processes)
    assert len(pids) == PROCESSES
    root = tempfile.mkdtemp(prefix="l9gpu-bench-proc-")
    try:
        write_proc_tree(root, sc.processes)
        index = PodIndex()
        StaticPodSource(index, scenario_pods(sc.processes))
        assert len(index) == CONTAINERS

        cold = []
        for _ in range(args.passes):
            attributor = ProcAttributor(root, index)
            started = time.perf_counter()
            owners = attributor.resolve(pids, 0.0)
            cold.append(time.perf_counter() - started)
        assert all(w.pod for w in owners.values()), "every process must resolve to a named pod"

        attributor = ProcAttributor(root, index)
        attributor.resolve(pids, 0.0)
        warm = []
        for n in range(args.passes):
            started = time.perf_counter()
            attributor.resolve(pids, float(n))
            warm.append(time.perf_counter() - started)
        assert attributor.cache.reads == PROCESSES  # warm passes re-read nothing but stat
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"attribution of {PROCESSES} processes in {CONTAINERS} containers, {args.passes} passes each")
    for name, values in (("cold cache", cold), ("warm cache", warm)):
        print(f"  {name}: median {statistics.median(values) * 1e3:.2f} ms, p99 {percentile(values, 0.99) * 1e3:.2f} ms"
              f" per pass ({statistics.median(values) / PROCESSES * 1e6:.1f} us per process)")
    print(f"checking {PROCESSES} live processes on the real /proc (CPU time per pass, median)")
    for name, (back_to_back, spaced) in bench_real_proc(args.passes).items():
        print(f"  {name}: {back_to_back * 1e3:.2f} ms back to back, {spaced * 1e3:.2f} ms a second apart")
    return 0


def bench_real_proc(passes: int) -> dict[str, tuple[float, float]]:
    from exporter.attribution.procfs import ProcCache, ProcFS

    results = {}
    with live_processes(PROCESSES) as live:
        pids = sorted(live)
        for name, kept_open, pidfds in (("by path (open, read, parse stat)", False, False),
                                        ("kept-open comm, one pread each", True, False),
                                        ("pidfds, one epoll_wait for all", True, True)):
            cache = ProcCache(ProcFS("/proc"), pidfds=pidfds)
            cache._real_procfs = kept_open  # the agent's choice on a real procfs, forced here for comparison
            cache.lookup(pids)
            timings = []
            for gap, count in ((0.0, passes), (1.0, 10)):
                spent = []
                for _ in range(count):
                    time.sleep(gap)
                    started = time.thread_time()
                    cache.lookup(pids)
                    spent.append(time.thread_time() - started)
                timings.append(statistics.median(spent))
            cache.close()
            results[name] = (timings[0], timings[1])
    return results


if __name__ == "__main__":
    sys.exit(main())
