"""The one small interface every device backend implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from exporter.model import DeviceSample


class BackendUnavailable(Exception):
    """The backend's library or tool is missing, or it sees no devices.

    The message is shown to the user as is: say what is missing and how to fix it.
    """


@runtime_checkable
class Backend(Protocol):
    """A source of `DeviceSample`s for one vendor.

    Lifecycle: `open()` once (raises `BackendUnavailable`), then `sample()` once per
    collection pass from the collector thread only, then `close()`.

    `sample()` must not raise for a single failing device: that device comes back with
    ``up=False`` and an ``error`` and the others carry on. It may raise for a failure of
    the whole backend (the driver went away), which the collector reports as a failed
    collector and retries on the next pass.

    Backends may also offer ``errors() -> Mapping[str, int]``: cumulative counts of
    problems they survived, by short reason ("timeout", "malformed_line", "gpu_lost"),
    exported as ``l9gpu_backend_errors_total{backend, reason}``.

    A call into a driver may never return. The collector reads every backend with a
    deadline (`exporter.bulkhead`); a backend can make that finer and say more:

    * ``reads(now) -> list[exporter.bulkhead.Read]``: the pass as parts, one per GPU, each
      given up on by itself when it overruns (the others are still read), with the
      devices to report down while it is stuck. Its driver calls should be followed by
      `exporter.bulkhead.check_abandoned`, so that a read given up on stops when its call
      returns. Without it, ``sample(now)`` is one part: every device of the backend is
      down while it hangs.
    * ``call_prefixes``: what its library's function names start with (``("amdsmi_",)``),
      to name the call a stuck read is in.
    * ``read_timeout``: seconds a part may take, when the collector's default (1 s) is too
      short for it (Gaudi's hl-smi has a timeout of its own).
    """

    name: str

    def open(self) -> None:
        """Load the vendor library and find the devices."""

    def sample(self, now: float) -> list[DeviceSample]:
        """Read every device once. ``now`` is the pass's monotonic time in seconds."""

    def close(self) -> None:
        """Release the vendor library."""
