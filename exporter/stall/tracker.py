"""Which GPUs have been busy with no work for ``--stall-after`` (pure).

`StallTracker.observe` is called once per pass with the pass's wall-clock time, its devices
and the workloads on each; it reads each device's signature (`exporter.stall.signature`),
keeps how long it has held, and returns the stalls the pass began and ended. A signature
must hold on every pass for ``stall_after`` seconds; one pass without it starts the count
again. A declared stall ends after `policy.CLEAR_PASSES` passes in a row without it, or at
once when no process holds the GPU any more or the GPU is down.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

from exporter.core.model import DeviceSample, Workload
from exporter.stall.policy import CLEAR_PASSES, COUNTER_WINDOW, STALL_AFTER
from exporter.stall.signature import Reading, read

# Why a stall ended (`Stall.end_reason`).
COMPUTES_AGAIN = "computes again"
WORKLOAD_LEFT = "no process holds the GPU any more"
GPU_DOWN = "the GPU is down"
AGENT_STOPPED = "the agent stopped"


@dataclass(frozen=True)
class Stall:
    """One stall of one GPU: from when its signature began to when it ended.

    Attributes:
        node, gpu, uuid, gpu_instance: where (``gpu`` the index).
        device_key: the GPU's `DeviceSample.key`.
        began: wall-clock time (Unix seconds) of the first pass with the signature.
        declared: when it had lasted ``--stall-after`` (the incident's and the Events' time).
        workloads: who held the GPU when it was declared.
        signals: the signature's values when it was declared (`signature.Reading.signals`).
        absent: the signals the GPU does not give, in words.
        ended: when it ended (None while it lasts).
        end_reason: why it ended ("" while it lasts).
    """

    node: str
    gpu: int
    uuid: str
    gpu_instance: str
    device_key: str
    began: float
    declared: float
    workloads: tuple[Workload, ...]
    signals: Mapping[str, object]
    absent: tuple[str, ...] = ()
    ended: float | None = None
    end_reason: str = ""

    def seconds(self, now: float) -> float:
        """How long it has lasted (until it ended, or until ``now``)."""
        return max(0.0, (self.ended if self.ended is not None else now) - self.began)


@dataclass
class _Device:
    since: float | None = None  # first pass of the current run of matching passes
    misses: int = 0  # passes in a row without the signature, while stalled
    stall: Stall | None = None  # the stall it is in, if any
    stalled_seconds: float = 0.0  # `gpu_stalled_seconds_total`
    last: float | None = None  # the last pass's time
    reading: Reading | None = None
    pcie: deque[tuple[float, int]] = field(default_factory=deque)  # (time, larger byte counter)


@dataclass(frozen=True)
class GpuState:
    """One judged GPU's state after a pass (the page, ``/api/v1/snapshot``, the families)."""

    stalled: bool
    since: float | None  # when the signature began to hold (None: it does not)
    reading: Reading
    stall: Stall | None
    stalled_seconds_total: float


class StallTracker:
    """Each GPU's signature over the passes.

    Args:
        node: the node's name.
        stall_after: seconds the signature must hold (``--stall-after``).
    """

    def __init__(self, node: str, stall_after: float = STALL_AFTER):
        self.node = node
        self.stall_after = stall_after
        self._devices: dict[str, _Device] = {}

    def observe(self, now: float, devices: Sequence[DeviceSample],
                holders: Mapping[str, Sequence[Workload]]) -> tuple[list[Stall], list[Stall]]:
        """Fold one pass in; return (stalls declared in it, stalls ended in it).

        Args:
            now: the pass's wall-clock time (Unix seconds).
            devices: the pass's devices.
            holders: per device key, the workloads on it (for the stall's record).
        """
        began: list[Stall] = []
        ended: list[Stall] = []
        seen = set()
        for device in devices:
            key = device.key
            seen.add(key)
            state = self._devices.setdefault(key, _Device())
            dt = 0.0 if state.last is None else max(0.0, now - state.last)
            state.last = now
            reading = read(device, _counter_rate(state, now, device))
            state.reading = reading
            if state.stall is not None:
                over = self._follow(state, reading, now, dt)
                if over is not None:
                    ended.append(over)
                continue
            if not reading.matched:
                state.since = None
                continue
            if state.since is None:
                state.since = now
            if now - state.since >= self.stall_after:
                stall = Stall(self.node, device.index, device.uuid, device.gpu_instance, key, state.since, now,
                              tuple(holders.get(key, ())), dict(reading.signals), reading.absent)
                state.stall, state.misses = stall, 0
                state.stalled_seconds += now - state.since
                began.append(stall)
        for key in [k for k in self._devices if k not in seen]:  # a device that went away
            gone = self._devices.pop(key)
            if gone.stall is not None:
                ended.append(replace(gone.stall, ended=now, end_reason=GPU_DOWN))
        return began, ended

    def _follow(self, state: _Device, reading: Reading, now: float, dt: float) -> Stall | None:
        """A stalled GPU's pass: the stall that ended in it, if any."""
        assert state.stall is not None
        reason = ""
        if reading.why_not == "down":
            reason = GPU_DOWN
        elif reading.why_not == "no process holds it":
            reason = WORKLOAD_LEFT
        elif reading.matched:
            state.misses = 0
        else:
            state.misses += 1
            if state.misses >= CLEAR_PASSES:
                reason = COMPUTES_AGAIN
        if not reason:
            state.stalled_seconds += dt
            return None
        over = replace(state.stall, ended=now, end_reason=reason)
        state.stall, state.since, state.misses = None, None, 0
        return over

    def states(self) -> dict[str, GpuState]:
        """Every judged device's state after the last pass, by device key."""
        return {key: GpuState(s.stall is not None, s.since, s.reading, s.stall, s.stalled_seconds)
                for key, s in self._devices.items() if s.reading is not None}

    def ongoing(self) -> list[Stall]:
        """The stalls that last, in device order."""
        return [s.stall for s in self._devices.values() if s.stall is not None]


def _counter_rate(state: _Device, now: float, device: DeviceSample) -> float | None:
    """Bytes per second over PCIe from the byte counters over the last `COUNTER_WINDOW`
    or more (None until that much is kept): the larger direction's, which the counters'
    sum bounds from above. Only needed where GPM gives no PCIe rate."""
    if device.gpm.get("pcie_tx_bytes_per_second") is not None:
        state.pcie.clear()
        return None
    tx, rx = device.pcie_tx_bytes_total, device.pcie_rx_bytes_total
    if tx is None or rx is None:
        state.pcie.clear()
        return None
    window = state.pcie
    window.append((now, tx + rx))
    while len(window) > 2 and now - window[1][0] >= COUNTER_WINDOW:
        window.popleft()
    start, total = window[0]
    if now - start < COUNTER_WINDOW:
        return None
    return max(0.0, (tx + rx - total) / (now - start))
