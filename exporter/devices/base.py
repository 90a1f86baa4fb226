"""The one interface every device backend implements: `Backend`."""

from __future__ import annotations

import abc
import argparse
from typing import Any, ClassVar, Mapping

from exporter.core.bulkhead import Read
from exporter.core.model import DeviceSample
from exporter.core.shares import READ_ALL, PassPlan

#: Where a backend's flags are listed in the ``devices`` group of ``--help``: the ones
#: that say where its devices are read from right after ``--backend``, the ones that say
#: how a pass samples them after ``--interval``.
SOURCE_FLAGS = "source"
SAMPLING_FLAGS = "sampling"


class BackendUnavailable(Exception):
    """The backend's library or tool is missing, or it sees no devices.

    The message is shown to the user as is: say what is missing and how to fix it.
    """


class Backend(abc.ABC):
    """A source of `DeviceSample`\\ s for one vendor.

    Lifecycle: built with the options of its flags (`options_from`), `open` once (raises
    `BackendUnavailable`), then one pass per collection pass, then `close`.

    A pass is `reads`: parts that the collector runs through its bulkhead
    (`exporter.core.bulkhead`) on worker threads, each given up on by itself when it overruns
    its deadline, so that a driver call that never returns degrades only its own part.
    Their driver calls should be followed by `exporter.core.bulkhead.check_abandoned`, so that
    a read given up on stops when its call returns. The default is the whole backend as
    one part (`sample`): every device of the backend is down while it hangs.

    `sample` must not raise for a single failing device: that device comes back
    `DeviceSample.down` and the others carry on. It may raise for a failure of the whole
    backend (the driver went away), which the collector reports as a failed collector and
    retries on the next pass.

    What only some backends can do (time their library calls, say their GPUs' GPM status,
    read per-process shares once the owners are known) is not here: a backend declares it
    by subclassing its interface in `exporter.devices.capabilities` too.

    Attributes:
        name: the ``--backend`` name, the ``backend`` label of its errors.
        call_prefixes: what its library's function names start with (``("amdsmi_",)``),
            to name the call a stuck read is in.
        read_timeout: seconds a part may take, when the collector's default (1 s) is too
            short for it (Gaudi's hl-smi has a timeout of its own); None: the default.
    """

    name: ClassVar[str]
    call_prefixes: tuple[str, ...] = ()
    read_timeout: float | None = None
    # The devices of the last finished `sample` of the default `reads`: reported down
    # while a later one is stuck.
    _last_sampled: tuple[DeviceSample, ...] = ()

    # ---- flags ----------------------------------------------------------------------

    @classmethod  # noqa: B027 - no flags by default
    def add_arguments(cls, group: Any, place: str) -> None:
        """Add this backend's flags that belong at ``place`` (`SOURCE_FLAGS` or
        `SAMPLING_FLAGS`) of the ``devices`` group; none by default."""

    @classmethod
    def options_from(cls, args: argparse.Namespace) -> dict[str, Any]:
        """The keyword arguments of the constructor, from the parsed flags."""
        return {}

    # ---- lifecycle ------------------------------------------------------------------

    def open(self) -> None:  # noqa: B027 - a backend without a library has nothing to load
        """Load the vendor library and find the devices."""

    @abc.abstractmethod
    def sample(self, now: float) -> list[DeviceSample]:
        """Read every device once, in this thread. ``now`` is the pass's monotonic time in seconds."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release the vendor library."""

    # ---- a pass ---------------------------------------------------------------------

    def reads(self, now: float, plan: PassPlan = READ_ALL) -> list[Read]:
        """This pass as parts the collector can give up on one by one.

        Args:
            now: monotonic seconds of this pass.
            plan: which GPUs' per-process samples to read in their own part (only
                backends with `exporter.devices.capabilities.ProcessShareReads` look at it).

        Returns:
            By default the whole backend as one part (key: its name), which reports the
            devices of its last finished pass down while it is stuck.
        """
        def run() -> list[DeviceSample]:
            devices = list(self.sample(now))
            self._last_sampled = tuple(devices)
            return devices

        return [Read(self.name, f"the {self.name} backend", run, calls=self.call_prefixes, timeout=self.read_timeout,
                     down=lambda reason: [d.down(reason) for d in self._last_sampled])]

    # ---- what else it tells ---------------------------------------------------------

    def errors(self) -> Mapping[str, int]:
        """Cumulative counts of problems survived, by short reason ("timeout",
        "malformed_line", "gpu_lost"): ``l9gpu_backend_errors_total{backend, reason}``."""
        return {}

    def node_name(self) -> str:
        """The node's name as the backend knows it ("" when it does not: a real node's
        is its hostname)."""
        return ""


__all__ = ["SAMPLING_FLAGS", "SOURCE_FLAGS", "Backend", "BackendUnavailable"]
