"""Incidents from the passes: who filled a GPU, who raised a fault, who was hurt (pure).

`IncidentTracker.observe` is called once per pass with what the pass saw (devices, the
owner, start time and name of every PID, the kernel log's new Xid lines, the XIDs NVML
counted in the pass, each GPU's active health reasons) and returns the incidents the pass
started. It remembers, for a while, which process held which PID when (a process that
raised an Xid is often gone when the line is read, and its PID may already be another's),
which workloads held each GPU at each pass, and each workload's memory on each GPU over the
last minute. docs/INCIDENTS.md says what each kind means and where the inference can be
wrong.

Who held a PID at a kernel-log record's time: each process seen with the PID is a *life*
that begins when the process started (``/proc/<pid>/stat``; where that is unknown, at the
first pass that saw it) and ends no later than the next process with that PID started (or
the first pass that no longer saw it). The record names the life that covers its time,
when exactly one does and no other comes within ``clock_margin`` of it; otherwise the
cause is unknown. A process that started after the record is never named.

Kinds:
- ``memory_exhausted`` (inferred: NVML reports no out-of-memory): the GPU's free memory
  fell under a threshold and, within a window after, a process on it exited or a
  workload's memory on it fell sharply. The victims are affected; the workload whose
  memory grew most over the minute before is the suspected cause. A GPU kept full by
  design (vLLM preallocates ~90%) raises nothing by being full: it takes an exit or a drop.
  One episode of a full GPU is one incident.
- ``xid``: from NVML's XID events or the kernel log's ``NVRM: Xid`` line, which names the
  process for application Xids: its workload caused it (``cause_basis`` ``kernel_log``).
  Without that, an application Xid on a GPU (or MIG instance) that exactly one workload
  held at the time, the agent and host tools such as nvidia-smi aside, names that workload
  (``sole_holder``); on a time-shared GPU the cause stays unknown. Xid 119 names whoever
  made the call (nvidia-smi, the agent), never a cause.
- ``gpu_lost``, ``row_remap_failure``, ``nvlink_errors``, ``stuck_in_driver_call``: when
  that health reason first becomes active on a GPU; every workload on it is affected.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from operator import is_
from typing import Any, Collection, Mapping, Sequence

from exporter.core.escape import for_terminal
from exporter.core.model import UNKNOWN, DeviceSample, Workload
from exporter.health.policy import RULES
from exporter.incidents.incident import (  # noqa: F401 - the engine's names, kept where they were read
    AMEND_MATCH,
    AMEND_WINDOW,
    APPLICATION_XIDS,
    CALLER_XIDS,
    CAUSE_BASES,
    EVENT_REASONS,
    GIB,
    HOST_TOOLS,
    KINDS,
    REASON_KINDS,
    Incident,
    IncidentConfig,
    xid_action,
)
from exporter.incidents.kmsg import normalise_pci_bus_id
from exporter.output.snapshot_json import describe_owner

LIVES_PER_PID = 8
_NO_LIVES: tuple[None] = (None,)
_ATTRIBUTED = ("kubernetes", "slurm")  # `Workload.attributed`, read without a call
_LATE: Any = object()  # `IncidentTracker._amend`: the line came after the amend window


@dataclass
class _Life:
    """One process that held a PID on a GPU, as the passes saw it (times: seconds since
    boot, the passes' clock)."""

    workload: Workload
    start: float | None  # from /proc/<pid>/stat; None where unknown
    first_seen: float
    last_seen: float
    end: float | None = None  # it held the PID no later than this; None: still holds it

    def begin(self) -> float:
        return self.start if self.start is not None else self.first_seen


@dataclass
class _Holders:
    """Who held a GPU over a run of passes that saw the same holders (first to last)."""

    first: float
    last: float
    workloads: frozenset[Workload]
    others: bool  # a process of no workload (not the agent, not a host tool) held it too


@dataclass
class _Gpu:
    """What the tracker keeps of one device between passes."""

    memory: deque  # (now, {workload: bytes}) over the growth window
    pids: frozenset[int] = frozenset()
    holders: tuple[Workload, ...] = ()
    full_since: float | None = None
    last_full: float | None = None
    reported: bool = False
    reasons: frozenset[str] = frozenset()
    passes: deque = field(default_factory=deque)  # _Holders of runs of passes, oldest first
    last_pass: _Seen | None = None  # what the last pass saw of its processes (None: it saw none)
    held_from: dict[int, Workload] | None = None  # the workloads the last run of `passes` was told from


@dataclass
class _Seen:
    """A GPU's processes as the passes saw them (the last pass that did, `number`; their
    PIDs and lives), who held the GPU (`_Holders`) and the memory per workload. A pass whose
    processes are the last pass's (``unchanged`` of `IncidentTracker.observe`) takes this
    on instead of going through them one by one (`IncidentTracker._track`)."""

    number: int
    pids: list[int]
    lives: list[_Life] = field(default_factory=list)
    workloads: dict[int, Workload] = field(default_factory=dict)
    others: bool = False
    work: dict[Workload, int] | None = None


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
        self._pids: dict[int, list[_Life]] = {}  # pid -> the processes that held it, oldest first
        self._open: set[int] = set()  # the pids seen on a GPU at the last pass
        self._recent: deque[Incident] = deque(maxlen=config.history)
        # NVML Xids waiting for the kernel log: (since, key, code, wall, the sole holder then)
        self._held: list[tuple[float, str, int, float, Workload | None]] = []
        self._from_log: dict[tuple[str, int], float] = {}  # (device key, xid) -> when the log named it
        # NVML Xids reported without their line, which a late line may amend (within `AMEND_WINDOW`;
        # the rest are kept to tell a line that comes later still): (since, key, code, incident)
        self._amendable: deque[tuple[float, str, int, Incident]] = deque(maxlen=config.history)
        self.late_lines = 0  # kernel-log lines read after `AMEND_WINDOW`: counted, nothing opened
        self._passes = 0  # passes observed

    def recent(self) -> tuple[Incident, ...]:
        """The incidents remembered, newest first."""
        return tuple(reversed(self._recent))

    def observe(self, now: float, wall: float, devices: Sequence[DeviceSample], owners: Mapping[int, Workload],
                xid_records: Sequence[Any] = (), reasons: Mapping[str, set[str]] | None = None,
                starts: Mapping[int, float] | None = None, comms: Mapping[int, str] | None = None,
                new_xids: Mapping[str, Mapping[str, int]] | None = None,
                unchanged: Collection[str] = frozenset()) -> list[Incident]:
        """Fold one pass in; the incidents it started, oldest first.

        Args:
            now: the pass's time, seconds since boot (``time.monotonic()``: the clock of
                the kernel log's stamps and of process start times).
            wall: the pass's wall-clock time (the incidents' time).
            owners: the workload of each GPU process's PID.
            xid_records: the kernel log's new Xid records (`kmsg.XidRecord`).
            starts: each PID's process start, seconds since boot, where known.
            comms: each PID's process name, where known (host tools are no workload).
            new_xids: per device key, the XID events NVML counted in this pass
                (``Snapshot.new_xids``, the baseline the health stage reads too); a device
                without an entry (its first pass) has none.
            unchanged: keys of the devices whose processes are those of the pass observed
                before, with the same owners, starts and names (``Snapshot.unchanged_processes``,
                which the collector tells); only the caller can know it, and a key it leaves
                out costs a look at each of the device's processes, never a wrong answer.
        """
        new: list[Incident] = []
        self._passes += 1
        instances = self._instances(devices)
        self._track(now, devices, owners, {} if starts is None else starts, {} if comms is None else comms, instances,
                    unchanged)
        for device in devices:
            state = self._gpus.setdefault(device.key, _Gpu(deque()))
            new += self._memory_pass(now, wall, device, state, owners)
        for key, children in instances.items():  # a MIG GPU's workloads are its instances'
            state = self._gpus[key]
            union = list(state.holders)
            for child in children:
                union += [w for w in self._gpus[child.key].holders if w not in union]
            state.holders = tuple(union)
        by_bus = {_bus(d.pci_bus_id): d for d in devices if d.pci_bus_id and not d.gpu_instance} if xid_records else {}
        amended: list[Incident] = []
        for record in xid_records:
            named = by_bus.get(_bus(record.pci_bus_id)) if record.pci_bus_id else None
            if named is None:
                continue
            amendment = self._amend(now, named, record)
            if amendment is _LATE:
                self.late_lines += 1  # NVML's incident of this fault is past amending: counted, nothing opened
            elif amendment is not None:
                amended.append(amendment)
            else:
                new.append(self._from_kernel_log(now, wall, named, record))
        for device in devices:
            state = self._gpus[device.key]
            new += self._nvml_xids(now, wall, device, state, (new_xids or {}).get(device.key, {}))
            new += self._reasons(wall, device, state, (reasons or {}).get(device.key, set()))
        new += self._release_held(now, {d.key: d for d in devices})
        self._forget(now)
        self._recent.extend(new)
        return new + amended

    # -- memory -------------------------------------------------------------------------

    def _memory_pass(self, now: float, wall: float, device: DeviceSample, state: _Gpu,
                     owners: Mapping[int, Workload]) -> list[Incident]:
        if not device.up:
            return []
        seen = state.last_pass  # this pass's (`_track`)
        previous = state.memory[-1][1] if state.memory else {}
        if seen is not None and seen.work is not None:
            # taken on from the last pass, with the same processes and owners (`_track`): the same memory
            work, exited = seen.work, frozenset[int]()
        else:
            work = self._memory_by_workload(device, owners)
            if seen is not None:
                seen.work = work
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
        victims = {w for w in (self._before(pid, now) for pid in exited) if w is not None}
        victims |= {w for w, before in previous.items()
                    if before and work.get(w, 0) <= before * (1 - self.config.drop_ratio)}
        if not victims:
            return []
        state.reported = True
        return [self._exhaustion(wall, device, state, victims)]

    @staticmethod
    def _memory_by_workload(device: DeviceSample, owners: Mapping[int, Workload]) -> dict[Workload, int]:
        """The device's memory per workload, bytes (processes of no workload under theirs)."""
        by_object: dict[int, list] = {}  # summed per workload object first: one hash per workload, not per process
        for p in device.processes:
            owner = owners.get(p.pid, UNKNOWN)
            entry = by_object.get(id(owner))
            if entry is None:
                by_object[id(owner)] = [owner, p.used_memory_bytes or 0]
            else:
                entry[1] += p.used_memory_bytes or 0
        work: dict[Workload, int] = {}
        for owner, used in by_object.values():
            work[owner] = work.get(owner, 0) + used
        return work

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
                        for_terminal(detail), bool(caused), "memory_growth" if caused else "")

    # -- who held what, when ------------------------------------------------------------

    def _track(self, now: float, devices: Sequence[DeviceSample], owners: Mapping[int, Workload],
               starts: Mapping[int, float], comms: Mapping[int, str],
               instances: Mapping[str, list[DeviceSample]], unchanged: Collection[str]) -> None:
        """Each PID's processes (lives) and each GPU's holders at this pass (workloads are
        told apart by identity, one object per workload and pass, rather than hashed). A GPU
        whose processes are the last pass's (``unchanged``) takes on the last pass's
        `_Seen` where nothing else changed (`_seen_again`); the others' processes are gone
        through one by one."""
        seen: set[int] = set()
        pids = self._pids
        held_by: dict[str, tuple[dict[int, Workload], bool]] = {}
        get_owner, get_start, get_comm = owners.get, starts.get, comms.get
        for device in devices:
            if not device.up:
                continue
            state = self._gpus.setdefault(device.key, _Gpu(deque()))
            last_pass = state.last_pass
            if last_pass is not None and device.key in unchanged and self._seen_again(last_pass, seen):
                # The same processes as in the last pass, each still its PID's newest life.
                for life in last_pass.lives:
                    life.last_seen = now
                seen.update(last_pass.pids)
                last_pass.number = self._passes
                held_by[device.key] = (last_pass.workloads, last_pass.others)
                continue
            seen_now = state.last_pass = _Seen(self._passes, [p.pid for p in device.processes])
            workloads: dict[int, Workload] = {}
            others = False
            for pid in seen_now.pids:
                owner = get_owner(pid, UNKNOWN)
                if owner.kind in _ATTRIBUTED:
                    workloads[id(owner)] = owner
                elif not self._host_tool(pid, get_comm(pid, "")):
                    others = True
                if pid in seen:
                    continue
                seen.add(pid)
                start = get_start(pid)
                lives = pids.get(pid)
                last = lives[-1] if lives else None
                if last is not None and last.end is None and last.start == start:
                    last.last_seen = now  # the same process, seen again: the common case
                    if last.workload is not owner and (owner.attributed or not last.workload.attributed):
                        last.workload = owner
                else:
                    self._live(pid, owner, start, now)
                    last = pids[pid][-1]
                seen_now.lives.append(last)
            seen_now.workloads, seen_now.others = workloads, others
            held_by[device.key] = (workloads, others)
        for device in devices:
            if device.key not in held_by:
                continue
            workloads, others = held_by[device.key]
            for child in instances.get(device.key, ()):  # a MIG GPU is held by its instances' holders
                child_workloads, child_others = held_by.get(child.key, ({}, False))
                workloads = {**workloads, **child_workloads}
                others = others or child_others
            state = self._gpus.setdefault(device.key, _Gpu(deque()))
            runs = state.passes
            if runs and workloads is state.held_from and runs[-1].others == others:
                runs[-1].last = now  # the holders of a `_Seen` taken on: the last run's
            else:
                held = frozenset(workloads.values())
                if runs and runs[-1].others == others and runs[-1].workloads == held:
                    runs[-1].last = now
                else:
                    runs.append(_Holders(now, now, held, others))
                state.held_from = workloads
            while runs and runs[0].last < now - self.config.pid_memory:
                runs.popleft()
        for pid in self._open - seen:
            lives = pids.get(pid)
            if lives and lives[-1].end is None:
                lives[-1].end = now  # gone from the GPUs by this pass
        self._open = seen

    def _seen_again(self, last: _Seen, seen: set[int]) -> bool:
        """For a GPU whose processes the caller says are the last pass's, with the same
        owners, starts and names: True when ``last`` is what the pass before saw of them, no
        PID is on an earlier GPU of this pass (``seen``) nor twice on this one, and each
        one's life is still its PID's newest: going through them one by one would change
        nothing but their ``last_seen``."""
        if last.number != self._passes - 1 or len(last.lives) != len(last.pids) or not seen.isdisjoint(last.pids):
            return False
        pids = self._pids
        return all(map(is_, [pids.get(pid, _NO_LIVES)[-1] for pid in last.pids], last.lives))

    @staticmethod
    def _instances(devices: Sequence[DeviceSample]) -> dict[str, list[DeviceSample]]:
        """The MIG instances of each MIG GPU of this pass, by the GPU's key: the GPU's Xids
        (NVML's and the kernel log's name the GPU, not the instance) hit them."""
        by_gpu: dict[tuple[str, int], list[DeviceSample]] = {}
        for d in devices:
            if d.gpu_instance:
                by_gpu.setdefault((d.vendor, d.index), []).append(d)
        if not by_gpu:
            return {}
        return {d.key: by_gpu[(d.vendor, d.index)] for d in devices
                if not d.gpu_instance and (d.vendor, d.index) in by_gpu}

    def _before(self, pid: int, now: float) -> Workload | None:
        """The workload of the process that had ``pid`` before this pass (not one that took
        the pid in it)."""
        for life in reversed(self._pids.get(pid) or ()):
            if life.first_seen < now:
                return life.workload
        return None

    def _host_tool(self, pid: int, comm: str) -> bool:
        return pid == self.config.agent_pid or comm in HOST_TOOLS

    def _live(self, pid: int, owner: Workload, start: float | None, now: float) -> None:
        lives = self._pids.setdefault(pid, [])
        last = lives[-1] if lives else None
        if last is not None and start == last.start and (last.end is None or start is not None):
            # the same process (seen again, or back on a GPU after a while)
            last.last_seen, last.end = now, None
            if owner.attributed or not last.workload.attributed:
                last.workload = owner
            return
        if last is not None:
            # Another process has the PID now. With its start known, the one before held
            # the PID until then at the latest; without it, only until last seen.
            bound = start if start is not None else last.last_seen
            last.end = min(last.end, bound) if last.end is not None else bound
        lives.append(_Life(owner, start, now, now))
        del lives[:-LIVES_PER_PID]

    def _holder(self, pid: int, at: float | None) -> tuple[Workload | None, str]:
        """The workload whose process held ``pid`` at time ``at`` (None where that cannot
        be told), and why not where it cannot."""
        lives = self._pids.get(pid) or []
        if at is None:
            return None, "the record's time is unknown"
        margin = self.config.clock_margin
        covering = [life for life in lives if life.begin() <= at <= (math.inf if life.end is None else life.end)]
        near = [life for life in lives
                if life.begin() - margin <= at <= (math.inf if life.end is None else life.end) + margin]
        if len(covering) == 1 and len(near) == 1:
            return covering[0].workload, ""
        if not near:
            return None, f"no process with pid {pid} was seen on a GPU at the record's time"
        return None, f"pid {pid} changed hands near the record's time"

    def _sole_holder(self, state: _Gpu, at: float | None = None) -> Workload | None:
        """The one workload that held the GPU at ``at`` (the passes just before and after
        it; None: the last two passes), None where there were more, none, or a process of
        no workload."""
        runs = list(state.passes)
        if not runs:
            return None
        if at is None:
            around = runs[-2:] if runs[-1].first == runs[-1].last else runs[-1:]
        else:
            before = [h for h in runs if h.first <= at]
            after = [h for h in runs if h.last >= at]
            if not before or not after:
                return None
            around = [before[-1], after[0]]
        workloads = {w for h in around for w in h.workloads}
        if len(workloads) != 1 or any(h.others for h in around):
            return None
        return next(iter(workloads))

    # -- faults -------------------------------------------------------------------------

    def _from_kernel_log(self, now: float, wall: float, device: DeviceSample, record: Any) -> Incident:
        state = self._gpus.get(device.key) or _Gpu(deque())
        action, description = xid_action(record.xid)
        self._from_log[(device.key, record.xid)] = now
        at = getattr(record, "time", None)
        if at is not None and at > now:
            # logged before it was read: later than this pass only by the clocks' difference
            at = now if at <= now + self.config.clock_margin else None
        caused: tuple[Workload, ...] = ()
        basis = why = ""
        if record.xid in APPLICATION_XIDS:
            owner, why = self._holder(record.pid, at) if record.pid is not None else (None, "")
            if owner is not None and owner.attributed:
                caused, basis = (owner,), "kernel_log"
            elif owner is None:
                sole = self._sole_holder(state, at) if at is not None else None
                if sole is not None:
                    caused, basis = (sole,), "sole_holder"
                    why = f"{why}; {describe_owner(sole)} alone held the GPU then" if why else \
                        f"{describe_owner(sole)} alone held the GPU then"
        affected = tuple(w for w in state.holders if w not in caused)
        who = (f"pid {record.pid} ({record.comm or 'name unknown'})" if record.pid is not None
               else "no process")
        if record.xid in CALLER_XIDS:
            who += ", the caller that noticed, not a cause"
        if why:
            who += f" ({why})"
        detail = for_terminal(f"Xid {record.xid} ({description}) from the kernel log, {who}: {record.text}"[:400])
        return Incident("xid", wall, self.node, device.index, device.uuid, device.gpu_instance, record.xid, action,
                        caused, affected, detail, bool(caused), basis)

    def _nvml_xids(self, now: float, wall: float, device: DeviceSample, state: _Gpu,
                   events: Mapping[str, int]) -> list[Incident]:
        """One incident per XID code NVML counted on the device in this pass (held for the
        kernel log's line where `IncidentConfig.xid_hold` says so)."""
        out = []
        for code_text in events:
            if not code_text.isdigit():
                continue
            code = int(code_text)
            sole = self._sole_holder(state) if code in APPLICATION_XIDS else None
            if self.config.xid_hold > 0:
                self._held.append((now, device.key, code, wall, sole))
            elif (device.key, code) not in self._from_log:
                out.append(self._nvml_incident(wall, device, state, code, sole))
        return out

    def _nvml_incident(self, wall: float, device: DeviceSample, state: _Gpu, code: int,
                       sole: Workload | None) -> Incident:
        action, description = xid_action(code)
        if sole is not None:
            return Incident("xid", wall, self.node, device.index, device.uuid, device.gpu_instance, code, action,
                            (sole,), tuple(w for w in state.holders if w != sole),
                            for_terminal(f"Xid {code} ({description}) from NVML; {describe_owner(sole)} alone held "
                                         "the GPU then"), True, "sole_holder")
        why = "cause unknown"
        if code in APPLICATION_XIDS and len(state.holders) > 1:
            why = "cause unknown: the GPU is shared and no kernel log names the process"
        return Incident("xid", wall, self.node, device.index, device.uuid, device.gpu_instance, code, action, (),
                        state.holders, f"Xid {code} ({description}) from NVML; {why}", False)

    def _release_held(self, now: float, devices: Mapping[str, DeviceSample]) -> list[Incident]:
        out, keep = [], []
        for since, key, code, wall, sole in self._held:
            claimed = self._from_log.get((key, code))
            if claimed is not None and claimed >= since - self.config.xid_hold:
                continue  # the kernel log's line told it, with the process
            if now - since < self.config.xid_hold:
                keep.append((since, key, code, wall, sole))
            elif key in devices:
                incident = self._nvml_incident(wall, devices[key], self._gpus[key], code, sole)
                self._amendable.append((since, key, code, incident))  # its line may still come, late
                out.append(incident)
        self._held = keep
        return out

    def _amend(self, now: float, device: DeviceSample, record: Any) -> Incident | None:
        """The incident NVML's Xid opened without its kernel-log line (``_amendable``), told
        again with the line read late: the same time (and so the same id), the cause the line
        names; `_LATE` where that incident was reported more than `AMEND_WINDOW` ago; None
        where no such incident waits for this line (it opens one of its own)."""
        at = getattr(record, "time", None)
        for i, (since, key, code, incident) in enumerate(self._amendable):
            if key != device.key or code != record.xid:
                continue
            if at is not None and not since - AMEND_MATCH <= at <= since + self.config.clock_margin:
                continue
            del self._amendable[i]
            if now - since > AMEND_WINDOW:
                return _LATE
            told = self._from_kernel_log(now, incident.time, device, record)
            involved = incident.caused_by + tuple(w for w in incident.affected if w not in incident.caused_by)
            amended = replace(told, affected=tuple(w for w in involved if w not in told.caused_by),
                              detail=for_terminal(f"{told.detail} (read {now - since:.0f}s after NVML's Xid)"[:460]),
                              previous=incident)
            self._recent = deque((amended if old is incident else old for old in self._recent),
                                 maxlen=self._recent.maxlen)
            return amended
        return None

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
        for pid in [pid for pid, lives in self._pids.items() if lives[-1].last_seen < horizon]:
            del self._pids[pid]
        for key in [key for key, seen in self._from_log.items() if seen < now - 60.0]:
            del self._from_log[key]

