"""Stalls: a GPU busy with no work, the way a wedged collective of a training job looks.

- `exporter.stall.policy`: THE table of thresholds, each with its source;
- `exporter.stall.signature`: one GPU's signature in one pass (pure);
- `exporter.stall.tracker`: how long each GPU's signature has held, the stalls it began
  and ended (pure);
- `exporter.stall.messages`: a stall's incident JSON, its Events' and banner's text;
- `exporter.stall.watch`: the watch that follows each published snapshot, and its families.

docs/TRAINING.md says what the signature is, why each threshold, and what it cannot see.
"""

from __future__ import annotations

from typing import Any

from exporter.core.parsing import argtype, parse_positive_duration
from exporter.stall.policy import STALL_AFTER

__all__ = ["add_arguments", "parse_stall_after"]


def parse_stall_after(text: str) -> float | None:
    """``--stall-after``: a duration (``5m``, ``90s``) or ``off`` (None)."""
    value = str(text).strip().lower()
    if value == "off":
        return None
    try:
        return parse_positive_duration(value)
    except ValueError:
        raise ValueError(f"{text!r}: give a duration such as 5m or 90s, or off") from None


def add_arguments(group: Any) -> None:
    """The flags of the stall part of ``l9gpu serve`` (docs/TRAINING.md)."""
    group.add_argument("--stall-after", default=f"{STALL_AFTER:g}s", type=argtype(parse_stall_after),
                       metavar="DURATION|off",
                       help="call a GPU stalled (gpu_stalled, an incident of kind stalled and an Event on its pods) "
                            "once it has been busy with no work this long: a kernel resident, no tensor or DRAM "
                            "activity, no PCIe or NVLink traffic, power far under its limit, as a training job's "
                            "wedged collective looks (docs/TRAINING.md); off disables it (default: 5m)")
