"""Run `l9gpu serve --backend nvml` on a node whose NVML is the tests' fake.

The node comes from a scenario file (the simulated backend's format): its GPUs become
fake NVIDIA GPUs, its processes fake NVML processes with their memory and SM share, and
its pods, cgroups and kubelet allocations go through the real attribution code exactly as
in the demo, except that cached processes are checked as on a real node: where the
scenario's PIDs are live processes (bench_agent gives it sleeping ones) through pidfds, as
the agent does on its own /proc, otherwise with a ``pread`` of each one's kept-open
``comm`` (``--proc-checks-by-path`` for the fixture-tree way). With
``--h200-costs`` every NVML call costs what it cost on a real H200
(`fakes.pynvml_fake.H200_COSTS`: CPU burnt with the GIL released, blocking calls sleep), so the
agent's CPU and pass times are what a user pays on a real driver.

Usage (what benchmarks/bench_agent.py runs)::

    python benchmarks/fake_nvml_agent.py SCENARIO [--h200-costs] [--nvlinks 18] -- serve --listen 127.0.0.1:9900 ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

GiB = 2**30


def fake_node(scenario: Any, h200_costs: bool, nvlinks: int = 0) -> Any:
    """A FakeNvml with the scenario's GPUs and processes, answering like an H200 (with
    ``nvlinks`` NVLinks each, all up and clean, as on an HGX board; none: a PCIe card)."""
    from fakes import pynvml_fake as F

    gpus = []
    for spec in scenario.gpus:
        procs = [p for p in scenario.processes if p.gpu == spec.index]
        used = sum(int(p.memory(0.0)) for p in procs)
        gpus.append(F.FakeGpu(
            name="NVIDIA H200", memory_total=spec.memory_bytes, memory_used=used,
            unsupported={"nvmlDeviceGetFanSpeed"}, mig_capable=True,
            processes=[F.FakeProcess(pid=p.pid, used_memory=int(p.memory(0.0))) for p in procs],
            live_sm={p.pid: int(round(100 * p.utilization(0.0))) for p in procs},
            nvlinks=[F.FakeNvLink() for _ in range(nvlinks)],
        ))
    fake = F.FakeNvml(gpus, driver_version="580.159.04", costs=F.H200_COSTS if h200_costs else None)
    fake.record_calls = False  # a long run: keep no call log
    return fake


def install(scenario_path: str, h200_costs: bool, real_proc_checks: bool = True, nvlinks: int = 0) -> None:
    """Make ``import pynvml`` give the fake node and attribution see the scenario's pods.

    ``real_proc_checks``: check cached processes as the agent does on a real /proc rather
    than by path, as it must on a fixture tree whose files could be replaced (the
    benchmark's tree never changes): through pidfds when every PID of the scenario is a
    live process, else with one ``pread`` of each process's kept-open ``comm``.
    """
    import os

    from exporter.app import wiring
    from exporter.attribution import procfs
    from exporter.devices.simulated.backend import load_scenario

    scenario = load_scenario(scenario_path)
    sys.modules["pynvml"] = fake_node(scenario, h200_costs, nvlinks)
    wiring.simulated_scenario = lambda backends: scenario  # the NVML fake's processes are the scenario's
    if real_proc_checks:
        plain_init = procfs.ProcCache.__init__

        live = all(os.path.isdir(f"/proc/{p.pid}") for p in scenario.processes)

        def init(self: procfs.ProcCache, procfs_: procfs.ProcFS, pidfds: bool = True) -> None:
            plain_init(self, procfs_, pidfds)
            self._real_procfs = True
            if pidfds and live and self._exits is None:
                self._exits = procfs.ProcessExits.open()

        procfs.ProcCache.__init__ = init  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s SCENARIO [--h200-costs] -- L9GPU_ARGS...")
    parser.add_argument("scenario")
    parser.add_argument("--h200-costs", action="store_true", help="charge every NVML call its H200 cost")
    parser.add_argument("--nvlinks", type=int, default=0, metavar="N",
                        help="give each GPU N NVLinks, up and clean (an HGX H100 or H200 has 18)")
    parser.add_argument("--proc-checks-by-path", action="store_true",
                        help="check cached processes by path every pass (as on a fixture tree) instead of as on "
                             "a real /proc")
    opts = parser.parse_args(own)
    install(opts.scenario, opts.h200_costs, real_proc_checks=not opts.proc_checks_by_path, nvlinks=opts.nvlinks)
    from exporter.app.cli import main as l9gpu_main

    return l9gpu_main(rest + ["--backend", "nvml"])


if __name__ == "__main__":
    raise SystemExit(main())
