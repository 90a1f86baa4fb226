"""A simulated node's processes: what each does over time, and the scenario's number rules.

A process's memory and utilisation are curves of the seconds since it started
(`memory_curve`, `utilization_curve`); a process may instead follow phases
(`exporter.devices.simulated.training`: compute, checkpoint, evaluate, wedged), each
with its utilisation, how much math its kernels do (``tensor``), how much of the dynamic
power its busy time draws (``power``) and how much memory and PCIe traffic it makes (``traffic``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

from exporter.core.model import frozen_mapping
from exporter.core.parsing import parse_positive_duration

GIB = 2**30


class ScenarioError(ValueError):
    """A scenario file that cannot be used; the message names the file and the field."""


class Phase(NamedTuple):
    """What a process does for a while (`ProcessSpec.phase`): all ratios 0-1."""

    name: str
    utilization: float
    tensor: float = 1.0  # how much math its kernels do (0: a spin-wait)
    power: float = 1.0  # how much of the GPU's dynamic power range its busy time draws
    traffic: float = 1.0  # how much of a busy GPU's memory-controller and PCIe traffic it makes


@dataclass(frozen=True)
class ProcessSpec:
    """One scenario process on one GPU."""

    pid: int
    gpu: int
    name: str
    memory: Callable[[float], float]
    utilization: Callable[[float], float]
    workload: Mapping[str, Any] = field(default_factory=frozen_mapping)
    tensor: float = 1.0
    start: float = 0.0  # seconds after the node's start when the process appears
    end: float = math.inf  # and when it exits
    phases: Callable[[float], Phase] | None = None  # what it does, by seconds since it started

    def running(self, t: float) -> bool:
        return self.start <= t < self.end

    def memory_at(self, t: float) -> int:
        """Bytes held ``t`` seconds after the node's start (curves count from the process's)."""
        return int(self.memory(max(0.0, t - self.start)))

    def phase_at(self, t: float) -> Phase:
        """What it does ``t`` seconds after the node's start (its curves, where it has no phases)."""
        since = max(0.0, t - self.start)
        if self.phases is not None:
            return self.phases(since)
        return Phase("", self.utilization(since), self.tensor)


def number(where: str, value: Any, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise ScenarioError(f"{where}: expected a number >= {minimum:g}, got {value!r}")
    return float(value)


def gpu_indexes(where: str, value: Any, count: int) -> list[int]:
    """A scenario entry's ``gpus``: a non-empty list of indexes of the node's GPUs."""
    if not isinstance(value, list) or not value or not all(
            isinstance(g, int) and 0 <= g < count for g in value):
        raise ScenarioError(f"{where}.gpus: expected a non-empty list of GPU indexes 0-{count - 1}")
    return value


def memory_curve(where: str, spec: Mapping[str, Any]) -> Callable[[float], float]:
    """Memory in bytes as a function of seconds since start."""
    if "memory_gib" in spec:
        constant = number(f"{where}.memory_gib", spec["memory_gib"]) * GIB
        return lambda t: constant
    memory = spec.get("memory")
    if not isinstance(memory, Mapping):
        raise ScenarioError(f"{where}: needs memory_gib or memory: {{start_gib, growth_gib_per_hour, max_gib}}")
    start = number(f"{where}.memory.start_gib", memory.get("start_gib", 0)) * GIB
    growth = number(f"{where}.memory.growth_gib_per_hour", memory.get("growth_gib_per_hour", 0)) * GIB / 3600
    ceiling = number(f"{where}.memory.max_gib", memory.get("max_gib", 1e9)) * GIB
    return lambda t: min(ceiling, start + growth * t)


def utilization_curve(where: str, value: Any) -> Callable[[float], float]:
    """SM share 0-1 as a function of seconds since start."""
    if isinstance(value, Mapping) and "wave" in value:
        wave = value["wave"]
        if not isinstance(wave, Mapping):
            raise ScenarioError(f"{where}.wave: expected {{min, max, period}}")
        low = number(f"{where}.wave.min", wave.get("min", 0.0))
        high = number(f"{where}.wave.max", wave.get("max", 1.0))
        try:
            period = parse_positive_duration(str(wave.get("period", "60s")))
        except ValueError as exc:
            raise ScenarioError(f"{where}.wave.period: {exc}") from None
        if not low <= high <= 1.0:
            raise ScenarioError(f"{where}.wave: need 0 <= min <= max <= 1")
        mid, amp = (low + high) / 2, (high - low) / 2
        return lambda t: mid + amp * math.sin(2 * math.pi * t / period)
    constant = number(where, value)
    if constant > 1.0:
        raise ScenarioError(f"{where}: utilisation is a ratio 0-1, got {value!r}")
    return lambda t: constant


