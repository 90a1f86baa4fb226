"""Incidents from the passes: who filled a GPU, who raised a fault, who was hurt (pure).

`IncidentTracker.observe` is called once per pass with what the pass saw (devices, the
owner of every PID, the kernel log's new Xid lines, each GPU's active health reasons) and
returns the incidents the pass started. It remembers, for a while, which workload held
which PID on which GPU (a process that raised an Xid is often gone when the line is read)
and each workload's memory on each GPU over the last minute. docs/INCIDENTS.md says what
each kind means and where the inference can be wrong.

Kinds:
- ``memory_exhausted`` (inferred: NVML reports no out-of-memory): the GPU's free memory
  fell under a threshold and, within a window after, a process on it exited or a
  workload's memory on it fell sharply. The victims are affected; the workload whose
  memory grew most over the minute before is the suspected cause. A GPU kept full by
  design (vLLM preallocates ~90%) raises nothing by being full: it takes an exit or a drop.
  One episode of a full GPU is one incident.
- ``xid``: from NVML's XID events (cause unknown) or the kernel log's ``NVRM: Xid`` line,
  which names the process for application Xids: its workload caused it. Xid 119 names
  whoever made the call (nvidia-smi, the agent), never a cause.
- ``gpu_lost``, ``row_remap_failure``, ``nvlink_errors``, ``stuck_in_driver_call``: when
  that health reason first becomes active on a GPU; every workload on it is affected.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from exporter.escape import for_terminal
from exporter.health.policy import RULES, XIDS
from exporter.incidents.kmsg import normalise_pci_bus_id
from exporter.model import UNKNOWN, DeviceSample, Workload
from exporter.snapshot_json import describe_owner, rfc3339, workload_json

KINDS = ("memory_exhausted", "xid", "gpu_lost", "row_remap_failure", "nvlink_errors", "stuck_in_driver_call")
REASON_KINDS = ("gpu_lost", "row_remap_failure", "nvlink_errors", "stuck_in_driver_call")
# Xids whose kernel-log line names the process at fault (NVIDIA's XID catalog).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69, 94, 109})
# Xids whose named process is the caller that noticed (nvidia-smi, the agent): not a cause.
CALLER_XIDS = frozenset({119})
GIB = 2**30
# The reasons of the Kubernetes Events an incident posts on its pods.
EVENT_REASONS = frozenset({"GPUMemoryExhausted", "GPUFaultCaused", "GPUFaultAffected"})


@dataclass(frozen=True)
class IncidentConfig:
    """Thresholds (docs/INCIDENTS.md).

    Attributes:
        free_ratio, free_bytes: a GPU is full while its free memory is under the larger.
        window: seconds after the GPU filled within which an exit or drop counts.
        growth_window: seconds before the GPU filled over which growth is measured.
        drop_ratio: a workload's memory falling by this share or more counts as a drop.
        pid_memory: seconds a PID's owner is remembered after its process is gone.
        history: incidents kept in memory (``--incident-history``).
        xid_hold: seconds an NVML Xid waits for the kernel log's line (which names the
            process) before it is reported without it; 0 without a kernel log.
    """

    free_ratio: float = 0.02
    free_bytes: int = GIB
    window: float = 10.0
    growth_window: float = 60.0
    drop_ratio: float = 0.5
    pid_memory: float = 600.0
    history: int = 256
    xid_hold: float = 0.0


@dataclass(frozen=True)
class Incident:
    """One incident (the ``/api/v1/incidents`` entries are `incident_json` of these)."""

    kind: str
    time: float  # wall clock, Unix seconds
    node: str
    gpu: int
    uuid: str
    gpu_instance: str
    xid: int | None
    action: str
    caused_by: tuple[Workload, ...]
    affected: tuple[Workload, ...]
    detail: str
    cause_known: bool


@dataclass
class _Gpu:
    """What the tracker keeps of one device between passes."""

    memory: deque  # (now, {workload: bytes}) over the growth window
    pids: frozenset[int] = frozenset()
    holders: tuple[Workload, ...] = ()
    full_since: float | None = None
    last_full: float | None = None
    reported: bool = False
    xids: Mapping[str, int] | None = None
    reasons: frozenset[str] = frozenset()


def _xid_action(code: int) -> tuple[str, str]:
    rule = XIDS.get(code)
    return (rule.action, rule.description) if rule is not None else ("inspect_hardware", "not in NVIDIA's catalog")


def _bus(text: str) -> str:
    """A PCI bus id as NVML prints it (``00000000:3B:00.0``), for matching a device to the
    kernel log's lines (`kmsg.normalise_pci_bus_id`, which the log's side already went
    through); "" for one that is no PCI address."""
    parts = text.strip().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return ""
    device, _, function = parts[2].partition(".")
    try:
        return normalise_pci_bus_id(parts[0], parts[1], device, function or None)
    except ValueError:
        return ""


class IncidentTracker:
    """Incidents from one pass after another (see the module docstring)."""

    def __init__(self, node: str, config: IncidentConfig = IncidentConfig()):
        self.node = node
        self.config = config
        self._gpus: dict[str, _Gpu] = {}
        self._pids: dict[int, tuple[Workload, str, float]] = {}  # pid -> owner, device key, last seen
        self._recent: deque[Incident] = deque(maxlen=config.history)
        self._held: list[tuple[float, str, int, float]] = []  # NVML Xids waiting: (since, key, code, wall)
        self._from_log: dict[tuple[str, int], float] = {}  # (device key, xid) -> when the log named it

    def recent(self) -> tuple[Incident, ...]:
        """The incidents remembered, newest first."""
        return tuple(reversed(self._recent))

    def observe(self, now: float, wall: float, devices: Sequence[DeviceSample], owners: Mapping[int, Workload],
                xid_records: Sequence[Any] = (), reasons: Mapping[str, set[str]] | None = None) -> list[Incident]:
        """Fold one pass in; the incidents it started, oldest first."""
        new: list[Incident] = []
        by_bus = {_bus(d.pci_bus_id): d for d in devices if d.pci_bus_id and not d.gpu_instance}
        for device in devices:
            state = self._gpus.setdefault(device.key, _Gpu(deque()))
            new += self._memory_pass(now, wall, device, state, owners)
        for record in xid_records:
            named = by_bus.get(_bus(record.pci_bus_id)) if record.pci_bus_id else None
            if named is not None:
                new.append(self._from_kernel_log(now, wall, named, record))
        for device in devices:
            state = self._gpus[device.key]
            new += self._nvml_xids(now, wall, device, state)
            new += self._reasons(wall, device, state, (reasons or {}).get(device.key, set()))
        new += self._release_held(now, {d.key: d for d in devices})
        self._forget(now)
        self._recent.extend(new)
        return new

    # -- memory -------------------------------------------------------------------------

    def _memory_pass(self, now: float, wall: float, device: DeviceSample, state: _Gpu,
                     owners: Mapping[int, Workload]) -> list[Incident]:
        if not device.up:
            return []
        # by owner object first (a container's processes share one): a Workload hashes all
        # its fields, once per owner here rather than once per process
        by_owner: dict[int, list[Any]] = {}
        pids, key = self._pids, device.key
        for p in device.processes:
            owner = owners.get(p.pid, UNKNOWN)
            pids[p.pid] = (owner, key, now)
            entry = by_owner.get(id(owner))
            if entry is None:
                by_owner[id(owner)] = [owner, p.used_memory_bytes or 0]
            else:
                entry[1] += p.used_memory_bytes or 0
        work: dict[Workload, int] = {}
        for owner, used in by_owner.values():
            work[owner] = work.get(owner, 0) + used
        previous = state.memory[-1][1] if state.memory else {}
        exited = state.pids - {p.pid for p in device.processes}
        state.pids = frozenset(p.pid for p in device.processes)
        state.holders = tuple(w for w in work if w.attributed)
        state.memory.append((now, work))
        while state.memory and state.memory[0][0] < now - self.config.growth_window - self.config.window:
            state.memory.popleft()
        total, used = device.memory_total_bytes, device.memory_used_bytes
        if not total or used is None:
            return []
        full = total - used < max(self.config.free_ratio * total, self.config.free_bytes)
        if full:
            state.last_full = now
            if state.full_since is None:
                state.full_since, state.reported = now, False
        elif state.last_full is not None and now - state.last_full > self.config.window:
            state.full_since = state.last_full = None  # the episode is over
        if state.full_since is None or state.reported:
            return []
        victims = {self._pids[pid][0] for pid in exited if pid in self._pids}
        victims |= {w for w, before in previous.items()
                    if before and work.get(w, 0) <= before * (1 - self.config.drop_ratio)}
        if not victims:
            return []
        state.reported = True
        return [self._exhaustion(wall, device, state, victims)]

    def _exhaustion(self, wall: float, device: DeviceSample, state: _Gpu, victims: set[Workload]) -> Incident:
        assert state.full_since is not None
        start = state.full_since - self.config.growth_window
        window = [(t, work) for t, work in state.memory if start <= t <= state.full_since]
        growth: dict[Workload, int] = {}
        if window:
            first, last = window[0][1], window[-1][1]
            growth = {w: last.get(w, 0) - first.get(w, 0) for w in set(first) | set(last) if w.attributed}
        suspect = max(growth.items(), key=lambda kv: kv[1], default=(None, 0))
        caused = (suspect[0],) if suspect[0] is not None and suspect[1] > 0 else ()
        detail = (f"free memory fell under {max(self.config.free_ratio, 0):.0%} (or 1 GiB) and "
                  f"{len(victims)} workload(s) then exited or dropped their memory")
        if caused:
            detail += f"; {describe_owner(caused[0])} grew {suspect[1] / GIB:.1f} GiB over the minute before"
        return Incident("memory_exhausted", wall, self.node, device.index, device.uuid, device.gpu_instance, None,
                        "restart_app", caused, tuple(sorted((w for w in victims if w.attributed), key=describe_owner)),
                        for_terminal(detail), bool(caused))

    # -- faults -------------------------------------------------------------------------

    def _from_kernel_log(self, now: float, wall: float, device: DeviceSample, record: Any) -> Incident:
        state = self._gpus.get(device.key) or _Gpu(deque())
        action, description = _xid_action(record.xid)
        self._from_log[(device.key, record.xid)] = now
        known = self._pids.get(record.pid) if record.pid is not None else None
        owner = known[0] if known is not None else None
        caused: tuple[Workload, ...] = ()
        if record.xid in APPLICATION_XIDS and owner is not None and owner.attributed:
            caused = (owner,)
        affected = tuple(w for w in state.holders if w not in caused)
        who = f"pid {record.pid} ({record.comm})" if record.pid is not None else "no process"
        if record.xid in CALLER_XIDS:
            who += ", the caller that noticed, not a cause"
        detail = for_terminal(f"Xid {record.xid} ({description}) from the kernel log, {who}: {record.text}"[:400])
        return Incident("xid", wall, self.node, device.index, device.uuid, device.gpu_instance, record.xid, action,
                        caused, affected, detail, bool(caused))

    def _nvml_xids(self, now: float, wall: float, device: DeviceSample, state: _Gpu) -> list[Incident]:
        counts = dict(device.xid_errors)
        before, state.xids = state.xids, counts
        if before is None:
            return []
        out = []
        for code_text, count in counts.items():
            if count <= before.get(code_text, 0) or not code_text.isdigit():
                continue
            code = int(code_text)
            if self.config.xid_hold > 0:
                self._held.append((now, device.key, code, wall))
            elif (device.key, code) not in self._from_log:
                out.append(self._nvml_incident(wall, device, state, code))
        return out

    def _nvml_incident(self, wall: float, device: DeviceSample, state: _Gpu, code: int) -> Incident:
        action, description = _xid_action(code)
        return Incident("xid", wall, self.node, device.index, device.uuid, device.gpu_instance, code, action, (),
                        state.holders, f"Xid {code} ({description}) from NVML; cause unknown", False)

    def _release_held(self, now: float, devices: Mapping[str, DeviceSample]) -> list[Incident]:
        out, keep = [], []
        for since, key, code, wall in self._held:
            claimed = self._from_log.get((key, code))
            if claimed is not None and claimed >= since - self.config.xid_hold:
                continue  # the kernel log's line told it, with the process
            if now - since < self.config.xid_hold:
                keep.append((since, key, code, wall))
            elif key in devices:
                out.append(self._nvml_incident(wall, devices[key], self._gpus[key], code))
        self._held = keep
        return out

    def _reasons(self, wall: float, device: DeviceSample, state: _Gpu, active: set[str]) -> list[Incident]:
        new = [r for r in REASON_KINDS if r in active and r not in state.reasons]
        state.reasons = frozenset(active)
        out = []
        for reason in new:
            rule = RULES.get(reason)
            action = rule.action if rule is not None else "inspect_hardware"
            text = rule.text if rule is not None else reason
            out.append(Incident(reason, wall, self.node, device.index, device.uuid, device.gpu_instance, None, action,
                                (), state.holders, for_terminal(text), False))
        return out

    def _forget(self, now: float) -> None:
        horizon = now - self.config.pid_memory
        for pid in [pid for pid, (_, _, seen) in self._pids.items() if seen < horizon]:
            del self._pids[pid]
        for key in [key for key, seen in self._from_log.items() if seen < now - 60.0]:
            del self._from_log[key]


def incident_id(incident: Incident) -> str:
    """A short id, the same for an incident wherever it shows (the JSON, the OTLP log
    records of each workload it involves): a hash of node, GPU, kind, Xid and time."""
    key = "|".join((incident.node, incident.uuid, incident.gpu_instance, incident.kind, str(incident.xid),
                    f"{incident.time:.6f}"))
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def incident_json(incident: Incident, extra_names: Sequence[str] = ()) -> dict[str, Any]:
    """An incident as ``/api/v1/incidents`` serves it (docs/INCIDENTS.md)."""
    return {
        "id": incident_id(incident),
        "kind": incident.kind, "time": incident.time, "time_rfc3339": rfc3339(incident.time),
        "node": incident.node, "gpu": incident.gpu, "uuid": incident.uuid, "gpu_instance": incident.gpu_instance,
        "xid": incident.xid, "action": incident.action,
        "caused_by": [workload_json(w) for w in incident.caused_by],
        "affected": [workload_json(w) for w in incident.affected],
        "cause_known": incident.cause_known, "detail": incident.detail,
    }


def _what(incident: Incident) -> str:
    if incident.kind == "memory_exhausted":
        return "ran out of memory (inferred)"
    if incident.xid is not None:
        _, description = _xid_action(incident.xid)
        return f"raised Xid {incident.xid} ({description}; action: {incident.action.replace('_', ' ')})"
    return f"reported {incident.kind.replace('_', ' ')} (action: {incident.action.replace('_', ' ')})"


def event_messages(incident: Incident) -> list[tuple[Workload, str, str]]:
    """The Kubernetes Events of an incident: (workload, reason, one-line message)."""
    where = f"GPU {incident.gpu} ({incident.uuid}, node {incident.node})"
    what = _what(incident)
    out = []
    exhausted = incident.kind == "memory_exhausted"
    for w in incident.caused_by:
        message = (f"{where} {what}: this container grew most before it filled" if exhausted
                   else f"{where} {what}: this container's process raised it")
        out.append((w, "GPUMemoryExhausted" if exhausted else "GPUFaultCaused", for_terminal(message)))
    suspect = f"; suspected cause: {describe_owner(incident.caused_by[0])}" if incident.caused_by else ""
    for w in incident.affected:
        message = (f"{where} {what} while this container held it{suspect}" if exhausted
                   else f"{where} {what} while this container held it")
        out.append((w, "GPUMemoryExhausted" if exhausted else "GPUFaultAffected", for_terminal(message)))
    return out
