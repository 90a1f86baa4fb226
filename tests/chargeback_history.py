"""Generated Prometheus history of the agent's chargeback counters, with known answers.

A history is nodes (each scraped every `step` seconds from its own offset, with agent
restarts: no samples while down, every counter back at 0 after) and workloads (a series
on one GPU of one node from ``begin`` to ``end``, in phases of constant SM share and
power). Counters are exact integrals between samples, as the agent computes them;
``container_gpu_idle_seconds`` grows while SM is 0 and drops to 0 while computing.
Phase changes, births and restarts fall on a node's sample times, so every figure a
report should give is simple arithmetic on the scenario (the tests write it out).

`write_openmetrics` writes the OpenMetrics text that ``promtool tsdb
create-blocks-from openmetrics`` turns into TSDB blocks; `backfill` does both.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

FAMILIES = (
    ("container_gpu_usage_seconds", "counter"),
    ("container_gpu_allocation_seconds", "counter"),
    ("container_gpu_energy_joules", "counter"),
    ("container_gpu_idle_seconds", "gauge"),
)
LABEL_ORDER = ("node", "gpu", "uuid", "model", "gpu_instance", "namespace", "pod", "container", "pod_uid",
               "slurm_job_id", "owner_kind", "owner_name", "slurm_user", "slurm_account")


@dataclass
class Node:
    name: str
    model: str
    offset: int = 0                                   # first sample at start + offset
    down: list[tuple[float, float]] = field(default_factory=list)  # (last sample before, first sample after)


@dataclass
class Workload:
    node: str
    gpu: int
    labels: dict[str, str]
    begin: float
    end: float
    phases: list[tuple[float, float, float]]          # (from time, SM share, watts), sorted, first at begin


def sample_times(node: Node, start: float, end: float, step: int) -> list[float]:
    times = []
    t = start + node.offset
    while t <= end:
        if not any(a < t < b for a, b in node.down):
            times.append(t)
        t += step
    return times


def _phase(w: Workload, t: float) -> tuple[float, float]:
    sm, watts = 0.0, 0.0
    for since, s, p in w.phases:
        if since <= t:
            sm, watts = s, p
    return sm, watts


def series_samples(w: Workload, node: Node, times: list[float]) -> Iterable[tuple[float, tuple[float, ...]]]:
    """(t, (usage, allocation, energy, idle)) at every sample of the workload's life."""
    usage = alloc = energy = idle = 0.0
    prev = None
    for t in times:
        if t < w.begin or t > w.end:
            continue
        if prev is not None and any(prev <= a and b <= t for a, b in node.down):
            usage = alloc = energy = idle = 0.0   # the agent restarted: counters from 0
        elif prev is not None:
            sm, watts = _phase(w, prev)
            dt = t - prev
            usage += sm * dt
            alloc += dt
            energy += watts * dt
            idle = idle + dt if sm == 0 else 0.0
        yield t, (usage, alloc, energy, idle)
        prev = t


def _labels(node: Node, w: Workload) -> str:
    labels = {"node": node.name, "gpu": str(w.gpu), "uuid": f"GPU-{node.name}-{w.gpu}", "model": node.model,
              "gpu_instance": "", **w.labels}
    ordered = [k for k in LABEL_ORDER if k in labels] + sorted(k for k in labels if k not in LABEL_ORDER)
    return ",".join(f'{k}="{labels[k]}"' for k in ordered if labels[k] != "")


def write_openmetrics(out: IO[str], nodes: list[Node], workloads: list[Workload], start: float, end: float,
                      step: int, scratch: Path | None = None) -> int:
    """The history as OpenMetrics text; returns the number of samples.

    Each family must be contiguous, so the samples of the later families wait in files under
    ``scratch`` (a temporary directory by default) rather than in memory.
    """
    by_name = {n.name: n for n in nodes}
    times = {n.name: sample_times(n, start, end, step) for n in nodes}
    count = 0
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        parts = [out] + [open(Path(tmp) / f"family{i}", "w+") for i in range(1, len(FAMILIES))]
        try:
            for i, (family, kind) in enumerate(FAMILIES):
                parts[i].write(f"# TYPE {family} {kind}\n")
            names = [family + ("_total" if kind == "counter" else "") for family, kind in FAMILIES]
            for w in workloads:
                labels = _labels(by_name[w.node], w)
                samples = list(series_samples(w, by_name[w.node], times[w.node]))
                count += len(samples) * len(FAMILIES)
                for i, name in enumerate(names):
                    head = f"{name}{{{labels}}} "
                    parts[i].writelines([f"{head}{values[i]:.17g} {t:.3f}\n" for t, values in samples])
            for part in parts[1:]:
                part.seek(0)
                shutil.copyfileobj(part, out)
        finally:
            for part in parts[1:]:
                part.close()
    out.write("# EOF\n")
    return count


def backfill(promtool: str, data_dir: Path, nodes: list[Node], workloads: list[Workload], start: float,
             end: float, step: int, work: Path, parts: int = 1) -> int:
    """Write the history as TSDB blocks under ``data_dir`` (Prometheus' --storage.tsdb.path).

    ``parts`` > 1 splits the workloads into that many files converted side by side (blocks
    of different series may overlap in time; Prometheus merges them when it queries).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    chunks = [workloads[i::parts] for i in range(parts)]
    count = 0
    procs = []
    for i, chunk in enumerate(chunks):
        text = work / f"history{i}.om"
        with open(text, "w") as f:
            count += write_openmetrics(f, nodes, chunk, start, end, step, scratch=work)
        out_dir = data_dir if parts == 1 else work / f"blocks{i}"
        procs.append((text, out_dir, subprocess.Popen(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=768h", str(text),
             str(out_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    for text, out_dir, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"promtool failed: {err.decode(errors='replace')[-2000:]}")
        text.unlink()
        if out_dir != data_dir:
            for block in out_dir.iterdir():
                block.rename(data_dir / block.name)
            out_dir.rmdir()
    return count
