"""A GPU's processes by owner: the one rule for "which workload runs what on this GPU".

`derive` groups each GPU's processes with it to split the GPU between workloads; a pass
asks `has_one_owner` before it decides to read a GPU's SM share off the device instead of
per process (`DeviceSample.sm_share_from_device`). Both see the same groups, so the two
cannot disagree on whether one owner holds a GPU.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple

from exporter.core.labels import Labeller, default_labeller
from exporter.core.model import UNKNOWN, DeviceSample, Workload


class OwnerGroup(NamedTuple):
    """One workload's processes on one GPU.

    Attributes:
        labels: the group's label values (what the caller's ``labels_of`` gave its owner).
        owner: the owner object of its first process.
        members: places of its processes in `DeviceSample.processes`, in order.
    """

    labels: tuple[str, ...]
    owner: Workload
    members: tuple[int, ...]


class ProcessGroups(NamedTuple):
    """A GPU's processes by owner: attributed ones grouped by labels, the rest apart.

    Attributes:
        groups: one per distinct label values, in the order of their first process.
        rest: places of the processes no workload owns (unknown, host, systemd, ...).
    """

    groups: tuple[OwnerGroup, ...]
    rest: tuple[int, ...]

    @property
    def one_owner(self) -> bool:
        """Every process belongs to one owner: one workload, or none attributed."""
        return not self.groups or (len(self.groups) == 1 and not self.rest)

    @property
    def sole_workload(self) -> OwnerGroup | None:
        """The one workload that runs every process on the GPU, if there is one."""
        return self.groups[0] if len(self.groups) == 1 and not self.rest else None


def group_processes(device: DeviceSample, owners: Mapping[int, Workload],
                    labels_of: Callable[[Workload], tuple[str, ...]]) -> ProcessGroups:
    """Group a GPU's processes by owner (PIDs missing from ``owners`` are unknown).

    Owners with equal ``labels_of`` values are one group. Processes are taken by owner
    object first (a container's processes share one object), so ``labels_of`` runs once
    per owner, not once per process.
    """
    owners_get = owners.get
    by_owner: dict[int, tuple[Workload, list[int]]] = {}
    for i, proc in enumerate(device.processes):
        owner = owners_get(proc.pid, UNKNOWN)
        entry = by_owner.get(id(owner))
        if entry is None:
            entry = by_owner[id(owner)] = (owner, [])
        entry[1].append(i)
    groups: dict[tuple[str, ...], tuple[Workload, list[int]]] = {}
    rest: list[int] = []
    for owner, members in by_owner.values():
        if not owner.attributed:
            rest.extend(members)
            continue
        labels = labels_of(owner)
        group = groups.get(labels)
        if group is None:
            groups[labels] = (owner, members)
        else:  # equal labels from two owner objects: one group, in process order
            group[1].extend(members)
            group[1].sort()
    rest.sort()
    return ProcessGroups(
        tuple(OwnerGroup(labels, owner, tuple(members)) for labels, (owner, members) in groups.items()), tuple(rest))


def has_one_owner(device: DeviceSample, owners: Mapping[int, Workload], labeller: Labeller = default_labeller) -> bool:
    """True when every process on ``device`` belongs to one owner, as `step` groups them:
    one workload (equal ``labeller`` values), or none attributed. The rule a pass uses to
    decide whether the device's utilisation can stand for the owner's SM share
    (`DeviceSample.sm_share_from_device`)."""
    # Decided on the owner objects (a container's processes share one) without building the
    # groups, and at the first process of another owner: most GPUs hold one container's
    # processes, and a shared GPU tells at its first process of a second owner.
    get, first = owners.get, None
    first_labels: tuple[str, ...] | None = None
    for proc in device.processes:
        owner = get(proc.pid, UNKNOWN)
        if first is None:
            first = owner
        elif owner is not first:
            if owner.attributed != first.attributed:
                return False  # a workload beside unattributed processes
            if owner.attributed:
                if first_labels is None:
                    first_labels = labeller(first)
                if labeller(owner) != first_labels:
                    return False
    return True  # one owner, or none attributed: the unattributed processes are one (no) owner
