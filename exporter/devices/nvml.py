"""NVIDIA GPUs through NVML (``--backend nvml``), via the ``pynvml`` binding.

A thin shim in the spirit of nvitop's ``libnvml``: every NVML call goes through
`_Nvml.call`, which turns "this device or driver cannot tell" into a *not available*
sentinel instead of an exception. Such values are left as None in the `DeviceSample`
and omitted from the output, never exported as 0. Not available means:

* ``NVML_ERROR_NOT_SUPPORTED`` (e.g. fan speed on a passively cooled card, ECC on a
  consumer card, utilisation on a MIG instance),
* ``NVML_ERROR_NOT_FOUND`` and ``NVML_ERROR_FUNCTION_NOT_FOUND`` (a driver older than
  the binding), and a function the installed binding does not have at all. A missing
  function is logged once, at info level, and then stays quiet.

Versioned functions fall back to older ones: ``nvmlDeviceGetComputeRunningProcesses_v3``
-> ``_v2`` -> plain (same for graphics processes), ``nvmlDeviceGetMemoryInfo`` version 2
-> version 1, ``nvmlDeviceGetTemperatureV`` -> ``nvmlDeviceGetTemperature``,
``nvmlDeviceGetCurrentClocksEventReasons`` -> ``...ClocksThrottleReasons``.

Units. NVML reports in driver units; everything is converted to base units here:

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

Per-process utilisation. ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)``
returns the driver's samples newer than ``lastSeenTimeStamp`` (microseconds). The
backend keeps the newest timestamp it has seen per device and, each pass, averages every
sample of the interval per PID (``smUtil`` and ``memUtil``, percent -> 0-1). The rule
for processes without a sample:

* the call answered ``NVML_ERROR_NOT_FOUND`` (no samples since the last pass), or it
  returned samples that do not include this PID: the device does sample processes and
  this one did not run a kernel, so it gets ``sm_utilization = 0.0`` (idle). Holding
  memory at 0 SM is exactly what ``container_gpu_idle_seconds`` is about.
* the call is not supported (or missing), or the device is a MIG instance: per-process
  utilisation is unknown, so ``sm_utilization`` stays None.

MIG. On a GPU in MIG mode every MIG device becomes its own `DeviceSample` (the parent's
``index``, the MIG ``uuid``, ``gpu_instance`` = its GPU instance id, its own memory and
processes). The parent GPU is still reported for whole-board values (power, energy,
temperature, clocks, ECC, XIDs) but without processes, so that no process is counted
twice.

What a pass costs. On a real driver some calls cost milliseconds (see DESIGN.md and
docs/PERFORMANCE.md), so a pass asks only for what it needs:

* A call that answers NOT_SUPPORTED (or FUNCTION_NOT_FOUND) on a device is not made
  again on that device (fan speed on an H200, for one), until its MIG mode changes.
* PCIe traffic comes from the cumulative byte counters (field values
  ``PCIE_COUNT_TX_BYTES``/``RX_BYTES``, read in the same ``nvmlDeviceGetFieldValues``
  call as the memory temperature); ``nvmlDeviceGetPcieThroughput``, which blocks for
  20 ms while the driver samples, is never called.
* The energy counter (``nvmlDeviceGetTotalEnergyConsumption``, milliseconds per call) is
  read every `ENERGY_COUNTER_PERIOD` seconds; between reads the backend adds the
  integral of power (microseconds per call) to the last reading. The value reported
  never goes backwards: when a reading comes in below the estimate, the estimate is
  held until the counter catches up, so the error never accumulates. A counter that
  drops (the driver reloaded) is passed through as the reset it is.
* MIG mode and the enforced power limit are re-read every `SLOW_PERIOD` seconds, ECC
  totals and the PCIe byte counters every `ECC_PERIOD` and `PCIE_PERIOD` (cumulative
  counters lose nothing by it; dcgm-exporter polls every 30 s), the graphics process
  list every `GRAPHICS_PERIOD` while a GPU has no graphics process; static facts (UUID,
  name, serial, PCI bus id, MIG slots) once. The re-reads of different GPUs are spread
  over the period.
* Per-process utilisation is asked only of GPUs that have processes, with
  ``nvmlDeviceGetProcessesUtilizationInfo`` where the driver has it (cheaper than
  ``nvmlDeviceGetProcessUtilization``, which remains the fallback), and, under the
  collector (`defer_process_utilization`), only of GPUs that more than one owner shares:
  the collector asks for them (`process_utilization_reads`) once it knows the owners,
  and a GPU held by one owner takes its utilisation as the owner's SM share
  (docs/ATTRIBUTION.md). GPUs shared in the last pass (`shared_gpus`) are read in their
  own part of the pass, as sharing lasts.

`NvmlBackend.enable_timings` makes every call record its wall and CPU time, which
``l9gpu snapshot --timings`` prints.

GPM. On Hopper and newer GPUs, `exporter.devices.gpm.GpmReader` adds SM, tensor-core,
DRAM, FP-pipe, PCIe and NVLink activity (``DeviceSample.gpm``) from NVML's GPM samples,
per GPU, or per MIG instance in MIG mode (the parent then has none).

XIDs. At ``open()`` an NVML event set is registered for critical XID events on every
device that supports them; each pass drains it without waiting and counts events per
device and XID code, cumulatively since the agent started.

Failures. A device whose core queries fail (``NVML_ERROR_GPU_IS_LOST``, or any other
unexpected NVML error) comes back ``up=False`` with the error text and no values; the
other devices carry on. Such problems are counted by reason in `NvmlBackend.errors`.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exporter.bulkhead import ABANDONED, Read, check_abandoned
from exporter.config import argtype, parse_duration
from exporter.devices.base import SAMPLING_FLAGS, Backend, BackendUnavailable
from exporter.devices.gpm import DEFAULT_INTERVAL_SECONDS, GpmReader
from exporter.model import DeviceSample, ProcessSample, frozen_mapping
from exporter.shares import READ_ALL, PassPlan

log = logging.getLogger(__name__)

# NVML return codes (nvml.h). Read from the binding when it has them; these are the
# values every NVML release has used.
_NVML_SUCCESS = 0
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_NOT_FOUND = 6
_NVML_ERROR_DRIVER_NOT_LOADED = 9
_NVML_ERROR_TIMEOUT = 10
_NVML_ERROR_LIBRARY_NOT_FOUND = 12
_NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NVML_ERROR_GPU_IS_LOST = 15
_NVML_ERROR_RESET_REQUIRED = 16
_NVML_ERROR_NO_PERMISSION = 4

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
_ULL_NOT_AVAILABLE = 2**64 - 1

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
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

_COMPUTE_PROCESS_FUNCTIONS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
_GRAPHICS_PROCESS_FUNCTIONS = (
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
)
# Per-process utilisation, cheapest first (same sample fields, same timestamp rule).
_PROCESS_UTIL_FUNCTIONS = (
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetProcessUtilization",
)
_THROTTLE_FUNCTIONS = (
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
)

# What NVML's function names start with, to name the call a stuck read is in: pynvml's
# functions are named as NVML's own.
_CALL_PREFIXES = ("nvml",)

# (call, device) pairs remembered as NOT_SUPPORTED at most.
_MAX_UNSUPPORTED = 4096

# Events drained per pass at most, so that a storm of events cannot stall a pass.
_MAX_EVENTS_PER_PASS = 10_000

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
_POWER_AVERAGING_SECONDS = 1.0


class _NotAvailable:
    """The value of an NVML query the device or driver cannot answer (one instance, `NA`)."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NA"


NA: Any = _NotAvailable()


class _NoSuchError(Exception):
    """Stands in for an exception class the binding does not define (never raised)."""


class _Nvml:
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
                ("NVML_ERROR_NOT_SUPPORTED", _NVML_ERROR_NOT_SUPPORTED),
                ("NVML_ERROR_NOT_FOUND", _NVML_ERROR_NOT_FOUND),
                ("NVML_ERROR_FUNCTION_NOT_FOUND", _NVML_ERROR_FUNCTION_NOT_FOUND),
            )
        )
        self.function_not_found = self.const("NVML_ERROR_FUNCTION_NOT_FOUND", _NVML_ERROR_FUNCTION_NOT_FOUND)
        self.not_supported = self.const("NVML_ERROR_NOT_SUPPORTED", _NVML_ERROR_NOT_SUPPORTED)
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
        return (name, _handle_key(args[0]), rest)

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
        key = _handle_key(handle)
        # list() copies in one step: after a stuck read, other GPUs may be read concurrently.
        self._unsupported = {k for k in list(self._unsupported) if len(k) < 2 or k[1] != key}

    def invoke(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fn`` (the binding's ``name``), timing it when timings are on.

        Every call into the driver goes through here. When it returns in a thread whose
        read the pass gave up on (it overran its deadline, see `exporter.bulkhead`), this
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


def _text(value: Any) -> str:
    """NVML strings come back as bytes from older bindings and str from newer ones."""
    if value is NA or value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value)


def _handle_key(handle: Any) -> Any:
    """A hashable identity for a device handle.

    Real handles are ctypes pointers: two pointer objects to the same device are
    different objects, so compare the address they hold.
    """
    if isinstance(handle, ctypes._Pointer):  # type: ignore[attr-defined]
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    try:
        hash(handle)
    except TypeError:
        return ("id", id(handle))
    return handle


def _scaled(value: Any, factor: float) -> float | None:
    if value is NA or value is None:
        return None
    return float(value) * factor


def _ratio(percent: Any) -> float | None:
    if percent is NA or percent is None:
        return None
    return min(max(float(percent) / 100.0, 0.0), 1.0)


class _DeviceDown(Exception):
    """A device cannot be read this pass; carries the error-count reason."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def parse_gpm_interval(text: str) -> float | None:
    """``--gpm-interval``: a duration (0 = every pass), or ``off`` (None)."""
    if str(text).strip().lower() == "off":
        return None
    return parse_duration(text)


class NvmlBackend(Backend):
    """NVIDIA GPUs (and MIG instances) through NVML.

    Args:
        nvml: a module with the ``pynvml`` API. Default: ``import pynvml`` (the
            ``nvidia-ml-py`` package) in `open`. Tests pass a fake.
        energy_counter_period: seconds between reads of the energy counter (power is
            integrated in between); 0 reads it every pass.
        gpm: read GPM metrics (SM, tensor-core, DRAM activity) where the GPU has them.
        gpm_interval: seconds between two GPM samples of a device (see `gpm`).
    """

    name = "nvml"
    call_prefixes = _CALL_PREFIXES
    defers_process_shares = True

    @classmethod
    def add_arguments(cls, group: Any, place: str) -> None:
        if place == SAMPLING_FLAGS:
            group.add_argument("--gpm-interval", default="5s", type=argtype(parse_gpm_interval),
                               metavar="DURATION|off",
                               help="NVIDIA Hopper and newer: time between two GPM samples of a GPU, over which SM, "
                                    "tensor-core and DRAM activity are averaged; 0 samples every pass, off turns GPM "
                                    "off (default: 5s)")

    @classmethod
    def options_from(cls, args: Any) -> dict[str, Any]:
        """``--gpm-interval``: off turns GPM off."""
        if args.gpm_interval is None:
            return {"gpm": False}
        return {"gpm": True, "gpm_interval": args.gpm_interval}

    def __init__(self, nvml: Any = None, energy_counter_period: float = ENERGY_COUNTER_PERIOD,
                 gpm: bool = True, gpm_interval: float = DEFAULT_INTERVAL_SECONDS):
        self._module = nvml
        self._energy_period = energy_counter_period
        self._gpm_enabled = gpm
        self._gpm_interval = gpm_interval
        self._gpm: GpmReader | None = None
        self._nvml: _Nvml | None = None
        self._count = 0
        self._handles: dict[int, Any] = {}
        self._static: dict[int, dict[str, Any]] = {}
        self._driver_version = ""
        self._event_set: Any = None
        self._xid_devices: dict[Any, int] = {}
        self._xid_counts: dict[int, Counter[str]] = defaultdict(Counter)
        self._last_seen: dict[int, int] = {}
        self._errors: Counter[str] = Counter()
        self._initialized = False
        self._next_read: dict[tuple[int, Hashable], float] = {}  # (gpu, what) -> when to re-read
        self._slow_values: dict[tuple[Any, ...], Any] = {}
        self._energy: dict[int, _EnergyEstimate] = {}
        self._fields_unsupported: dict[int, set[int]] = defaultdict(set)
        self._mig_enabled: dict[int, bool] = {}
        self._mig_slots: dict[int, Any] = {}
        self._mig_capacities: dict[str, float] = {}  # MIG UUID -> its part of the GPU
        self._unfinished: set[int] = set()  # GPUs whose read is under way (or was given up on)
        self._parts: list[Read] | None = None  # what `reads` returns, made once
        # The plan of the pass `reads` was last asked for: which GPUs' per-process samples
        # their part reads (the others' are left to `process_share_reads`).
        self._plan = READ_ALL
        self._pass_now = 0.0  # the time of the pass `reads` was last asked for

    # ---- lifecycle --------------------------------------------------------------

    def open(self) -> None:
        """Load NVML, find the GPUs and register for XID events.

        Raises:
            BackendUnavailable: nvidia-ml-py or the NVIDIA driver is missing, or NVML
                sees no GPU.
        """
        module = self._module
        if module is None:
            try:
                import pynvml as module  # type: ignore[no-redef,import-untyped]
            except ImportError as exc:
                raise BackendUnavailable(
                    f"the NVIDIA backend needs the nvidia-ml-py package ({exc}); "
                    "install it with `pip install nvidia-ml-py`"
                ) from exc
            self._module = module
        nvml = _Nvml(module)
        self._nvml = nvml
        try:
            nvml.module.nvmlInit()
        except nvml.error as exc:
            raise BackendUnavailable(self._init_message(nvml, exc)) from exc
        except OSError as exc:
            raise BackendUnavailable(f"cannot load the NVIDIA management library: {exc}") from exc
        self._initialized = True
        if self._gpm_enabled:
            self._gpm = GpmReader(nvml, self._gpm_interval, NA)
        try:
            self._count = int(nvml.module.nvmlDeviceGetCount())
        except nvml.error as exc:
            self.close()
            raise BackendUnavailable(f"NVML cannot count the GPUs: {exc}") from exc
        if self._count <= 0:
            self.close()
            raise BackendUnavailable(
                "NVML sees no NVIDIA GPU. In a container, check that the GPUs are exposed "
                "to it (NVIDIA container runtime, NVIDIA_VISIBLE_DEVICES)."
            )
        try:
            self._driver_version = _text(nvml.call("nvmlSystemGetDriverVersion"))
        except nvml.error:
            log.debug("NVML driver version unavailable", exc_info=True)
        for index in range(self._count):
            self._get_handle(index)
        self._register_xid_events()
        self._parts = None
        log.info("NVML: %d GPU(s), driver %s", self._count, self._driver_version or "unknown")

    @staticmethod
    def _init_message(nvml: _Nvml, exc: BaseException) -> str:
        code = nvml.code(exc)
        if code == nvml.const("NVML_ERROR_LIBRARY_NOT_FOUND", _NVML_ERROR_LIBRARY_NOT_FOUND):
            return (
                "the NVIDIA management library (libnvidia-ml.so.1) was not found: install the "
                "NVIDIA driver, or run the container with the NVIDIA container runtime so the "
                "driver libraries are mounted"
            )
        if code == nvml.const("NVML_ERROR_DRIVER_NOT_LOADED", _NVML_ERROR_DRIVER_NOT_LOADED):
            return "the NVIDIA kernel driver is not loaded (is there an NVIDIA GPU, and is the driver installed?)"
        if code == nvml.const("NVML_ERROR_NO_PERMISSION", _NVML_ERROR_NO_PERMISSION):
            return "no permission to open the NVIDIA devices (/dev/nvidia*)"
        return f"NVML failed to initialise: {exc}"

    def close(self) -> None:
        """Free the event set and shut NVML down."""
        nvml = self._nvml
        if nvml is None:
            return
        if self._gpm is not None:
            self._gpm.close()
        if self._event_set is not None:
            try:
                nvml.call("nvmlEventSetFree", self._event_set)
            except Exception:
                log.debug("nvmlEventSetFree failed", exc_info=True)
            self._event_set = None
        self._parts = None
        if self._initialized:
            try:
                nvml.call("nvmlShutdown")
            except Exception:
                log.debug("nvmlShutdown failed", exc_info=True)
            self._initialized = False

    def errors(self) -> Mapping[str, int]:
        """Problems survived since start, by reason (``gpu_lost``, ``device_error``, ...)."""
        errors = Counter(self._errors)
        if self._gpm is not None:
            errors.update(self._gpm.errors)
        return dict(errors)

    def gpm_status(self) -> dict[tuple[int, str], str]:
        """GPM per (GPU index, MIG instance or ""): active, warming up, or why it is unsupported."""
        if self._gpm is None:
            return {}
        return self._gpm.status()

    def enable_timings(self) -> bool:
        """Record the wall and CPU time of every NVML call from now on (see `timings`)."""
        if self._nvml is None:
            return False
        self._nvml.timings = {}
        return True

    def timings(self, reset: bool = False) -> dict[str, tuple[int, float, float, float]]:
        """Per NVML function: (calls, wall seconds, CPU seconds, slowest call's wall seconds).

        Empty unless `enable_timings` was called; ``reset`` starts counting afresh.
        """
        nvml = self._nvml
        if nvml is None or nvml.timings is None:
            return {}
        out = {name: (int(e[0]), e[1], e[2], e[3]) for name, e in nvml.timings.items()}
        if reset:
            nvml.timings = {}
        return out

    # ---- sampling ---------------------------------------------------------------

    def sample(self, now: float) -> list[DeviceSample]:
        """Read every GPU (and MIG instance) once, in this thread, without deadlines.

        The collector runs `reads` instead, each part with a deadline.

        Args:
            now: monotonic seconds of this pass; schedules the slow re-reads and the
                power integral between energy counter reads.
        """
        samples: list[DeviceSample] = []
        for read in self.reads(now):
            samples.extend(read.run())
        return samples

    def reads(self, now: float, plan: PassPlan = READ_ALL) -> list[Read]:
        """This pass as parts the collector can give up on one by one (`exporter.bulkhead`).

        The XID event drain (key ``"events"``), one part per GPU (key: its index; MIG
        instances are part of their GPU's), and last the GPM cleanup (``"gpm"``). A
        GPU stuck in a call is not asked anything else (its XID events, GPM buffers and
        counters stay as they are) until the call returns; then it is read afresh, as
        after a lost GPU: a new energy reading, new GPM windows.

        Args:
            now: monotonic seconds of this pass (see `sample`).
            plan: the GPUs whose per-process samples their part reads (the others' are
                left to `process_share_reads`, `exporter.shares`).
        """
        self._require()
        self._pass_now, self._plan = now, plan
        if self._gpm is not None:
            self._gpm.begin_pass(now)
        parts = self._parts
        if parts is None:  # the same parts every pass (they read the pass's time from here)
            parts = []
            if self._event_set is not None:
                parts.append(Read("events", "NVML XID events", self._read_xid_events, calls=_CALL_PREFIXES))
            for index in range(self._count):
                parts.append(Read(index, f"GPU {index}", functools.partial(self._read_gpu_part, index),
                                  calls=_CALL_PREFIXES, down=functools.partial(self._down_samples, index)))
            if self._gpm is not None:
                parts.append(Read("gpm", "NVML GPM buffers", self._end_gpm_pass, calls=_CALL_PREFIXES, last=True))
            self._parts = parts
        return parts

    def _read_xid_events(self) -> list[DeviceSample]:
        self._drain_xid_events(self._require())
        return []

    def _read_gpu_part(self, index: int) -> list[DeviceSample]:
        return self._read_gpu(self._require(), index, self._pass_now)

    def _end_gpm_pass(self) -> list[DeviceSample]:
        if self._gpm is not None:
            self._gpm.end_pass()
        return []

    def _read_gpu(self, nvml: _Nvml, index: int, now: float) -> list[DeviceSample]:
        """One GPU's part of a pass; a GPU that cannot be read comes back down."""
        if index in self._unfinished:
            # Its last read never finished (given up on while stuck in a call, which has
            # returned since): start afresh, as after a lost GPU.
            self._forget_gpu(index)
        self._unfinished.add(index)
        try:
            samples = self._sample_gpu(nvml, index, now)
        except _DeviceDown as down:
            samples = self._went_down(index, down)
        self._unfinished.discard(index)
        if self._gpm is not None:
            self._gpm.gpu_read(index)
        return samples

    def _went_down(self, index: int, down: _DeviceDown) -> list[DeviceSample]:
        """A GPU that could not be read: counted, forgotten, reported down."""
        self._errors[down.reason] += 1
        self._forget_gpu(index)
        self._handles.pop(index, None)  # get a fresh handle next pass
        log.debug("GPU %d not readable: %s", index, down)
        return [self._down_sample(index, str(down))]

    def _forget_gpu(self, index: int) -> None:
        """Drop what is carried from pass to pass for a GPU (after it was down or stuck)."""
        if self._gpm is not None:
            self._gpm.forget(index)
        self._energy.pop(index, None)  # a fresh energy reading: nothing integrated across the gap

    def _down_samples(self, index: int, error: str) -> list[DeviceSample]:
        return [self._down_sample(index, error)]

    def _down_sample(self, index: int, error: str) -> DeviceSample:
        """A GPU that could not be read: its identity, XID counts and why, no values."""
        static = self._static.get(index, {})
        identity = DeviceSample(index=index, uuid=static.get("uuid", ""), model=static.get("model", ""),
                                vendor="nvidia", driver_version=self._driver_version,
                                pci_bus_id=static.get("pci_bus_id", ""), serial=static.get("serial", ""))
        return identity.down(error, xid_errors=self._xid_counts.get(index))

    def _require(self) -> _Nvml:
        if self._nvml is None or not self._initialized:
            raise RuntimeError("NvmlBackend.sample() called before open()")
        return self._nvml

    def _down(self, nvml: _Nvml, exc: BaseException) -> _DeviceDown:
        code = nvml.code(exc)
        if code == nvml.const("NVML_ERROR_GPU_IS_LOST", _NVML_ERROR_GPU_IS_LOST):
            return _DeviceDown("gpu_lost", f"GPU is lost: {exc}")
        if code == nvml.const("NVML_ERROR_RESET_REQUIRED", _NVML_ERROR_RESET_REQUIRED):
            return _DeviceDown("reset_required", f"GPU requires reset: {exc}")
        return _DeviceDown("device_error", f"NVML error {code}: {exc}")

    def _get_handle(self, index: int) -> Any:
        nvml = self._require()
        handle = self._handles.get(index)
        if handle is not None:
            return handle
        try:
            handle = nvml.invoke("nvmlDeviceGetHandleByIndex", nvml.module.nvmlDeviceGetHandleByIndex, index)
        except nvml.error as exc:
            log.debug("no NVML handle for GPU %d: %s", index, exc)
            return None
        self._handles[index] = handle
        if self._event_set is not None and _handle_key(handle) not in self._xid_devices:
            self._register_xid(nvml, index, handle)
        return handle

    def _guard(self, nvml: _Nvml, fn: Callable[..., Any], *args: Any) -> Any:
        """Run an optional query: a lost GPU stops the device, other errors give NA."""
        try:
            return fn(*args)
        except nvml.error as exc:
            code = nvml.code(exc)
            if code in (
                nvml.const("NVML_ERROR_GPU_IS_LOST", _NVML_ERROR_GPU_IS_LOST),
                nvml.const("NVML_ERROR_RESET_REQUIRED", _NVML_ERROR_RESET_REQUIRED),
            ):
                raise self._down(nvml, exc) from exc
            self._errors["query_error"] += 1
            log.debug("NVML query %s failed: %s", getattr(fn, "__name__", fn), exc)
            return NA

    def _opt(self, nvml: _Nvml, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._guard(nvml, lambda: nvml.call(name, *args, **kwargs))

    def _static_info(self, nvml: _Nvml, index: int, handle: Any) -> dict[str, Any]:
        """Facts that do not change while the driver is loaded; read once per GPU."""
        static = self._static.get(index)
        if static is not None and static.get("uuid"):
            return static
        uuid = _text(nvml.call("nvmlDeviceGetUUID", handle))
        model = _text(nvml.call("nvmlDeviceGetName", handle))
        serial = _text(self._opt(nvml, "nvmlDeviceGetSerial", handle))
        pci = self._opt(nvml, "nvmlDeviceGetPciInfo", handle)
        bus_id = _text(getattr(pci, "busId", None)) if pci is not NA else ""
        static = {"uuid": uuid, "model": model, "serial": serial, "pci_bus_id": bus_id}
        self._static[index] = static
        return static

    def _due(self, index: int, what: Hashable, now: float, period: float) -> bool:
        """True when ``what`` of GPU ``index`` is to be read in this pass.

        The first pass reads everything; after it, the re-reads of GPU i are first due
        (i + 1) / count of a period later, so that GPUs do not all pay in the same pass.
        """
        key = (index, what)
        due = self._next_read.get(key)
        if due is None:
            self._next_read[key] = now + period * (index + 1) / max(1, self._count)
            return True
        if now < due:
            return False
        self._next_read[key] = max(due + period, now)
        return True

    def _slow(self, index: int, what: str, now: float, period: float, read: Callable[[], Any]) -> Any:
        """A value re-read every ``period`` seconds, served from the last read in between."""
        key = (index, what)
        if self._due(index, what, now, period) or key not in self._slow_values:
            self._slow_values[key] = read()
        return self._slow_values[key]

    def _sample_gpu(self, nvml: _Nvml, index: int, now: float) -> list[DeviceSample]:
        handle = self._get_handle(index)
        if handle is None:
            raise _DeviceDown("device_error", "no NVML handle for this GPU")
        try:
            static = self._static_info(nvml, index, handle)
            memory = self._memory_info(nvml, handle)
            utilization = nvml.call("nvmlDeviceGetUtilizationRates", handle)
        except nvml.error as exc:
            raise self._down(nvml, exc) from exc

        mig_enabled = self._slow(index, "mig_mode", now, SLOW_PERIOD,
                                 lambda: self._read_mig_mode(nvml, index, handle))

        throttle = self._guard(nvml, lambda: nvml.first(_THROTTLE_FUNCTIONS, handle))
        power_watts = _scaled(self._opt(nvml, "nvmlDeviceGetPowerUsage", handle), 1e-3)
        fields = self._field_values(nvml, index, handle, now)

        values: dict[str, Any] = {
            "utilization": _ratio(getattr(utilization, "gpu", None)) if utilization is not NA else None,
            "memory_utilization": _ratio(getattr(utilization, "memory", None)) if utilization is not NA else None,
            "memory_used_bytes": _int_or_none(getattr(memory, "used", None)) if memory is not NA else None,
            "memory_total_bytes": _int_or_none(getattr(memory, "total", None)) if memory is not NA else None,
            "temperature_celsius": _scaled(self._temperature(nvml, handle), 1.0),
            "memory_temperature_celsius": fields.get(nvml.const("NVML_FI_DEV_MEMORY_TEMP")),
            "power_watts": power_watts,
            "power_limit_watts": self._slow(
                index, "power_limit", now, SLOW_PERIOD,
                lambda: _scaled(self._opt(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle), 1e-3)),
            "energy_joules": self._energy_joules(nvml, index, handle, now, power_watts),
            "sm_clock_hertz": _scaled(
                self._opt(nvml, "nvmlDeviceGetClockInfo", handle, nvml.const("NVML_CLOCK_SM")), 1e6
            ),
            "memory_clock_hertz": _scaled(
                self._opt(nvml, "nvmlDeviceGetClockInfo", handle, nvml.const("NVML_CLOCK_MEM")), 1e6
            ),
            "pcie_tx_bytes_total": _int_or_none(fields.get(nvml.const("NVML_FI_DEV_PCIE_COUNT_TX_BYTES"))),
            "pcie_rx_bytes_total": _int_or_none(fields.get(nvml.const("NVML_FI_DEV_PCIE_COUNT_RX_BYTES"))),
            "fan_speed_ratio": _ratio(self._opt(nvml, "nvmlDeviceGetFanSpeed", handle)),
            "ecc_errors": self._slow(index, "ecc", now, ECC_PERIOD,
                                     lambda: frozen_mapping(self._ecc(nvml, handle))),
            "throttle_reasons": frozen_mapping(decode_throttle_reasons(throttle) if throttle is not NA else None),
            "xid_errors": frozen_mapping(self._xid_counts.get(index)),
            # GPM of the whole GPU; in MIG mode each instance has its own (below).
            "gpm": self._read_gpm(nvml, handle, index) if not mig_enabled else frozen_mapping(),
        }
        processes: tuple[ProcessSample, ...] = ()
        if not mig_enabled:
            processes = self._processes(nvml, index, handle, per_process_util=True, now=now)
        parent = DeviceSample(
            index=index,
            uuid=static["uuid"],
            model=static["model"],
            vendor="nvidia",
            driver_version=self._driver_version,
            pci_bus_id=static["pci_bus_id"],
            serial=static["serial"],
            processes=processes,
            **values,
        )
        samples = [parent]
        if mig_enabled:
            instances = self._sample_mig(nvml, index, handle,
                                         {**static, "memory_total_bytes": values["memory_total_bytes"]}, now)
            # The parent carries the slices that are in no instance (it runs no process).
            free = max(0.0, 1.0 - sum(d.capacity for d in instances))
            samples = [replace(parent, capacity=free), *instances]
        return samples

    def _read_mig_mode(self, nvml: _Nvml, index: int, handle: Any) -> bool:
        """Whether MIG is on; a change makes every call on the GPU worth asking again."""
        mig_mode = self._opt(nvml, "nvmlDeviceGetMigMode", handle)
        enabled = (
            mig_mode is not NA
            and bool(mig_mode)
            and mig_mode[0] == nvml.const("NVML_DEVICE_MIG_ENABLE")
        )
        before = self._mig_enabled.get(index)
        if before is not None and before != enabled:
            log.info("GPU %d: MIG mode is now %s", index, "on" if enabled else "off")
            nvml.forget(handle)
            self._mig_slots.pop(index, None)
            self._fields_unsupported.pop(index, None)
        self._mig_enabled[index] = enabled
        return enabled

    def _field_values(self, nvml: _Nvml, index: int, handle: Any, now: float) -> dict[int, float]:
        """Memory temperature every pass and the PCIe byte counters every `PCIE_PERIOD`,
        in one field-values call (the counters cost 0.46 ms on an H200, the temperature
        next to nothing); between counter reads the last counter values are served.

        A field the device answers NOT_SUPPORTED for is not asked again.
        """
        skip = self._fields_unsupported[index]
        pcie = (nvml.const("NVML_FI_DEV_PCIE_COUNT_TX_BYTES"), nvml.const("NVML_FI_DEV_PCIE_COUNT_RX_BYTES"))
        candidates: tuple[int, ...] = (nvml.const("NVML_FI_DEV_MEMORY_TEMP"),)
        last_pcie: dict[int, float] = self._slow_values.get((index, "pcie"), {})
        if self._due(index, "pcie", now, PCIE_PERIOD):
            candidates += pcie
            last_pcie = {}
        wanted = [field for field in candidates if field not in skip]
        if not wanted:
            return dict(last_pcie)
        values = self._opt(nvml, "nvmlDeviceGetFieldValues", handle, wanted)
        if values is NA or not values:
            return dict(last_pcie)
        out: dict[int, float] = dict(last_pcie)
        for field, value in zip(wanted, values):
            ret = getattr(value, "nvmlReturn", _NVML_SUCCESS)
            if ret != _NVML_SUCCESS:
                if ret in nvml.na_codes:
                    skip.add(field)
                continue
            member = _VALUE_MEMBERS.get(getattr(value, "valueType", 1), "uiVal")
            number = getattr(getattr(value, "value", None), member, None)
            if number is not None:
                out[field] = number
        if pcie[0] in wanted or pcie[1] in wanted:
            self._slow_values[(index, "pcie")] = {f: v for f, v in out.items() if f in pcie}
        return out

    def _energy_joules(self, nvml: _Nvml, index: int, handle: Any, now: float,
                       power_watts: float | None) -> float | None:
        """The device's energy counter in joules, read every ``energy_counter_period``.

        Between reads: the last reading plus the integral of power since (see the module
        doc). None where the device has no energy counter (derive then integrates power).
        """
        estimate = self._energy.get(index)
        due = self._energy_period <= 0 or self._due(index, "energy", now, self._energy_period)
        if estimate is None or power_watts is None or due:
            reading = _scaled(self._opt(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle), 1e-3)
            if reading is None:
                self._energy.pop(index, None)
                return None
            if estimate is None:
                estimate = _EnergyEstimate(reading, reading, now, power_watts)
                self._energy[index] = estimate
            else:
                estimate.read(reading, now, power_watts)
            return estimate.reported
        estimate.integrate(now, power_watts)
        return estimate.reported

    def _memory_info(self, nvml: _Nvml, handle: Any) -> Any:
        """Memory info, version 2 where the driver has it (``used`` without reserved)."""
        version = getattr(nvml.module, "nvmlMemory_v2", None)
        if version is not None:
            try:
                memory = nvml.call("nvmlDeviceGetMemoryInfo", handle, version=version)
            except TypeError:  # a binding without the version argument
                memory = NA
            except nvml.error as exc:
                # ARGUMENT_VERSION_MISMATCH and friends: the driver predates version 2.
                if nvml.code(exc) == nvml.const("NVML_ERROR_GPU_IS_LOST", _NVML_ERROR_GPU_IS_LOST):
                    raise
                memory = NA
            if memory is not NA:
                return memory
        return nvml.call("nvmlDeviceGetMemoryInfo", handle)

    def _temperature(self, nvml: _Nvml, handle: Any) -> Any:
        sensor = nvml.const("NVML_TEMPERATURE_GPU")
        value = self._opt(nvml, "nvmlDeviceGetTemperatureV", handle, sensor)
        if value is NA:
            value = self._opt(nvml, "nvmlDeviceGetTemperature", handle, sensor)
        return value

    def _ecc(self, nvml: _Nvml, handle: Any) -> dict[str, int]:
        counters: dict[str, int] = {}
        aggregate = nvml.const("NVML_AGGREGATE_ECC")
        for name, error_type in (
            ("corrected", nvml.const("NVML_MEMORY_ERROR_TYPE_CORRECTED")),
            ("uncorrected", nvml.const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED")),
        ):
            count = self._opt(nvml, "nvmlDeviceGetTotalEccErrors", handle, error_type, aggregate)
            if count is not NA and count is not None:
                counters[name] = int(count)
        return counters

    # ---- processes --------------------------------------------------------------

    def _processes(
        self, nvml: _Nvml, index: int, handle: Any, per_process_util: bool, now: float
    ) -> tuple[ProcessSample, ...]:
        found: dict[int, tuple[int | None, str]] = {}
        graphics_key = (index, "graphics", _handle_key(handle))
        kinds = [("compute", _COMPUTE_PROCESS_FUNCTIONS)]
        if self._slow_values.get(graphics_key) or self._due(index, graphics_key[1:], now, GRAPHICS_PERIOD):
            kinds.append(("graphics", _GRAPHICS_PROCESS_FUNCTIONS))
        for kind, functions in kinds:
            infos = self._guard(nvml, lambda fns=functions: nvml.first(fns, handle))
            if kind == "graphics":
                self._slow_values[graphics_key] = bool(infos)
            if infos is NA or infos is None:
                continue
            for info in infos:
                try:  # the binding's process objects always have both
                    pid, memory = info.pid, info.usedGpuMemory
                except AttributeError:
                    pid, memory = getattr(info, "pid", 0), getattr(info, "usedGpuMemory", None)
                pid = int(pid or 0)
                if pid <= 0:
                    continue
                memory = _process_memory(memory)
                known = found.get(pid)
                if known is None:
                    found[pid] = (memory, kind)
                elif known[0] is None:
                    # Compute and graphics contexts of one process share its memory
                    # figure; keep the first kind and a figure if either has one.
                    found[pid] = (memory, known[1])
        if not found:
            # No process, nothing to ask the driver's per-process samples about (they
            # cost milliseconds). The last-seen timestamp stays, so the next pass with
            # processes reads only samples newer than the last one read.
            return ()
        util: dict[int, tuple[float, float]] | None = None
        if per_process_util and self._plan.reads_shares(index):
            util = self._process_utilization(nvml, index, handle)
        return _processes_with_shares([(pid, *found[pid]) for pid in sorted(found)], util)

    def process_share_reads(self, devices: Sequence[DeviceSample]) -> list[Read]:
        """The per-process samples of these GPUs, as parts of the pass (`exporter.bulkhead`).

        Under a `PassPlan` without per-process metrics, a GPU's part of the pass leaves
        its processes' SM shares unread (unless the plan names it in ``shared``), so that
        the collector can ask for them once it knows the processes' owners: only for GPUs
        that more than one owner shares (the per-process read costs 1.5 ms on an H200, more
        than the rest of a GPU's pass).
        Each part returns the GPU's sample with its processes' shares, or the GPU down
        when it was lost meanwhile; its key is the GPU's, so it is not asked while a call
        of its first part is stuck.

        Args:
            devices: whole GPUs of this pass (MIG instances have no per-process samples).
        """
        reads = []
        for device in devices:
            if device.gpu_instance or not device.processes or not device.up:
                continue
            index = device.index
            reads.append(Read(index, f"GPU {index}", functools.partial(self._read_shares, device),
                              calls=_CALL_PREFIXES, down=functools.partial(self._down_samples, index)))
        return reads

    def _read_shares(self, device: DeviceSample) -> list[DeviceSample]:
        nvml = self._require()
        index = device.index
        handle = self._handles.get(index)
        if handle is None:  # lost since its first part: the next pass reads it afresh
            return [device]
        self._unfinished.add(index)
        try:
            util = self._process_utilization(nvml, index, handle)
        except _DeviceDown as down:
            self._unfinished.discard(index)
            return self._went_down(index, down)
        self._unfinished.discard(index)
        processes = [(p.pid, p.used_memory_bytes, p.kind) for p in device.processes]
        return [replace(device, processes=_processes_with_shares(processes, util))]

    def _process_utilization(self, nvml: _Nvml, index: int, handle: Any) -> dict[int, tuple[float, float]] | None:
        """Mean SM and memory utilisation (0-1) per PID over the samples since last pass.

        Asks ``nvmlDeviceGetProcessesUtilizationInfo`` where the driver has it, else
        ``nvmlDeviceGetProcessUtilization``; both take and return the same timestamps.

        Returns:
            PID -> (sm, memory) for PIDs with samples; an empty dict when the device
            samples processes but has none new (NOT_FOUND: all idle); None when the
            device cannot sample processes at all.
        """
        last_seen = self._last_seen.get(index, 0)
        for name in _PROCESS_UTIL_FUNCTIONS:
            fn = getattr(nvml.module, name, None)
            if not callable(fn):
                nvml.call(name)  # not in this binding: logs that once
                continue
            if nvml.unsupported(name, handle):
                continue
            try:
                samples = nvml.invoke(name, fn, handle, last_seen)
            except nvml.mismatch:
                nvml.remember_unsupported(name, handle)
                continue
            except nvml.error as exc:
                code = nvml.code(exc)
                # NOT_FOUND: no sample newer than last_seen. pynvml raises NVMLError(SUCCESS)
                # when the driver answers "success, zero samples" to its sizing call.
                if code in (nvml.const("NVML_ERROR_NOT_FOUND", _NVML_ERROR_NOT_FOUND), _NVML_SUCCESS):
                    return {}
                if code in (nvml.not_supported, nvml.function_not_found):
                    nvml.remember_unsupported(name, handle)
                    continue
                if code in (
                    nvml.const("NVML_ERROR_GPU_IS_LOST", _NVML_ERROR_GPU_IS_LOST),
                    nvml.const("NVML_ERROR_RESET_REQUIRED", _NVML_ERROR_RESET_REQUIRED),
                ):
                    raise self._down(nvml, exc) from exc
                self._errors["query_error"] += 1
                log.debug("%s failed: %s", name, exc)
                return None
            return self._aggregate_utilization(index, last_seen, samples or ())
        return None

    def _aggregate_utilization(
        self, index: int, last_seen: int, samples: Iterable[Any]
    ) -> dict[int, tuple[float, float]]:
        sums: dict[int, list[float]] = {}
        newest = last_seen
        for sample in samples:
            try:  # the binding's samples always have these (ctypes structs)
                stamp, pid, sm, mem = sample.timeStamp, sample.pid, sample.smUtil, sample.memUtil
            except AttributeError:
                stamp, pid = getattr(sample, "timeStamp", 0), getattr(sample, "pid", 0)
                sm, mem = getattr(sample, "smUtil", 0), getattr(sample, "memUtil", 0)
            stamp = int(stamp or 0)
            if stamp > newest:
                newest = stamp
            if stamp <= last_seen:
                continue  # the driver promises newer samples only; be safe anyway
            pid = int(pid or 0)
            acc = sums.get(pid)
            if acc is None:
                sums[pid] = [float(sm or 0), float(mem or 0), 1]
            else:
                acc[0] += float(sm or 0)
                acc[1] += float(mem or 0)
                acc[2] += 1
        self._last_seen[index] = newest
        return {
            pid: (min(sm / n / 100.0, 1.0), min(mem / n / 100.0, 1.0))
            for pid, (sm, mem, n) in sums.items()
        }

    # ---- MIG --------------------------------------------------------------------

    def _sample_mig(self, nvml: _Nvml, index: int, handle: Any, parent: Mapping[str, Any],
                    now: float) -> list[DeviceSample]:
        count = self._mig_slots.get(index)
        if count is None:
            count = self._mig_slots[index] = self._opt(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle)
        if count is NA:
            return []
        samples = []
        for slot in range(int(count)):
            mig = self._opt(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is NA or mig is None:
                continue  # an empty slot
            try:
                uuid = _text(nvml.call("nvmlDeviceGetUUID", mig))
                instance = nvml.call("nvmlDeviceGetGpuInstanceId", mig)
                memory = nvml.call("nvmlDeviceGetMemoryInfo", mig)
            except nvml.error as exc:
                down = self._down(nvml, exc)
                if down.reason != "device_error":
                    raise down from exc
                self._errors["mig_error"] += 1
                log.debug("MIG device %d/%d not readable: %s", index, slot, exc)
                continue
            utilization = self._opt(nvml, "nvmlDeviceGetUtilizationRates", mig)
            gpm = frozen_mapping() if instance is NA else self._read_gpm(nvml, handle, index, int(instance))
            capacity = self._mig_capacity(nvml, mig, uuid, int(count), memory, parent)
            samples.append(
                DeviceSample(
                    index=index,
                    uuid=uuid,
                    model=parent["model"],
                    vendor="nvidia",
                    gpu_instance="" if instance is NA else str(instance),
                    driver_version=self._driver_version,
                    pci_bus_id=parent["pci_bus_id"],
                    serial=parent["serial"],
                    utilization=_ratio(getattr(utilization, "gpu", None)) if utilization is not NA else None,
                    memory_utilization=(
                        _ratio(getattr(utilization, "memory", None)) if utilization is not NA else None
                    ),
                    memory_used_bytes=_int_or_none(getattr(memory, "used", None)) if memory is not NA else None,
                    memory_total_bytes=_int_or_none(getattr(memory, "total", None)) if memory is not NA else None,
                    gpm=gpm,
                    # NVML has no per-process utilisation on MIG devices.
                    processes=self._processes(nvml, index, mig, per_process_util=False, now=now),
                    capacity=capacity,
                )
            )
        return samples

    def _mig_capacity(self, nvml: _Nvml, mig: Any, uuid: str, slots: int, memory: Any,
                      parent: Mapping[str, Any]) -> float:
        """A MIG instance's part of its GPU: its compute slices over the GPU's MIG slots
        (``nvmlDeviceGetAttributes``: a 1g.10gb of an H100 is 1/7), read once per instance.

        Where the driver does not say, its memory's share of the GPU's is the nearest figure.
        """
        capacity = self._mig_capacities.get(uuid)
        if capacity is not None:
            return capacity
        attributes = self._opt(nvml, "nvmlDeviceGetAttributes", mig)
        slices = 0 if attributes is NA else int(getattr(attributes, "computeInstanceSliceCount", 0)
                                                  or getattr(attributes, "gpuInstanceSliceCount", 0) or 0)
        total = parent.get("memory_total_bytes") or 0
        if slices and slots:
            capacity = min(1.0, slices / slots)
        elif memory is not NA and total and getattr(memory, "total", 0):
            capacity = min(1.0, int(memory.total) / total)
        else:
            capacity = 1.0 / slots if slots else 1.0
        if len(self._mig_capacities) > 4096:  # instances come and go with new UUIDs: stay bounded
            self._mig_capacities.clear()
        self._mig_capacities[uuid] = capacity
        return capacity

    def _read_gpm(self, nvml: _Nvml, handle: Any, index: int, gpu_instance: int | None = None) -> Any:
        """GPM values (see `exporter.devices.gpm`); a lost GPU stops the device."""
        gpm = self._gpm
        if gpm is None:
            return frozen_mapping()
        try:
            return gpm.read(handle, index, gpu_instance)
        except nvml.error as exc:
            raise self._down(nvml, exc) from exc

    # ---- XID events -------------------------------------------------------------

    def _register_xid_events(self) -> None:
        nvml = self._require()
        try:
            event_set = nvml.call("nvmlEventSetCreate")
        except nvml.error as exc:
            log.info("NVML event set unavailable, XID errors will not be counted: %s", exc)
            return
        if event_set is NA:
            return
        self._event_set = event_set
        for index, handle in list(self._handles.items()):
            self._register_xid(nvml, index, handle)
        if not self._xid_devices:
            log.info("no GPU supports XID events; XID errors will not be counted")

    def _register_xid(self, nvml: _Nvml, index: int, handle: Any) -> None:
        xid = nvml.const("nvmlEventTypeXidCriticalError")
        try:
            supported = nvml.call("nvmlDeviceGetSupportedEventTypes", handle)
            if supported is not NA and not int(supported) & xid:
                log.debug("GPU %d does not report XID events", index)
                return
            if nvml.call("nvmlDeviceRegisterEvents", handle, xid, self._event_set) is NA:
                log.debug("GPU %d does not support XID events", index)
                return
        except nvml.error as exc:
            log.debug("cannot register XID events on GPU %d: %s", index, exc)
            return
        self._xid_devices[_handle_key(handle)] = index

    def _drain_xid_events(self, nvml: _Nvml) -> None:
        if self._event_set is None:
            return
        timeout = nvml.const("NVML_ERROR_TIMEOUT", _NVML_ERROR_TIMEOUT)
        xid = nvml.const("nvmlEventTypeXidCriticalError")
        for _ in range(_MAX_EVENTS_PER_PASS):
            try:
                event = nvml.call("nvmlEventSetWait", self._event_set, 0)
            except nvml.error as exc:
                if nvml.code(exc) != timeout:
                    self._errors["event_wait_error"] += 1
                    log.debug("nvmlEventSetWait failed: %s", exc)
                return
            if event is NA:
                return
            if not int(getattr(event, "eventType", 0) or 0) & xid:
                continue
            index = self._event_device(nvml, getattr(event, "device", None))
            if index is None:
                self._errors["xid_unknown_device"] += 1
                continue
            code = str(int(getattr(event, "eventData", 0) or 0))
            self._xid_counts[index][code] += 1
            log.warning("GPU %d: XID %s", index, code)

    def _event_device(self, nvml: _Nvml, device: Any) -> int | None:
        """Map an event's device handle back to a GPU index."""
        if device is None:
            return None
        index = self._xid_devices.get(_handle_key(device))
        if index is not None:
            return index
        try:
            uuid = _text(nvml.call("nvmlDeviceGetUUID", device))
        except nvml.error:
            return None
        for known, static in list(self._static.items()):
            if uuid and static.get("uuid") == uuid:
                return known
        return None


@dataclass
class _EnergyEstimate:
    """A GPU's energy counter between reads: the last reading plus integrated power.

    Attributes:
        reading: the counter's last reading, joules.
        reported: what the backend reports: never less than before, except when the
            counter itself drops (a driver reload).
        at: monotonic seconds of the last power reading.
        power: the last power reading, watts (None: unknown).
        integral: joules integrated from power since the last counter reading.
    """

    reading: float
    reported: float
    at: float
    power: float | None
    integral: float = 0.0

    def read(self, reading: float, now: float, power: float | None) -> None:
        """A fresh counter reading replaces the estimate (held while it is ahead)."""
        if reading < self.reading:
            self.reported = reading  # the counter restarted; derive sees the reset
        else:
            self.reported = max(self.reported, reading)
        self.reading, self.integral, self.at, self.power = reading, 0.0, now, power

    def integrate(self, now: float, power: float) -> None:
        dt = max(0.0, now - self.at)
        if dt <= _POWER_AVERAGING_SECONDS or self.power is None:
            self.integral += power * dt
        else:
            # The reading covers the last second exactly; the gap before it, the mean
            # of the readings at both ends.
            gap = dt - _POWER_AVERAGING_SECONDS
            self.integral += power * _POWER_AVERAGING_SECONDS + (self.power + power) / 2.0 * gap
        self.at, self.power = now, power
        self.reported = max(self.reported, self.reading + self.integral)


def decode_throttle_reasons(mask: int) -> dict[str, bool]:
    """Turn an NVML clock event reason bit mask into reason name -> active."""
    mask = int(mask)
    return {name: bool(mask & bit) for name, bit in THROTTLE_REASONS}


def _processes_with_shares(processes: Sequence[tuple[int, int | None, str]],
                           util: Mapping[int, tuple[float, float]] | None) -> tuple[ProcessSample, ...]:
    """(pid, memory, kind) of each process, with its SM and memory shares from ``util`` (see
    the module doc for the rule): a process without a sample was idle (0); None (the
    device cannot sample processes, or they were not read) leaves the shares unknown."""
    if util is None:
        return tuple(ProcessSample(pid=pid, used_memory_bytes=memory, kind=kind) for pid, memory, kind in processes)
    out = []
    for pid, memory, kind in processes:
        sm, mem = util.get(pid, (0.0, 0.0))
        out.append(ProcessSample(pid=pid, used_memory_bytes=memory, sm_utilization=sm, memory_utilization=mem,
                                 kind=kind))
    return tuple(out)


def _int_or_none(value: Any) -> int | None:
    if value is None or value is NA:
        return None
    return int(value)


def _process_memory(value: Any) -> int | None:
    """usedGpuMemory in bytes; None when NVML cannot tell (WDDM, some MIG setups)."""
    if value is None or value is NA:
        return None
    value = int(value)
    if value >= _ULL_NOT_AVAILABLE or value < 0:
        return None
    return value


__all__ = ["THROTTLE_REASONS", "NvmlBackend", "decode_throttle_reasons"]
