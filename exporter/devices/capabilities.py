"""What only some backends can do, each declared as an interface of its own.

`exporter.devices.base.Backend` is what every backend does: open, a pass, close, its
errors and flags. A backend that can do more says so by subclassing one of these as well
(``class NvmlBackend(..., Backend, Timings, GpmStatus, ProcessShareReads)``), and whoever
needs it asks with ``isinstance(backend, Timings)``: a backend that does not declare it is
not asked, and nothing is discovered by the name of a method.

Each is an abstract base class, so that a backend declaring one and forgetting a method
cannot be built, and the type checker narrows a `Backend` to the capability once asked.
"""

from __future__ import annotations

import abc
from typing import Mapping, NamedTuple, Sequence

from exporter.core.bulkhead import Read
from exporter.core.model import DeviceSample


class CallTiming(NamedTuple):
    """What one library function cost since timing started (or was last reset)."""

    calls: int
    wall_seconds: float
    cpu_seconds: float
    max_wall_seconds: float  # the slowest single call's


class Timings(abc.ABC):
    """Times every call into the vendor library (``l9gpu snapshot --timings``)."""

    @abc.abstractmethod
    def enable_timings(self) -> bool:
        """Record the wall and CPU time of every library call from now on (`timings`);
        False when the backend cannot now (its library is not loaded)."""

    @abc.abstractmethod
    def timings(self, reset: bool = False) -> dict[str, CallTiming]:
        """Per library function, what its calls cost since `enable_timings` or the last
        ``reset`` (True: start counting afresh)."""


class GpmStatus(abc.ABC):
    """Reads GPM (SM, tensor-core, DRAM activity over a window of two samples) and can say,
    per GPU, whether its values are there yet or why they never will be."""

    @abc.abstractmethod
    def gpm_status(self) -> Mapping[tuple[int, str], str]:
        """Per (GPU index, MIG instance or ""): active, warming up, or why it is
        unsupported (``"unsupported: <reason>"``)."""


class ProcessShareReads(abc.ABC):
    """Leaves its processes' SM shares unread until the collector knows who owns them.

    A pass of such a backend reads the per-process samples only of the GPUs its
    `exporter.core.shares.PassPlan` names; the collector asks for the others' here, once
    the pass's processes are attributed and a GPU turns out to be shared
    (`exporter.core.shares`). A backend without it reads every GPU's samples every pass.
    """

    @abc.abstractmethod
    def process_share_reads(self, devices: Sequence[DeviceSample]) -> list[Read]:
        """Parts of the pass (`exporter.core.bulkhead`) that read these GPUs' per-process
        samples: each returns its GPU's sample with its processes' SM shares."""


__all__ = ["CallTiming", "GpmStatus", "ProcessShareReads", "Timings"]
