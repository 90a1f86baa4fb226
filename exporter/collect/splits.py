"""How one GPU's pass is cut between its holders: energy (`split_energy`), time
(`split_time`), and the device's energy counter (`advance_energy`). Pure functions of plain
values; `exporter.collect.derive` applies them per GPU and pass, and its docstring (with
docs/ATTRIBUTION.md and docs/CHARGEBACK.md) says what the rules mean for operators.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from exporter.core.model import DeviceSample


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


class EnergyWeights(NamedTuple):
    """What `split_energy` reads of a GPU's processes' shares, worked out once for them
    (`energy_weights`): a pass whose shares are the last pass's splits by these.

    Attributes:
        processes: how many processes.
        holders_only: the device reports neither an SM share nor memory for any process.
        util_sum: the positive SM shares summed.
        busy: the busy part of the GPU's time, at most 1 (0 where no share is known).
        by_util: (place, SM share) of each process with a positive SM share.
        memory_sum: the positive memory figures summed, bytes.
        by_memory: (place, bytes) of each process holding memory.
    """

    processes: int
    holders_only: bool
    util_sum: float
    busy: float
    by_util: list[tuple[int, float]]
    memory_sum: int
    by_memory: list[tuple[int, int]]


def energy_weights(shares: Sequence[tuple[float | None, int | None]]) -> EnergyWeights:
    """The `EnergyWeights` of per-process (SM share 0-1 or None, memory bytes or None)."""
    known = [u for u, _ in shares if u is not None]
    util_sum = sum([u if u > 0.0 else 0.0 for u in known])  # negative shares count as 0
    return EnergyWeights(
        len(shares), bool(shares) and reports_nothing(shares), util_sum, min(1.0, util_sum) if known else 0.0,
        [(i, u) for i, (u, _) in enumerate(shares) if u is not None and u > 0],
        sum([m for _, m in shares if m and m > 0]), [(i, m) for i, (_, m) in enumerate(shares) if m and m > 0])


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
    return split_energy_by(delta, energy_weights(shares))


def split_energy_by(delta: float, weights: EnergyWeights) -> tuple[list[float], float]:
    """`split_energy` by the processes' `EnergyWeights`: the busy part of ΔE by SM share,
    the idle part by memory held (nobody's where no process holds memory)."""
    count = weights.processes
    parts = [0.0] * count
    if delta <= 0 or not count:
        return parts, max(0.0, delta)
    if weights.holders_only:  # e.g. Gaudi: only who holds the device is known
        return [delta / count] * count, 0.0
    busy_energy = delta * weights.busy
    util_sum = weights.util_sum
    if util_sum > 0:
        for i, u in weights.by_util:
            parts[i] += busy_energy * u / util_sum
    idle_energy = delta - busy_energy
    memory_sum = weights.memory_sum
    if memory_sum > 0:
        for i, m in weights.by_memory:
            parts[i] += idle_energy * m / memory_sum
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
