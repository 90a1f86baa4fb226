"""A fake of the ``pynvml`` module (nvidia-ml-py) for tests, no GPU needed.

It reproduces the real binding's shapes: the ``NVMLError`` class whose constructor
picks the subclass from the code (``NVMLError(3)`` is an ``NVMLError_NotSupported``),
the real return codes and constant names, struct-like results with the real field names
(``c_nvmlMemory_t.total/free/used``, ``c_nvmlProcessInfo_t.pid/usedGpuMemory/...``,
``c_nvmlEventData_t.device/eventType/eventData/...``), and NVML's units: milliwatts,
millijoules, MHz, KB/s, percent.

Usage::

    from fakes.pynvml_fake import FakeNvml, FakeGpu, FakeProcess, FakeUtilSample  # tests/ is on sys.path

    fake = FakeNvml(gpus=[
        FakeGpu(power_mw=250_000, processes=[FakeProcess(pid=os.getpid(), used_memory=2**30)]),
        FakeGpu(unsupported={"nvmlDeviceGetFanSpeed"}),
    ])
    backend = NvmlBackend(nvml=fake)          # inject it ...
    install(monkeypatch, fake)                # ... or make `import pynvml` return it

Everything is plain mutable data, so a test changes the world between two passes:
``fake.gpus[0].energy_mj += 5000``, ``fake.gpus[1].lost = True``,
``fake.add_util_samples(0, [FakeUtilSample(pid, timestamp, sm=80)])``,
``fake.queue_xid(1, 79)``. ``fake.calls`` records every call as ``(name, args)``.

Knobs per GPU: ``unsupported`` (function names that raise NVMLError_NotSupported;
also ``pcie_counters`` and ``perf_policy_fields``: those field values answer NOT_SUPPORTED),
``errors`` (function name -> NVML error code to raise), ``lost`` (every call on the
device raises NVMLError_GpuIsLost), ``mig_devices`` (MIG mode on), ``xid_supported``.
Knobs per fake: ``missing`` (function names absent from the module, like an old
binding), ``init_error`` (code raised by ``nvmlInit``), ``legacy_bytes`` (strings
returned as bytes, as bindings before 11.5 did), ``costs`` (what each call costs).

Calls that hang. A real driver call can block for seconds or for ever (a GPU that fell
off the bus, the driver's own lock held), and a thread stuck in it cannot be interrupted.
``block = fake.block("nvmlDeviceGetPowerUsage", gpu=1)`` makes that call on GPU 1 wait
until ``block.release()`` (``fake.block()`` with no arguments: every call, as when the
driver's lock is held; ``seconds=30``: release itself after 30 s). ``block.entered`` is
set once a call waits in it, ``block.waiting`` counts the calls waiting now.

Call costs. A fake that answers for free hides the calls that make a pass slow on a real
driver. ``FakeNvml(costs=H200_COSTS)`` charges every call what it cost on a real H200
(driver 580.159.04, 2026-12-04, median per call): CPU time is burnt with the GIL
released (hashing a buffer, as a ctypes call into the driver releases it) and the rest of
the call's wall time is slept, so ``nvmlDeviceGetPcieThroughput`` blocks for 20.7 ms
while using 0.63 ms of CPU, as the real one does. Field values cost by the fields asked for.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

# ---- return codes (nvml.h; the same numbers as in pynvml) ------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

_ERROR_CODES = {k: v for k, v in dict(globals()).items() if k.startswith("NVML_ERROR_")}

_ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}

# ---- other constants (same names and values as pynvml) --------------------------------

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
NVML_FI_DEV_POWER_INSTANT = 186
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_DEVICE_MIG_DISABLE = 0
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3
NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_FI_DEV_PERF_POLICY_POWER = 74  # .. NVML_FI_DEV_PERF_POLICY_RELIABILITY = 79: NVML_PERF_POLICY_* + 74
NVML_FI_DEV_PERF_POLICY_THERMAL = 75
NVML_FI_DEV_PERF_POLICY_SYNC_BOOST = 76
NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT = 77
NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION = 78
NVML_FI_DEV_PERF_POLICY_RELIABILITY = 79
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_PERF_POLICY_SYNC_BOOST = 2
NVML_PERF_POLICY_BOARD_LIMIT = 3
NVML_PERF_POLICY_LOW_UTILIZATION = 4
NVML_PERF_POLICY_RELIABILITY = 5
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
nvmlGpuFabricInfo_v2 = 0x02000024
nvmlEccSramErrorStatus_v1 = 0x01000068
NVML_DEVICE_MIG_ENABLE = 1
nvmlMemory_v2 = 0x02000028

nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypePState = 0x4
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypeClock = 0x10
nvmlEventTypeNone = 0x0

nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonApplicationsClocksSetting = 0x2
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSyncBoost = 0x10
nvmlClocksEventReasonSwThermalSlowdown = 0x20
nvmlClocksEventReasonHwThermalSlowdown = 0x40
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksEventReasonDisplayClockSetting = 0x100
nvmlClocksEventReasonNone = 0x0
# The older names of the same bits.
nvmlClocksThrottleReasonGpuIdle = 0x1
nvmlClocksThrottleReasonApplicationsClocksSetting = 0x2
nvmlClocksThrottleReasonSwPowerCap = 0x4
nvmlClocksThrottleReasonHwSlowdown = 0x8
nvmlClocksThrottleReasonSyncBoost = 0x10
nvmlClocksThrottleReasonSwThermalSlowdown = 0x20
nvmlClocksThrottleReasonHwThermalSlowdown = 0x40
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 0x80
nvmlClocksThrottleReasonDisplayClockSetting = 0x100

GiB = 2**30
MiB = 2**20
ProcessesUtilizationInfo_v1 = 0x01000018


# ---- call costs (measured on an H200, driver 580.159.04, 2026-12-04) ----------------------


@dataclass(frozen=True)
class CallCost:
    """What one call costs: wall time and CPU time, in seconds."""

    wall: float
    cpu: float


_MS = 1e-3


def _ms(cpu: float, wall: float | None = None) -> CallCost:
    """A call's cost in milliseconds of CPU (and of wall time, where the call also waits)."""
    return CallCost((cpu if wall is None else wall) * _MS, cpu * _MS)


# What each pynvml call cost on a real H200 (driver 580.159.04, nvidia-ml-py 13.610.43,
# 2026-12-04): for the calls every steady pass makes, the median over 40 of the agent's
# passes 1 s apart (benchmarks/results/2026-12-04-gpu_check-h200-pass-costs.txt; they run
# colder than back to back); for the others, the median of 30 calls back to back while a
# PyTorch job computed (benchmarks/results/2026-12-04-gpu_check-h200.txt). CPU time; the
# wall time is the same except where given. Calls not listed cost DEFAULT_COST.
H200_COSTS: Mapping[str, CallCost] = {
    "nvmlDeviceGetPcieThroughput": _ms(0.63, wall=20.7),  # blocks while the driver samples
    "nvmlDeviceGetTotalEnergyConsumption": _ms(2.8),  # 6.3 ms once in a pass
    "nvmlDeviceGetProcessUtilization": _ms(1.83),
    "nvmlDeviceGetProcessesUtilizationInfo": _ms(1.86),
    "nvmlDeviceGetMigMode": _ms(0.105),  # 0.45 ms once in a pass
    "nvmlDeviceGetFanSpeed": _ms(0.1),  # NOT_SUPPORTED on H200, still costs
    # every pass (0.034 ms back to back)
    "nvmlDeviceGetComputeRunningProcesses_v3": _ms(0.037),
    "nvmlDeviceGetComputeRunningProcesses_v2": _ms(0.037),
    "nvmlDeviceGetComputeRunningProcesses": _ms(0.037),
    "nvmlDeviceGetGraphicsRunningProcesses_v3": _ms(0.015),
    "nvmlDeviceGetGraphicsRunningProcesses_v2": _ms(0.015),
    "nvmlDeviceGetGraphicsRunningProcesses": _ms(0.015),
    "nvmlDeviceGetMemoryInfo": _ms(0.084),  # every pass (0.007 ms back to back)
    "nvmlEventSetWait": _ms(0.059),  # the XID poll, timeout 0, once a pass
    # every pass (0.001-0.004 ms back to back)
    "nvmlDeviceGetUtilizationRates": _ms(0.012),
    "nvmlDeviceGetPowerUsage": _ms(0.007),
    "nvmlDeviceGetTemperatureV": _ms(0.014),
    "nvmlDeviceGetTemperature": _ms(0.014),
    "nvmlDeviceGetClockInfo": _ms(0.005),
    "nvmlDeviceGetCurrentClocksEventReasons": _ms(0.01),
    "nvmlDeviceGetCurrentClocksThrottleReasons": _ms(0.01),
    "nvmlDeviceGetTotalEccErrors": _ms(0.0095),
    "nvmlGpmSampleGet": _ms(0.26),
    "nvmlGpmMigSampleGet": _ms(0.26),
    # the agent's metrics, in its passes (1.35 ms under load, 1.5-1.7 ms back to back; the
    # first call 6.3 ms). Graphics activity is nearly all of it: every other metric
    # together 0.0025 ms (GPM_WITHOUT_GRAPHICS)
    "nvmlGpmMetricsGet": _ms(1.87),
    # Health reads (benchmarks/gpu_check.py --health-calls-only, 50 calls each).
    "nvmlDeviceGetRemappedRows": _ms(0.003),
    "nvmlDeviceGetRowRemapperHistogram": _ms(0.002),
    "nvmlDeviceGetRetiredPages_v2": _ms(0.003),  # NOT_SUPPORTED on H200
    "nvmlDeviceGetRetiredPagesPendingStatus": _ms(0.003),  # NOT_SUPPORTED on H200
    "nvmlDeviceGetSramEccErrorStatus": _ms(0.017),
    "nvmlDeviceGetCurrPcieLinkGeneration": _ms(0.002),
    "nvmlDeviceGetCurrPcieLinkWidth": _ms(0.03),
    "nvmlDeviceGetMaxPcieLinkGeneration": _ms(0.002),
    "nvmlDeviceGetMaxPcieLinkWidth": _ms(0.002),
    "nvmlDeviceGetPcieReplayCounter": _ms(0.085, wall=0.086),
    "nvmlDeviceGetNvLinkState": _ms(0.012),  # NOT_SUPPORTED on a PCIe H200
    "nvmlDeviceGetNvLinkErrorCounter": _ms(0.013),
    "nvmlDeviceGetViolationStatus": _ms(0.42),  # per policy, 0.36-0.77 ms
    "nvmlDeviceGetPersistenceMode": _ms(0.005),
    "nvmlDeviceGetGpuFabricInfoV": _ms(0.019),
    "nvmlDeviceGetGpuFabricInfo": _ms(0.019),
}
GPM_WITHOUT_GRAPHICS = _ms(0.0025)  # nvmlGpmMetricsGet of any metrics but graphics activity
# Calls not timed on the H200 (names, UUIDs, PCI info: once at start; the power limit).
DEFAULT_COST = _ms(0.02)
# nvmlDeviceGetFieldValues: the energy fields cost what the energy call costs; the two
# PCIe byte counters 0.21 ms together back to back; the memory temperature alone 0.029 ms
# in the agent's passes; the six violation times 0.6 ms together back to back (1.4 ms for
# a health read's whole call in a pass); other fields the default.
FIELD_COSTS: Mapping[int, float] = {
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: 2.8 * _MS,
    191: 2.8 * _MS,  # NVML_FI_DEV_ENERGY (newer drivers)
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES: 0.105 * _MS,
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES: 0.105 * _MS,
    NVML_FI_DEV_MEMORY_TEMP: 0.029 * _MS,
    # the six violation times: 0.60-0.63 ms together, one sixth of six ViolationStatus calls
    **{field: 0.105 * _MS for field in range(NVML_FI_DEV_PERF_POLICY_POWER, NVML_FI_DEV_PERF_POLICY_RELIABILITY + 1)},
}
FREE = CallCost(0.0, 0.0)


class _Burner:
    """Burns CPU time with the GIL released, as a call into the driver does.

    hashlib releases the GIL while it hashes a large buffer; the hashing rate is
    measured once, so ``burn(0.002)`` costs about 2 ms of this thread's CPU time.
    """

    def __init__(self) -> None:
        self._buffer = memoryview(bytes(64 * MiB))
        self._rate: float | None = None
        self._lock = threading.Lock()

    def _bytes_per_second(self) -> float:
        with self._lock:
            if self._rate is None:
                rates = []
                for _ in range(5):
                    start = time.thread_time()
                    hashlib.sha256(self._buffer[: 4 * MiB]).digest()
                    rates.append(4 * MiB / max(time.thread_time() - start, 1e-6))
                self._rate = sorted(rates)[len(rates) // 2]
            return self._rate

    def burn(self, seconds: float) -> None:
        if seconds <= 0:
            return
        size = min(len(self._buffer), max(4096, int(seconds * self._bytes_per_second())))
        hashlib.sha256(self._buffer[:size]).digest()


_BURNER = _Burner()


def charge(cost: CallCost) -> None:
    """Spend ``cost``: its CPU time burnt without the GIL, the rest of its wall time slept."""
    if cost.wall <= 0 and cost.cpu <= 0:
        return
    start = time.perf_counter()
    _BURNER.burn(cost.cpu)
    left = cost.wall - (time.perf_counter() - start)
    if left > 0:
        time.sleep(left)


# ---- calls that hang ------------------------------------------------------------------


@dataclass(eq=False)
class Block:
    """Calls that wait until released, as a wedged driver's do (`FakeNvml.block`).

    ``call`` None matches every function, ``gpu`` None every device and the calls about
    none (event sets, counts); ``seconds``: released by itself that long after the first
    call entered it (one call hangs that long; the next ones answer).
    """

    call: str | None = None
    gpu: int | None = None
    seconds: float | None = None
    while_exists: str | None = None  # or: hang while this file exists (another process's knob)
    released: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    waiting: int = 0
    calls: int = 0  # calls that waited in it, in all
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def matches(self, name: str, args: tuple[Any, ...]) -> bool:
        if self.released.is_set() or (self.call is not None and name != self.call):
            return False
        if self.gpu is not None and not (args and isinstance(args[0], FakeHandle) and args[0].index == self.gpu):
            return False
        return self.while_exists is None or os.path.exists(self.while_exists)

    def hold(self) -> None:
        with self._lock:
            self.waiting += 1
            self.calls += 1
        self.entered.set()
        try:
            if self.while_exists is None:
                if not self.released.wait(self.seconds):  # like a ctypes call: nothing can interrupt it
                    self.released.set()  # its time is up: the later calls answer at once
            else:  # a knob of another process: the file
                deadline = None if self.seconds is None else time.monotonic() + self.seconds
                while os.path.exists(self.while_exists) and not self.released.is_set() and (
                        deadline is None or time.monotonic() < deadline):
                    self.released.wait(0.01)
        finally:
            with self._lock:
                self.waiting -= 1

    def release(self) -> None:
        """Let the waiting calls return, and the next ones through."""
        self.released.set()


# ---- errors -------------------------------------------------------------------------


class NVMLError(Exception):
    """Like pynvml's: ``NVMLError(code)`` returns the subclass for that code, ``.value`` is the code."""

    _valClassMapping: ClassVar[dict[int, type]] = {}

    def __new__(cls, value: int = NVML_ERROR_UNKNOWN):  # type: ignore[no-untyped-def]
        typ = NVMLError._valClassMapping.get(value, cls) if cls is NVMLError else cls
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __init__(self, value: int = NVML_ERROR_UNKNOWN):
        super().__init__(value)

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


class NVMLLibraryMismatchError(Exception):
    """pynvml raises this from an unversioned call whose versioned symbol is missing."""


def _class_name(constant: str) -> str:
    # NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost, as pynvml names them
    words = constant[len("NVML_ERROR_"):].split("_")
    return "NVMLError_" + "".join(w.capitalize() for w in words)


def _make_error_class(code: int, name: str) -> type:
    def new(cls, *args):  # type: ignore[no-untyped-def]
        return NVMLError.__new__(cls, code)

    def init(self, *args):  # type: ignore[no-untyped-def]
        Exception.__init__(self, code)

    return type(name, (NVMLError,), {"__new__": new, "__init__": init, "__module__": __name__})


for _constant, _code in _ERROR_CODES.items():
    _cls = _make_error_class(_code, _class_name(_constant))
    NVMLError._valClassMapping[_code] = _cls
    globals()[_cls.__name__] = _cls

NVMLError_NotSupported: type = NVMLError._valClassMapping[NVML_ERROR_NOT_SUPPORTED]
NVMLError_NotFound: type = NVMLError._valClassMapping[NVML_ERROR_NOT_FOUND]
NVMLError_Timeout: type = NVMLError._valClassMapping[NVML_ERROR_TIMEOUT]
NVMLError_GpuIsLost: type = NVMLError._valClassMapping[NVML_ERROR_GPU_IS_LOST]
NVMLError_FunctionNotFound: type = NVMLError._valClassMapping[NVML_ERROR_FUNCTION_NOT_FOUND]
NVMLError_LibraryNotFound: type = NVMLError._valClassMapping[NVML_ERROR_LIBRARY_NOT_FOUND]
NVMLError_DriverNotLoaded: type = NVMLError._valClassMapping[NVML_ERROR_DRIVER_NOT_LOADED]


# ---- result structs (real field names) ------------------------------------------------


class _Struct:
    _fields_: tuple[str, ...] = ()

    def __init__(self, **values: Any):
        for name in self._fields_:
            setattr(self, name, values.pop(name, 0))
        if values:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(values)}")

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}: {getattr(self, n)!r}" for n in self._fields_)
        return f"{type(self).__name__}({inner})"


class c_nvmlDeviceAttributes(_Struct):
    _fields_ = ("multiprocessorCount", "sharedCopyEngineCount", "sharedDecoderCount", "sharedEncoderCount",
                "sharedJpegCount", "sharedOfaCount", "gpuInstanceSliceCount", "computeInstanceSliceCount",
                "memorySizeMB")


class c_nvmlMemory_t(_Struct):
    _fields_ = ("total", "free", "used")


class c_nvmlMemory_v2_t(_Struct):
    _fields_ = ("version", "total", "reserved", "free", "used")


class c_nvmlUtilization_t(_Struct):
    _fields_ = ("gpu", "memory")


class c_nvmlProcessInfo_t(_Struct):
    _fields_ = ("pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId")


class c_nvmlProcessUtilizationSample_t(_Struct):
    _fields_ = ("pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil")


class c_nvmlProcessUtilizationInfo_v1_t(_Struct):
    _fields_ = ("timeStamp", "pid", "smUtil", "memUtil", "encUtil", "decUtil", "jpgUtil", "ofaUtil")


class c_nvmlEventData_t(_Struct):
    _fields_ = ("device", "eventType", "eventData", "gpuInstanceId", "computeInstanceId")


class nvmlPciInfo_t(_Struct):
    _fields_ = ("busIdLegacy", "domain", "bus", "device", "pciDeviceId", "pciSubSystemId", "busId")


c_nvmlPciInfo_t = nvmlPciInfo_t


class c_nvmlValue_t(_Struct):
    _fields_ = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class c_nvmlFieldValue_t(_Struct):
    _fields_ = ("fieldId", "scopeId", "timestamp", "latencyUsec", "valueType", "nvmlReturn", "value")


class c_nvmlRowRemapperHistogramValues(_Struct):
    _fields_ = ("max", "high", "partial", "low", "none")


class c_nvmlViolationTime_t(_Struct):
    _fields_ = ("referenceTime", "violationTime")


class c_nvmlEccSramErrorStatus_v1_t(_Struct):
    _fields_ = ("version", "aggregateUncParity", "aggregateUncSecDed", "aggregateCor", "volatileUncParity",
                "volatileUncSecDed", "volatileCor", "aggregateUncBucketL2", "aggregateUncBucketSm",
                "aggregateUncBucketPcie", "aggregateUncBucketMcu", "aggregateUncBucketOther", "bThresholdExceeded")


c_nvmlEccSramErrorStatus_t = c_nvmlEccSramErrorStatus_v1_t


class c_nvmlGpuFabricInfoV_t(_Struct):
    _fields_ = ("version", "clusterUuid", "status", "cliqueId", "state", "healthMask")


class c_nvmlGpuFabricInfo_t(_Struct):
    _fields_ = ("clusterUuid", "status", "cliqueId", "state")


@dataclass
class FakeNvLink:
    """One NVLink: up, and its data-link error counters (lifetime)."""

    up: bool = True
    replay: int = 0
    recovery: int = 0
    crc_flit: int = 0
    crc_data: int = 0


@dataclass
class FakeFabric:
    """``nvmlDeviceGetGpuFabricInfoV``'s answer: state (NVML_GPU_FABRIC_STATE_*), status
    (an nvmlReturn_t), health mask (0: all fields NOT_SUPPORTED)."""

    state: int = NVML_GPU_FABRIC_STATE_COMPLETED
    status: int = NVML_SUCCESS
    health_mask: int = 0
    health: bool = True  # False: an older driver/GPU with the unversioned call only (no healthMask)


class c_nvmlEventSet_t:
    """An event set handle; holds the devices registered on it."""

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}  # gpu index -> event type mask
        self.freed = False


@dataclass(frozen=True)
class FakeHandle:
    """A device handle. Equal (not identical) handles name the same device, as two
    ctypes pointers to one device do."""

    index: int
    mig: int | None = None


# ---- the configurable world -----------------------------------------------------------


@dataclass
class FakeProcess:
    """A process holding a GPU. ``used_memory`` in bytes; None = NVML cannot tell."""

    pid: int
    used_memory: int | None = 1 * GiB
    kind: str = "compute"  # or "graphics"
    gpu_instance_id: int = 0xFFFFFFFF
    compute_instance_id: int = 0xFFFFFFFF


@dataclass
class FakeUtilSample:
    """One driver sample of a process: timestamp in microseconds, utilisation in percent."""

    pid: int
    timestamp: int
    sm: int = 0
    mem: int = 0
    enc: int = 0
    dec: int = 0


@dataclass
class FakeMig:
    """A MIG device (one GPU instance) on a parent GPU."""

    uuid: str
    gpu_instance_id: int
    memory_total: int = 10 * GiB
    memory_used: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    name: str = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    compute_instance_id: int = 0
    slices: int = 1  # compute slices of the GPU's 7 (nvmlDeviceGetAttributes: computeInstanceSliceCount)
    gpm: FakeGpm = field(default_factory=lambda: FakeGpm())  # see the GPM section below


@dataclass
class FakeGpu:
    """One GPU, in NVML's own units (mW, mJ, MHz, KB/s, percent)."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""  # filled in from the index when empty
    serial: str = "1650923000000"
    bus_id: str = ""  # filled in from the index when empty
    memory_total: int = 80 * GiB
    memory_used: int = 10 * GiB
    memory_reserved: int = 512 * MiB
    utilization_gpu: int = 50
    utilization_memory: int = 20
    temperature: int = 45
    memory_temperature: int | None = 52
    power_mw: int = 250_000
    power_limit_mw: int = 700_000
    energy_mj: int = 123_456_789
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    pcie_rx_kbs: int = 1000
    pcie_tx_kbs: int = 500
    pcie_tx_bytes: int = 700_000_000_000  # cumulative, NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    pcie_rx_bytes: int = 1_300_000_000_000  # cumulative, NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    fan_percent: int = 30
    ecc_corrected: int = 2
    ecc_uncorrected: int = 0
    clock_reasons: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    util_samples: list[FakeUtilSample] = field(default_factory=list)
    # pid -> SM percent: every utilisation query answers one fresh sample per listed
    # process, stamped now (as an H200 does: one sample per process, the average since the
    # timestamp asked for; the level here is constant between changes).
    live_sm: dict[int, int] | None = None
    mig_devices: list[FakeMig] = field(default_factory=list)
    mig_capable: bool = False  # MIG mode query supported (disabled) even without MIG devices
    xid_supported: bool = True
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    errors: dict[str, int] = field(default_factory=dict)
    gpm: FakeGpm = field(default_factory=lambda: FakeGpm())  # see the GPM section below
    # ---- health (see FakeNvml's health calls) ----
    # (correctable, uncorrectable, pending, failure); None: NOT_SUPPORTED (pre-Ampere)
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    remap_histogram: dict[str, int] = field(
        default_factory=lambda: {"max": 640, "high": 0, "partial": 0, "low": 0, "none": 0})
    # cause -> retired page count; None: NOT_SUPPORTED (Ampere and newer)
    retired_pages: dict[int, int] | None = None
    retired_pending: int = NVML_FEATURE_DISABLED
    ecc_volatile_corrected: int = 0
    ecc_volatile_uncorrected: int = 0
    sram_threshold_exceeded: int | None = 0  # None: NOT_SUPPORTED
    pcie_generation: int = 5
    pcie_generation_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    pcie_replays: int = 0
    nvlinks: list[FakeNvLink] = field(default_factory=list)  # none: link 0 answers NOT_SUPPORTED
    violation_ns: dict[int, int] = field(default_factory=dict)  # NVML_PERF_POLICY_* -> ns
    recovery_action: int | None = 0  # None: the driver lacks the field (NOT_SUPPORTED in the entry)
    persistence_mode: int = NVML_FEATURE_ENABLED
    fabric: FakeFabric | None = None  # None: NOT_SUPPORTED (no NVSwitch)

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig_devices)


# Functions that take a device handle first: the fake checks lost/unsupported/errors.
_DEVICE_FUNCTIONS = frozenset(
    {
        "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetSerial", "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureV", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetFanSpeed", "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents",
    }
)

# What a MIG device handle cannot answer (NOT_SUPPORTED on real hardware).
_MIG_UNSUPPORTED = frozenset(
    {
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetFanSpeed",
    }
)


# ==== GPM (GPU Performance Monitoring, Hopper and newer) ===================================
#
# The real binding: ``nvmlGpmQueryDeviceSupport(handle)`` -> c_nvmlGpmSupport_t
# (version, isSupportedDevice); ``nvmlGpmSampleAlloc()`` -> an opaque sample pointer;
# ``nvmlGpmSampleGet(handle, sample)`` and ``nvmlGpmMigSampleGet(parent handle,
# gpuInstanceId, sample)`` fill it and return it; ``nvmlGpmMetricsGet(c_nvmlGpmMetricsGet_t)``
# fills ``metrics[i].value`` / ``.nvmlReturn`` for ``numMetrics`` requested ``metricId``s,
# each the average between ``sample1`` and ``sample2``; ``nvmlGpmSampleFree(sample)``.
# Activity metrics are percent (0-100), PCIe and NVLink MiB per second.
#
# The fake keeps, per GPU (or MIG instance), the current value of each metric and its
# integral over the fake's GPM clock (``fake.gpm_clock``, default time.monotonic); a
# sample records the integrals, and MetricsGet divides their difference by the time
# between the two samples, so a value that changed mid-window averages like the real
# counters do. Change values with ``fake.set_gpm(gpu, {metric id: value}, gpu_instance=)``
# (which integrates up to now first). A pre-Hopper GPU (``FakeGpm.supported`` False, or
# by default a name without H100/H200/H800/GH200/B100/B200) answers
# ``isSupportedDevice = 0`` and NOT_SUPPORTED to sampling, as the real driver does.

NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_INTEGER_UTIL = 4
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DFMA_TENSOR_UTIL = 6
NVML_GPM_METRIC_HMMA_TENSOR_UTIL = 7
NVML_GPM_METRIC_IMMA_TENSOR_UTIL = 9
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_FP64_UTIL = 11
NVML_GPM_METRIC_FP32_UTIL = 12
NVML_GPM_METRIC_FP16_UTIL = 13
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC = 60
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC = 61
NVML_GPM_METRIC_MAX = 477  # the size of c_nvmlGpmMetricsGet_t.metrics in nvidia-ml-py 13
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1

_HOPPER_OR_NEWER = ("H100", "H200", "H800", "GH200", "B100", "B200", "GB200", "B300")


def default_gpm_values() -> dict[int, float]:
    """A bf16 job at about half load on a card without NVLink (NVLink metrics NOT_SUPPORTED)."""
    return {
        NVML_GPM_METRIC_GRAPHICS_UTIL: 58.6, NVML_GPM_METRIC_SM_UTIL: 54.6, NVML_GPM_METRIC_SM_OCCUPANCY: 8.1,
        NVML_GPM_METRIC_ANY_TENSOR_UTIL: 53.0, NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 53.0,
        NVML_GPM_METRIC_IMMA_TENSOR_UTIL: 0.0, NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 0.0,
        NVML_GPM_METRIC_DRAM_BW_UTIL: 11.2, NVML_GPM_METRIC_FP64_UTIL: 0.0, NVML_GPM_METRIC_FP32_UTIL: 2.5,
        NVML_GPM_METRIC_FP16_UTIL: 0.5, NVML_GPM_METRIC_INTEGER_UTIL: 4.0,
        NVML_GPM_METRIC_PCIE_TX_PER_SEC: 100.0, NVML_GPM_METRIC_PCIE_RX_PER_SEC: 250.0,
    }


@dataclass
class FakeGpm:
    """The GPM counters of one GPU or MIG instance.

    ``values``: metric id -> current value in NVML's unit (percent, MiB/s); a metric
    not in it answers NOT_SUPPORTED in its entry. ``supported``: None = from the GPU's
    name (Hopper and newer); a MIG instance follows its parent GPU.
    """

    values: dict[int, float] = field(default_factory=default_gpm_values)
    supported: bool | None = None
    _integrals: dict[int, float] = field(default_factory=dict, repr=False)
    _since: float | None = field(default=None, repr=False)

    def advance(self, now: float) -> None:
        """Integrate every metric up to ``now`` (the fake's GPM clock)."""
        if self._since is not None:
            dt = max(0.0, now - self._since)
            for metric, value in self.values.items():
                self._integrals[metric] = self._integrals.get(metric, 0.0) + value * dt
        self._since = now


class c_nvmlGpmSupport_t(_Struct):
    _fields_ = ("version", "isSupportedDevice")


class c_metricInfo_t(_Struct):
    _fields_ = ("shortName", "longName", "unit")


class c_nvmlGpmMetric_t(_Struct):
    _fields_ = ("metricId", "nvmlReturn", "value", "metricInfo")


class c_nvmlGpmMetricsGet_t(_Struct):
    """Like the ctypes struct: ``metrics`` is a fixed array of NVML_GPM_METRIC_MAX entries."""

    _fields_ = ("version", "numMetrics", "sample1", "sample2", "metrics")

    def __init__(self, **values: Any):
        super().__init__(**values)
        if not self.metrics:
            self.metrics = [c_nvmlGpmMetric_t(metricInfo=c_metricInfo_t()) for _ in range(NVML_GPM_METRIC_MAX)]


class c_nvmlGpmSample_t:
    """An opaque GPM sample buffer: what it recorded, and whether it was freed."""

    def __init__(self) -> None:
        self.freed = False
        self.device: tuple[int, int | None] | None = None  # (gpu index, gpu instance id) sampled
        self.time: float | None = None
        self.integrals: dict[int, float] = {}


class _FakeGpmFunctions:
    """The GPM functions of `FakeNvml` (a mixin: it uses the fake's devices and call log)."""

    gpus: list[FakeGpu]
    gpm_samples: list[c_nvmlGpmSample_t]
    gpm_clock: Any = staticmethod(time.monotonic)

    def _enter(self, name: str, args: tuple[Any, ...]) -> None:  # pragma: no cover - FakeNvml's
        raise NotImplementedError

    def _device(self, name: str, handle: Any, *args: Any) -> tuple[FakeGpu, FakeMig | None]:  # pragma: no cover
        raise NotImplementedError

    @staticmethod
    def gpm_supported(gpu: FakeGpu) -> bool:
        if gpu.gpm.supported is not None:
            return gpu.gpm.supported
        return any(tag in gpu.name for tag in _HOPPER_OR_NEWER)

    def set_gpm(self, gpu_index: int, values: dict[int, float], gpu_instance: int | None = None) -> None:
        """Change GPM values from now on (integrating the old ones up to now first)."""
        counters = self._gpm_counters(self.gpus[gpu_index], gpu_instance)
        counters.advance(self.gpm_clock())
        counters.values.update(values)

    def _gpm_counters(self, gpu: FakeGpu, gpu_instance: int | None) -> FakeGpm:
        if gpu_instance is None:
            return gpu.gpm
        for mig in gpu.mig_devices:
            if mig.gpu_instance_id == gpu_instance:
                return mig.gpm
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> c_nvmlGpmSupport_t:
        gpu, _ = self._device("nvmlGpmQueryDeviceSupport", device)
        return c_nvmlGpmSupport_t(version=NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(self.gpm_supported(gpu)))

    def nvmlGpmSampleAlloc(self) -> c_nvmlGpmSample_t:
        self._enter("nvmlGpmSampleAlloc", ())
        sample = c_nvmlGpmSample_t()
        self.gpm_samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, gpmSample: c_nvmlGpmSample_t) -> None:
        self._enter("nvmlGpmSampleFree", (gpmSample,))
        if not isinstance(gpmSample, c_nvmlGpmSample_t) or gpmSample.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpmSample.freed = True

    def _gpm_take(self, gpu: FakeGpu, gpu_instance: int | None, sample: Any, index: int) -> c_nvmlGpmSample_t:
        if not isinstance(sample, c_nvmlGpmSample_t) or sample.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not self.gpm_supported(gpu):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        counters = self._gpm_counters(gpu, gpu_instance)
        now = self.gpm_clock()
        counters.advance(now)
        sample.device, sample.time, sample.integrals = (index, gpu_instance), now, dict(counters._integrals)
        return sample

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> c_nvmlGpmSample_t:
        gpu, mig = self._device("nvmlGpmSampleGet", device, gpmSample)
        if mig is not None or gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # in MIG mode: per instance only
        return self._gpm_take(gpu, None, gpmSample, device.index)

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: Any) -> c_nvmlGpmSample_t:
        gpu, mig = self._device("nvmlGpmMigSampleGet", device, gpuInstanceId, gpmSample)
        if mig is not None or not gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # takes the parent GPU's handle
        return self._gpm_take(gpu, int(gpuInstanceId), gpmSample, device.index)

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet", (metricsGet,))
        if not isinstance(metricsGet, c_nvmlGpmMetricsGet_t):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if metricsGet.version != NVML_GPM_METRICS_GET_VERSION:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first, second = metricsGet.sample1, metricsGet.sample2
        for sample in (first, second):
            if not isinstance(sample, c_nvmlGpmSample_t) or sample.freed or sample.time is None:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if first.device != second.device or not 0 < metricsGet.numMetrics <= NVML_GPM_METRIC_MAX:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        elapsed = second.time - first.time
        if elapsed <= 0:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # the fake's clock must move between samples
        index, gpu_instance = first.device
        counters = self._gpm_counters(self.gpus[index], gpu_instance)
        for entry in metricsGet.metrics[: metricsGet.numMetrics]:
            if entry.metricId in counters.values:
                delta = second.integrals.get(entry.metricId, 0.0) - first.integrals.get(entry.metricId, 0.0)
                entry.value, entry.nvmlReturn = delta / elapsed, NVML_SUCCESS
            else:
                entry.value, entry.nvmlReturn = 0.0, NVML_ERROR_NOT_SUPPORTED
        return metricsGet



class FakeNvml(_FakeGpmFunctions):
    """A stand-in for the ``pynvml`` module: its functions, constants and errors.

    Args:
        gpus: the GPUs, index = position in the list.
        driver_version: what ``nvmlSystemGetDriverVersion`` returns.
        missing: function names the module does not have (``getattr`` raises
            AttributeError), as with an old nvidia-ml-py.
        init_error: an NVML error code ``nvmlInit`` raises (e.g. LIBRARY_NOT_FOUND).
        legacy_bytes: return strings as bytes, like bindings before 11.5.
        costs: what each call costs (e.g. `H200_COSTS`); None answers for free.
            Calls not in the mapping cost ``default_cost``. Every call's cost is added
            to ``bill`` (wall and CPU seconds).
        default_cost: the cost of calls ``costs`` does not list (with ``costs`` set).
        spend: with ``costs``, actually spend them (burn CPU, sleep); False only keeps
            the bill, for tests that check a call plan without timing anything.
    """

    def __init__(
        self,
        gpus: Iterable[FakeGpu] = (),
        driver_version: str = "550.54.15",
        missing: Iterable[str] = (),
        init_error: int | None = None,
        legacy_bytes: bool = False,
        costs: Mapping[str, CallCost] | None = None,
        default_cost: CallCost = DEFAULT_COST,
        spend: bool = True,
    ):
        self.gpus = list(gpus)
        for index, gpu in enumerate(self.gpus):
            if not gpu.uuid:
                gpu.uuid = f"GPU-{index:08x}-1111-2222-3333-444444444444"
            if not gpu.bus_id:
                gpu.bus_id = f"00000000:{0x17 + index:02X}:00.0"
        self.driver_version = driver_version
        self.missing = set(missing)
        self.init_error = init_error
        self.legacy_bytes = legacy_bytes
        self.costs = costs
        self.default_cost = default_cost
        self.spend = spend
        self.bill = [0.0, 0.0]  # wall, CPU seconds the calls cost
        self.record_calls = True
        self.initialized = False
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.event_sets: list[c_nvmlEventSet_t] = []
        self._events: list[c_nvmlEventData_t] = []
        self.gpm_samples: list[c_nvmlGpmSample_t] = []  # every GPM sample buffer allocated
        self.blocks: list[Block] = []  # calls that hang until released (see `block`)

    def __new__(cls, *args: Any, **kwargs: Any) -> FakeNvml:
        # Only a fake with missing functions pays for hiding them on every attribute
        # access; a real module's attributes cost a dict lookup.
        missing = kwargs.get("missing", args[2] if len(args) > 2 else ())
        if cls is FakeNvml and missing:
            cls = _FakeNvmlWithMissing
        return super().__new__(cls)

    # Module attributes: constants, error classes and structs come from this file.
    def __getattr__(self, name: str) -> Any:
        module = sys.modules[__name__]
        missing = object.__getattribute__(self, "__dict__").get("missing", ())
        if name.startswith("_") or name in missing or not hasattr(module, name):
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return getattr(module, name)

    # ---- test helpers ---------------------------------------------------------------

    def block(self, call: str | None = None, gpu: int | None = None, seconds: float | None = None,
              while_exists: str | None = None) -> Block:
        """Make ``call`` (every call if None) on GPU ``gpu`` (any, if None) hang until the
        returned `Block` is released, for ``seconds``, or while the file ``while_exists``
        exists (for an agent in another process: see tests/fakes/nvml_shim)."""
        block = Block(call, gpu, seconds, while_exists)
        self.blocks.append(block)
        return block

    def queue_xid(self, gpu_index: int, xid: int, gpu_instance_id: int = 0xFFFFFFFF) -> None:
        """Make an XID critical error event on a GPU, as the driver would."""
        self._events.append(
            c_nvmlEventData_t(
                device=FakeHandle(gpu_index),
                eventType=nvmlEventTypeXidCriticalError,
                eventData=xid,
                gpuInstanceId=gpu_instance_id,
                computeInstanceId=0xFFFFFFFF,
            )
        )

    def add_util_samples(self, gpu_index: int, samples: Iterable[FakeUtilSample]) -> None:
        """Add per-process utilisation samples to a GPU's driver buffer."""
        self.gpus[gpu_index].util_samples.extend(samples)

    def called(self, name: str) -> list[tuple[Any, ...]]:
        """The argument tuples of every call to ``name``."""
        return [args for n, args in self.calls if n == name]

    # ---- plumbing -------------------------------------------------------------------

    def _str(self, value: str) -> Any:
        return value.encode() if self.legacy_bytes else value

    def _enter(self, name: str, args: tuple[Any, ...]) -> None:
        if self.record_calls:
            self.calls.append((name, args))
        if self.costs is not None:
            cost = self._cost(name, args)
            self.bill[0] += cost.wall
            self.bill[1] += cost.cpu
            if self.spend:
                charge(cost)
        if self.blocks:
            for block in self.blocks:
                if block.matches(name, args):
                    block.hold()
        if not self.initialized and name not in ("nvmlInit", "nvmlInitWithFlags"):
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _device(self, name: str, handle: Any, *args: Any) -> tuple[FakeGpu, FakeMig | None]:
        self._enter(name, (handle,) + args)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if name in gpu.errors:
            raise NVMLError(gpu.errors[name])
        if name in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mig = None
        if handle.mig is not None:
            if handle.mig >= len(gpu.mig_devices):
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            mig = gpu.mig_devices[handle.mig]
            if name in _MIG_UNSUPPORTED:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu, mig

    def _cost(self, name: str, args: tuple[Any, ...]) -> CallCost:
        assert self.costs is not None
        if name == "nvmlDeviceGetFieldValues" and len(args) > 1:
            seconds = 0.0
            for field_id in args[1]:
                field_id = field_id[0] if isinstance(field_id, tuple) else field_id
                seconds += FIELD_COSTS.get(field_id, 0.0)
            seconds = max(seconds, self.default_cost.cpu)
            return CallCost(seconds, seconds)
        if name == "nvmlGpmMetricsGet" and args and self.costs is H200_COSTS:
            request = args[0]
            asked = {entry.metricId for entry in request.metrics[: request.numMetrics]}
            if NVML_GPM_METRIC_GRAPHICS_UTIL not in asked:
                return GPM_WITHOUT_GRAPHICS
        return self.costs.get(name, self.default_cost)

    # ---- init -----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", ())
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True
        self.init_calls += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown", ())
        self.initialized = False
        self.shutdown_calls += 1

    def nvmlSystemGetDriverVersion(self) -> Any:
        self._enter("nvmlSystemGetDriverVersion", ())
        return self._str(self.driver_version)

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount", ())
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex", (index,))
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    # ---- identity -------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        gpu, mig = self._device("nvmlDeviceGetUUID", handle)
        return self._str(mig.uuid if mig else gpu.uuid)

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        gpu, mig = self._device("nvmlDeviceGetName", handle)
        return self._str(mig.name if mig else gpu.name)

    def nvmlDeviceGetSerial(self, handle: Any) -> Any:
        gpu, _ = self._device("nvmlDeviceGetSerial", handle)
        return self._str(gpu.serial)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> nvmlPciInfo_t:
        gpu, _ = self._device("nvmlDeviceGetPciInfo", handle)
        bus = int(gpu.bus_id.split(":")[1], 16)
        # c_char arrays come back as bytes from the real binding, whatever its version.
        return nvmlPciInfo_t(busIdLegacy=gpu.bus_id.encode()[:16], domain=0, bus=bus, device=0,
                             pciDeviceId=0x233010DE, pciSubSystemId=0x16C110DE, busId=gpu.bus_id.encode())

    # ---- memory and utilisation ------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu, mig = self._device("nvmlDeviceGetMemoryInfo", handle, version)
        if mig is not None:
            if version:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return c_nvmlMemory_t(total=mig.memory_total, free=mig.memory_total - mig.memory_used,
                                  used=mig.memory_used)
        if version:
            if "nvmlDeviceGetMemoryInfo_v2" in gpu.unsupported or "nvmlDeviceGetMemoryInfo_v2" in self.missing:
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            return c_nvmlMemory_v2_t(version=version, total=gpu.memory_total, reserved=gpu.memory_reserved,
                                     free=gpu.memory_total - gpu.memory_reserved - gpu.memory_used,
                                     used=gpu.memory_used)
        # Version 1 counts the driver's reserved memory as used.
        used = gpu.memory_used + gpu.memory_reserved
        return c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - used, used=used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> c_nvmlUtilization_t:
        gpu, _ = self._device("nvmlDeviceGetUtilizationRates", handle)
        return c_nvmlUtilization_t(gpu=gpu.utilization_gpu, memory=gpu.utilization_memory)

    # ---- thermal, power, clocks -------------------------------------------------------

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu, _ = self._device("nvmlDeviceGetTemperature", handle, sensor)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int = 0x1000010) -> int:
        gpu, _ = self._device("nvmlDeviceGetTemperatureV", handle, sensor)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> list[c_nvmlFieldValue_t]:
        gpu, _ = self._device("nvmlDeviceGetFieldValues", handle, list(field_ids))
        out = []
        for field_id in field_ids:
            if isinstance(field_id, tuple):
                field_id = field_id[0]
            value = c_nvmlFieldValue_t(fieldId=field_id, valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                                       value=c_nvmlValue_t())
            if field_id == NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temperature is not None:
                value.value.uiVal = gpu.memory_temperature
                value.nvmlReturn = NVML_SUCCESS
            elif field_id in (NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES) and (
                    "pcie_counters" not in gpu.unsupported):
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = (gpu.pcie_tx_bytes if field_id == NVML_FI_DEV_PCIE_COUNT_TX_BYTES
                                      else gpu.pcie_rx_bytes)
                value.nvmlReturn = NVML_SUCCESS
            elif field_id in (NVML_FI_DEV_ECC_SBE_VOL_TOTAL, NVML_FI_DEV_ECC_DBE_VOL_TOTAL) and (
                    "nvmlDeviceGetTotalEccErrors" not in gpu.unsupported):
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = (gpu.ecc_volatile_corrected if field_id == NVML_FI_DEV_ECC_SBE_VOL_TOTAL
                                      else gpu.ecc_volatile_uncorrected)
                value.nvmlReturn = NVML_SUCCESS
            elif NVML_FI_DEV_PERF_POLICY_POWER <= field_id <= NVML_FI_DEV_PERF_POLICY_RELIABILITY and not (
                    {"nvmlDeviceGetViolationStatus", "perf_policy_fields"} & set(gpu.unsupported)):
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value.ullVal = gpu.violation_ns.get(field_id - NVML_FI_DEV_PERF_POLICY_POWER, 0)
                value.nvmlReturn = NVML_SUCCESS
            elif field_id == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and gpu.recovery_action is not None:
                value.value.uiVal = gpu.recovery_action
                value.nvmlReturn = NVML_SUCCESS
            else:
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            out.append(value)
        return out

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        gpu, _ = self._device("nvmlDeviceGetPowerUsage", handle)
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        gpu, _ = self._device("nvmlDeviceGetEnforcedPowerLimit", handle)
        return gpu.power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu, _ = self._device("nvmlDeviceGetTotalEnergyConsumption", handle)
        return gpu.energy_mj

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu, _ = self._device("nvmlDeviceGetClockInfo", handle, clock_type)
        if clock_type == NVML_CLOCK_SM:
            return gpu.sm_clock_mhz
        if clock_type == NVML_CLOCK_MEM:
            return gpu.mem_clock_mhz
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetPcieThroughput(self, handle: Any, counter: int) -> int:
        gpu, _ = self._device("nvmlDeviceGetPcieThroughput", handle, counter)
        return gpu.pcie_rx_kbs if counter == NVML_PCIE_UTIL_RX_BYTES else gpu.pcie_tx_kbs

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        gpu, _ = self._device("nvmlDeviceGetFanSpeed", handle)
        return gpu.fan_percent

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        gpu, _ = self._device("nvmlDeviceGetTotalEccErrors", handle, error_type, counter_type)
        if counter_type == NVML_VOLATILE_ECC:
            return (gpu.ecc_volatile_corrected if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED
                    else gpu.ecc_volatile_uncorrected)
        return gpu.ecc_corrected if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else gpu.ecc_uncorrected

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu, _ = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return gpu.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        gpu, _ = self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return gpu.clock_reasons

    # ---- health -------------------------------------------------------------------------

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        """pynvml's: (corrRows, uncRows, isPending, failureOccurred); NOT_SUPPORTED before
        Ampere and in MIG mode."""
        gpu, mig = self._device("nvmlDeviceGetRemappedRows", handle)
        if gpu.remapped_rows is None or mig is not None or gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.remapped_rows

    def nvmlDeviceGetRowRemapperHistogram(self, handle: Any) -> c_nvmlRowRemapperHistogramValues:
        gpu, mig = self._device("nvmlDeviceGetRowRemapperHistogram", handle)
        if gpu.remapped_rows is None or mig is not None or gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return c_nvmlRowRemapperHistogramValues(**gpu.remap_histogram)

    def nvmlDeviceGetRetiredPages_v2(self, handle: Any, sourceFilter: int) -> list[tuple[int, int]]:
        """pynvml's: [(page address, timestamp)] for one cause."""
        gpu, _ = self._device("nvmlDeviceGetRetiredPages_v2", handle, sourceFilter)
        if gpu.retired_pages is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [(0x1000 * (i + 1), 1_700_000_000 + i) for i in range(gpu.retired_pages.get(sourceFilter, 0))]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        gpu, _ = self._device("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if gpu.retired_pages is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.retired_pending

    def nvmlDeviceGetSramEccErrorStatus(self, handle: Any, status: Any) -> int:
        """Fills the caller's c_nvmlEccSramErrorStatus_v1_t, as pynvml's does."""
        gpu, _ = self._device("nvmlDeviceGetSramEccErrorStatus", handle, status)
        if gpu.sram_threshold_exceeded is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        status.bThresholdExceeded = gpu.sram_threshold_exceeded
        return NVML_SUCCESS

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetCurrPcieLinkGeneration", handle)[0].pcie_generation

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetCurrPcieLinkWidth", handle)[0].pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetMaxPcieLinkGeneration", handle)[0].pcie_generation_max

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetMaxPcieLinkWidth", handle)[0].pcie_width_max

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetPcieReplayCounter", handle)[0].pcie_replays

    def _nvlink(self, name: str, handle: Any, link: int, *args: Any) -> FakeNvLink:
        gpu, mig = self._device(name, handle, link, *args)
        if not gpu.nvlinks or mig is not None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # a PCIe GPU
        if not 0 <= link < len(gpu.nvlinks):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # past the GPU's last link
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return NVML_FEATURE_ENABLED if self._nvlink("nvmlDeviceGetNvLinkState", handle, link).up else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        nvlink = self._nvlink("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)
        members = ("replay", "recovery", "crc_flit", "crc_data")
        if not 0 <= counter < len(members):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return int(getattr(nvlink, members[counter]))

    def nvmlDeviceGetViolationStatus(self, handle: Any, perfPolicyType: int) -> c_nvmlViolationTime_t:
        gpu, _ = self._device("nvmlDeviceGetViolationStatus", handle, perfPolicyType)
        if not 0 <= perfPolicyType <= NVML_PERF_POLICY_RELIABILITY:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return c_nvmlViolationTime_t(referenceTime=1_700_000_000_000_000,
                                     violationTime=gpu.violation_ns.get(perfPolicyType, 0))

    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetPersistenceMode", handle)[0].persistence_mode

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, gpuFabricInfo: Any) -> int:
        """Fills the caller's c_nvmlGpuFabricInfoV_t, as pynvml's does."""
        gpu, _ = self._device("nvmlDeviceGetGpuFabricInfoV", handle, gpuFabricInfo)
        if gpu.fabric is None or not gpu.fabric.health:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpuFabricInfo.state, gpuFabricInfo.status = gpu.fabric.state, gpu.fabric.status
        gpuFabricInfo.healthMask = gpu.fabric.health_mask
        return NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, gpuFabricInfo: Any) -> int:
        gpu, _ = self._device("nvmlDeviceGetGpuFabricInfo", handle, gpuFabricInfo)
        if gpu.fabric is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpuFabricInfo.state, gpuFabricInfo.status = gpu.fabric.state, gpu.fabric.status
        return NVML_SUCCESS

    # ---- processes --------------------------------------------------------------------

    def _process_list(self, name: str, handle: Any, kind: str) -> list[c_nvmlProcessInfo_t]:
        gpu, mig = self._device(name, handle)
        processes = mig.processes if mig is not None else gpu.processes
        out = []
        for proc in processes:
            if proc.kind != kind:
                continue
            out.append(c_nvmlProcessInfo_t(
                pid=proc.pid,
                usedGpuMemory=proc.used_memory,  # None, as pynvml turns NVML_VALUE_NOT_AVAILABLE into
                gpuInstanceId=mig.gpu_instance_id if mig is not None else proc.gpu_instance_id,
                computeInstanceId=mig.compute_instance_id if mig is not None else proc.compute_instance_id,
            ))
        return out

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[c_nvmlProcessInfo_t]:
        return self._process_list("nvmlDeviceGetComputeRunningProcesses_v3", handle, "compute")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[c_nvmlProcessInfo_t]:
        return self._process_list("nvmlDeviceGetComputeRunningProcesses_v2", handle, "compute")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[c_nvmlProcessInfo_t]:
        return self._process_list("nvmlDeviceGetComputeRunningProcesses", handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any) -> list[c_nvmlProcessInfo_t]:
        return self._process_list("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Any) -> list[c_nvmlProcessInfo_t]:
        return self._process_list("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[c_nvmlProcessInfo_t]:
        return self._process_list("nvmlDeviceGetGraphicsRunningProcesses", handle, "graphics")

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[c_nvmlProcessUtilizationSample_t]:
        """Samples newer than ``timeStamp`` (µs); NOT_FOUND when there are none, like NVML."""
        gpu, _ = self._device("nvmlDeviceGetProcessUtilization", handle, timeStamp)
        return self._util_samples(gpu, timeStamp, c_nvmlProcessUtilizationSample_t)

    @staticmethod
    def _util_samples(gpu: FakeGpu, timeStamp: int, struct: type[_Struct]) -> list[Any]:
        """The GPU's samples newer than ``timeStamp`` as ``struct``s (both per-process
        utilisation structs have the same fields); NOT_FOUND when there are none."""
        if gpu.live_sm:  # sampled now: one sample per process
            stamp = int(time.time() * 1e6)
            return [struct(pid=pid, timeStamp=stamp, smUtil=sm) for pid, sm in gpu.live_sm.items()]
        newer = [s for s in gpu.util_samples if s.timestamp > timeStamp]
        if not newer:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return [struct(pid=s.pid, timeStamp=s.timestamp, smUtil=s.sm, memUtil=s.mem, encUtil=s.enc, decUtil=s.dec)
                for s in newer]

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, timeStamp: int) -> list[
            c_nvmlProcessUtilizationInfo_v1_t]:
        """Like pynvml's: the samples newer than ``timeStamp`` (µs) as a list of
        ``c_nvmlProcessUtilizationInfo_v1_t``; NVMLError(SUCCESS) when there are none
        (the binding raises the sizing call's SUCCESS), NOT_FOUND as NVML answers it."""
        gpu, _ = self._device("nvmlDeviceGetProcessesUtilizationInfo", handle, timeStamp)
        return self._util_samples(gpu, timeStamp, c_nvmlProcessUtilizationInfo_v1_t)

    # ---- MIG ----------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu, mig = self._device("nvmlDeviceGetMigMode", handle)
        if mig is not None or not (gpu.mig_capable or gpu.mig_enabled):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu, mig = self._device("nvmlDeviceGetMaxMigDeviceCount", handle)
        if mig is not None or not (gpu.mig_capable or gpu.mig_enabled):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeHandle:
        gpu, _ = self._device("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)
        if not gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig_devices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return FakeHandle(handle.index, index)

    def nvmlDeviceGetAttributes_v2(self, handle: Any) -> c_nvmlDeviceAttributes:
        gpu, mig = self._device("nvmlDeviceGetAttributes_v2", handle)
        if mig is None:  # a whole GPU: every SM, all 7 slices when it is not split
            return c_nvmlDeviceAttributes(multiprocessorCount=132, gpuInstanceSliceCount=7,
                                          computeInstanceSliceCount=7, memorySizeMB=gpu.memory_total // 2**20)
        return c_nvmlDeviceAttributes(multiprocessorCount=16 * mig.slices, gpuInstanceSliceCount=mig.slices,
                                      computeInstanceSliceCount=mig.slices, memorySizeMB=mig.memory_total // 2**20)

    def nvmlDeviceGetAttributes(self, handle: Any) -> c_nvmlDeviceAttributes:
        return self.nvmlDeviceGetAttributes_v2(handle)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        _, mig = self._device("nvmlDeviceGetGpuInstanceId", handle)
        if mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return mig.gpu_instance_id

    # ---- events -------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> c_nvmlEventSet_t:
        self._enter("nvmlEventSetCreate", ())
        event_set = c_nvmlEventSet_t()
        self.event_sets.append(event_set)
        return event_set

    def nvmlEventSetFree(self, event_set: c_nvmlEventSet_t) -> None:
        self._enter("nvmlEventSetFree", (event_set,))
        event_set.freed = True

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        gpu, _ = self._device("nvmlDeviceGetSupportedEventTypes", handle)
        types = nvmlEventTypePState | nvmlEventTypeClock
        if gpu.xid_supported:
            types |= nvmlEventTypeXidCriticalError
        return types

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: c_nvmlEventSet_t) -> None:
        gpu, _ = self._device("nvmlDeviceRegisterEvents", handle, event_types, event_set)
        if event_types & nvmlEventTypeXidCriticalError and not gpu.xid_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        event_set.registered[handle.index] = event_set.registered.get(handle.index, 0) | event_types

    def nvmlEventSetWait(self, event_set: c_nvmlEventSet_t, timeoutms: int) -> c_nvmlEventData_t:
        """The next queued event for a device registered on the set; NVMLError_Timeout if none."""
        self._enter("nvmlEventSetWait", (event_set, timeoutms))
        for position, event in enumerate(self._events):
            mask = event_set.registered.get(event.device.index, 0)
            if mask & event.eventType:
                del self._events[position]
                return event
        raise NVMLError(NVML_ERROR_TIMEOUT)


def install(monkeypatch: Any, fake: FakeNvml) -> FakeNvml:
    """Make ``import pynvml`` return ``fake`` for the rest of the test (pytest monkeypatch)."""
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def function_names() -> list[str]:
    """The pynvml functions the fake implements."""
    return sorted(n for n in dir(FakeNvml) if n.startswith("nvml") and callable(getattr(FakeNvml, n)))


__all__ = [
    "DEFAULT_COST", "FREE", "H200_COSTS", "Block", "CallCost", "charge",
    "FakeFabric", "FakeGpm", "FakeGpu", "FakeNvLink", "FakeHandle", "FakeMig", "FakeNvml", "FakeProcess", "FakeUtilSample", "NVMLError",
    "function_names", "install",
]


class _FakeNvmlWithMissing(FakeNvml):
    """A `FakeNvml` whose ``missing`` functions are hidden, as in an old nvidia-ml-py."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_") and name in object.__getattribute__(self, "__dict__").get("missing", ()):
            raise AttributeError(f"module 'pynvml' has no attribute {name!r}")
        return object.__getattribute__(self, name)
