"""``l9gpu snapshot``: one pass of the node, as a table or JSON, for the on-call engineer."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping

from exporter.app.wiring import CLOSE_TIMEOUT, build_collector, close_backends_within, gpm_status, open_sources_within
from exporter.core.escape import for_terminal
from exporter.devices import joined_name
from exporter.devices.capabilities import CallTiming, Timings
from exporter.devices.nvml.gpm import WARMING_UP
from exporter.output.snapshot_json import describe_owner, document_json, duration, snapshot_document
from exporter.stall.messages import signals_text

# `l9gpu snapshot` measures GPM activity over this long (two samples this far apart).
SNAPSHOT_GPM_WINDOW = 1.0
# `l9gpu snapshot` waits this long (seconds) for the API server's pod list, for names (at
# most half its --timeout, so that a hung API server leaves time to read the GPUs).
SNAPSHOT_POD_LIST_WAIT = 10.0
# `l9gpu snapshot` waits at most this long (seconds) for the agent's recent incidents.
INCIDENTS_WAIT = 2.0


def snapshot(args: argparse.Namespace) -> int:
    """Collect once and print the node's GPUs and their processes' owners.

    Where a GPU has GPM, its activity needs two samples: a second pass follows the
    first after `SNAPSHOT_GPM_WINDOW` seconds, and the second pass is printed.
    """
    if args.gpm_interval is not None:
        args.gpm_interval = 0.0  # sample on each of the (at most two) passes
    backends, attributor = open_sources_within(args, args.timeout,
                                        wait_for_pods=min(SNAPSHOT_POD_LIST_WAIT, args.timeout / 2))
    timed: list[Timings] = []
    passes: list[tuple[str, dict[str, CallTiming]]] = []
    collector = None
    try:
        collector, extra_names = build_collector(args, backends, attributor)
        if args.timings:
            timed = [b for b in backends if isinstance(b, Timings) and b.enable_timings()]
        snap = collector.collect_once()
        gpm_warming = any(status == WARMING_UP for status in gpm_status(backends).values())
        if args.timings:
            # The first pass also reads what is read once or on a slow schedule; a steady
            # pass, one interval later (at most a second), is what every pass costs.
            passes.append(("first pass", call_timings(timed)))
        if args.timings or gpm_warming:
            time.sleep(max(min(args.interval, 1.0) if args.timings else 0.0,
                           SNAPSHOT_GPM_WINDOW if gpm_warming else 0.0))
            snap = collector.collect_once()
        if args.timings:
            passes.append(("steady pass", call_timings(timed)))
        statuses = gpm_status(backends)
    finally:
        if collector is not None:
            collector.stop()
        attributor.close()
        close_backends_within(backends, min(args.timeout, CLOSE_TIMEOUT))
    if args.json:
        doc = with_one_pass_stalls(snapshot_document(snap, extra_names, statuses), snap)
        if args.timings:
            doc["timings"] = {name: {call: {"calls": c, "wall_seconds": w, "cpu_seconds": cpu, "max_wall_seconds": m}
                                     for call, (c, w, cpu, m) in calls.items()} for name, calls in passes}
        sys.stdout.write(document_json(doc))
    else:
        source = getattr(args, "incidents_from", "off")
        agent = (ask_node_agent(source, snap.node, min(args.timeout, INCIDENTS_WAIT))
                 if source and source != "off" else None)
        verdicts = agent.health if agent is not None else None
        print(format_table(snap, statuses, verdicts))
        doc = with_one_pass_stalls(snapshot_document(snap, extra_names, statuses), snap)
        if agent is not None:  # "needs a look" lists what the agent's page lists
            for gpu in doc["gpus"]:
                gpu["health"] = (verdicts or {}).get(gpu.get("uuid"), gpu.get("health"))
                gpu["stall"] = (agent.stalls or {}).get((gpu.get("uuid"), gpu.get("gpu_instance", "")), gpu["stall"])
        attention = format_attention(doc)
        if attention:
            print()
            print(attention)
        for call in snap.stuck:  # a stuck GPU is in the table, down; this lists the other parts
            if not call.devices:
                print(f"{call.what}: stuck in {call.call} for {call.seconds:.1f} s")
        print()
        print(format_health_source(agent))
        if agent is not None:
            print(format_incidents(agent.base, agent.incidents, agent.error))
        if args.timings:
            print()
            print(format_timings(passes) if timed else
                  f"no per-call timings for the {joined_name(backends)} backend (NVIDIA's nvml backend has them)")
            if any(name.startswith("nvmlGpm") for _, calls in passes for name in calls):
                print("(nvmlGpm* calls: this snapshot samples GPM on both passes; `l9gpu serve` samples a GPU "
                      "every --gpm-interval)")
    return 0


@dataclass(frozen=True)
class NodeAgent:
    """What the agent serving this node says, read from its API, or why nothing is used.

    Attributes:
        base: its URL (``--incidents-from``).
        incidents: the incidents it remembers, newest first (None: unknown, see ``error``).
        health: its health verdicts (the ``health`` objects of /api/v1/snapshot) by GPU UUID:
            they know each GPU's history, which one pass does not (None: not known).
        stalls: its GPUs' ``stall`` objects (docs/TRAINING.md) by (UUID, MIG instance): how
            long each has been busy with no work, which one pass cannot tell (None: not known).
        error: why its incidents are not shown, in a few words ("" when they are).
    """

    base: str
    incidents: list[dict[str, Any]] | None
    health: dict[str, Any] | None = None
    error: str = ""
    stalls: dict[tuple[str, str], Any] | None = None


def ask_node_agent(base: str, node: str, timeout: float) -> NodeAgent:
    """Read the incidents and health verdicts of the agent at ``base``, if it serves ``node``.

    An agent of another node (a forwarded port, a wrong ``--incidents-from``) is not used:
    its incidents and verdicts are about other GPUs."""
    incidents, error, served = fetch_incidents(base, timeout)
    if incidents is None:
        return NodeAgent(base, None, error=error)
    if served != node:
        return NodeAgent(base, None, error=f"it serves node {served or '(unnamed)'}, not {node}: its incidents and "
                                           "health verdicts are not this node's")
    doc, _ = _fetch_json(base, "/api/v1/snapshot", timeout)
    gpus = doc.get("gpus") if isinstance(doc, dict) and doc.get("node") == node else None
    health = ({gpu["uuid"]: gpu.get("health") for gpu in gpus
               if isinstance(gpu, dict) and isinstance(gpu.get("uuid"), str) and gpu.get("health")}
              if isinstance(gpus, list) else None)
    stalls = ({(gpu["uuid"], str(gpu.get("gpu_instance") or "")): gpu["stall"] for gpu in gpus
               if isinstance(gpu, dict) and isinstance(gpu.get("uuid"), str) and isinstance(gpu.get("stall"), dict)}
              if isinstance(gpus, list) else None)
    return NodeAgent(base, incidents, health=health, stalls=stalls)


def with_one_pass_stalls(doc: dict[str, Any], snap: Any) -> dict[str, Any]:
    """``doc`` with each GPU's ``stall`` object as this one pass reads it (`exporter.stall`):
    ``signature`` where the pass matches, which the node's agent calls stalled only once it
    has lasted --stall-after."""
    from exporter.stall.signature import read
    from exporter.stall.watch import reading_entry

    readings = {(d.uuid, d.gpu_instance): reading_entry(read(d)) for d in snap.devices}
    for gpu in doc["gpus"]:
        gpu["stall"] = readings.get((gpu.get("uuid"), gpu.get("gpu_instance", "")))
    return doc


def format_health_source(agent: NodeAgent | None) -> str:
    """Whose the HEALTH column's verdicts are: the node's agent's, or this one pass's."""
    if agent is not None and agent.health is not None:
        return for_terminal(f"health: the verdicts of the agent at {agent.base}, which knows each GPU's history")
    return "health: from this one pass; a condition that must last (a narrowed PCIe link) is judged by the node's agent"


def _fetch_json(base: str, path: str, timeout: float) -> tuple[Any, str]:
    """``base + path`` read as JSON, or None and why not, in a few words."""
    import json
    import urllib.error
    import urllib.request

    url = base.rstrip("/") + path
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the node's own agent: no proxy
    try:
        with opener.open(url, timeout=timeout) as response:
            doc = json.loads(response.read(8 << 20))
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return None, f"it asks for credentials (HTTP {exc.code}, its --web-config): read {url} with them"
        return None, f"it answered HTTP {exc.code}"
    except urllib.error.URLError as exc:
        reason = exc.reason
        return None, f"no agent answered ({getattr(reason, 'strerror', None) or reason})"
    except (OSError, ValueError) as exc:
        return None, f"no answer it could read ({getattr(exc, 'strerror', None) or exc})"
    return doc, ""


def fetch_incidents(base: str, timeout: float) -> tuple[list[dict[str, Any]] | None, str, str | None]:
    """The incidents the agent at ``base`` remembers (its ``/api/v1/incidents``), newest
    first, or None and why not, in a few words; and the node it serves."""
    doc, error = _fetch_json(base, "/api/v1/incidents", timeout)
    if doc is None:
        return None, error, None
    items = doc.get("incidents") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        return None, "its answer holds no incidents list", None
    node = doc.get("node")
    return [i for i in items if isinstance(i, dict)], "", node if isinstance(node, str) else None


def format_incidents(base: str, items: list[dict[str, Any]] | None, error: str = "",
                     now: float | None = None, limit: int = 10) -> str:
    """The recent incidents block of the table: newest first, one line each (escaped for
    a terminal: names and the driver's text come from the node's users)."""
    if items is None:
        return for_terminal(f"recent incidents: unknown, the agent at {base}: {error}")
    if not items:
        return for_terminal(f"recent incidents (the agent at {base}): none since it started")
    now = time.time() if now is None else now

    def names(key: str) -> str:
        return ", ".join(str(w.get("owner", "")) for w in item.get(key) or ()) or "-"

    lines = [f"recent incidents (the agent at {base}), newest first:"]
    for item in items[:limit]:
        try:
            age = duration(now - float(item.get("time") or now))  # as the page's Incidents panel
        except (TypeError, ValueError):
            age = "?"
        what = str(item.get("kind", "?")) + (f" {item['xid']}" if item.get("xid") is not None else "")
        gpu = f"GPU {item.get('gpu', '?')}" + (f" MIG {item['gpu_instance']}" if item.get("gpu_instance") else "")
        basis = f" ({str(item['cause_basis']).replace('_', ' ')})" if item.get("cause_basis") else ""
        lines.append(f"  {age:>8} ago  {gpu:<6} {what:<18} caused by {names('caused_by')}{basis}; affected "
                     f"{names('affected')}; action {str(item.get('action', '')).replace('_', ' ')}")
    if len(items) > limit:
        lines.append(f"  ({len(items) - limit} older at {base.rstrip('/')}/api/v1/incidents)")
    return "\n".join(for_terminal(line) for line in lines)


def call_timings(backends: list[Timings]) -> dict[str, CallTiming]:
    """What each library call of ``backends`` cost since the last time they were asked."""
    calls: dict[str, CallTiming] = {}
    for part in backends:
        calls.update(part.timings(reset=True))
    return calls


def format_timings(passes: list[tuple[str, dict[str, CallTiming]]]) -> str:
    """What each vendor library call cost in each timed pass, costliest first."""
    lines = []
    for title, calls in passes:
        wall = sum(t[1] for t in calls.values()) * 1e3
        cpu = sum(t[2] for t in calls.values()) * 1e3
        lines.append(f"{title}: {sum(t[0] for t in calls.values())} calls, {wall:.2f} ms wall, {cpu:.2f} ms CPU")
        lines.append(f"  {'CALL':<46}{'CALLS':>6}{'WALL ms':>10}{'CPU ms':>9}{'PER CALL ms':>13}{'MAX ms':>9}")
        for name, (count, w, c, slowest) in sorted(calls.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"  {name:<46}{count:>6}{w * 1e3:>10.3f}{c * 1e3:>9.3f}{w * 1e3 / max(count, 1):>13.3f}"
                         f"{slowest * 1e3:>9.3f}")
    return "\n".join(lines)


def _gpm_line(device: Any, status: str | None) -> str | None:
    """One line of GPM activity for the table, or why there is none."""
    gpm = device.gpm
    if gpm:
        parts = [f"{label} {gpm[key] * 100:.0f}%" for label, key in (
            ("graphics", "graphics_active"), ("sm", "sm_active"), ("occupancy", "sm_occupancy"),
            ("tensor", "tensor_active"), ("dram", "dram_active")) if key in gpm]
        return "       gpm: " + "  ".join(parts)
    if status and status.startswith("unsupported: "):
        return f"       gpm: not available ({status[len('unsupported: '):]})"
    return None


def _owner(row: Any) -> str:
    return describe_owner(row.workload)


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:.1f}"


def _allocations_by_device(snap: Any) -> dict[str, list[Any]]:
    by_device: dict[str, list[Any]] = {}
    for row in getattr(snap, "allocations", ()):
        by_device.setdefault(row.device_key, []).append(row)
    return by_device


def format_table(snap: Any, gpm: Mapping[tuple[int, str], str] | None = None,
                 verdicts: Mapping[str, Any] | None = None) -> str:
    """A plain-text table: one line per GPU, then its GPM activity (or why it has none) and
    one indented line per process and allocation.

    ``verdicts`` are the health verdicts of the agent serving the node, by GPU UUID (the
    ``health`` objects of its /api/v1/snapshot): the HEALTH column shows them. Without them
    it shows this pass's own verdicts, and its title says they are from one pass.

    Process names, pod, namespace and container names and Slurm fields are chosen by the
    node's users, and device names and errors come from the driver: every line is passed
    through `escape.for_terminal`, so a control character is printed as ``\\x1b`` and the
    like, never sent to the operator's terminal.
    """
    title = "HEALTH" if verdicts is not None else "HEALTH (1 PASS)"
    width = max(10, len(title))
    lines = [f"node {snap.node}",
             f"{'GPU':<4} {'MODEL':<28} {'UTIL':>5} {'MEMORY GiB':>14} {'POWER W':>8}  {title:<{width}} PROCESSES",
             f"       {'PID':<12} {'COMMAND':<16} {'MEMORY':>10}  {'SM':>7}  OWNER"]
    by_device: dict[str, list[Any]] = {}
    for row in snap.processes:
        by_device.setdefault(row.device_key, []).append(row)
    allocations = _allocations_by_device(snap)
    for d in snap.devices:
        gpu = f"{d.index}" + (f"/{d.gpu_instance}" if d.gpu_instance else "")
        if not d.up:
            lines.append(f"{gpu:<4} {d.model[:28]:<28} DOWN: {d.error}")
            continue
        util = "-" if d.utilization is None else f"{d.utilization * 100:.0f}%"
        mem = f"{_gib(d.memory_used_bytes)}/{_gib(d.memory_total_bytes)}"
        power = "-" if d.power_watts is None else f"{d.power_watts:.0f}"
        rows = by_device.get(d.key, [])
        verdict = snap.verdicts.get(d.key)
        health = verdict.state if verdict is not None else "-"
        agents = (verdicts or {}).get(d.uuid)
        if isinstance(agents, Mapping) and isinstance(agents.get("state"), str):
            health = agents["state"]
        lines.append(f"{gpu:<4} {d.model[:28]:<28} {util:>5} {mem:>14} {power:>8}  {health:<{width}} {len(rows)}")
        gpm_line = _gpm_line(d, (gpm or {}).get((d.index, d.gpu_instance)))
        if gpm_line:
            lines.append(gpm_line)
        for row in rows:
            sm = "-" if row.sm_utilization is None else f"{row.sm_utilization * 100:.0f}%"
            lines.append(f"       pid {row.pid:<8} {row.comm[:16]:<16} {_gib(row.used_memory_bytes):>6} GiB  "
                         f"sm {sm:>4}  {_owner(row)}")
        for alloc in allocations.get(d.key, []):
            lines.append(f"       allocated to {_owner(alloc)} ({alloc.resource_name} {alloc.device_id})")
    return "\n".join(for_terminal(line) for line in lines)



# GPM: SM this busy with no tensor-core work is worth a look (FP32 where TF32/BF16 would do).
BUSY_SM = 0.5


def format_attention(doc: Mapping[str, Any]) -> str:
    """What needs a look, as on the page: GPUs not healthy (their reasons and the action),
    GPUs down, memory held at 0% SM, GPUs allocated but unused, GPUs stalled (the node's
    agent's word) or busy with no work in this pass, and GPUs busy without tensor-core work
    (where GPM has a sample).

    A snapshot is one or two passes: memory held at 0% SM is what this pass saw (the page
    calls it a zombie after three passes, the ``GPUZombieWorkload`` alert after an hour).
    """
    items: list[str] = []
    for gpu in doc.get("gpus", ()):
        name = _gpu_name(gpu)
        health = gpu.get("health") or {}
        if health.get("state") not in (None, "healthy"):
            reasons = "; ".join(r.get("text", r.get("reason", "")) for r in health.get("reasons", ()))
            items.append(f"{name} is {health['state']} (action: {health.get('action', '').replace('_', ' ')}): "
                         f"{reasons}")
        if not gpu.get("up", True):
            items.append(f"{name} is down: {gpu.get('error') or 'not readable'}")
            continue
        for w in gpu.get("workloads") or ():
            if w.get("zombie"):
                items.append(f"idle holder: {w.get('owner', '')} holds {_gib(w.get('memory_used_bytes'))} GiB on "
                             f"{name} at 0% SM in this pass")
            if w.get("allocated_unused"):
                items.append(f"allocated, unused: {w.get('owner', '')} has {name} allocated and runs nothing on it")
        stall = gpu.get("stall") or {}
        if stall.get("state") == "stalled" and stall.get("headline"):
            items.append(f"stalled: {stall['headline']}")
        elif stall.get("state") in ("signature", "matching"):
            items.append(f"busy with no work in this pass: {name} ({signals_text(stall.get('signals') or {})}); the "
                         "node's agent calls it stalled once it lasts --stall-after (docs/TRAINING.md)")
        gpm = gpu.get("gpm") or {}
        sm, tensor = gpm.get("sm_active"), gpm.get("tensor_active")
        if sm is not None and tensor is not None and sm >= BUSY_SM and tensor == 0:
            items.append(f"busy without tensor cores: {name} SM active {sm * 100:.0f}%, tensor 0% "
                         "(FP32 where TF32 or BF16 would do?)")
    if not items:
        return ""
    return "\n".join(for_terminal(line) for line in ["needs a look:", *(f"  {item}" for item in items)])


def _gpu_name(gpu: Mapping[str, Any]) -> str:
    name = f"GPU {gpu.get('index', '?')}"
    return f"{name} MIG {gpu['gpu_instance']}" if gpu.get("gpu_instance") else name
