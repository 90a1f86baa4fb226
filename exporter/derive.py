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

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

from exporter.model import UNKNOWN, AllocationRow, DeviceSample, Unattributed, Workload, WorkloadUsage

# Label values a workload series gets beyond the device labels: a function of the
# owner, so configured extras (owner, pod labels) stay out of this module.
Labeller = Callable[[Workload], tuple[str, ...]]


def default_labeller(workload: Workload) -> tuple[str, ...]:
    """namespace, pod, container, pod_uid, slurm_job_id (see catalogue.WORKLOAD_ID_LABELS)."""
    return (workload.namespace, workload.pod, workload.container, workload.pod_uid, workload.slurm_job_id)


# The owner of a pod (top-level controller) and of a Slurm job (user, account): one value
# per workload, so they add no series, and chargeback can group by them.
OWNER_LABELS: tuple[str, ...] = ("owner_kind", "owner_name", "slurm_user", "slurm_account")


def label_schema(pod_labels: Sequence[str] = ()) -> tuple[tuple[str, ...], Labeller]:
    """Extra workload label names and the matching labeller.

    Workload series always carry the owner (``owner_kind``, ``owner_name``: Deployment,
    StatefulSet, Job, ...; ``slurm_user``, ``slurm_account`` for a Slurm job); each
    ``--pod-label KEY`` adds ``label_<key>`` with the pod's label value ("" when the pod has
    no such label).
    """
    keys = list(dict.fromkeys(pod_labels))
    names = OWNER_LABELS + tuple("label_" + sanitize_label_name(k) for k in keys)

    def labeller(workload: Workload) -> tuple[str, ...]:
        pod_labels_map = dict(workload.labels)
        return default_labeller(workload) + (workload.owner_kind, workload.owner_name,
                                              workload.slurm_user, workload.slurm_account) + tuple(
            pod_labels_map.get(k, "") for k in keys)

    return names, labeller


def sanitize_label_name(key: str) -> str:
    """A Kubernetes label key as a Prometheus label name suffix (like kube-state-metrics)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def device_label_values(node: str, device: DeviceSample) -> tuple[str, ...]:
    """Values for catalogue.DEVICE_LABELS."""
    return (node, str(device.index), device.uuid, device.model, device.gpu_instance)


@dataclass(frozen=True)
class WorkloadCounters:
    # None until the device first reports a share for the workload's processes (SM share
    # for usage; SM share or memory for energy): a Gaudi workload never gets one, so its
    # usage and energy series stay absent instead of reading 0.
    usage_seconds: float | None = None
    allocation_seconds: float = 0.0
    energy_joules: float | None = None
    idle_since: float | None = None
    last_seen: float = 0.0


@dataclass(frozen=True)
class DeriveState:
    """Everything `step` remembers between passes."""

    last_now: float | None = None
    energy_raw: Mapping[str, float] = field(default_factory=dict)
    energy_total: Mapping[str, float] = field(default_factory=dict)
    unattributed_energy: Mapping[str, float] = field(default_factory=dict)
    workloads: Mapping[tuple[str, tuple[str, ...]], WorkloadCounters] = field(default_factory=dict)
    capacity: Mapping[str, float] = field(default_factory=dict)
    unallocated: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Derived:
    """What one pass contributes to the snapshot."""

    device_energy_joules: Mapping[str, float]
    workloads: tuple[WorkloadUsage, ...]
    unattributed: tuple[Unattributed, ...]
    unattributed_processes: int
    device_capacity_seconds: Mapping[str, float] = field(default_factory=dict)


def advance_energy(raw_before: float | None, total_before: float | None, device: DeviceSample,
                   dt: float) -> tuple[float | None, float | None]:
    """Next (raw reading, monotonic total) of a device's energy counter.

    The device's own counter is used where it has one (a drop, e.g. after a driver
    reload, adds nothing rather than going backwards); otherwise power is integrated
    over ``dt`` seconds. Returns (None, total_before) when neither is known.
    """
    if device.energy_joules is not None:
        raw = device.energy_joules
        if total_before is None:
            return raw, raw
        if raw_before is None:
            return raw, total_before
        return raw, total_before + max(0.0, raw - raw_before)
    if device.power_watts is not None:
        return None, (total_before or 0.0) + device.power_watts * dt
    return None, total_before


def reports_nothing(shares: Sequence[tuple[float | None, int | None]]) -> bool:
    """True when no process on the device has an SM share or a memory figure."""
    return all(u is None and m is None for u, m in shares)


def split_energy(delta: float, shares: Sequence[tuple[float | None, int | None]]) -> tuple[list[float], float]:
    """Split one GPU's energy delta over its processes.

    Args:
        delta: joules the device used in this pass.
        shares: per process (SM share 0-1 or None, memory bytes or None).

    Returns:
        (joules per process, joules that belong to nobody: idle with no holder).
        Where the device reports neither for any process (Gaudi), the holders of the
        device share ΔE equally.
    """
    parts = [0.0] * len(shares)
    if delta <= 0 or not shares:
        return parts, max(0.0, delta)
    if reports_nothing(shares):  # e.g. Gaudi: only who holds the device is known
        return [delta / len(shares)] * len(shares), 0.0
    known = [u for u, _ in shares if u is not None]
    util_sum = sum(max(0.0, u) for u in known)
    busy = min(1.0, util_sum) if known else 0.0
    busy_energy = delta * busy
    if util_sum > 0:
        for i, (u, _) in enumerate(shares):
            if u is not None and u > 0:
                parts[i] += busy_energy * u / util_sum
    idle_energy = delta - busy_energy
    memory_sum = sum(max(0, m or 0) for _, m in shares)
    if memory_sum > 0:
        for i, (_, m) in enumerate(shares):
            if m:
                parts[i] += idle_energy * max(0, m) / memory_sum
        return parts, 0.0
    return parts, idle_energy


def split_time(holders: Sequence[tuple[int, int | None]], replicas: int | None) -> tuple[list[float], float]:
    """Split one GPU's time between the workloads that hold it.

    Args:
        holders: per holder (device-plugin replicas it was allocated on this GPU, 0 for a
            holder outside the device plugin; memory it holds there in bytes, None where
            the device reports no per-process memory).
        replicas: how many replicas the kubelet can allocate on this GPU (N), None where
            unknown (then the replicas held count as all of them).

    Returns:
        (each holder's fraction of the GPU's time, the fraction nobody holds); they add
        up to 1. The rules (docs/CHARGEBACK.md says why):

        - A holder outside the device plugin (a Slurm job, a process beside the plugin's
          pods, any holder where allocations are unknown) takes the share of the GPU that
          its memory is of all memory the holders hold (holding memory is what keeps
          others off the GPU); where memory is not reported, each holder counts the same.
        - The rest is cut into the N replicas: a container holding k of them is allocated
          k/N of it, and replicas nobody holds are unallocated.
        - With no holder at all, the whole GPU is unallocated.
    """
    n = len(holders)
    if n == 0:
        return [], 1.0
    held = 0  # replicas held, and whether anyone holds the GPU outside the device plugin
    outside = False
    for k, _ in holders:
        if k > 0:
            held += k
        else:
            outside = True
    if not outside:  # the common case: device-plugin holders only (a whole GPU: 1 of 1)
        total = max(replicas or 0, held)
        return [k / total for k, _ in holders], (total - held) / total
    memory_known = all(m is not None for _, m in holders)
    weight = [max(0, m or 0) if memory_known else 1 for _, m in holders]
    outside_weight = sum(w for (k, _), w in zip(holders, weight) if k <= 0)
    if held:
        all_weight = sum(weight)
        outside_share = outside_weight / all_weight if all_weight else 0.0
    else:
        outside_share = 1.0
    outsiders = sum(1 for k, _ in holders if k <= 0)
    rest = 1.0 - outside_share
    total = max(replicas or 0, held)
    parts = [rest * k / total if k > 0 else
             outside_share * (w / outside_weight if outside_weight else 1.0 / outsiders)
             for (k, _), w in zip(holders, weight)]
    return parts, (rest * (total - held) / total) if held else rest


def _labels(cache: dict[int, tuple[str, ...]], labeller: Labeller, owner: Workload) -> tuple[str, ...]:
    """The owner's label values, computed once per owner object in a pass (the objects
    live through the pass, so their ids are stable)."""
    labels = cache.get(id(owner))
    if labels is None:
        labels = cache[id(owner)] = labeller(owner)
    return labels


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
    energy_raw = dict(state.energy_raw)
    energy_total = dict(state.energy_total)
    unattributed_energy = dict(state.unattributed_energy)
    capacity_total = dict(state.capacity)
    unallocated_total = dict(state.unallocated)
    counters = dict(state.workloads)
    usages: list[WorkloadUsage] = []
    unattributed: list[Unattributed] = []
    unattributed_count = 0
    seen: set[tuple[str, tuple[str, ...]]] = set()
    label_cache: dict[int, tuple[str, ...]] = {}
    owners_get = owners.get
    allocated_to: dict[str, list[AllocationRow]] = {}
    for row in allocations or ():
        if row.workload.attributed:
            allocated_to.setdefault(row.device_key, []).append(row)

    for device in devices:
        key = device.key
        before = energy_total.get(key)
        raw, total = advance_energy(energy_raw.get(key), before, device, dt)
        if raw is not None:
            energy_raw[key] = raw
        if total is not None:
            energy_total[key] = total
        delta = (total - before) if (total is not None and before is not None) else 0.0
        device_seconds = max(0.0, device.capacity) * dt
        capacity_total[key] = capacity_total.get(key, 0.0) + device_seconds
        if not device.up:
            # Nobody can be told to hold a GPU the agent cannot read: its time is unallocated.
            unallocated_total[key] = unallocated_total.get(key, 0.0) + device_seconds
            unattributed.append(Unattributed(key, None, 0, unattributed_energy.get(key, 0.0),
                                             unallocated_total[key]))
            continue

        procs = device.processes
        sms = [p.sm_utilization for p in procs]
        if device.sm_share_from_device and procs and device.utilization is not None:
            # One owner, its share read off the device: put it on the first process, so
            # the split below gives the owner all of ΔE·busy (and, holding memory, the rest).
            sms = [device.utilization] + [None] * (len(procs) - 1)
        shares = [(sm, p.used_memory_bytes) for sm, p in zip(sms, procs)]
        parts, nobody = split_energy(delta, shares)
        holders_only = bool(procs) and reports_nothing(shares)
        dev_labels = device_label_values(node, device)
        # Processes by owner object first (a container's processes share one object),
        # so labels are built and hashed once per owner, not once per process.
        by_owner: dict[int, tuple[Workload, list[int]]] = {}
        for i, proc in enumerate(procs):
            owner = owners_get(proc.pid, UNKNOWN)
            entry = by_owner.get(id(owner))
            if entry is None:
                entry = by_owner[id(owner)] = (owner, [])
            entry[1].append(i)
        groups: dict[tuple[str, ...], list[int]] = {}
        # Groups that are named Kubernetes containers: only those can be matched to an
        # allocation (pod-resources names pods; a pod known by UID only cannot be told).
        pods: set[tuple[str, ...]] = set()
        rest: list[int] = []
        for owner, members in by_owner.values():
            if not owner.attributed:
                rest.extend(members)
                continue
            labels = dev_labels + _labels(label_cache, labeller, owner)
            group = groups.get(labels)
            if group is None:
                groups[labels] = members
            else:  # equal labels from two owner objects: one group, in process order
                group.extend(members)
                group.sort()
            if owner.kind == "kubernetes" and owner.pod:
                pods.add(labels)
        rest.sort()
        rest_count = len(rest)
        rest_memory: int | None = sum(procs[i].used_memory_bytes or 0 for i in rest)
        rest_energy = nobody
        for i in rest:
            rest_energy += parts[i]
        unattributed_count += rest_count
        if rest_count and all(p.used_memory_bytes is None for p in procs):
            rest_memory = None  # the device reports no per-process memory at all

        # Replicas per container (dict: one entry per container however many it was given),
        # and how many the kubelet can allocate on this GPU.
        allocated_labels: dict[tuple[str, ...], set[str]] = {}
        replicas: int | None = None
        for row in allocated_to.get(key, ()):
            allocated_labels.setdefault(dev_labels + _labels(label_cache, labeller, row.workload),
                                        set()).add(row.device_id)
            if row.replicas is not None:
                replicas = max(replicas or 0, row.replicas)

        # What each group holds, before the GPU's time is split between the holders.
        summed: list[tuple[tuple[str, ...], list[int], int | None, float | None, float, bool, bool | None,
                           bool]] = []
        holders: list[tuple[int, int | None]] = []  # (replicas held, memory) of those taking part
        taking: list[int] = []  # their places in summed + idle_allocated
        for labels, members in groups.items():
            allocated = (labels in allocated_labels) if allocations is not None and labels in pods else None
            memory: int | None = None  # stays None when the device reports no per-process memory
            util_sum: float | None = None
            energy = 0.0
            energy_known = holders_only
            for i in members:
                used, sm = procs[i].used_memory_bytes, sms[i]
                if used is not None:
                    memory = used if memory is None else memory + used
                if sm is not None:
                    util_sum = sm if util_sum is None else util_sum + sm
                # An energy share needs an SM share or memory; without either the device's
                # energy went to the unattributed bucket (split_energy), not to this workload.
                energy_known = energy_known or used is not None or sm is not None
                energy += parts[i]
            # Holding the GPU: memory on it, or (where memory is unknown) a process on it;
            # or device-plugin replicas of it. Groups that hold nothing take no part in the split.
            held = memory > 0 if memory is not None else True
            k = len(allocated_labels[labels]) if allocated else 0
            if held or k:
                taking.append(len(summed))
                holders.append((k, memory))
            summed.append((labels, members, memory, util_sum, energy, energy_known, allocated, held))
        idle_allocated = [labels for labels in allocated_labels if labels not in groups]
        for n, labels in enumerate(idle_allocated, start=len(summed)):
            taking.append(n)
            holders.append((len(allocated_labels[labels]), 0))
        fractions, free = split_time(holders, replicas)
        share = [0.0] * (len(summed) + len(idle_allocated))
        for n, fraction in zip(taking, fractions):
            share[n] = fraction * device_seconds
        unallocated_total[key] = unallocated_total.get(key, 0.0) + free * device_seconds
        unattributed_energy[key] = unattributed_energy.get(key, 0.0) + rest_energy
        unattributed.append(Unattributed(key, rest_memory, rest_count, unattributed_energy[key],
                                         unallocated_total[key]))

        for n, (labels, members, memory, util_sum, energy, energy_known, allocated, held) in enumerate(summed):
            wkey = (key, labels)
            seen.add(wkey)
            util = None if util_sum is None else min(1.0, util_sum)
            old = counters.get(wkey, WorkloadCounters())
            idle_since = old.idle_since
            if (held or allocated) and util == 0.0:
                idle_since = now if idle_since is None else idle_since
            else:
                idle_since = None
            new = WorkloadCounters(
                usage_seconds=old.usage_seconds if util is None else (old.usage_seconds or 0.0) + util * dt,
                allocation_seconds=old.allocation_seconds + share[n],
                energy_joules=(old.energy_joules or 0.0) + energy if energy_known
                else old.energy_joules,
                idle_since=idle_since,
                last_seen=now,
            )
            counters[wkey] = new
            # Idle time is unknown (None) while the SM share is: never 0 for "cannot tell".
            idle_seconds = None if util is None else (now - idle_since if idle_since is not None else 0.0)
            usages.append(WorkloadUsage(
                device_key=key, labels=labels, memory_used_bytes=memory, utilization=util,
                processes=len(members), idle_seconds=idle_seconds,
                usage_seconds_total=new.usage_seconds, allocation_seconds_total=new.allocation_seconds,
                energy_joules_total=new.energy_joules, allocated=allocated,
            ))

        # Allocated and running nothing here: honestly using nothing, idle since allocation.
        for n, labels in enumerate(idle_allocated, start=len(summed)):
            wkey = (key, labels)
            seen.add(wkey)
            old = counters.get(wkey, WorkloadCounters())
            idle_since = now if old.idle_since is None else old.idle_since
            new = WorkloadCounters(
                # Usage stays absent until the device reports an SM share for its processes
                # (never 0 for "cannot tell" once a process runs on a device without one).
                usage_seconds=old.usage_seconds,
                allocation_seconds=old.allocation_seconds + share[n],
                energy_joules=old.energy_joules or 0.0,  # no process, no memory: no share
                idle_since=idle_since,
                last_seen=now,
            )
            counters[wkey] = new
            usages.append(WorkloadUsage(
                device_key=key, labels=labels, memory_used_bytes=0, utilization=0.0, processes=0,
                idle_seconds=now - idle_since, usage_seconds_total=new.usage_seconds,
                allocation_seconds_total=new.allocation_seconds, energy_joules_total=new.energy_joules,
                allocated=True,
            ))

    # Vanished workloads: counters stay exported for the grace period, then go.
    for wkey, old in list(counters.items()):
        if wkey in seen:
            continue
        if now - old.last_seen > grace_seconds:
            del counters[wkey]
            continue
        usages.append(WorkloadUsage(
            device_key=wkey[0], labels=wkey[1], memory_used_bytes=0, utilization=None, processes=0,
            idle_seconds=0.0, usage_seconds_total=old.usage_seconds,
            allocation_seconds_total=old.allocation_seconds, energy_joules_total=old.energy_joules,
            present=False,
        ))
        counters[wkey] = replace(old, idle_since=None)

    new_state = DeriveState(now, energy_raw, energy_total, unattributed_energy, counters, capacity_total,
                            unallocated_total)
    return new_state, Derived(dict(energy_total), tuple(usages), tuple(unattributed), unattributed_count,
                              dict(capacity_total))
