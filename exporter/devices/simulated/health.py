"""Health reads of the simulated node: a healthy H100's answers, and what a scenario changes.

A scenario's ``health`` list sets signals on some GPUs, optionally for a time window::

    health:
      - gpus: [3]
        row_remap: {pending: true, uncorrectable: 1}
      - gpus: [2]
        pcie: {width: 8}            # x8 of x16
        from: 0s                    # optional: since (default: the start)
        until: 10m                  # optional: up to (default: for ever)

Fields: ``row_remap`` (``pending``, ``failure``: booleans; ``correctable``,
``uncorrectable``, ``banks_no_spare``: whole numbers), ``pcie`` (``generation``,
``generation_max`` 1-6, ``width``, ``width_max`` 1-32, ``replays``), ``nvlink``
(``links``: how many, ``down``: list of link numbers, ``replay``/``recovery``/``crc_flit``/
``crc_data``: counts on every link), ``recovery_action`` (0-7), ``gpu_lost`` (boolean).
Anything else is an error naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from exporter.core.parsing import parse_duration_or_seconds
from exporter.health import HealthSignals, NvLink, Pcie, RowRemap, Violations

# The simulated node's boot id (`HealthSignals.boot_id`): it never reboots.
SIMULATED_BOOT_ID = "sim-boot-0"


class HealthScenarioError(ValueError):
    """A bad ``health`` entry; the message names the field."""


@dataclass(frozen=True)
class HealthSpec:
    """One scenario health entry: which GPUs, when, and the signals it sets."""

    gpus: tuple[int, ...]
    start: float
    end: float
    row_remap: Mapping[str, Any]
    pcie: Mapping[str, Any]
    nvlink: Mapping[str, Any]
    recovery_action: int | None = None
    gpu_lost: bool = False

    def active(self, t: float) -> bool:
        return self.start <= t < self.end


_ROW_FLAGS = ("pending", "failure")
_ROW_COUNTS = ("correctable", "uncorrectable", "banks_no_spare")
_PCIE_RANGES = {"generation": (1, 6), "generation_max": (1, 6), "width": (1, 32), "width_max": (1, 32),
                "replays": (0, 2**63)}
_NVLINK_COUNTS = ("replay", "recovery", "crc_flit", "crc_data")


def _whole(where: str, value: Any, low: int = 0, high: int = 2**63) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HealthScenarioError(f"{where}: expected a whole number {low}-{high}, got {value!r}")
    return value


def _ranged(low: int, high: int) -> Callable[[str, Any], int]:
    return lambda where, value: _whole(where, value, low, high)


def _flag(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise HealthScenarioError(f"{where}: expected true or false, got {value!r}")
    return value


def _section(where: str, doc: Any, check: Mapping[str, Callable[[str, Any], Any]]) -> dict[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, Mapping):
        raise HealthScenarioError(f"{where}: expected a mapping")
    out = {}
    for name, value in doc.items():
        if name not in check:
            raise HealthScenarioError(f"{where}.{name}: unknown field (use {', '.join(check)})")
        out[str(name)] = check[name](f"{where}.{name}", value)
    return out


def scenario_duration(where: str, value: Any) -> float:
    """A scenario time (``from``, ``until``, ``at``): a duration (``90s``, ``2m``) or a
    number of seconds, not negative."""
    try:
        seconds = parse_duration_or_seconds(str(value))
    except ValueError as exc:
        raise HealthScenarioError(f"{where}: {exc}") from None
    if seconds < 0:
        raise HealthScenarioError(f"{where}: a duration must not be negative, got {value!r}")
    return seconds


def _links(where: str, value: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                              for n in value):
        raise HealthScenarioError(f"{where}: expected a list of link numbers")
    return value


_KNOWN = ("gpus", "from", "until", "row_remap", "pcie", "nvlink", "recovery_action", "gpu_lost")


def parse_health(where: str, doc: Any, gpu_indexes: Callable[[str, Any], list[int]]) -> tuple[HealthSpec, ...]:
    """A scenario's ``health`` list (``where`` names it in errors)."""
    if doc is None:
        return ()
    if not isinstance(doc, list):
        raise HealthScenarioError(f"{where}: expected a list of entries with gpus and signals")
    specs = []
    for n, entry in enumerate(doc):
        at = f"{where}[{n}]"
        if not isinstance(entry, Mapping):
            raise HealthScenarioError(f"{at}: expected a mapping with gpus and signals")
        unknown = [k for k in entry if k not in _KNOWN]
        if unknown:
            raise HealthScenarioError(f"{at}.{unknown[0]}: unknown field (use {', '.join(_KNOWN)})")
        row = _section(f"{at}.row_remap", entry.get("row_remap"),
                       {**dict.fromkeys(_ROW_FLAGS, _flag), **dict.fromkeys(_ROW_COUNTS, _whole)})
        pcie = _section(f"{at}.pcie", entry.get("pcie"), {k: _ranged(*r) for k, r in _PCIE_RANGES.items()})
        nvlink = _section(f"{at}.nvlink", entry.get("nvlink"), {
            "links": _ranged(1, 18), "down": _links, **dict.fromkeys(_NVLINK_COUNTS, _whole)})
        action = entry.get("recovery_action")
        specs.append(HealthSpec(
            tuple(gpu_indexes(at, entry.get("gpus", []))),
            scenario_duration(f"{at}.from", entry["from"]) if "from" in entry else 0.0,
            scenario_duration(f"{at}.until", entry["until"]) if "until" in entry else float("inf"),
            row, pcie, nvlink,
            None if action is None else _whole(f"{at}.recovery_action", action, 0, 7),
            _flag(f"{at}.gpu_lost", entry.get("gpu_lost", False))))
    return tuple(specs)


def simulated_signals(index: int, t: float, busy: float, power_capped_seconds: float,
                      specs: tuple[HealthSpec, ...]) -> HealthSignals:
    """GPU ``index``'s health read at ``t`` seconds: a healthy H100 SXM, changed by ``specs``.

    A healthy link runs gen 5 x16 while busy and trains down to gen 1 at idle (full width).
    """
    row: dict[str, Any] = {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False,
                           "banks_no_spare": 0}
    pcie: dict[str, Any] = {"generation": 5 if busy > 0 else 1, "generation_max": 5, "width": 16, "width_max": 16,
                            "replays": 0}
    nvlink: dict[str, Any] = {}
    action, lost = 0, False
    for spec in specs:
        if index in spec.gpus and spec.active(t):
            row.update(spec.row_remap)
            pcie.update(spec.pcie)
            nvlink.update(spec.nvlink)
            action = spec.recovery_action if spec.recovery_action is not None else action
            lost = lost or spec.gpu_lost
    links = tuple(NvLink(n, n not in nvlink.get("down", ()), *(nvlink.get(k, 0) for k in _NVLINK_COUNTS))
                  for n in range(nvlink.get("links", 0)))
    signals = HealthSignals(
        row_remap=RowRemap(**row), pcie=Pcie(**pcie), nvlinks=links,
        violations=Violations(power=power_capped_seconds, thermal=0.0, reliability=0.0, board_limit=0.0,
                              sync_boost=0.0, low_utilization=0.0),
        recovery_action=action, persistence_mode=True, boot_id=SIMULATED_BOOT_ID)
    return replace(signals, gpu_lost=True) if lost else signals
