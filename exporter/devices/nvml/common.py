"""What the NVML backend's parts share: its state between passes, the periods of slow re-reads,
and the guard around optional queries.

The periods. A pass asks only for what it needs (the cost of each call, and so the
periods below, are in docs/PERFORMANCE.md): MIG mode and the enforced power limit are
re-read every `SLOW_PERIOD` seconds, ECC totals and the PCIe byte counters every
`ECC_PERIOD` and `PCIE_PERIOD` (cumulative counters lose nothing by it; dcgm-exporter
polls every 30 s), the graphics process list every `GRAPHICS_PERIOD` while a GPU has no
graphics process, the energy counter every `ENERGY_COUNTER_PERIOD` (`energy`); static
facts (UUID, name, serial, PCI bus id, MIG slots) once. When each is due, the re-reads of
different GPUs spread over its period, is the devices' one schedule
(`exporter.devices.schedule.Schedule`, through `NvmlState._due`), which also times the
health reads.

Failures. A device whose core queries fail (``NVML_ERROR_GPU_IS_LOST``, or any other
unexpected NVML error) comes back down with the error text and no values; the other
devices carry on. An optional query that fails otherwise gives `NA` (counted as
``query_error``). Such problems are counted by reason in `NvmlBackend.errors`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

from exporter.core.model import frozen_mapping
from exporter.core.shares import PassPlan
from exporter.devices.nvml.gpm import GpmReader
from exporter.devices.nvml.libnvml import NA, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED, DeviceDown, Nvml
from exporter.devices.schedule import Schedule

log = logging.getLogger(__name__)

# Seconds between reads of values that are costly or change slowly (see the module doc).
ENERGY_COUNTER_PERIOD = 30.0
SLOW_PERIOD = 30.0
ECC_PERIOD = 10.0
PCIE_PERIOD = 10.0
# Graphics contexts are rare on data-centre GPUs: while a GPU has none, its graphics
# process list is asked this often (compute processes: every pass).
GRAPHICS_PERIOD = 5.0
# NVML averages power over the last second (Ampere and newer): up to this interval the
# reading times the interval is the energy used in it; in longer intervals the reading
# covers the last second and the mean of the readings at both ends the rest.
POWER_AVERAGING_SECONDS = 1.0


def _saying(what: str, exc: BaseException) -> str:
    """Why a device is down: NVML's text for the error, after ``what`` unless that text
    already says it (NVML's text for GPU_IS_LOST is "GPU is lost")."""
    text = str(exc)
    return text if text.lower().startswith(what.lower()) else f"{what}: {text}"


class NvmlState:
    """The NVML backend's state that its parts (`processes`, `mig`, `events`, `energy`)
    read and keep; `NvmlBackend.__init__` sets every attribute."""

    _nvml: Nvml | None
    _initialized: bool
    _count: int
    _handles: dict[int, Any]
    _static: dict[int, dict[str, Any]]
    _driver_version: str
    _errors: Counter[str]
    _gpm: GpmReader | None
    _schedule: Schedule
    _slow_values: dict[tuple[Any, ...], Any]
    _plan: PassPlan

    def _require(self) -> Nvml:
        if self._nvml is None or not self._initialized:
            raise RuntimeError("NvmlBackend.sample() called before open()")
        return self._nvml

    def _down(self, nvml: Nvml, exc: BaseException) -> DeviceDown:
        code = nvml.code(exc)
        if code == nvml.const("NVML_ERROR_GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST):
            return DeviceDown("gpu_lost", _saying("GPU is lost", exc))
        if code == nvml.const("NVML_ERROR_RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED):
            return DeviceDown("reset_required", _saying("GPU requires reset", exc))
        return DeviceDown("device_error", f"NVML error {code}: {exc}")

    def _guard(self, nvml: Nvml, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an optional query: a lost GPU stops the device, other errors give NA."""
        try:
            return fn(*args)
        except nvml.error as exc:
            return self._query_failed(nvml, getattr(fn, "__name__", fn), exc)

    def _query_failed(self, nvml: Nvml, what: Any, exc: BaseException) -> Any:
        """An optional query's error: a lost GPU stops the device (raises), others count and give NA."""
        code = nvml.code(exc)
        if code in (
            nvml.const("NVML_ERROR_GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST),
            nvml.const("NVML_ERROR_RESET_REQUIRED", NVML_ERROR_RESET_REQUIRED),
        ):
            raise self._down(nvml, exc) from exc
        self._errors["query_error"] += 1
        log.debug("NVML query %s failed: %s", what, exc)
        return NA

    def _opt(self, nvml: Nvml, name: str, *args: Any) -> Any:
        """`_guard` of ``nvml.call(name, *args)``."""
        try:
            return nvml.call(name, *args)
        except nvml.error as exc:
            return self._query_failed(nvml, name, exc)

    def _due(self, index: int, what: Hashable, now: float, period: float) -> bool:
        """True when ``what`` of GPU ``index`` is to be read in this pass (`Schedule.due`
        over this backend's GPUs: every GPU on its first pass, then staggered)."""
        return self._schedule.due(index, self._count, now, period, what)

    def _slow(self, index: int, what: str, now: float, period: float, read: Callable[..., Any], *args: Any) -> Any:
        """A value re-read (``read(*args)``) every ``period`` seconds, served from the last
        read in between."""
        key = (index, what)
        if self._due(index, what, now, period) or key not in self._slow_values:
            self._slow_values[key] = read(*args)
        return self._slow_values[key]

    def _read_gpm(self, nvml: Nvml, handle: Any, index: int, gpu_instance: int | None = None) -> Any:
        """GPM values (see `exporter.devices.nvml.gpm`); a lost GPU stops the device."""
        gpm = self._gpm
        if gpm is None:
            return frozen_mapping()
        try:
            return gpm.read(handle, index, gpu_instance)
        except nvml.error as exc:
            raise self._down(nvml, exc) from exc
