"""The simulated node's kernel log: what ``--kernel-log auto`` reads on the demo node.

The simulated driver logs its scenario's Xids as the NVIDIA driver does
(`exporter.devices.simulated.backend.SimulatedBackend.kernel_lines`); `ScenarioKernelLog`
reads them through the kernel log reader's own parser (`exporter.incidents.kmsg.parse_xid`),
so the demo's incidents take the path a real node's take. The wiring builds it from the
opened simulated backend (`exporter.app.wiring.build_incident_watch`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.incidents.kmsg import XidRecord, parse_xid

if TYPE_CHECKING:
    from exporter.devices.simulated.backend import SimulatedBackend


class ScenarioKernelLog:
    """The scenario's Xid lines, each once its time has come, as `kmsg.KernelLog` hands
    out the machine's: `poll`, `counts`, `close`."""

    def __init__(self, node: SimulatedBackend):
        self._node = node
        self.path = f"the simulated node's scenario ({node.node_name()})"  # what ``--kernel-log auto`` says it reads
        self._next = 0  # how many of the node's lines have been read
        self._counts = {"read": 0, "xid": 0}

    def poll(self) -> list[XidRecord]:
        """The Xid records logged since the last poll, stamped on the node's clock (the
        passes'), as the kernel stamps its records."""
        out = []
        for line in self._node.kernel_lines(self._next):
            self._next += 1
            record = parse_xid(line.text, seq=self._next, boot_usec=int(line.at * 1e6))
            self._counts["read"] += 1
            if record is not None:
                self._counts["xid"] += 1
                out.append(record)
        return out

    def counts(self) -> dict[str, int]:
        """Lines read and Xids found, by outcome (as `kmsg.KernelLog.counts`)."""
        return dict(self._counts)

    def close(self) -> None:
        """Nothing to release: the lines are the scenario's."""


def scenario_kernel_log(node: SimulatedBackend) -> ScenarioKernelLog | None:
    """The opened simulated node's kernel log; None for a scenario that logs no Xid (then
    ``--kernel-log auto`` reads the machine's)."""
    return ScenarioKernelLog(node) if node.scenario is not None and node.scenario.xids else None


__all__ = ["ScenarioKernelLog", "scenario_kernel_log"]
