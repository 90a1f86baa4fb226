"""A simulated fleet of training jobs as the agents' series, and the training rules staged for
``promtool tsdb create-blocks-from rules`` (benchmarks/bench_training.py, tests/test_training_dashboard.py).

Jobs of 8 GPUs a node (a fifth of them half H100 and half A100) have events at given times:
a ``wedge`` (every rank busy with no work, the agent's ``container_gpu_stalled`` reading 1
``--stall-after`` later on every rank but the odd one out, which goes idle, vanishes or had
an Xid; the job ends with it), a hardware ``straggler`` (one GPU throttled, slower in clock,
on a narrower PCIe link or replaying), a ``checkpoint``, an ``evaluation``, a ``data_stall``
and a ``restart`` (every pod recreated under a new name). `write_history` writes each
rank's GPU every minute as OpenMetrics text for ``promtool tsdb create-blocks-from
openmetrics``; `staged_rules` splits the rules' 1-minute group into passes, a rule after the
records it reads, its alerts as records of their expressions.
"""

from __future__ import annotations

import random
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "alerts" / "l9gpu-training.rules.yaml"
GROUP = "l9gpu-training"
H100 = ("NVIDIA H100 80GB HBM3", 1980e6)
A100 = ("NVIDIA A100-SXM4-80GB", 1410e6)
IDLE_CLOCK = 345e6
SIZES = ((8, 15), (16, 10), (32, 8), (64, 7), (128, 5), (256, 3), (512, 2))
STRAGGLER_CAUSES = ("thermal", "power_brake", "hw_slowdown", "clock", "pcie_link", "pcie_replays")
QUIET_KINDS = ("checkpoint", "evaluation", "data_stall", "restart")
ODD_MODES = ("idle", "vanished", "xid")
FAMILIES = (  # (family as written, kind); workload families first
    ("container_gpu_allocation_seconds", "counter"), ("container_gpu_stalled", "gauge"),
    ("gpu_utilization_ratio", "gauge"), ("gpu_sm_clock_hertz", "gauge"), ("gpu_temperature_celsius", "gauge"),
    ("gpu_tensor_active_ratio", "gauge"), ("gpu_clock_throttle_active", "gauge"), ("gpu_pcie_link_width", "gauge"),
    ("gpu_pcie_link_width_max", "gauge"), ("gpu_pcie_link_generation", "gauge"),
    ("gpu_pcie_link_generation_max", "gauge"), ("gpu_pcie_replays", "counter"), ("gpu_up", "gauge"),
    ("gpu_xid_errors", "counter"), ("gpu_power_watts", "gauge"),
)


@dataclass
class Event:
    kind: str
    start: int            # minutes from the week's start
    end: int
    rank: int = -1        # the odd rank (wedge) or the slow one (straggler)
    cause: str = ""       # straggler cause, or the odd rank's mode


@dataclass
class Job:
    name: str
    namespace: str
    size: int
    mixed: bool
    start: int
    end: int
    power_capped: bool
    events: list[Event] = field(default_factory=list)

    def model(self, rank: int) -> tuple[str, float]:
        return A100 if self.mixed and rank >= self.size // 2 else H100

    def place(self, rank: int) -> tuple[str, int]:
        return f"{self.name}-n{rank // 8:02d}", rank % 8


def simulate(n_jobs: int, days: int, stall_after_s: int, rng: random.Random) -> list[Job]:
    """The jobs and their events (module doc)."""
    sizes = [size for size, weight in SIZES for _ in range(weight)]
    jobs = []
    for i in range(n_jobs):
        duration = rng.randint(60, 240)
        start = rng.randint(0, days * 1440 - duration - 1)
        job = Job(f"job{i:02d}", rng.choice(("research", "pretrain", "finetune")), rng.choice(sizes),
                  rng.random() < 0.2, start, start + duration, rng.random() < 0.33)
        t = start + rng.randint(5, 20)
        kinds = [rng.choice(QUIET_KINDS) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.6:
            kinds.append("straggler")
        rng.shuffle(kinds)
        if rng.random() < 0.4:
            kinds.append("wedge")  # last: the job is killed at its end
        for kind in kinds:
            length = {"checkpoint": (2, 8), "evaluation": (10, 20), "data_stall": (3, 10), "restart": (1, 3),
                      "straggler": (30, 90), "wedge": (30, 60)}[kind]
            minutes = rng.randint(*length)
            if t + minutes + 15 > job.end and kind != "wedge":
                continue
            event = Event(kind, t, t + minutes)
            if kind == "straggler":
                event.rank, event.cause = rng.randrange(job.size), rng.choice(STRAGGLER_CAUSES)
            if kind == "wedge":
                event.rank, event.cause = rng.randrange(job.size), rng.choice(ODD_MODES)
                event.end = t + minutes
                job.end = event.end
            job.events.append(event)
            t = event.end + rng.randint(15, 30)
            if t >= job.end:
                break
        jobs.append(job)
    return jobs


def rank_state(job: Job, rank: int, m: int, stall_after_m: int, gpu_rng: random.Random) -> dict[str, Any] | None:
    """The agent's readings of one rank's GPU in minute ``m`` (None: no workload series)."""
    model, top = job.model(rank)
    state: dict[str, Any] = {"util": 0.97 + 0.03 * gpu_rng.random(), "tensor": 0.4 + 0.1 * gpu_rng.random(),
                             "power": 0.85, "clock": top, "temp": 0.0, "stalled": 0, "throttle": [], "width": 16, "gen": 5,
                             "replays": 0, "xid": 0, "present": True}
    if job.power_capped:
        state["throttle"].append("sw_power_cap")
    elif gpu_rng.random() < 0.01:
        state["throttle"].append("sw_power_cap")
    if gpu_rng.random() < 0.001:
        state["replays"] = 1
    for e in job.events:
        if not e.start <= m < e.end:
            continue
        if e.kind in ("checkpoint", "data_stall", "restart"):
            state.update(util=0.02 if e.kind != "restart" else 0.0, tensor=0.0, clock=IDLE_CLOCK, temp=-10.0, gen=1,
                         throttle=[], power=0.15)
            state["present"] = e.kind != "restart"
        elif e.kind == "evaluation":
            state.update(util=0.9, tensor=0.08, power=0.5)
        elif e.kind == "straggler" and rank == e.rank:
            slow = {"thermal": ("hw_thermal_slowdown", 0.7, 20), "power_brake": ("hw_power_brake_slowdown", 0.6, 0),
                    "hw_slowdown": ("hw_slowdown", 0.5, 0), "clock": (None, 0.8, 0)}.get(e.cause)
            if slow:
                reason, factor, hotter = slow
                state["clock"] *= factor
                state["temp"] += hotter
                if reason:
                    state["throttle"].append(reason)
            elif e.cause == "pcie_link":
                state["width"] = 8
            elif e.cause == "pcie_replays":
                state["replays"] = 120
        elif e.kind == "wedge":
            state.update(tensor=0.0, throttle=[], util=1.0, power=0.3)
            if rank == e.rank:
                state.update(util=0.0, clock=IDLE_CLOCK, gen=1, power=0.15)
                state["present"] = not (e.cause == "vanished" and m >= e.start + 1)
                state["xid"] = int(e.cause == "xid")
            elif m >= e.start + stall_after_m:
                state["stalled"] = 1
    return state


def write_history(out: IO[str], jobs: list[Job], week_start: int, stall_after_m: int, seed: int) -> int:
    """The agents' series of every job as OpenMetrics text (each family contiguous); returns
    the number of samples."""
    parts = [tempfile.TemporaryFile("w+") for _ in FAMILIES]
    count = 0
    for job in jobs:
        rng = random.Random(f"{seed}-{job.name}")
        nodes = {job.place(r)[0] for r in range(job.size)}
        offsets = {node: rng.randint(0, 50) for node in sorted(nodes)}
        for rank in range(job.size):
            node, gpu = job.place(rank)
            model, top = job.model(rank)
            device = f'node="{node}",gpu="{gpu}",uuid="GPU-{node}-{gpu}",model="{model}"'
            spread = 1.0 - 0.03 * rng.random()
            base_temp = 55 + 15 * rng.random()
            gpu_rng = random.Random(f"{seed}-{job.name}-{rank}")
            alloc = 0.0
            pod_generation = 0
            replays = 0
            xid = 0
            was_present = True
            for m in range(job.start, job.end):
                s = rank_state(job, rank, m, stall_after_m, gpu_rng)
                t = week_start + 60 * m + offsets[node]
                ts = f" {t}\n"
                replays += s["replays"]
                xid = max(xid, s["xid"])
                if s["present"] and not was_present:
                    pod_generation += 1
                    alloc = 0.0
                was_present = s["present"]
                if s["present"]:
                    pod = f"{job.name}-{rank}" + (f"-r{pod_generation}" if pod_generation else "")
                    workload = (f'{device},namespace="{job.namespace}",pod="{pod}",container="trainer",'
                                f'training_job="{job.name}",training_rank="{rank}"')
                    parts[0].write(f"container_gpu_allocation_seconds_total{{{workload}}} {alloc:.0f}{ts}")
                    parts[1].write(f"container_gpu_stalled{{{workload}}} {s['stalled']}{ts}")
                    alloc += 60
                    count += 2
                clock = s["clock"] * (spread if s["clock"] > IDLE_CLOCK else 1.0)
                temp = base_temp + s["temp"] + gpu_rng.random() - 0.5
                rows = ((2, f"gpu_utilization_ratio{{{device}}} {s['util']:.3f}{ts}"),
                        (3, f"gpu_sm_clock_hertz{{{device}}} {clock:.0f}{ts}"),
                        (4, f"gpu_temperature_celsius{{{device}}} {temp:.1f}{ts}"),
                        (7, f"gpu_pcie_link_width{{{device}}} {s['width']}{ts}"),
                        (8, f"gpu_pcie_link_width_max{{{device}}} 16{ts}"),
                        (9, f"gpu_pcie_link_generation{{{device}}} {s['gen']}{ts}"),
                        (10, f"gpu_pcie_link_generation_max{{{device}}} 5{ts}"),
                        (11, f"gpu_pcie_replays_total{{{device}}} {replays}{ts}"),
                        (12, f"gpu_up{{{device}}} 1{ts}"),
                        (14, f"gpu_power_watts{{{device}}} {s['power'] * (700 if model == H100[0] else 400):.0f}{ts}"))
                for i, row in rows:
                    parts[i].write(row)
                count += len(rows)
                if model == H100[0]:
                    parts[5].write(f"gpu_tensor_active_ratio{{{device}}} {s['tensor']:.3f}{ts}")
                    count += 1
                for reason in s["throttle"]:
                    parts[6].write(f'gpu_clock_throttle_active{{{device},reason="{reason}"}} 1{ts}')
                    count += 1
                if xid:
                    parts[13].write(f'gpu_xid_errors_total{{{device},xid="79"}} {xid}{ts}')
                    count += 1
    for (family, kind), part in zip(FAMILIES, parts):
        out.write(f"# TYPE {family} {kind}\n")
        part.seek(0)
        while chunk := part.read(1 << 20):
            out.write(chunk)
        part.close()
    out.write("# EOF\n")
    return count


def staged_rules(alerts_as: str = "bench:{}:pending") -> tuple[list[str], dict[str, str]]:
    """The 1-minute group's rules as stage files (a rule's stage is one more than the latest
    of the records it reads), its alerts as records of their expressions; and each alert's
    ``for``."""
    group = next(g for g in yaml.safe_load(RULES.read_text())["groups"] if g["name"] == GROUP)
    records = {rule["record"] for rule in group["rules"] if "record" in rule}
    stage: dict[str, int] = {}
    staged: dict[int, list[dict[str, str]]] = {}
    waits: dict[str, str] = {}
    for rule in group["rules"]:
        reads = {name for name in re.findall(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["expr"]) if name in records}
        k = 1 + max((stage[name] for name in reads), default=0)
        name = rule.get("record") or alerts_as.format(rule["alert"])
        if "alert" in rule:
            waits[rule["alert"]] = rule.get("for", "0s")
        stage[name] = k
        staged.setdefault(k, []).append({"record": name, "expr": rule["expr"]})
    texts = [yaml.safe_dump({"groups": [{"name": GROUP, "interval": "1m", "rules": staged[k]}]}, sort_keys=False)
             for k in sorted(staged)]
    return texts, waits
