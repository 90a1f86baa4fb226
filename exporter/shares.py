"""Whose SM share is read how: what a pass reads of each GPU's per-process samples.

A process's SM share comes from the driver's per-process samples (NVML:
``nvmlDeviceGetProcessUtilization``), which cost more per GPU than the rest of its pass.
Where every process on a GPU belongs to one owner (`exporter.process_groups.has_one_owner`,
the one rule that derive groups processes by too), the owner's share is the GPU's
utilisation (`share_from_device`) and the samples need not be read; only a GPU that
several owners share needs them (docs/ATTRIBUTION.md). Whether a GPU is shared is known
only once the pass's processes are attributed, after the device reads, so a backend that
leaves the samples until then (`exporter.devices.base.Backend.defers_process_shares`) is
read in two steps:

1. its pass, under the `PassPlan` decided at the end of the previous pass: the GPUs that
   several owners shared then have their samples read in their own part of the pass
   (sharing lasts: one read per pass is cheaper than two);
2. once the owners are known, `plan_shares` gives the single-owner GPUs their share from
   the device, names the GPUs that a second owner has just joined (their samples are read
   now, `Backend.process_share_reads`) and decides the next pass's plan.

Everything here is pure: the collector keeps the plan between passes, the backend is told
it as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from exporter.labels import Labeller
from exporter.model import DeviceSample, Workload, updated
from exporter.process_groups import has_one_owner


@dataclass(frozen=True)
class PassPlan:
    """What one backend's pass reads of its GPUs' per-process samples.

    Attributes:
        process_metrics: read every GPU's per-process samples in its own part of the pass
            (per-process series are exported, or the backend reads them anyway). The
            default, and what `Backend.sample` reads.
        shared: the GPU indexes (of this backend) whose per-process samples are read in
            their own part of the pass all the same: those several owners shared in the
            last pass.
    """

    process_metrics: bool = True
    shared: frozenset[int] = frozenset()

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
    share from the device); or just joined by a second owner (read now). The next plan
    names the GPUs several owners share in this pass.
    """
    if plan.process_metrics:
        return SharePlan(tuple(devices), (), plan)
    out = list(devices)
    read_now: list[int] = []
    shared: set[int] = set()
    for n, device in enumerate(devices):
        if not device.up or device.gpu_instance or not device.processes:
            continue
        one = has_one_owner(device, owners, labeller)
        if not one:
            shared.add(device.index)
        if device.index in plan.shared:
            continue  # shared in the last pass: read in its part of this one
        if one and device.utilization is not None:
            out[n] = share_from_device(device)
        else:  # a second owner has just appeared: read now
            read_now.append(n)
            shared.add(device.index)
    return SharePlan(tuple(out), tuple(read_now), PassPlan(process_metrics=False, shared=frozenset(shared)))


__all__ = ["READ_ALL", "PassPlan", "SharePlan", "plan_shares", "share_from_device"]
