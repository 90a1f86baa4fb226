"""State that needs memory across passes, as pure transitions.

`step(state, ...)` takes the previous `DeriveState` and one pass's inputs (the device
samples, each PID's owner, and ``now``) and returns the next state plus what the
snapshot shows: the monotonic device energy counters, per (GPU, workload) usage and
counters, and per GPU the part that belongs to no workload. Nothing here reads a clock
or does I/O, so every rule is tested with plain values.

Energy split (documented for operators in docs/ATTRIBUTION.md): per GPU and pass, with
ΔE the device's energy delta and u_p each process's SM share (0-1),
  busy = min(1, Σ u_p);  busy energy ΔE·busy is split in proportion to u_p;
  idle energy ΔE·(1 - busy) is split in proportion to each process's memory;
  with no process memory (or no processes) the idle energy is unattributed.
When a device reports no per-process utilisation, all of ΔE is split by memory; when it
reports neither utilisation nor memory per process (Gaudi), the processes holding the
device share ΔE equally.
Each process's part goes to its workload, or to the GPU's unattributed bucket. The parts
add up to ΔE exactly (up to float rounding), which the tests hold.
Where one owner holds a GPU and its per-process samples were not read
(`DeviceSample.sm_share_from_device`), the owner's SM share is the device's utilisation:
it is busy for ΔE·busy with busy = that utilisation, idle (and holding memory) for the rest,
so with memory it gets all of ΔE, as it would from per-process samples whatever they said.

Who owns a GPU's processes is decided once per GPU and pass (`process_groups`): the
groups that get workload series, the unattributed rest, and whether one workload runs
every process there (`WorkloadUsage.sole_owner`: device-wide values such as GPM can then
carry its labels).

Allocations (kubelet pod-resources, `AllocationRow`) add no memory and no energy: they
only say which containers hold a GPU through the device plugin. A container with a GPU
allocated gets workload series on it even with no process there (0 processes, 0 memory,
0 utilisation, energy share 0), and its idle time counts while it is allocated or holds
memory with zero SM: "allocated and unused" is idle from the moment of allocation.

GPU time (docs/CHARGEBACK.md, "How a GPU's time is split"): per GPU and pass, the device's
capacity seconds (`DeviceSample.capacity` x dt) are cut between its holders by
`split_time`, and what nobody holds is the GPU's unallocated time, so that per GPU
  sum of holders' allocation seconds + unallocated seconds = capacity seconds,
exactly like memory and energy. A GPU that is down is held by nobody that pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import is_
from typing import Mapping, NamedTuple, Sequence

from exporter.collect.splits import EnergyWeights, advance_energy, energy_weights, split_energy_by, split_time
from exporter.core.labels import Labeller, default_labeller, device_label_values, workload_key
from exporter.core.model import (
    UNKNOWN,
    AllocationRow,
    DeviceSample,
    ProcessSample,
    Unattributed,
    Workload,
    WorkloadUsage,
)
from exporter.core.process_groups import OwnerGroup, ProcessGroups, group_processes

# A workload's counters are kept per (device key, series label values).
WorkloadKey = tuple[str, tuple[str, ...]]


class WorkloadCounters(NamedTuple):
    """What `step` remembers of one workload on one GPU (a named tuple: one is made per
    workload, GPU and pass).

    Attributes:
        workload: the owner as last seen (for the grace period, when no process names it).
        usage_seconds: None until the device first reports an SM share for the workload's
            processes: a Gaudi workload never gets one, so its usage series stays absent
            instead of reading 0.
        energy_joules: None until the device first reports an SM share or memory for them.
    """

    usage_seconds: float | None = None
    allocation_seconds: float = 0.0
    energy_joules: float | None = None
    idle_since: float | None = None
    last_seen: float = 0.0
    workload: Workload = UNKNOWN


_NO_COUNTERS = WorkloadCounters()  # a workload's counters before its first pass


@dataclass(frozen=True)
class DeriveState:
    """Everything `step` remembers between passes."""

    last_now: float | None = None
    energy_raw: Mapping[str, float] = field(default_factory=dict)
    energy_total: Mapping[str, float] = field(default_factory=dict)
    unattributed_energy: Mapping[str, float] = field(default_factory=dict)
    workloads: Mapping[WorkloadKey, WorkloadCounters] = field(default_factory=dict)
    capacity: Mapping[str, float] = field(default_factory=dict)
    unallocated: Mapping[str, float] = field(default_factory=dict)
    layouts: Mapping[str, DeviceLayout] = field(default_factory=dict)


class DeviceLayout(NamedTuple):
    """Who runs what on one GPU in a pass: its processes grouped by owner
    (`group_processes`), kept for the next pass. Most passes see the same processes with
    the same owner objects as the last, and then take the groups (and their label values)
    from here instead of grouping and labelling again.

    Attributes:
        device_labels: the GPU's label values the groups' labels start with.
        labeller: what made the groups' labels.
        pids: the GPU's PIDs, in process order.
        owners: each PID's owner object (None where unknown), held so that their
            identities cannot be taken by other objects while the layout is kept.
        groups: the processes by owner.
        holdings: what `split_device` worked out from the processes' samples last (one
            `_Holdings` or none): a pass whose processes tuple is the same object takes it.
    """

    device_labels: tuple[str, ...]
    labeller: Labeller
    pids: list[int]
    owners: list[Workload | None]
    groups: ProcessGroups
    holdings: list[_Holdings]


class _Holdings(NamedTuple):
    """What a GPU's processes hold, apart from this pass's energy: for the processes tuple
    (`DeviceSample.processes`) and SM-share source it was worked out for.

    Attributes:
        processes, share_from_device, utilization: what it was worked out for.
        energy: the processes' (SM share, memory) as `split_energy_by` splits energy by them
            (``holders_only``: the device reports neither for any process).
        groups: per group of `DeviceLayout.groups` (memory, SM share summed at most 1,
            energy known, holds the GPU), as `_holding` says.
        plan: the `_SplitPlan` `split_device` worked out from these last (one or none).
    """

    processes: tuple[ProcessSample, ...]
    share_from_device: bool
    utilization: float | None
    energy: EnergyWeights
    groups: list[tuple[int | None, float | None, bool, bool]]
    plan: list[_SplitPlan]


class _SplitPlan(NamedTuple):
    """How `split_device` cuts a GPU between its holders, apart from this pass's energy and
    seconds: for one `_Holdings` and the allocations it was worked out with.

    Attributes:
        known_allocations, allocated_here, replicas: the allocations it was worked out with.
        running: per group with processes (labels, owner, processes, memory, SM share,
            energy known, allocated, held, the group's process places, its fraction of the
            GPU's time or None where it takes no part in the time split).
        idle: per container allocated the GPU and running nothing there (labels, fraction of
            the GPU's time or None).
        free: the fraction of the GPU's time nobody holds.
        sole: the GPU has one running holder, owner of every process.
        rest_memory: what the processes no workload owns hold (bytes; None where unknown).
    """

    known_allocations: bool
    allocated_here: dict[tuple[str, ...], tuple[Workload, set[str]]]
    replicas: int | None
    running: list[tuple[tuple[str, ...], Workload, int, int | None, float | None, bool, bool | None, bool,
                        tuple[int, ...], float | None]]
    idle: list[tuple[tuple[str, ...], float | None]]
    free: float
    sole: bool
    rest_memory: int | None


@dataclass(frozen=True)
class Derived:
    """What one pass contributes to the snapshot."""

    device_energy_joules: Mapping[str, float]
    workloads: tuple[WorkloadUsage, ...]
    unattributed: tuple[Unattributed, ...]
    unattributed_processes: int
    device_capacity_seconds: Mapping[str, float] = field(default_factory=dict)


class _Pass:
    """What one pass looks up more than once: label values and workloads by owner object.

    A workload's identity (`workload_key`) names one `Workload` per pass: the owner
    of its first process on the node (devices in order), so every GPU's usage of it
    carries the same object (a Slurm job's step is the one it first runs on the node); a
    container allocated a GPU it runs nothing on, and no process before, is its
    allocation's.
    """

    def __init__(self, node: str, labeller: Labeller, owners: Mapping[int, Workload],
                 allocations: Sequence[AllocationRow] | None, layouts: Mapping[str, DeviceLayout]):
        self.node = node
        self.labeller = labeller
        self.owners = owners
        self._last_layouts = layouts
        self.layouts: dict[str, DeviceLayout] = {}  # this pass's, for the next
        self.known_allocations = allocations is not None
        self._labels: dict[int, tuple[str, ...]] = {}
        self._workloads: dict[tuple[str, ...], Workload] = {}
        self.allocated_to: dict[str, list[AllocationRow]] = {}
        for row in allocations or ():
            if row.workload.attributed:
                self.allocated_to.setdefault(row.device_key, []).append(row)

    def labels(self, owner: Workload) -> tuple[str, ...]:
        """The owner's label values after the device labels, once per owner object in a
        pass (the objects live through the pass, so their ids are stable)."""
        labels = self._labels.get(id(owner))
        if labels is None:
            labels = self._labels[id(owner)] = self.labeller(owner)
        return labels

    def layout(self, device: DeviceSample, device_labels: tuple[str, ...]) -> DeviceLayout:
        """The GPU's processes by owner: the last pass's layout where the GPU has the same
        PIDs with the same owner objects (and labels), else `group_processes` afresh."""
        pids = [p.pid for p in device.processes]
        get = self.owners.get
        owners = [get(pid) for pid in pids]
        last = self._last_layouts.get(device.key)
        if (last is not None and last.pids == pids and last.device_labels == device_labels
                and last.labeller is self.labeller and all(map(is_, owners, last.owners))):
            layout = last
        else:
            groups = group_processes(device, self.owners, lambda owner: device_labels + self.labels(owner))
            layout = DeviceLayout(device_labels, self.labeller, pids, owners, groups, [])
        self.layouts[device.key] = layout
        return layout

    def workload(self, owner: Workload, runs: bool = True) -> Workload:
        """The pass's one `Workload` with the owner's identity. Ask for process owners
        (``runs``) in process order, devices in order: the first one asked for is it."""
        if runs:
            return self._workloads.setdefault(workload_key(owner), owner)
        return self._workloads.get(workload_key(owner), owner)


class HolderShare(NamedTuple):
    """What one workload holds of one GPU in a pass, before its counters advance.

    Attributes:
        labels: its series label values (device labels first).
        workload: its owner.
        processes: its processes on the GPU (0 for a container allocated the GPU and
            running nothing there).
        memory: their memory, bytes (None where the device reports none per process).
        utilization: their SM share summed, at most 1 (None where the device reports none).
        energy: their part of this pass's energy delta, joules.
        energy_known: whether the device reported something to split energy by.
        allocated: whether the kubelet allocated it this GPU (None where unknown).
        held: it holds memory (or, where memory is unknown, runs a process) on the GPU.
        allocation_seconds: its part of the GPU's capacity seconds this pass.
        sole_owner: it runs every process on the GPU.
    """

    labels: tuple[str, ...]
    workload: Workload
    processes: int
    memory: int | None
    utilization: float | None
    energy: float
    energy_known: bool
    allocated: bool | None
    held: bool
    allocation_seconds: float = 0.0
    sole_owner: bool = False


class DeviceSplit(NamedTuple):
    """One GPU's pass cut between its holders and nobody.

    Attributes:
        running: the workloads with processes on it, in the order of their first process.
        idle_allocated: the containers allocated it that run nothing there.
        rest_processes, rest_memory, rest_energy: what no workload owns (processes,
            bytes or None where the device reports no per-process memory, joules).
        unallocated_seconds: the part of its capacity seconds no holder holds.
    """

    running: tuple[HolderShare, ...]
    idle_allocated: tuple[HolderShare, ...]
    rest_processes: int
    rest_memory: int | None
    rest_energy: float
    unallocated_seconds: float


def _process_sm_shares(device: DeviceSample) -> list[float | None]:
    """Each process's SM share; where the pass found one owner (`has_one_owner`) and read
    its share off the device, the device's utilisation on its first process (so the energy split gives the owner all of
    ΔE·busy and, holding memory, the rest)."""
    procs = device.processes
    if device.sm_share_from_device and procs and device.utilization is not None:
        return [device.utilization] + [None] * (len(procs) - 1)
    return [p.sm_utilization for p in procs]


def _allocations_here(ctx: _Pass, device: DeviceSample, dev_labels: tuple[str, ...]
                      ) -> tuple[dict[tuple[str, ...], tuple[Workload, set[str]]], int | None]:
    """The containers the kubelet allocated this GPU, by labels, with the ids each holds
    (one entry per container however many it was given), and how many the kubelet can
    allocate on it."""
    allocated: dict[tuple[str, ...], tuple[Workload, set[str]]] = {}
    replicas: int | None = None
    for row in ctx.allocated_to.get(device.key, ()):
        entry = allocated.setdefault(dev_labels + ctx.labels(row.workload), (row.workload, set()))
        entry[1].add(row.device_id)
        if row.replicas is not None:
            replicas = max(replicas or 0, row.replicas)
    return allocated, replicas


# A `HolderShare`'s fields before the time split (all but allocation_seconds and sole_owner).
_Holding = tuple[tuple[str, ...], Workload, int, int | None, float | None, float, bool, bool | None, bool]


def _holding(group: OwnerGroup, procs: Sequence[ProcessSample], sms: Sequence[float | None], holders_only: bool
             ) -> tuple[int | None, float | None, bool, bool]:
    """What a group of processes holds of the GPU apart from energy: (memory, SM share
    summed at most 1, whether its energy share is known, whether it holds the GPU)."""
    memory: int | None = None  # stays None when the device reports no per-process memory
    util_sum: float | None = None
    energy_known = holders_only
    for i in group.members:
        used, sm = procs[i].used_memory_bytes, sms[i]
        if used is not None:
            memory = used if memory is None else memory + used
            energy_known = True
        if sm is not None:
            util_sum = sm if util_sum is None else util_sum + sm
            # An energy share needs an SM share or memory; without either the device's
            # energy went to the unattributed bucket (split_energy), not to this workload.
            energy_known = True
    # Holding the GPU: memory on it, or (where memory is unknown) a process on it.
    held = memory > 0 if memory is not None else True
    return memory, None if util_sum is None else min(1.0, util_sum), energy_known, held


def _holdings(device: DeviceSample, layout: DeviceLayout) -> _Holdings:
    """The GPU's `_Holdings`: the layout's, where worked out for these processes, else afresh."""
    procs = device.processes
    last = layout.holdings[0] if layout.holdings else None
    if (last is not None and last.processes is procs and last.share_from_device == device.sm_share_from_device
            and last.utilization == device.utilization):
        return last
    sms = _process_sm_shares(device)
    weights = energy_weights([(sm, p.used_memory_bytes) for sm, p in zip(sms, procs)])
    holdings = _Holdings(procs, device.sm_share_from_device, device.utilization, weights,
                         [_holding(group, procs, sms, weights.holders_only) for group in layout.groups.groups], [])
    layout.holdings[:] = [holdings]
    return holdings


def split_device(ctx: _Pass, device: DeviceSample, delta: float, device_seconds: float) -> DeviceSplit:
    """Cut one GPU's pass (energy ``delta`` joules, ``device_seconds`` capacity seconds)
    between its holders and nobody: processes by owner, energy by `split_energy_by`, time by
    `split_time`. Who holds what is worked out once per `_Holdings` and allocations
    (`_split_plan`); a pass adds its energy and seconds."""
    dev_labels = device_label_values(ctx.node, device)
    layout = ctx.layout(device, dev_labels)
    holdings = _holdings(device, layout)
    parts, nobody = split_energy_by(delta, holdings.energy)
    allocated_here, replicas = _allocations_here(ctx, device, dev_labels)
    plan = holdings.plan[0] if holdings.plan else None
    if (plan is None or plan.known_allocations != ctx.known_allocations or plan.replicas != replicas
            or plan.allocated_here != allocated_here):
        plan = _split_plan(ctx, layout.groups, holdings, device.processes, allocated_here, replicas)
        holdings.plan[:] = [plan]
    sole = plan.sole
    running: list[HolderShare] = []
    for labels, owner, processes, memory, utilization, energy_known, allocated, held, members, fraction in plan.running:
        energy = 0.0
        for i in members:
            energy += parts[i]
        running.append(HolderShare(labels, ctx.workload(owner), processes, memory, utilization, energy, energy_known,
                                   allocated, held, 0.0 if fraction is None else fraction * device_seconds, sole))
    idle = tuple(HolderShare(labels, ctx.workload(allocated_here[labels][0], runs=False), 0, 0, 0.0, 0.0, False, True,
                             False, 0.0 if fraction is None else fraction * device_seconds, False)
                 for labels, fraction in plan.idle)
    rest = layout.groups.rest
    rest_energy = nobody
    for i in rest:
        rest_energy += parts[i]
    return DeviceSplit(tuple(running), idle, len(rest), plan.rest_memory, rest_energy, plan.free * device_seconds)


def _split_plan(ctx: _Pass, groups: ProcessGroups, holdings: _Holdings, procs: Sequence[ProcessSample],
                allocated_here: dict[tuple[str, ...], tuple[Workload, set[str]]], replicas: int | None) -> _SplitPlan:
    """Who holds what of a GPU (`_SplitPlan`): its groups of processes with what they hold,
    the containers allocated it that run nothing there, and each one's fraction of the
    GPU's time by `split_time`."""
    known_allocations = ctx.known_allocations
    # per holder: (replicas held, memory, takes part in the time split)
    holders: list[tuple[int, int | None, bool]] = []
    allocated_to: list[bool | None] = []
    for group, (memory, _, _, held) in zip(groups.groups, holdings.groups):
        allocated: bool | None = None
        if known_allocations:
            # Only a named Kubernetes container can be matched to an allocation (pod-resources
            # names pods; a pod known by UID only cannot be told).
            owner = group.owner
            if owner.kind == "kubernetes" and owner.pod:
                allocated = group.labels in allocated_here
        allocated_to.append(allocated)
        replicas_held = len(allocated_here[group.labels][1]) if allocated else 0
        holders.append((replicas_held, memory, held or bool(replicas_held)))
    running_labels = {group.labels for group in groups.groups} if allocated_here else set()
    idle_here = [(labels, len(device_ids)) for labels, (_, device_ids) in allocated_here.items()
                 if labels not in running_labels]
    holders += [(held, 0, bool(held)) for _, held in idle_here]
    taking = [n for n, (_, _, takes) in enumerate(holders) if takes]
    fractions, free = split_time([holders[n][:2] for n in taking], replicas)
    fraction_of: list[float | None] = [None] * len(holders)
    for n, fraction in zip(taking, fractions):
        fraction_of[n] = fraction
    running = [(group.labels, group.owner, len(group.members), memory, utilization, energy_known, allocated_to[n],
                held, group.members, fraction_of[n])
               for n, (group, (memory, utilization, energy_known, held)) in enumerate(zip(groups.groups,
                                                                                          holdings.groups))]
    idle = [(labels, fraction_of[n]) for n, (labels, _) in enumerate(idle_here, len(running))]
    rest_memory: int | None = 0
    if groups.rest:
        rest_memory = sum([procs[i].used_memory_bytes or 0 for i in groups.rest])
        if all(p.used_memory_bytes is None for p in procs):
            rest_memory = None  # the device reports no per-process memory at all
    return _SplitPlan(known_allocations, dict(allocated_here), replicas, running, idle, free,
                      groups.sole_workload is not None, rest_memory)


def advance_workload(old: WorkloadCounters, share: HolderShare, device_key: str, now: float,
                     dt: float) -> tuple[WorkloadCounters, WorkloadUsage]:
    """A holder's counters after this pass, and its usage as the snapshot shows it.

    A workload running processes is idle (``idle_since``) while it holds the GPU or is
    allocated it at an SM share of exactly 0; a container allocated the GPU and running
    nothing there is idle from the moment of allocation.
    """
    util = share.utilization
    if share.processes:
        idle_since = old.idle_since
        if (share.held or share.allocated) and util == 0.0:
            idle_since = now if idle_since is None else idle_since
        else:
            idle_since = None
        usage = old.usage_seconds if util is None else (old.usage_seconds or 0.0) + util * dt
        energy = (old.energy_joules or 0.0) + share.energy if share.energy_known else old.energy_joules
        # Idle time is unknown (None) while the SM share is: never 0 for "cannot tell".
        idle_seconds = None if util is None else (now - idle_since if idle_since is not None else 0.0)
    else:
        idle_since = now if old.idle_since is None else old.idle_since
        # Usage stays absent until the device reports an SM share for its processes
        # (never 0 for "cannot tell" once a process runs on a device without one).
        usage = old.usage_seconds
        energy = old.energy_joules or 0.0  # no process, no memory: no share
        idle_seconds = now - idle_since
    new = WorkloadCounters(usage, old.allocation_seconds + share.allocation_seconds, energy, idle_since, now,
                           share.workload)
    return new, WorkloadUsage(
        device_key=device_key, workload=share.workload, labels=share.labels, memory_used_bytes=share.memory,
        utilization=util, processes=share.processes, idle_seconds=idle_seconds,
        usage_seconds_total=new.usage_seconds, allocation_seconds_total=new.allocation_seconds,
        energy_joules_total=new.energy_joules, allocated=share.allocated, sole_owner=share.sole_owner,
    )


def expire_workloads(counters: dict[WorkloadKey, WorkloadCounters], seen: set[WorkloadKey], now: float,
                     grace_seconds: float) -> list[WorkloadUsage]:
    """Vanished workloads: their counters stay exported for the grace period, then go.

    Removes the expired ones from ``counters`` and clears the others' idle timers; returns
    the usages (``present=False``) of those still kept.
    """
    kept: list[WorkloadUsage] = []
    for wkey, old in list(counters.items()):
        if wkey in seen:
            continue
        if now - old.last_seen > grace_seconds:
            del counters[wkey]
            continue
        kept.append(WorkloadUsage(
            device_key=wkey[0], workload=old.workload, labels=wkey[1], memory_used_bytes=0, utilization=None,
            processes=0, idle_seconds=0.0, usage_seconds_total=old.usage_seconds,
            allocation_seconds_total=old.allocation_seconds, energy_joules_total=old.energy_joules,
            present=False,
        ))
        counters[wkey] = old._replace(idle_since=None)
    return kept


class _Ledger:
    """The pass's working copy of the state's per-device totals."""

    def __init__(self, state: DeriveState):
        self.energy_raw = dict(state.energy_raw)
        self.energy_total = dict(state.energy_total)
        self.unattributed_energy = dict(state.unattributed_energy)
        self.capacity = dict(state.capacity)
        self.unallocated = dict(state.unallocated)

    def advance_energy(self, device: DeviceSample, dt: float) -> float:
        """Advance the device's energy counter; returns this pass's delta, joules."""
        key = device.key
        before = self.energy_total.get(key)
        raw, total = advance_energy(self.energy_raw.get(key), before, device, dt)
        if raw is not None:
            self.energy_raw[key] = raw
        if total is not None:
            self.energy_total[key] = total
        return (total - before) if (total is not None and before is not None) else 0.0

    def add_time(self, key: str, capacity_seconds: float, unallocated_seconds: float) -> None:
        self.capacity[key] = self.capacity.get(key, 0.0) + capacity_seconds
        self.unallocated[key] = self.unallocated.get(key, 0.0) + unallocated_seconds

    def unattributed(self, key: str, memory: int | None, processes: int, energy: float) -> Unattributed:
        self.unattributed_energy[key] = self.unattributed_energy.get(key, 0.0) + energy
        return Unattributed(key, memory, processes, self.unattributed_energy[key], self.unallocated[key])


def step(
    state: DeriveState,
    now: float,
    node: str,
    devices: Sequence[DeviceSample],
    owners: Mapping[int, Workload],
    labeller: Labeller = default_labeller,
    grace_seconds: float = 300.0,
    allocations: Sequence[AllocationRow] | None = None,
) -> tuple[DeriveState, Derived]:
    """Fold one pass into the state.

    Args:
        state: the previous state (`DeriveState()` at start).
        now: the pass's monotonic time, seconds.
        node: the node name (first label of every series).
        devices: this pass's samples; devices that are down keep their counters.
        owners: owner of each PID; PIDs missing here are unknown (unattributed).
        labeller: workload label values after the device labels.
        grace_seconds: how long counters of a vanished workload are still exported.
        allocations: the GPUs the kubelet allocated to containers this pass; None when
            unknown (pod-resources off or never answered): then no series says whether a
            GPU was allocated.
    """
    dt = 0.0 if state.last_now is None else max(0.0, now - state.last_now)
    ledger = _Ledger(state)
    ctx = _Pass(node, labeller, owners, allocations, state.layouts)
    counters = dict(state.workloads)
    usages: list[WorkloadUsage] = []
    unattributed: list[Unattributed] = []
    unattributed_count = 0
    seen: set[WorkloadKey] = set()
    for device in devices:
        key = device.key
        delta = ledger.advance_energy(device, dt)
        device_seconds = max(0.0, device.capacity) * dt
        if not device.up:
            # Nobody can be told to hold a GPU the agent cannot read: its time is unallocated.
            ledger.add_time(key, device_seconds, device_seconds)
            unattributed.append(ledger.unattributed(key, None, 0, 0.0))
            continue
        split = split_device(ctx, device, delta, device_seconds)
        ledger.add_time(key, device_seconds, split.unallocated_seconds)
        unattributed_count += split.rest_processes
        unattributed.append(ledger.unattributed(key, split.rest_memory, split.rest_processes, split.rest_energy))
        for share in split.running + split.idle_allocated:
            wkey = (key, share.labels)
            seen.add(wkey)
            counters[wkey], usage = advance_workload(counters.get(wkey, _NO_COUNTERS), share, key, now, dt)
            usages.append(usage)
    usages += expire_workloads(counters, seen, now, grace_seconds)
    new_state = DeriveState(now, ledger.energy_raw, ledger.energy_total, ledger.unattributed_energy, counters,
                            ledger.capacity, ledger.unallocated, ctx.layouts)
    return new_state, Derived(dict(ledger.energy_total), tuple(usages), tuple(unattributed), unattributed_count,
                              dict(ledger.capacity))
