"""Attribution: from a GPU process's PID to the workload that owns it.

The collector calls `Attributor.resolve` once per pass with every GPU PID it saw; the
default `NullAttributor` knows no owners, so every process counts as unattributed.
"""

from __future__ import annotations

import argparse
from typing import Any, Iterable, Mapping, Protocol

from exporter.model import UNKNOWN, Workload


class Attributor(Protocol):
    """Maps host PIDs to workloads. Called from the collector thread only."""

    def resolve(self, pids: Iterable[int], now: float) -> Mapping[int, Workload]:
        """Return the owner of each PID (missing PIDs count as unknown)."""

    def comm(self, pid: int) -> str:
        """The process's short command name ("" when unknown)."""

    def statuses(self) -> Mapping[str, bool]:
        """Health of the attribution sources, by collector name (for self-metrics)."""

    def info(self) -> Mapping[str, float]:
        """Extra self facts for the snapshot (e.g. host_pids_visible)."""

    def close(self) -> None:
        """Stop background threads (API watch) and release sockets."""


class NullAttributor:
    """Knows no owners: every GPU process is unattributed."""

    def resolve(self, pids: Iterable[int], now: float) -> Mapping[int, Workload]:
        return {pid: UNKNOWN for pid in pids}

    def comm(self, pid: int) -> str:
        return ""

    def statuses(self) -> Mapping[str, bool]:
        return {}

    def info(self) -> Mapping[str, float]:
        return {}

    def close(self) -> None:
        return None


def add_arguments(group: Any) -> None:
    """Add attribution flags to the CLI (an argparse parser or group)."""
    group.add_argument("--proc-root", default="/proc", metavar="DIR",
                       help="where the host's /proc is mounted (default: /proc; needs hostPID or a host mount)")


def build_attributor(args: argparse.Namespace, backend: object, node: str) -> Attributor:
    """Build the attributor the CLI flags ask for."""
    return NullAttributor()
