"""The stall section of benchmarks/gpu_check.py: is a kernel spinning with no work called stalled?

A wedged collective of a training job is a resident kernel that spins on a flag
(docs/TRAINING.md). On a real GPU a child plays three phases of ``--stall-phase-seconds``
each, holding ``--stall-gib`` GiB throughout: ``spin`` (``torch.cuda._sleep``, a kernel that
keeps the GPU resident and does no work, queued back to back), ``matmul`` (bf16 matrix
multiplies) and ``idle`` (nothing runs, the memory stays held). This process reads the GPU
through the agent's own NVML backend once per ``--stall-tick`` and folds each reading into
the agent's own stall tracker with ``--stall-after``. The checks: the spin phase is called
stalled, and not before ``--stall-after`` of matching passes; no stall begins in the matmul
or the idle phase, and the spin's stall ends once the matmuls run. The signals of each phase
(utilisation, tensor and DRAM activity, power against the limit, PCIe) are reported, the
figures docs/TRAINING.md's thresholds are judged by. ``--stall-only`` runs this section
alone, ``--no-stall`` skips it; its report goes to ``$OUT/gpu_check_stall.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from processes import ChildWorkload  # benchmarks/, on the path gpu_check.py sets

PHASES = ("spin", "matmul", "idle")
SIGNALS = ("utilization", "tensor_active", "dram_active", "power_ratio", "pcie_bytes_per_second",
           "nvlink_bytes_per_second")


def _emit(event: str, **values: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **values}), flush=True)


def run_stall_workload(phase_seconds: float, gib: float) -> int:
    """The child: spin, matmul, idle, each ``phase_seconds``, holding ``gib`` GiB; events on stdout."""
    import torch  # type: ignore[import-not-found,unused-ignore]

    device = torch.device("cuda:0")
    held = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    torch.cuda.synchronize()
    _emit("spin", pid=os.getpid(), held_bytes=held.numel())
    end = time.monotonic() + phase_seconds
    while time.monotonic() < end:
        for _ in range(8):  # queued back to back: the GPU always has a resident kernel
            torch.cuda._sleep(50_000_000)
        torch.cuda.synchronize()
    _emit("matmul")
    end, multiplies = time.monotonic() + phase_seconds, 0
    while time.monotonic() < end:
        for _ in range(16):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        multiplies += 16
    _emit("idle", multiplies=multiplies)
    time.sleep(phase_seconds)
    _emit("done")
    return 0


class ChildStallWorkload(ChildWorkload):
    """The child as a subprocess on one GPU; `phase` follows its events."""

    def __init__(self, python: str, script: Path, device: int, phase_seconds: float, gib: float):
        super().__init__([python, str(script), "--stall-workload-child", "--stall-phase-seconds", str(phase_seconds),
                          "--stall-gib", str(gib)], device)


def stall_section(nvml_module: Any, device: int, workload: Any, stall_after: float, deadline_seconds: float,
                  tick: float = 1.0, clock: Any = time.monotonic, sleep: Any = time.sleep) -> dict[str, Any]:
    """Read the GPU once per ``tick`` through the agent's NVML backend and stall tracker while
    ``workload`` goes spin -> matmul -> idle -> done; check and report it.

    Args:
        nvml_module: ``pynvml`` (or the tests' fake with the same API), not yet initialised.
        device: NVML index of the GPU the workload runs on.
        workload: has ``start()``, ``phase()`` ("starting", "spin", "matmul", "idle", "done",
            "failed") and ``stop()``.
        stall_after: the tracker's ``--stall-after``, seconds.
        deadline_seconds: give up after this long.
        tick: seconds between two readings (the agent's ``--interval``).
        clock, sleep: the time the passes read and how they wait (the tests' fake clock).

    Returns:
        ``{"status": "passed"|"failed", "checks", "passes", "stalls", "phases"}``.
    """
    from exporter.devices.nvml import NvmlBackend
    from exporter.stall.tracker import StallTracker

    backend = NvmlBackend(nvml=nvml_module, gpm=True, gpm_interval=0.0, health_interval=None)
    backend.open()
    tracker = StallTracker("gpu-check", stall_after)
    passes: list[dict[str, Any]] = []
    stalls: list[dict[str, Any]] = []
    try:
        workload.start()
        started = clock()
        while clock() - started < deadline_seconds:
            sleep(tick)
            phase = workload.phase()
            now = clock()
            devices = [d for d in backend.sample(now) if d.index == device and not d.gpu_instance]
            began, ended = tracker.observe(now, devices, {})
            state = tracker.states().get(devices[0].key) if devices else None
            if state is not None:
                passes.append({"t": round(now - started, 3), "phase": phase, "matched": state.reading.matched,
                               "stalled": state.stalled, "why_not": state.reading.why_not,
                               **{k: v for k, v in state.reading.signals.items() if k in SIGNALS}})
            for stall in began:
                stalls.append({"phase": phase, "began": round(stall.began - started, 3),
                               "declared": round(stall.declared - started, 3), "signals": dict(stall.signals),
                               "absent": list(stall.absent)})
            for stall in ended:
                for entry in stalls:
                    if entry["began"] == round(stall.began - started, 3):
                        entry.update(ended=round((stall.ended or now) - started, 3), ended_in=phase,
                                     end_reason=stall.end_reason)
            if phase in ("done", "failed"):
                break
    finally:
        workload.stop()
        backend.close()
    return _judge(passes, stalls, stall_after, tick)


def _judge(passes: list[dict[str, Any]], stalls: list[dict[str, Any]], stall_after: float,
           tick: float) -> dict[str, Any]:
    checks = []
    spin = [s for s in stalls if s["phase"] == "spin"]
    first_match = next((p["t"] for p in passes if p["phase"] == "spin" and p["matched"]), None)
    ok = bool(spin) and first_match is not None and spin[0]["declared"] - first_match >= stall_after - 1e-6
    checks.append({"name": "stall_spin_is_stalled", "passed": ok,
                   "detail": (f"the spinning kernel was called stalled {spin[0]['declared'] - first_match:.1f} s after "
                              f"its first matching pass (--stall-after {stall_after:g} s)" if ok else
                              f"no stall declared in the spin phase (first matching pass: {first_match})")})
    for phase in ("matmul", "idle"):
        begun = [s for s in stalls if s["phase"] == phase]
        checks.append({"name": f"stall_{phase}_not_stalled", "passed": not begun,
                       "detail": f"{len(begun)} stall(s) began in the {phase} phase"})
    ended = bool(spin) and spin[0].get("ended_in") == "matmul" and spin[0].get("end_reason") == "computes again"
    checks.append({"name": "stall_ends_when_it_computes", "passed": ended,
                   "detail": f"the spin's stall ended in {spin[0].get('ended_in') if spin else None!r} "
                             f"({spin[0].get('end_reason') if spin else 'no stall'})"})
    if passes and passes[-1]["phase"] != "done":
        checks.append({"name": "stall_workload_completed", "passed": False,
                       "detail": f"the workload ended as {passes[-1]['phase']!r}"})
    phases = {}
    for phase in PHASES:
        rows = [p for p in passes if p["phase"] == phase]
        phases[phase] = {"passes": len(rows), "matched": sum(p["matched"] for p in rows),
                         **{k: _median([p[k] for p in rows if isinstance(p.get(k), (int, float))]) for k in SIGNALS}}
    return {"status": "passed" if all(c["passed"] for c in checks) else "failed", "checks": checks,
            "passes": passes, "stalls": stalls, "phases": phases, "stall_after_seconds": stall_after,
            "tick_seconds": tick}


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def report_stall(result: dict[str, Any]) -> None:
    """Print the section: each phase's median signals, the stalls, PASS/FAIL per check."""
    print("  ".join(f"{h:>14}" for h in ("phase", "passes", "matched") + SIGNALS))
    for phase, row in result["phases"].items():
        print("  ".join(f"{v!s:>14}" for v in (phase, row["passes"], row["matched"], *[row[k] for k in SIGNALS])))
    for stall in result["stalls"]:
        print(f"  stall: {stall}")
    for check in result["checks"]:
        print(f"{'PASS' if check['passed'] else 'FAIL'}  {check['name']}: {check['detail']}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The section's options of gpu_check.py."""
    group = parser.add_argument_group("stall section (a kernel spinning with no work, docs/TRAINING.md)")
    group.add_argument("--no-stall", action="store_true", help="skip the stall section")
    group.add_argument("--stall-only", action="store_true", help="run only the stall section")
    group.add_argument("--stall-after", type=float, default=20.0, help="the tracker's --stall-after, s (default: 20)")
    group.add_argument("--stall-phase-seconds", type=float, default=40.0,
                       help="each of the spin, matmul and idle phases (default: 40; more than --stall-after)")
    group.add_argument("--stall-tick", type=float, default=1.0, help="seconds between readings (default: 1)")
    group.add_argument("--stall-gib", type=float, default=2.0, help="GiB the child holds (default: 2)")
    group.add_argument("--stall-workload-child", action="store_true", help=argparse.SUPPRESS)


def run_stall_check(args: Any, script: Path, write_report: Any) -> int:
    """The stall section on a real GPU: 0 passed, 1 failed, 2 cannot run."""
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("pynvml") is None:
        print("gpu_check: the stall section needs torch and nvidia-ml-py", file=sys.stderr)
        return 2
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    workload = ChildStallWorkload(args.python, script, args.device, args.stall_phase_seconds, args.stall_gib)
    print(f"\nstall: a spinning kernel, bf16 matmuls, then idle, {args.stall_phase_seconds:.0f} s each on GPU "
          f"{args.device}; read every {args.stall_tick:g} s, --stall-after {args.stall_after:g} s")
    result = stall_section(pynvml, args.device, workload, args.stall_after,
                           3 * args.stall_phase_seconds + args.startup_timeout + 30, tick=args.stall_tick)
    result["workload"] = workload.events
    report_stall(result)
    write_report("gpu_check_stall.json", result)
    return 1 if result["status"] == "failed" else 0
