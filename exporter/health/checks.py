"""One health read -> the reasons it raises (pure): validation, rates between reads, lasting links.

What the driver said is checked before it is believed: a count that is negative, not a whole
number or not finite, a PCIe generation outside 1-6 or a width outside 1-32 (or above the
link's maximum), a flag that is neither 0 nor 1 gives no verdict from that field and one
problem line for the caller to log; nothing here raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from exporter.health import policy as p
from exporter.health.signals import (
    FabricState,
    HealthSignals,
    NvLink,
    RecoveryAction,
    XgmiStatus,
    as_count,
    as_seconds,
    count_problem,
    seconds_problem,
)

_RECOVERY_ACTIONS = {
    RecoveryAction.GPU_RESET: p.RESET_GPU,
    RecoveryAction.BUS_RESET: p.RESET_GPU,
    RecoveryAction.NODE_REBOOT: p.REBOOT_NODE,
    RecoveryAction.SYSTEM_REBOOT: p.REBOOT_NODE,
    RecoveryAction.DRAIN_P2P: p.DRAIN_AND_RESET,
    RecoveryAction.DRAIN_AND_RESET: p.DRAIN_AND_RESET,
    RecoveryAction.RECOVER_IMEX_DOMAIN: p.INSPECT_HARDWARE,
}


@dataclass(frozen=True)
class HealthConfig:
    """What the caller decides about the verdict.

    Attributes:
        busy_utilization: utilisation (0-1) above which the GPU counts as busy, so that a PCIe
            generation below its maximum counts as downgraded.
        width_reads: consecutive health reads a PCIe width below its maximum must last.
        fabric_reads: consecutive health reads a fabric registration may stay unfinished.
        app_window_s: an application XID clears after this long with no repeat.
        counter_quiet_s: a rising-counter reason (PCIe replays, NVLink errors) clears after
            this long with no rise over its threshold.
        field_settle_s: an XID whose action the recovery action field decides clears when the
            field reads none at least this long after the XID.
    """

    busy_utilization: float = 0.5
    width_reads: int = 3
    fabric_reads: int = 3
    app_window_s: float = 600.0
    counter_quiet_s: float = 600.0
    field_settle_s: float = 60.0


DEFAULT_CONFIG = HealthConfig()


@dataclass(frozen=True)
class Reason:
    """One active reason: its name (from :data:`policy.REASONS`), its action, one line for people."""

    reason: str
    action: str
    text: str


_NvCounts = tuple[int, int | None, int | None, int | None, int | None]


@dataclass(frozen=True)
class ReadMemory:
    """What one health read leaves for the next: baselines for rates and reset evidence."""

    time: float | None = None
    pcie_replays: int | None = None
    nvlink: tuple[_NvCounts, ...] = ()
    boot_id: str | None = None
    energy_mj: int | None = None
    ecc_volatile: int | None = None
    recovery_action: int | None = None
    width_low_reads: int = 0
    fabric_bad_reads: int = 0
    pcie_replays_rise: float | None = None
    nvlink_rise: float | None = None


@dataclass(frozen=True)
class ReadResult:
    """The reasons one health read raises, its memory, whether it shows a reset, its problems."""

    reasons: tuple[Reason, ...]
    memory: ReadMemory
    reset_seen: bool
    recovery_field_readable: bool
    problems: tuple[tuple[str, str], ...]


class _Inputs:
    """Checks values as they come from a driver; collects a problem per bad field."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def _bad(self, key: str, value: object, why: str) -> None:
        self.problems.append((key, f"{key}: the driver answered {value!r}, {why}; ignored"))

    def count(self, key: str, value: object) -> int | None:
        why = count_problem(value)
        if why is not None:
            self._bad(key, value, why)
            return None
        return as_count(value)

    def ranged(self, key: str, value: object, low: int, high: int) -> int | None:
        number = self.count(key, value)
        if number is not None and not low <= number <= high:
            self._bad(key, value, f"outside {low}-{high}")
            return None
        return number

    def flag(self, key: str, value: object) -> bool | None:
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        self._bad(key, value, "neither 0 nor 1")
        return None

    def seconds(self, key: str, value: object) -> float | None:
        why = seconds_problem(value)
        if why is not None:
            self._bad(key, value, why)
            return None
        return as_seconds(value)


def _reason(name: str, detail: str = "", action: str | None = None) -> Reason:
    rule = p.RULES[name]
    return Reason(name, action or rule.action, rule.text + (f" ({detail})" if detail else ""))


def _memory_reasons(s: HealthSignals, ins: _Inputs) -> list[Reason]:
    out: list[Reason] = []
    if s.row_remap is not None:
        rr = s.row_remap
        if ins.flag("row_remap.pending", rr.pending):
            out.append(_reason("row_remap_pending"))
        if ins.flag("row_remap.failure", rr.failure):
            out.append(_reason("row_remap_failure"))
        banks = ins.count("row_remap.banks_no_spare", rr.banks_no_spare)
        if banks:
            out.append(_reason("row_remap_no_spare", f"{banks} bank{'s' if banks > 1 else ''}"))
        ins.count("row_remap.correctable", rr.correctable)
        ins.count("row_remap.uncorrectable", rr.uncorrectable)
    if s.retired_pages is not None:
        rp = s.retired_pages
        if ins.flag("retired_pages.pending", rp.pending):
            out.append(_reason("retired_pages_pending"))
        pages = [ins.count("retired_pages.single_bit", rp.single_bit),
                 ins.count("retired_pages.double_bit", rp.double_bit)]
        total = sum(n for n in pages if n is not None)
        if total > p.RETIRED_PAGES_LIMIT:
            out.append(_reason("retired_pages_limit", f"{total} pages"))
    if s.ecc is not None:
        if ins.flag("ecc.sram_threshold_exceeded", s.ecc.sram_threshold_exceeded):
            out.append(_reason("sram_threshold"))
        uncorrected = ins.count("ecc.volatile_uncorrected", s.ecc.volatile_uncorrected)
        if uncorrected:
            out.append(_reason("ecc_uncorrectable", f"{uncorrected} since the last reset"))
    return out


def _pcie(s: HealthSignals, memory: ReadMemory, now: float, busy: bool, cfg: HealthConfig,
          ins: _Inputs) -> tuple[list[Reason], ReadMemory]:
    if s.pcie is None:
        return [], replace(memory, pcie_replays=None, width_low_reads=0)
    link = s.pcie
    gen = ins.ranged("pcie.generation", link.generation, 1, 6)
    gen_max = ins.ranged("pcie.generation_max", link.generation_max, 1, 6)
    width = ins.ranged("pcie.width", link.width, 1, 32)
    width_max = ins.ranged("pcie.width_max", link.width_max, 1, 32)
    if gen is not None and gen_max is not None and gen > gen_max:
        ins._bad("pcie.generation", gen, f"above the link's maximum {gen_max}")
        gen = None
    if width is not None and width_max is not None and width > width_max:
        ins._bad("pcie.width", width, f"above the link's maximum x{width_max}")
        width = None
    details = []
    if gen is not None and gen_max is not None and gen < gen_max and busy:
        details.append(f"gen {gen} of {gen_max} while busy")
    narrow = width is not None and width_max is not None and width < width_max
    low_reads = memory.width_low_reads + 1 if narrow else 0
    if narrow and low_reads >= cfg.width_reads:
        details.append(f"x{width} of x{width_max} for {low_reads} reads")
    out = [_reason("pcie_downgraded", ", ".join(details))] if details else []
    replays = ins.count("pcie.replays", link.replays)
    rise = memory.pcie_replays_rise
    if replays is not None and memory.pcie_replays is not None and memory.time is not None and now > memory.time:
        per_minute = (replays - memory.pcie_replays) * 60.0 / (now - memory.time)
        if per_minute > p.PCIE_REPLAYS_PER_MINUTE:
            rise = now
    if rise is not None and now - rise < cfg.counter_quiet_s:
        out.append(_reason("pcie_replays"))
    else:
        rise = None
    return out, replace(memory, pcie_replays=replays, width_low_reads=low_reads, pcie_replays_rise=rise)


def _nvlink_counts(link: NvLink, ins: _Inputs) -> _NvCounts:
    key = f"nvlink[{link.link}]"
    return (link.link, ins.count(key + ".replay", link.replay), ins.count(key + ".recovery", link.recovery),
            ins.count(key + ".crc_flit", link.crc_flit), ins.count(key + ".crc_data", link.crc_data))


def _rose(before: int | None, after: int | None) -> int:
    """How much a lifetime counter rose; 0 when unknown or when it went back (a reset)."""
    if before is None or after is None or after < before:
        return 0
    return after - before


def _nvlink(s: HealthSignals, memory: ReadMemory, now: float, cfg: HealthConfig,
            ins: _Inputs) -> tuple[list[Reason], ReadMemory]:
    out: list[Reason] = []
    states = [(link.link, ins.flag(f"nvlink[{link.link}].up", link.up)) for link in s.nvlinks]
    down = [n for n, up in states if up is False]
    up_count = sum(1 for _, up in states if up)
    if down and up_count:
        out.append(_reason("nvlink_down", f"link {', '.join(map(str, down))} down, {up_count} up"))
    counts = tuple(_nvlink_counts(link, ins) for link in s.nvlinks)
    before = {c[0]: c for c in memory.nvlink}
    rise = memory.nvlink_rise
    dt = now - memory.time if memory.time is not None else 0.0
    rising = []
    for c in counts:
        old = before.get(c[0])
        if old is None or dt <= 0:
            continue
        link_errors = _rose(old[1], c[1]) + _rose(old[2], c[2])
        crc_rate = (_rose(old[3], c[3]) + _rose(old[4], c[4])) / dt
        if link_errors >= p.NVLINK_ERRORS_PER_READ or crc_rate >= p.NVLINK_CRC_PER_SECOND:
            rising.append(c[0])
    if rising:
        rise = now
    if rise is not None and now - rise < cfg.counter_quiet_s:
        detail = f"link {', '.join(map(str, rising))}" if rising else "quiet since the last rise"
        out.append(_reason("nvlink_errors", detail))
    else:
        rise = None
    return out, replace(memory, nvlink=counts, nvlink_rise=rise)


def _driver_reasons(s: HealthSignals, memory: ReadMemory, cfg: HealthConfig,
                    ins: _Inputs) -> tuple[list[Reason], ReadMemory]:
    out: list[Reason] = []
    action = ins.count("recovery_action", s.recovery_action)
    if action:
        known = next((a for a in RecoveryAction if a == action), None)
        # A value newer than this table: someone must look at what the driver asks for.
        mapped = _RECOVERY_ACTIONS.get(known, p.INSPECT_HARDWARE) if known else p.INSPECT_HARDWARE
        out.append(_reason("recovery_action", known.name.lower() if known else f"code {action}", action=mapped))
    xgmi = ins.ranged("xgmi_status", s.xgmi_status, 0, max(XgmiStatus))
    if xgmi:
        out.append(_reason("xgmi_errors", XgmiStatus(xgmi).name.lower()))
    bad_reads = 0
    fabric_state = ins.ranged("fabric.state", s.fabric.state if s.fabric else None, 0, max(FabricState))
    if s.fabric is not None and fabric_state:
        if fabric_state == FabricState.COMPLETED:
            if s.fabric.status_ok is False or s.fabric.degraded is True:
                detail = "registration failed" if s.fabric.status_ok is False else "degraded"
                out.append(_reason("fabric_unhealthy", detail))
        else:
            bad_reads = memory.fabric_bad_reads + 1
            if bad_reads >= cfg.fabric_reads:
                out.append(_reason("fabric_unhealthy", f"registration {FabricState(fabric_state).name.lower()}"))
    if s.gpu_lost:
        out.append(_reason("gpu_lost"))
    if s.reset_required:
        out.append(_reason("reset_required"))
    return out, replace(memory, recovery_action=action, fabric_bad_reads=bad_reads)


def _reset_evidence(s: HealthSignals, memory: ReadMemory, ins: _Inputs) -> tuple[bool, ReadMemory]:
    """Did the GPU reset or the node reboot since the last read? Told by the driver's state only.

    Evidence: the node's boot id changed; the driver's total-energy counter or volatile ECC
    counts (both restart at driver load or GPU reset) went back; the recovery action field
    went from an action back to none.
    """
    energy = ins.count("energy_mj", s.energy_mj)
    volatile = None
    if s.ecc is not None:
        corrected = ins.count("ecc.volatile_corrected", s.ecc.volatile_corrected)
        uncorrected = s.ecc.volatile_uncorrected  # checked (and reported) with the memory reasons
        if corrected is not None and isinstance(uncorrected, int) and not isinstance(uncorrected, bool) \
                and uncorrected >= 0:
            volatile = corrected + uncorrected
    action = s.recovery_action if isinstance(s.recovery_action, int) and s.recovery_action >= 0 else None
    seen = ((s.boot_id is not None and memory.boot_id is not None and s.boot_id != memory.boot_id)
            or (energy is not None and memory.energy_mj is not None and energy < memory.energy_mj)
            or (volatile is not None and memory.ecc_volatile is not None and volatile < memory.ecc_volatile)
            or (action == RecoveryAction.NONE and bool(memory.recovery_action)))
    return seen, replace(memory, boot_id=s.boot_id or memory.boot_id, energy_mj=energy, ecc_volatile=volatile)


def evaluate(signals: HealthSignals, memory: ReadMemory, now: float, utilization: float | None,
             cfg: HealthConfig = DEFAULT_CONFIG) -> ReadResult:
    """The reasons one health read raises, given what the previous read left.

    Args:
        signals: this read's answers.
        memory: what the previous read left (``ReadMemory()`` for the first).
        now: the pass's time, seconds (monotonic or wall, the same clock every pass).
        utilization: the GPU's utilisation this pass, 0-1 (None if unknown: not busy).
        cfg: the thresholds.
    """
    ins = _Inputs()
    busy = utilization is not None and math.isfinite(utilization) and utilization > cfg.busy_utilization
    reset_seen, mem = _reset_evidence(signals, memory, ins)
    reasons = _memory_reasons(signals, ins)
    pcie, mem = _pcie(signals, mem, now, busy, cfg, ins)
    nvlink, mem = _nvlink(signals, mem, now, cfg, ins)
    driver, mem = _driver_reasons(signals, mem, cfg, ins)
    for v_name, v_value in (signals.violations.items() if signals.violations else ()):
        ins.seconds(f"violations.{v_name}", v_value)
    first_seen: dict[str, tuple[str, str]] = {}
    for key, message in ins.problems:
        first_seen.setdefault(key, (key, message))
    all_reasons = tuple(sorted(reasons + pcie + nvlink + driver, key=lambda r: r.reason))
    readable = isinstance(signals.recovery_action, int) and signals.recovery_action >= 0
    return ReadResult(all_reasons, replace(mem, time=now), reset_seen, readable, tuple(first_seen.values()))
