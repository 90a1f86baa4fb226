"""Generated Prometheus history of the agent's chargeback counters, with known answers.

A history is nodes (each scraped every `step` seconds from its own offset, with agent
restarts: no samples while down, every counter back at 0 after), their GPUs (a whole GPU,
or a MIG instance with its part of the GPU, present from ``begin`` to ``end``) and
workloads (a series on one GPU of one node from ``begin`` to ``end``, in phases of
constant SM share and power, holding ``share`` of a physical GPU: 1 for a whole GPU, k/N
for k of N time-slicing replicas, 3/7 for a 3g MIG instance). Counters are exact integrals
between samples, as the agent computes them; ``container_gpu_idle_seconds`` grows while SM
is 0 and drops to 0 while computing. Each GPU's ``gpu_capacity_seconds_total`` grows by
its capacity and ``gpu_unallocated_seconds_total`` by what its workloads did not hold.
Phase changes, births and restarts fall on a node's sample times, so every figure a
report should give is simple arithmetic on the scenario (the tests write it out).

Inference engines (`EngineCounters`) write their token counters as the engine names them
(vLLM's and SGLang's counters, Triton's histogram ``_sum``), scraped every ``step``
seconds from ``offset``, in phases of constant tokens per second; an engine restart
(``down``: no samples, and the counters back at 0 at the first sample after) loses what it
would have served meanwhile.

`write_openmetrics` writes the OpenMetrics text that ``promtool tsdb
create-blocks-from openmetrics`` turns into TSDB blocks (`exporter.report.backfill`, which
``make demo-report`` uses too); `backfill` does both.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

from exporter.report.backfill import create_blocks, finish_blocks

FAMILIES = (
    ("container_gpu_usage_seconds", "counter"),
    ("container_gpu_allocation_seconds", "counter"),
    ("container_gpu_energy_joules", "counter"),
    ("container_gpu_idle_seconds", "gauge"),
)
DEVICE_FAMILIES = ("gpu_capacity_seconds", "gpu_unallocated_seconds")  # counters
STALLED_FAMILY = "container_gpu_stalled"  # gauge, 0/1, for the workloads with ``stalled`` intervals
LABEL_ORDER = ("node", "gpu", "uuid", "model", "gpu_instance", "namespace", "pod", "container", "pod_uid",
               "slurm_job_id", "training_job", "training_rank", "owner_kind", "owner_name", "slurm_user",
               "slurm_account")


@dataclass
class Device:
    """One GPU, or one MIG instance (``gpu_instance``) or MIG-mode parent (``capacity`` < 1)."""

    gpu: int
    capacity: float = 1.0
    gpu_instance: str = ""
    begin: float = float("-inf")
    end: float = float("inf")


@dataclass
class Node:
    name: str
    model: str
    offset: int = 0                                   # first sample at start + offset
    down: list[tuple[float, float]] = field(default_factory=list)  # (last sample before, first sample after)
    devices: list[Device] = field(default_factory=list)  # GPU series (none: workload series only)


@dataclass
class Workload:
    node: str
    gpu: int
    labels: dict[str, str]
    begin: float
    end: float
    phases: list[tuple[float, float, float]]          # (from time, SM share, watts), sorted, first at begin
    share: float = 1.0                                # GPU-seconds allocated per second
    gpu_instance: str = ""                            # the MIG instance it runs on
    # (from, until) while the agent calls its GPU stalled; None: no container_gpu_stalled series
    stalled: list[tuple[float, float]] | None = None


@dataclass
class EngineCounters:
    """One engine's token series for one model in one pod (labels: namespace, pod, the
    engine's own), counted in ``prompt`` and ``generated`` families as the engine names
    them; ``histogram``: they are the ``_sum`` of histograms (Triton), else counters."""

    labels: dict[str, str]
    prompt: str                                        # family, e.g. vllm:prompt_tokens
    generated: str
    begin: float
    end: float
    phases: list[tuple[float, float, float]]           # (from time, prompt/s, generated/s)
    histogram: bool = False
    step: int = 60
    offset: int = 0
    down: list[tuple[float, float]] = field(default_factory=list)  # (last sample before, first sample after)
    generated_labels: dict[str, str] | None = None     # where the generated family's labels differ


def engine_samples(e: EngineCounters, start: float, end: float) -> Iterable[tuple[float, float, float]]:
    """(t, prompt tokens, generated tokens) at each of the engine's samples."""
    prompt = generated = 0.0
    prev = None
    t = start + e.offset
    while t <= end:
        if e.begin <= t <= e.end and not any(a < t < b for a, b in e.down):
            if prev is not None and any(prev <= a and b <= t for a, b in e.down):
                prompt = generated = 0.0   # the engine restarted: counters from 0
            elif prev is not None:
                rate_p = rate_g = 0.0
                for since, p, g in e.phases:
                    if since <= prev:
                        rate_p, rate_g = p, g
                prompt += rate_p * (t - prev)
                generated += rate_g * (t - prev)
            yield t, prompt, generated
            prev = t
        t += e.step


def _write_engines(out: IO[str], engines: list[EngineCounters], start: float, end: float) -> int:
    """Each engine family, contiguous; a histogram's count and +Inf bucket beside its sum."""
    families: dict[str, list[tuple[EngineCounters, int]]] = {}
    for e in engines:
        families.setdefault(e.prompt, []).append((e, 1))
        families.setdefault(e.generated, []).append((e, 2))
    count = 0
    for family, members in families.items():
        histogram = members[0][0].histogram
        out.write(f"# TYPE {family} {'histogram' if histogram else 'counter'}\n")
        for e, index in members:
            own = e.generated_labels if index == 2 and e.generated_labels is not None else e.labels
            labels = ",".join(f'{k}="{v}"' for k, v in own.items())
            rows = list(engine_samples(e, start, end))
            count += len(rows)
            if not histogram:
                out.writelines([f"{family}_total{{{labels}}} {row[index]:.17g} {row[0]:.3f}\n" for row in rows])
                continue
            for row in rows:
                requests = int(row[index] // 400)
                out.write(f'{family}_bucket{{{labels},le="+Inf"}} {requests} {row[0]:.3f}\n'
                          f"{family}_count{{{labels}}} {requests} {row[0]:.3f}\n"
                          f"{family}_sum{{{labels}}} {row[index]:.17g} {row[0]:.3f}\n")
    return count


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
            alloc += w.share * dt
            energy += watts * dt
            idle = idle + dt if sm == 0 else 0.0
        yield t, (usage, alloc, energy, idle)
        prev = t


def _uuid(node: Node, gpu: int, gpu_instance: str) -> str:
    return f"MIG-{node.name}-{gpu}-{gpu_instance}" if gpu_instance else f"GPU-{node.name}-{gpu}"


def _labels(node: Node, w: Workload | Device) -> str:
    labels = {"node": node.name, "gpu": str(w.gpu), "uuid": _uuid(node, w.gpu, w.gpu_instance), "model": node.model,
              "gpu_instance": w.gpu_instance, **getattr(w, "labels", {})}
    ordered = [k for k in LABEL_ORDER if k in labels] + sorted(k for k in labels if k not in LABEL_ORDER)
    return ",".join(f'{k}="{labels[k]}"' for k in ordered if labels[k] != "")


def device_samples(device: Device, node: Node, workloads: list[Workload], times: list[float]
                   ) -> Iterable[tuple[float, tuple[float, float]]]:
    """(t, (capacity, unallocated)) at every sample while the GPU is there: per interval its
    capacity, less what the workloads on it held (those with samples at both ends)."""
    mine = [w for w in workloads if w.node == node.name and w.gpu == device.gpu
            and w.gpu_instance == device.gpu_instance]
    capacity = unallocated = 0.0
    prev = None
    for t in times:
        if t < device.begin or t > device.end:
            continue
        if prev is not None and any(prev <= a and b <= t for a, b in node.down):
            capacity = unallocated = 0.0   # the agent restarted: counters from 0
        elif prev is not None:
            dt = t - prev
            held = sum(w.share for w in mine if w.begin <= prev and t <= w.end)
            capacity += device.capacity * dt
            unallocated += (device.capacity - held) * dt
        yield t, (capacity, unallocated)
        prev = t


def write_openmetrics(out: IO[str], nodes: list[Node], workloads: list[Workload], start: float, end: float,
                      step: int, scratch: Path | None = None, held: list[Workload] | None = None,
                      gpu_series: bool = True, engines: list[EngineCounters] | None = None) -> int:
    """The history as OpenMetrics text; returns the number of samples.

    Each family must be contiguous, so the samples of the later families wait in files under
    ``scratch`` (a temporary directory by default) rather than in memory. The GPU series
    (with ``gpu_series``) account for the holdings of ``held`` (default ``workloads``);
    ``engines``' token series follow.
    """
    held = workloads if held is None else held
    by_name = {n.name: n for n in nodes}
    times = {n.name: sample_times(n, start, end, step) for n in nodes}
    count = 0
    families = ([(family, kind) for family, kind in FAMILIES] + [(family, "counter") for family in DEVICE_FAMILIES]
                + [(STALLED_FAMILY, "gauge")])
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        parts = [out] + [open(Path(tmp) / f"family{i}", "w+") for i in range(1, len(families))]
        try:
            for i, (family, kind) in enumerate(families):
                parts[i].write(f"# TYPE {family} {kind}\n")
            names = [family + ("_total" if kind == "counter" else "") for family, kind in families]
            for w in workloads:
                labels = _labels(by_name[w.node], w)
                samples = list(series_samples(w, by_name[w.node], times[w.node]))
                count += len(samples) * len(FAMILIES)
                for i, name in enumerate(names[:len(FAMILIES)]):
                    head = f"{name}{{{labels}}} "
                    parts[i].writelines([f"{head}{values[i]:.17g} {t:.3f}\n" for t, values in samples])
                if w.stalled is not None:
                    count += len(samples)
                    parts[-1].writelines([f"{STALLED_FAMILY}{{{labels}}} {int(any(a <= t < b for a, b in w.stalled))} "
                                          f"{t:.3f}\n" for t, _ in samples])
            for node in nodes if gpu_series else ():
                for device in node.devices:
                    labels = _labels(node, device)
                    device_rows = list(device_samples(device, node, held, times[node.name]))
                    count += len(device_rows) * len(DEVICE_FAMILIES)
                    for i, name in enumerate(names[len(FAMILIES):len(FAMILIES) + len(DEVICE_FAMILIES)]):
                        head = f"{name}{{{labels}}} "
                        parts[len(FAMILIES) + i].writelines(
                            [f"{head}{values[i]:.17g} {t:.3f}\n" for t, values in device_rows])
            for part in parts[1:]:
                part.seek(0)
                shutil.copyfileobj(part, out)
        finally:
            for part in parts[1:]:
                part.close()
    count += _write_engines(out, engines or [], start, end)
    out.write("# EOF\n")
    return count


def backfill(promtool: str, data_dir: Path, nodes: list[Node], workloads: list[Workload], start: float,
             end: float, step: int, work: Path, parts: int = 1, engines: list[EngineCounters] | None = None) -> int:
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
        with open(text, "w") as f:  # the GPU series once, in the first part
            count += write_openmetrics(f, nodes, chunk, start, end, step, scratch=work, held=workloads,
                                       gpu_series=i == 0, engines=engines if i == 0 else None)
        out_dir = data_dir if parts == 1 else work / f"blocks{i}"
        procs.append((text, out_dir, create_blocks(promtool, text, out_dir)))
    for text, out_dir, proc in procs:
        finish_blocks(proc)
        text.unlink()
        if out_dir != data_dir:
            for block in out_dir.iterdir():
                block.rename(data_dir / block.name)
            out_dir.rmdir()
    return count
