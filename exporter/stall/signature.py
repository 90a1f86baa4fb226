"""The stall signature of one GPU in one pass (pure): does it look busy with no work?

`read` takes one `DeviceSample` (and the PCIe rate the caller made from the byte counters,
where GPM gives none) and returns a `Reading`: the value of each signal, whether each is
within its threshold (`exporter.stall.policy`), the signals the device does not give, and
the first reason it is not a stall. Whether the signature lasts long enough is the
tracker's (`exporter.stall.tracker`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from exporter.core.model import DeviceSample
from exporter.stall.policy import BUSY, DRAM, NVLINK, PCIE, POWER, SLOWDOWN_REASONS, TENSOR

# What a device lacks, by signal, said once in the reading (the page and the incident show it).
NO_GPM = "no GPM on this GPU (pre-Hopper, or GPM off): tensor and NVLink activity unknown"


@dataclass(frozen=True)
class Reading:
    """What one pass says of one GPU.

    Attributes:
        judged: the device gives enough to judge (a resident kernel, and tensor activity or
            power against its limit); False for a GPU that is down, held by no process, or
            too poorly read.
        matched: judged, and every signal it gives is within its threshold.
        signals: each signal's value (ratios 0-1, bytes per second, the names of the active
            slowdown reasons), only those the device gives.
        absent: the signals it does not give, in words (e.g. `NO_GPM`).
        why_not: the first signal out of its threshold, in words ("" when matched).
    """

    judged: bool
    matched: bool
    signals: Mapping[str, object] = field(default_factory=dict)
    absent: tuple[str, ...] = ()
    why_not: str = ""


NOT_JUDGED = Reading(False, False)


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def read(device: DeviceSample, pcie_counter_rate: float | None = None) -> Reading:
    """The signature of ``device`` in this pass.

    Args:
        device: the GPU (or MIG instance) as the pass read it.
        pcie_counter_rate: bytes per second over PCIe (the larger direction) from the byte
            counters, where the caller has a window of them; used only where GPM has no rate.
    """
    if not device.up:
        return Reading(False, False, why_not="down")
    if not device.processes:
        return Reading(False, False, why_not="no process holds it")
    gpm = device.gpm
    signals: dict[str, object] = {}
    absent: list[str] = []
    busy = device.utilization if device.utilization is not None else gpm.get("graphics_active")
    if busy is None:
        return Reading(False, False, why_not="no utilisation reading")
    signals[BUSY.name] = busy
    if "tensor_active" in gpm:
        signals[TENSOR.name] = gpm["tensor_active"]
    else:
        absent.append(NO_GPM)
    dram = gpm.get("dram_active", device.memory_utilization)
    if dram is not None:
        signals[DRAM.name] = dram
    if device.power_watts is not None and device.power_limit_watts:
        signals[POWER.name] = device.power_watts / device.power_limit_watts
    elif device.gpu_instance:
        absent.append("power: the parent GPU's, not this MIG instance's")
    else:
        absent.append("power or its enforced limit")
    pcie = _larger(gpm.get("pcie_tx_bytes_per_second"), gpm.get("pcie_rx_bytes_per_second"))
    pcie = pcie if pcie is not None else pcie_counter_rate
    if pcie is not None:
        signals[PCIE.name] = pcie
    else:
        absent.append("PCIe throughput (warming up, or no counters)")
    nvlink = _larger(gpm.get("nvlink_tx_bytes_per_second"), gpm.get("nvlink_rx_bytes_per_second"))
    if nvlink is not None:
        signals[NVLINK.name] = nvlink
    if device.throttle_reasons:
        signals["throttled"] = [r for r in SLOWDOWN_REASONS if device.throttle_reasons.get(r)]
    if TENSOR.name not in signals and POWER.name not in signals:
        return Reading(False, False, signals, tuple(absent), "neither tensor activity nor power is read")
    return Reading(True, not (why := _why_not(signals)), signals, tuple(absent), why)


def _larger(a: float | None, b: float | None) -> float | None:
    values = [v for v in (a, b) if v is not None]
    return max(values) if values else None


def _why_not(signals: Mapping[str, object]) -> str:
    """The first signal out of its threshold, in words; "" when none is."""
    busy = float(signals[BUSY.name])  # type: ignore[arg-type]
    if busy < BUSY.value:
        return f"utilisation {_pct(busy)} < {_pct(BUSY.value)}: no kernel resident most of the time"
    for t, what in ((TENSOR, "tensor activity"), (DRAM, "DRAM activity"), (POWER, "power of its limit")):
        value = signals.get(t.name)
        if isinstance(value, (int, float)) and value > t.value:
            return f"{what} {_pct(value)} > {_pct(t.value)}: it computes"
    for t, what in ((PCIE, "PCIe"), (NVLINK, "NVLink")):
        value = signals.get(t.name)
        if isinstance(value, (int, float)) and value > t.value:
            return f"{what} {value / 1e6:.0f} MB/s > {t.value / 1e6:.0f} MB/s: it moves data"
    throttled = signals.get("throttled")
    if throttled:
        return f"clocks held down ({', '.join(throttled)}): slow, not wedged"  # type: ignore[arg-type]
    return ""
