"""NVML calls (nvitop's ``libnvml`` role): every call of the NVML backend goes through `Nvml.call`.

"This device or driver cannot tell" becomes the *not available* sentinel `NA` instead of
an exception. Such values are left as None in the `DeviceSample` and omitted from the
output, never exported as 0. Not available means:

* ``NVML_ERROR_NOT_SUPPORTED`` (e.g. fan speed on a passively cooled card, ECC on a
  consumer card, utilisation on a MIG instance),
* ``NVML_ERROR_NOT_FOUND`` and ``NVML_ERROR_FUNCTION_NOT_FOUND`` (a driver older than
  the binding), and a function the installed binding does not have at all. A missing
  function is logged once, at info level, and then stays quiet.

A call that answers NOT_SUPPORTED (or FUNCTION_NOT_FOUND) on a device is not made again on
that device (fan speed on an H200, for one), until its MIG mode changes (`Nvml.forget`).

Versioned functions fall back to older ones: ``nvmlDeviceGetComputeRunningProcesses_v3``
-> ``_v2`` -> plain (same for graphics processes), ``nvmlDeviceGetMemoryInfo`` version 2
-> version 1, ``nvmlDeviceGetTemperatureV`` -> ``nvmlDeviceGetTemperature``,
``nvmlDeviceGetCurrentClocksEventReasons`` -> ``...ClocksThrottleReasons``.

Units. NVML reports in driver units; the backend converts everything to base units
(`scaled`, `ratio`):

===============================  ==================  ==========================
value                            NVML unit           DeviceSample
===============================  ==================  ==========================
power usage, enforced limit      milliwatts          watts (÷ 1000)
total energy consumption         millijoules         joules (÷ 1000)
SM and memory clocks             MHz                 hertz (× 10^6)
PCIe tx/rx byte counters         bytes (cumulative)  bytes (cumulative)
GPU / memory utilisation, fan    percent             ratio 0-1 (÷ 100)
per-process SM / memory util     percent per sample  ratio 0-1, mean of samples
memory                           bytes               bytes
temperatures                     degrees Celsius     degrees Celsius
===============================  ==================  ==========================

`Nvml.invoke` records every call's wall and CPU time when timings are on
(``l9gpu snapshot --timings``) and stops a read the pass has given up on once its call
returns (`exporter.core.bulkhead.check_abandoned`).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from exporter.core.bulkhead import ABANDONED, check_abandoned

log = logging.getLogger(__name__)

# ctypes' pointer base class (``ctypes._Pointer``, which the stubs do not name).
_POINTER: Any = ctypes.POINTER(ctypes.c_int).__mro__[1]

# NVML return codes (nvml.h). Read from the binding when it has them; these are the
# values every NVML release has used.
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_NO_PERMISSION = 4

# Other NVML constants, with their nvml.h values as fallbacks for old bindings.
_CONSTANTS: dict[str, int] = {
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_FI_DEV_MEMORY_TEMP": 82,
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 197,
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 198,
    "NVML_DEVICE_MIG_ENABLE": 1,
    "nvmlEventTypeXidCriticalError": 0x8,
    "nvmlMemory_v2": 0x02000028,
}

# NVML_VALUE_NOT_AVAILABLE for unsigned long long: how old bindings report "unknown
# process memory" (newer ones already turn it into None).
ULL_NOT_AVAILABLE = 2**64 - 1

# Clock event (throttle) reason bits, from nvml.h (nvmlClocksEventReason*).
THROTTLE_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)

# Field value types (nvmlValueType_t) -> the member of c_nvmlValue_t that holds it.
VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

COMPUTE_PROCESS_FUNCTIONS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
GRAPHICS_PROCESS_FUNCTIONS = (
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
)
# Per-process utilisation, cheapest first (same sample fields, same timestamp rule).
PROCESS_UTIL_FUNCTIONS = (
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetProcessUtilization",
)
THROTTLE_FUNCTIONS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)

# What NVML's function names start with, to name the call a stuck read is in: pynvml's
# functions are named as NVML's own.
CALL_PREFIXES = ("nvml",)

# (call, device) pairs remembered as NOT_SUPPORTED at most.
_MAX_UNSUPPORTED = 4096

# Events drained per pass at most, so that a storm of events cannot stall a pass.
MAX_EVENTS_PER_PASS = 10_000


class _NotAvailable:
    """The value of an NVML query the device or driver cannot answer (one instance, `NA`)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NA"


NA: Any = _NotAvailable()


class _NoSuchError(Exception):
    """Stands in for an exception class the binding does not define (never raised)."""


class Nvml:
    """Every NVML call of the backend, with "not available" folded into `NA`.

    Args:
        module: the ``pynvml`` module (or a fake with the same API).
    """

    def __init__(self, module: Any):
        self.module = module
        self._consts: dict[str, int] = {}
        self.error: type[BaseException] = getattr(module, "NVMLError", _NoSuchError)
        # pynvml raises this (not an NVMLError) from an unversioned function whose
        # versioned C symbol the driver lacks.
        self.mismatch: type[BaseException] = getattr(module, "NVMLLibraryMismatchError", _NoSuchError)
        self.na_codes = frozenset(
            self.const(name, default)
            for name, default in (
                ("NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED),
                ("NVML_ERROR_NOT_FOUND", NVML_ERROR_NOT_FOUND),
                ("NVML_ERROR_FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND),
            )
        )
        self.function_not_found = self.const("NVML_ERROR_FUNCTION_NOT_FOUND", NVML_ERROR_FUNCTION_NOT_FOUND)
        self.not_supported = self.const("NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED)
        self._reported_missing: set[str] = set()
        self._lock = threading.Lock()
        # (function, device, other arguments) that answered NOT_SUPPORTED or
        # FUNCTION_NOT_FOUND: never asked again. Function names alone for a cheap test.
        self._unsupported: set[tuple[Any, ...]] = set()
        self._unsupported_names: set[str] = set()
        # function -> [calls, wall seconds, CPU seconds, slowest wall seconds]; None: off
        self.timings: dict[str, list[float]] | None = None

    def const(self, name: str, default: int | None = None) -> int:
        """An NVML constant from the binding, or its nvml.h value (looked up once: a pass
        asks for about ten per GPU)."""
        value = self._consts.get(name)
        if value is None:
            found = getattr(self.module, name, None)
            value = found if isinstance(found, int) else _CONSTANTS[name] if default is None else default
            self._consts[name] = value
        return value

    def has(self, name: str) -> bool:
        return callable(getattr(self.module, name, None))

    def code(self, exc: BaseException) -> int | None:
        """The NVML return code of an NVMLError."""
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def _missing(self, name: str, why: str) -> None:
        with self._lock:
            if name in self._reported_missing:
                return
            self._reported_missing.add(name)
        log.info("NVML function %s is not available (%s); using a fallback or omitting its values", name, why)

    @staticmethod
    def _key(name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if not args:
            return (name,)
        rest: Any = args[1:]
        try:
            hash(rest)
        except TypeError:  # e.g. a list of field ids
            rest = repr(rest)
        return (name, handle_key(args[0]), rest)

    def unsupported(self, name: str, *args: Any) -> bool:
        """True when ``name(*args)`` answered NOT_SUPPORTED or FUNCTION_NOT_FOUND before."""
        return name in self._unsupported_names and self._key(name, args) in self._unsupported

    def remember_unsupported(self, name: str, *args: Any) -> None:
        """Never make this call on this device again (until `forget`)."""
        if len(self._unsupported) >= _MAX_UNSUPPORTED:
            # Handles are stable pointers, so this holds a few entries per device; should a
            # driver hand out new ones, asking again once in a while is the worst case.
            self._unsupported.clear()
        self._unsupported_names.add(name)
        self._unsupported.add(self._key(name, args))

    def forget(self, handle: Any) -> None:
        """Ask a device everything again (its MIG mode changed, so may its answers)."""
        key = handle_key(handle)
        # list() copies in one step: after a stuck read, other GPUs may be read concurrently.
        self._unsupported = {k for k in list(self._unsupported) if len(k) < 2 or k[1] != key}

    def invoke(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` (the binding's ``name``), timing it when timings are on.

        Every call into the driver goes through here. When it returns in a thread whose
        read the pass gave up on (it overran its deadline, see `exporter.core.bulkhead`), this
        raises `Abandoned` instead, so that the stale read goes no further.
        """
        timings = self.timings
        if timings is None:
            try:
                return fn(*args, **kwargs)
            finally:
                if ABANDONED:
                    check_abandoned()
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            entry = timings.setdefault(name, [0, 0.0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += wall
            entry[2] += cpu
            entry[3] = max(entry[3], wall)
            check_abandoned()

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``name`` on the binding.

        Returns:
            The result, or `NA` when the function is missing or NVML answers
            NOT_SUPPORTED, NOT_FOUND or FUNCTION_NOT_FOUND. A call that answered
            NOT_SUPPORTED or FUNCTION_NOT_FOUND returns `NA` from then on without
            reaching the driver.

        Raises:
            NVMLError: any other NVML error (lost GPU, permissions, driver trouble).
        """
        key_args = args + (tuple(sorted(kwargs.items())),) if kwargs else args
        if name in self._unsupported_names and self._key(name, key_args) in self._unsupported:
            return NA
        fn: Callable[..., Any] | None = getattr(self.module, name, None)
        if not callable(fn):
            self._missing(name, "not in the installed nvidia-ml-py")
            return NA
        try:
            return self.invoke(name, fn, *args, **kwargs)
        except self.mismatch:
            self._missing(name, "the driver lacks it")
            self.remember_unsupported(name, *key_args)
            return NA
        except self.error as exc:
            code = self.code(exc)
            if code in self.na_codes:
                if code == self.function_not_found:
                    self._missing(name, "the driver lacks it")
                    self.remember_unsupported(name, *key_args)
                elif code == self.not_supported:
                    self.remember_unsupported(name, *key_args)
                return NA
            raise

    def first(self, names: Sequence[str], *args: Any) -> Any:
        """Call the first of ``names`` that gives an answer (newest version first)."""
        for name in names:
            result = self.call(name, *args)
            if result is not NA:
                return result
        return NA


def text(value: Any) -> str:
    """NVML strings come back as bytes from older bindings and str from newer ones."""
    if value is NA or value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle.

    Real handles are ctypes pointers: two pointer objects to the same device are
    different objects, so compare the address they hold.
    """
    if isinstance(handle, _POINTER):
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    try:
        hash(handle)
    except TypeError:
        return ("id", id(handle))
    return handle


def scaled(value: Any, factor: float) -> float | None:
    if value is NA or value is None:
        return None
    return float(value) * factor


def ratio(percent: Any) -> float | None:
    if percent is NA or percent is None:
        return None
    return min(max(float(percent) / 100.0, 0.0), 1.0)


class DeviceDown(Exception):
    """A device cannot be read this pass; carries the error-count reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason



def decode_throttle_reasons(mask: int) -> dict[str, bool]:
    """Turn an NVML clock event reason bit mask into reason name -> active."""
    mask = int(mask)
    return {name: bool(mask & bit) for name, bit in THROTTLE_REASONS}


@functools.lru_cache(maxsize=256)
def throttle_reasons_mapping(mask: int) -> Mapping[str, bool]:
    """`decode_throttle_reasons` as the read-only mapping a sample carries, decoded once per
    mask: a GPU reports the same few masks pass after pass."""
    return MappingProxyType(decode_throttle_reasons(mask))




def int_or_none(value: Any) -> int | None:
    if value is None or value is NA:
        return None
    return int(value)


def process_memory(value: Any) -> int | None:
    """usedGpuMemory in bytes; None when NVML cannot tell (WDDM, some MIG setups)."""
    if value is None or value is NA:
        return None
    value = int(value)
    if value >= ULL_NOT_AVAILABLE or value < 0:
        return None
    return value


__all__ = ["CALL_PREFIXES", "NA", "THROTTLE_REASONS", "DeviceDown", "Nvml", "decode_throttle_reasons", "handle_key",
           "int_or_none", "process_memory", "ratio", "scaled", "text"]
