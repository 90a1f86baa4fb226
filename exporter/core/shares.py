"""Whose SM share is read how: what a pass reads of each GPU's per-process samples.

A process's SM share comes from the driver's per-process samples (NVML:
``nvmlDeviceGetProcessUtilization``), which cost more per GPU than the rest of its pass.
Where every process on a GPU belongs to one owner (`exporter.core.process_groups.has_one_owner`,
the one rule that derive groups processes by too), the owner's share is the GPU's
utilisation (`share_from_device`) and the samples need not be read; only a GPU that
several owners share needs them (docs/ATTRIBUTION.md). Whether a GPU is shared is known
only once the pass's processes are attributed, after the device reads, so a backend that
leaves the samples until then (`exporter.devices.capabilities.ProcessShareReads`) is
read in two steps:

1. its pass, under the `PassPlan` decided at the end of the previous pass: the GPUs that
   several owners shared then have their samples read in their own part of the pass
   (sharing lasts: one read per pass is cheaper than two);
2. once the owners are known, `plan_shares` gives the single-owner GPUs their share from
   the device, names the GPUs that a second owner has just joined (their samples are read
   now, `ProcessShareReads.process_share_reads`) and decides the next pass's plan.

A shared GPU's samples are read every `PassPlan.every` passes (`SHARED_READ_PERIOD`
seconds), each GPU in its own phase so that the reads spread over the passes. In the
passes between, its processes' shares are carried from the last read (`carried_utilization`,
by the backend in its part of the pass where it can, else `carry_shares` here):
each process keeps its SM share of that read, scaled by how the GPU's utilisation (read
every pass, cheaply) moved since. The cadence loses nothing: a read asks for the samples
newer than the last one read, and an H200 answers one sample per process averaging that
whole time (measured, docs/PERFORMANCE.md "On an H200"); a driver that answered only its
latest instant would be sampled less often, the carry keeping the shares' total
following the GPU's own load.
A GPU whose processes changed since the last read, or whose utilisation rose from 0, is
read at once.

Everything here is pure: the collector keeps the plan between passes, the backend is told
it as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Mapping, Sequence

from exporter.core.labels import Labeller
from exporter.core.model import DeviceSample, ProcessSample, Workload, frozen_mapping, updated
from exporter.core.process_groups import has_one_owner

#: Seconds between reads of the per-process samples of a GPU that several owners share
#: (without ``--process-metrics``); the shares are carried in between (module doc). The
#: driver's one sample per process averages the time since the last read (an H200, measured),
#: so no period loses time; this one bounds how long a change in the split between owners
#: waits to be seen, at a fifth of the per-pass read's cost at a 1 s interval.
SHARED_READ_PERIOD = 5.0


def passes_between_reads(interval: float, period: float = SHARED_READ_PERIOD) -> int:
    """How many passes of ``interval`` seconds make up a read period (at least one)."""
    return max(1, int(round(period / interval))) if interval > 0 else 1


@dataclass(frozen=True)
class LastRead:
    """A GPU's per-process samples as last read, to carry into the passes between reads.

    Attributes:
        utilization: the GPU's utilisation in the pass of the read (0-1).
        shares: per PID, its (SM, memory) shares of that read.
    """

    utilization: float
    shares: Mapping[int, tuple[float | None, float | None]]

    @classmethod
    def of(cls, device: DeviceSample) -> LastRead | None:
        """The read of ``device``'s samples in this pass; None where it has none to carry."""
        if device.utilization is None or any(p.sm_utilization is None for p in device.processes):
            return None
        return cls(device.utilization,
                   frozen_mapping({p.pid: (p.sm_utilization, p.memory_utilization) for p in device.processes}))


def carried_utilization(last: LastRead, pids: Collection[int], utilization: float | None
                        ) -> dict[int, tuple[float, float | None]] | None:
    """Per PID, the (SM, memory) shares carried from ``last`` to a pass in which the GPU's
    processes are ``pids`` and its utilisation ``utilization``: each SM share scaled by the
    utilisation now against then (at most 1), memory shares as they were.

    None when they cannot be carried and the samples are to be read now: another set of
    processes than at the read, no utilisation, or a GPU busy now that was idle then.
    """
    shares = last.shares
    if utilization is None or len(pids) != len(shares) or any(pid not in shares for pid in pids):
        return None
    if last.utilization > 0:
        scale = utilization / last.utilization
    elif utilization == 0 and not any(sm for sm, _ in shares.values()):
        scale = 0.0
    else:
        return None
    return {pid: (min(1.0, (sm or 0.0) * scale), mem) for pid, (sm, mem) in shares.items()}


def carry_shares(device: DeviceSample, last: LastRead) -> DeviceSample | None:
    """``device`` with its processes' shares carried from ``last`` (`carried_utilization`);
    None when they cannot be."""
    carried = carried_utilization(last, [p.pid for p in device.processes], device.utilization)
    if carried is None:
        return None
    processes = tuple(ProcessSample(p.pid, p.used_memory_bytes, carried[p.pid][0], carried[p.pid][1], p.kind)
                      for p in device.processes)
    return updated(device, processes=processes)


@dataclass(frozen=True)
class PassPlan:
    """What one backend's pass reads of its GPUs' per-process samples.

    Attributes:
        process_metrics: read every GPU's per-process samples in its own part of the pass
            (per-process series are exported, or the backend reads them anyway). The
            default, and what `Backend.sample` reads.
        shared: the GPU indexes (of this backend) whose per-process samples are read in
            their own part of the pass all the same: those several owners shared in the
            last pass, whose read is due.
        carried: GPUs several owners shared in the last pass whose read is not due in
            this one: per index, the read their shares are carried from.
        every: a shared GPU's samples are read every this many passes.
        seq: the pass's number (the phase of each GPU's reads).
    """

    process_metrics: bool = True
    shared: frozenset[int] = frozenset()
    carried: Mapping[int, LastRead] = field(default_factory=dict)
    every: int = 1
    seq: int = 0

    def due(self, index: int) -> bool:
        """True when GPU ``index``'s samples, if it is shared, are read in this pass."""
        return self.every <= 1 or (self.seq + index) % self.every == 0

    def reads_shares(self, index: int) -> bool:
        """True when GPU ``index``'s part of the pass reads its per-process samples."""
        return self.process_metrics or index in self.shared


#: The plan of a pass that reads everything (`Backend.sample`, a backend that does not defer).
READ_ALL = PassPlan()


@dataclass(frozen=True)
class SharePlan:
    """What `plan_shares` decided for one backend's devices of a pass.

    Attributes:
        devices: the devices, a single-owner GPU's with its owner's share from the device.
        read_now: places in ``devices`` whose per-process samples are to be read now (a
            second owner has just joined them).
        next_plan: the plan of this backend's next pass.
    """

    devices: tuple[DeviceSample, ...]
    read_now: tuple[int, ...]
    next_plan: PassPlan


def share_from_device(device: DeviceSample) -> DeviceSample:
    """A device held by one owner whose per-process samples were not read: the owner's SM
    share is the device's utilisation (on its one process, where it has one)."""
    processes = device.processes
    if len(processes) == 1:
        processes = (updated(processes[0], sm_utilization=device.utilization),)
    return updated(device, processes=processes, sm_share_from_device=True)


def plan_shares(devices: Sequence[DeviceSample], owners: Mapping[int, Workload], labeller: Labeller,
                plan: PassPlan) -> SharePlan:
    """Decide the SM shares of one deferring backend's devices, read under ``plan``.

    A whole GPU with processes is, in turn: read in its own part already (in
    ``plan.shared``, or every GPU under ``plan.process_metrics``); held by one owner (its
    share from the device); shared, its read not due, its shares carried from the last
    read (`carry_shares`); or just joined by a second owner, or changed since its last
    read (read now). The next plan names the GPUs several owners share in this pass:
    those whose read is due in it to be read, the others with the read to carry.
    """
    if plan.process_metrics:
        return SharePlan(tuple(devices), (), plan)
    out = list(devices)
    read_now: list[int] = []
    shared: set[int] = set()
    last: dict[int, LastRead] = {}
    for n, device in enumerate(devices):
        if not device.up or device.gpu_instance or not device.processes:
            continue
        index = device.index
        one = has_one_owner(device, owners, labeller)
        if not one:
            shared.add(index)
        if index in plan.shared:  # shared in the last pass: read in its part of this one
            read = LastRead.of(device)
            if read is not None:
                last[index] = read
            continue
        if one and device.utilization is not None:
            out[n] = share_from_device(device)
            continue
        carried = None
        if index in plan.carried:
            last_read = plan.carried[index]
            if all(p.sm_utilization is not None for p in device.processes) and len(device.processes) == len(
                    last_read.shares) and all(p.pid in last_read.shares for p in device.processes):
                carried = device  # the backend carried them in its part of the pass
            else:
                carried = carry_shares(device, last_read)
        if carried is not None:
            out[n] = carried
            last[index] = plan.carried[index]
        else:  # a second owner has just appeared, or the GPU changed since its read: read now
            read_now.append(n)
            shared.add(index)
    following = PassPlan(process_metrics=False, every=plan.every, seq=plan.seq + 1)
    due = frozenset(i for i in shared if i not in last or following.due(i))
    following = PassPlan(process_metrics=False, shared=due, carried={i: last[i] for i in shared - due},
                         every=plan.every, seq=plan.seq + 1)
    return SharePlan(tuple(out), tuple(read_now), following)


__all__ = ["READ_ALL", "SHARED_READ_PERIOD", "LastRead", "PassPlan", "SharePlan", "carry_shares",
           "carried_utilization", "passes_between_reads", "plan_shares", "share_from_device"]
