"""``--health-interval``, shared by every backend that reads GPU health (NVML, amdsmi, hl-smi).

Flags are per backend, but this one means the same for all of them, so it is declared once
(`add_health_interval_argument`, called by the NVML backend, whose flags are always listed)
and each backend takes its value with `health_interval_from`. ``off`` turns health reads off.

`HealthSchedule` says which GPU's health is due in a pass: every GPU on the first pass,
then each every interval, GPU i first due (i + 1) / count of an interval later, so that not
all GPUs read their health in the same pass. `read_boot_id` reads the node's boot id (a
change means the node rebooted: evidence that clears a reboot verdict).
"""

from __future__ import annotations

import argparse
from typing import Any

from exporter.core.parsing import argtype, parse_duration_or_seconds

DEFAULT_HEALTH_INTERVAL = 30.0
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def parse_health_interval(text: str) -> float | None:
    """``--health-interval``: a duration (0 = every pass), or ``off`` (None)."""
    if str(text).strip().lower() == "off":
        return None
    return parse_duration_or_seconds(text)


def add_health_interval_argument(group: Any) -> None:
    """Declare ``--health-interval`` (once, for every backend)."""
    group.add_argument("--health-interval", default="30s", type=argtype(parse_health_interval),
                       metavar="DURATION|off",
                       help="time between two health reads of a GPU (row remapping, ECC, PCIe link, NVLink, "
                            "violation time, recovery action; each backend reads what its vendor has); "
                            "GPUs are staggered over it; off turns health reads off (default: 30s)")


def health_interval_from(args: argparse.Namespace) -> float | None:
    """The parsed ``--health-interval`` (None: off); the default where the flag was not declared."""
    value = vars(args).get("health_interval", DEFAULT_HEALTH_INTERVAL)
    if isinstance(value, str):  # a default not passed through argparse's type
        return parse_health_interval(value)
    return value


class HealthSchedule:
    """Which GPUs read their health in a pass (see the module doc).

    Args:
        interval: seconds between two health reads of a GPU; None: never.
    """

    def __init__(self, interval: float | None = DEFAULT_HEALTH_INTERVAL):
        self.interval = interval
        self._next: dict[int, float] = {}

    def due(self, index: int, count: int, now: float) -> bool:
        """True when GPU ``index`` (of ``count``) reads its health in the pass at ``now``."""
        if self.interval is None:
            return False
        due = self._next.get(index)
        if due is None:
            self._next[index] = now + self.interval * (index + 1) / max(1, count)
            return True
        if now < due:
            return False
        self._next[index] = max(due + self.interval, now)
        return True


def read_boot_id(path: str = BOOT_ID_PATH) -> str | None:
    """The node's boot id, None where it cannot be read (not Linux, no /proc)."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


__all__ = ["BOOT_ID_PATH", "DEFAULT_HEALTH_INTERVAL", "HealthSchedule", "add_health_interval_argument",
           "health_interval_from", "parse_health_interval", "read_boot_id"]
