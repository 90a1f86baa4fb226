"""The one schedule of a backend's slow re-reads, and the health reads it times.

`Schedule` says whether something of a GPU (its health, its ECC totals, its PCIe byte
counters, its energy counter...) is read in a pass: every GPU reads it on its first pass;
after that, GPU i of n is first due (i + 1) / n of a period later, then every period, so
that the GPUs of a node do not all pay for the same costly read in the same pass. The
NVML backend's slow values (`exporter.devices.nvml.common`, their periods there) and every
backend's health reads are timed by it.

Health reads. ``--health-interval`` means the same for every backend that reads GPU health
(NVML, amdsmi, hl-smi), so a backend only declares that it reads health by subclassing
`HealthReads`: the flag is declared once (`add_health_interval_argument`, called by
`exporter.devices.add_arguments`), the registry hands its value to the backend's constructor
(`exporter.devices.options_from`: ``health_interval``, which the backend passes on to
`HealthReads`), and a pass asks `HealthReads.health_due`. ``off`` turns health reads off.
`read_boot_id` reads the node's boot id (a change means the node rebooted: evidence that
clears a reboot verdict); `HealthReads` keeps the one read when the backend opens.
"""

from __future__ import annotations

import argparse
from collections.abc import Hashable
from typing import Any

from exporter.core.parsing import argtype, parse_duration_or_seconds

DEFAULT_HEALTH_INTERVAL = 30.0
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


class Schedule:
    """When each GPU's re-reads are next due (see the module doc).

    One per backend (or per part of one that keeps its own), remembering per (GPU, what)
    when it is next due.
    """

    def __init__(self) -> None:
        self._next: dict[tuple[int, Hashable], float] = {}

    def due(self, index: int, count: int, now: float, period: float, what: Hashable = "") -> bool:
        """True when ``what`` of GPU ``index`` (of ``count``) is read in the pass at ``now``.

        Args:
            index: the GPU's index, which places it in the stagger.
            count: how many GPUs the reads are spread over.
            now: the pass's monotonic time, seconds.
            period: seconds between two reads (0: every pass).
            what: which of the GPU's reads (each has its own due time).
        """
        key = (index, what)
        due = self._next.get(key)
        if due is None:
            self._next[key] = now + period * (index + 1) / max(1, count)
            return True
        if now < due:
            return False
        self._next[key] = max(due + period, now)
        return True


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


def read_boot_id(path: str = BOOT_ID_PATH) -> str | None:
    """The node's boot id, None where it cannot be read (not Linux, no /proc)."""
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


class HealthReads:
    """What a backend that reads its GPUs' health (``DeviceSample.health_signals``) declares.

    A backend subclasses it beside `exporter.devices.base.Backend` and takes
    ``health_interval`` (and ``boot_id_path``) in its constructor, to hand them to
    ``HealthReads.__init__``; the registry gives it ``--health-interval``. In a pass it
    reads a GPU's health where `health_due` says so, and stamps the read with `_boot_id`
    (read by `open_health` when the backend opens).

    Args:
        health_interval: seconds between two health reads of a GPU, the GPUs staggered
            over it; None: never (``--health-interval off``).
        boot_id_path: where the node's boot id is read.
    """

    def __init__(self, health_interval: float | None = DEFAULT_HEALTH_INTERVAL,
                 boot_id_path: str = BOOT_ID_PATH) -> None:
        self._health_interval = health_interval
        self._health_schedule = Schedule()
        self._boot_id_path = boot_id_path
        self._boot_id: str | None = None

    def open_health(self) -> None:
        """Read the node's boot id (at `open`: the health reads carry it)."""
        self._boot_id = read_boot_id(self._boot_id_path)

    def health_due(self, index: int, count: int, now: float) -> bool:
        """True when GPU ``index`` (of ``count``) reads its health in the pass at ``now``:
        every GPU on its first pass, then every ``health_interval``, staggered."""
        if self._health_interval is None:
            return False
        return self._health_schedule.due(index, count, now, self._health_interval, "health")


__all__ = ["BOOT_ID_PATH", "DEFAULT_HEALTH_INTERVAL", "HealthReads", "Schedule", "add_health_interval_argument",
           "health_interval_from", "parse_health_interval", "read_boot_id"]
