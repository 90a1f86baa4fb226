"""A stand-in for the ``amdsmi`` Python package, for tests on machines without ROCm.

It mirrors the real interface (``py-interface/amdsmi_interface.py`` and
``amdsmi_exception.py`` in ROCm/amdsmi): the same function names and signatures, the same
exception classes (``AmdSmiLibraryException`` carries ``err_code``), the same enums and
the same units:

* ``amdsmi_get_gpu_activity``: percent, "N/A" where unsupported;
* ``amdsmi_get_gpu_memory_usage/total``: bytes; ``amdsmi_get_gpu_vram_usage``: MiB;
* ``amdsmi_get_power_info``: watts ("N/A" for the socket power a card lacks);
  ``power_limit`` in watts, or microwatts with ``power_limit_microwatts=True`` (as some
  ROCm 6.x releases did);
* ``amdsmi_get_energy_count``: ticks of ``counter_resolution`` microjoules, under
  ``energy_accumulator`` (ROCm 6.4+) and/or ``power`` (older);
* ``amdsmi_get_temp_metric``: degrees Celsius;
* ``amdsmi_get_clock_info``: MHz under ``clk`` (new) or ``cur_clk`` (old);
* processes: ``process_api="dicts"`` returns dicts from ``amdsmi_get_gpu_process_list``
  (ROCm 6.2+); ``process_api="handles"`` returns handles that
  ``amdsmi_get_gpu_process_info`` resolves (before 6.2). ``engine_usage.gfx`` is
  cumulative nanoseconds, ``memory_usage.vram_mem`` bytes.

* health: ``amdsmi_get_gpu_ecc_count(handle, AmdSmiGpuBlock)`` and
  ``amdsmi_get_gpu_total_ecc_count`` return ``correctable_count`` / ``uncorrectable_count`` /
  ``deferred_count``; a block missing from ``ecc_blocks`` raises NOT_SUPPORTED, as the
  library does for a RAS block the card lacks. ``amdsmi_get_gpu_bad_page_info`` returns a
  list of records (``value``, ``page_address``, ``page_size``, ``status``: an
  ``AmdSmiMemoryPageStatus``). ``amdsmi_get_pcie_info`` returns ``pcie_static`` (max width,
  max speed in MT/s) and ``pcie_metric`` (width, speed in MT/s, replay count, ...).
  ``amdsmi_gpu_xgmi_error_status`` returns an ``AmdSmiXgmiStatus``. ``library_lacks`` names
  functions an older library does not have (reading them raises AttributeError);
  ``calls`` counts every call by function name.

Tests mutate the `FakeGpu` objects between passes. A field set to an exception instance
raises it; ``lost=True`` makes every call for that GPU raise a DRM error; ``hang`` (a
``threading.Event``) makes every call for that GPU wait until it is set, as a call into a
wedged driver does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class AmdSmiRetCode(IntEnum):
    """Return codes (values from amdsmi.h)."""

    SUCCESS = 0
    ERR_INVAL = 1
    ERR_NOT_SUPPORTED = 2
    NOT_IMPLEMENTED = 3
    FAIL_LOAD_MODULE = 4
    FAIL_LOAD_SYMBOL = 5
    DRM_ERROR = 6
    API_FAILED = 7
    TIMEOUT = 8
    RETRY = 9
    ERR_NO_PERM = 10
    INIT_ERROR = 18
    ERR_BUSY = 30
    ERR_NOT_FOUND = 31
    NOT_INIT = 32
    NO_DATA = 40
    UNKNOWN_ERROR = 0xFFFFFFFF


class AmdSmiException(Exception):
    """Base smi exception class."""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int):
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        try:
            self.err_info = "AMDSMI_STATUS_" + AmdSmiRetCode(err_code).name
        except ValueError:
            self.err_info = "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred"

    def __str__(self) -> str:
        return f"An error occured with code: {self.err_code}({self.err_info})"

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(AmdSmiRetCode.RETRY)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(AmdSmiRetCode.TIMEOUT)


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received: Any, expected: type, msg: str | None = None):
        super().__init__(msg)
        self.err_msg = msg or f"Invalid parameter:\nActual type: {type(received)}\nExpected type: {expected}"

    def __str__(self) -> str:
        return self.err_msg


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1 << 0
    INIT_AMD_GPUS = 1 << 1


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3
    HBM_1 = 4
    HBM_2 = 5
    HBM_3 = 6
    PLX = 7


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0
    MAX = 1
    MIN = 2


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4
    PCIE = 5


class AmdSmiGpuBlock(IntEnum):
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128
    DF = 256
    SMN = 512
    SEM = 1024
    MP0 = 2048
    MP1 = 4096
    FUSE = 8192
    MCA = 16384
    VCN = 32768
    JPEG = 65536
    IH = 131072
    MPIO = 262144
    LAST = 262144
    RESERVED = 9223372036854775808


class AmdSmiMemoryPageStatus(IntEnum):
    RESERVED = 0
    PENDING = 1
    UNRESERVABLE = 2


class AmdSmiXgmiStatus(IntEnum):
    NO_ERRORS = 0
    ERROR = 1
    MULTIPLE_ERRORS = 2


NA = "N/A"


def _default_blocks() -> dict:
    return {"UMC": (3, 0, 1), "SDMA": (0, 0, 0), "GFX": (0, 0, 0), "MMHUB": (0, 0, 0)}


def _default_pcie() -> dict:
    return {"pcie_static": {"max_pcie_width": 16, "max_pcie_speed": 32000, "pcie_interface_version": 5,
                            "slot_type": "OAM", "max_pcie_interface_version": 5},
            "pcie_metric": {"pcie_width": 16, "pcie_speed": 32000, "pcie_bandwidth": 48, "pcie_replay_count": 2,
                            "pcie_l0_to_recovery_count": 0, "pcie_replay_roll_over_count": 0,
                            "pcie_nak_sent_count": 0, "pcie_nak_received_count": 0}}


@dataclass
class FakeProcess:
    pid: int
    name: str = "python3"
    vram_bytes: int = 0
    gfx_ns: int = 0
    enc_ns: int = 0


@dataclass
class FakeGpu:
    """One GPU's readings, in the library's own units."""

    uuid: str = "a4ff740f-0000-1000-80ea-3fe8d9b2e51c"
    bdf: str = "0000:c1:00.0"
    market_name: str = "AMD Instinct MI300X"
    asic_serial: str = "0x5F1B2C3D4E5F6A7B"
    driver_version: str = "6.8.5"
    gfx_activity: Any = 42
    umc_activity: Any = 17
    vram_used_bytes: Any = 3 * 2**30
    vram_total_bytes: Any = 192 * 2**30
    memory_usage_api: bool = True  # amdsmi_get_gpu_memory_usage/total present
    current_socket_power: Any = 350
    average_socket_power: Any = NA
    power_limit_watts: Any = 750
    power_limit_microwatts: bool = False
    energy_ticks: Any = 1_000_000
    counter_resolution: float = 15.3
    energy_key: str = "both"  # "energy_accumulator", "power" or "both"
    temperatures: dict = field(default_factory=lambda: {"EDGE": NA, "JUNCTION": 61, "VRAM": 48})
    gfx_mhz: Any = 2100
    mem_mhz: Any = 1300
    clock_key: str = "clk"
    correctable: Any = 3
    uncorrectable: Any = 0
    deferred: Any = 1
    ecc_blocks: dict = field(default_factory=_default_blocks)  # block name -> (corr, uncorr, deferred)
    bad_pages: Any = field(default_factory=list)  # records, or an exception
    pcie: Any = field(default_factory=_default_pcie)
    xgmi_status: Any = AmdSmiXgmiStatus.NO_ERRORS
    processes: list = field(default_factory=list)
    lost: bool = False
    process_list_error: BaseException | None = None
    hang: Any = None  # a threading.Event: calls for this GPU wait until it is set


class FakeHandle:
    """Stands for ``amdsmi_wrapper.amdsmi_processor_handle``."""

    def __init__(self, gpu: FakeGpu):
        self.gpu = gpu


class FakeProcessHandle:
    """Stands for ``amdsmi_wrapper.amdsmi_process_handle_t`` (before ROCm 6.2)."""

    def __init__(self, process: FakeProcess):
        self.process = process


class FakeAmdSmi:
    """The module: use as ``AmdBackend(amdsmi=FakeAmdSmi([...]))``."""

    AmdSmiRetCode = AmdSmiRetCode
    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiRetryException = AmdSmiRetryException
    AmdSmiTimeoutException = AmdSmiTimeoutException
    AmdSmiParameterException = AmdSmiParameterException
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiMemoryType = AmdSmiMemoryType
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiClkType = AmdSmiClkType
    AmdSmiGpuBlock = AmdSmiGpuBlock
    AmdSmiMemoryPageStatus = AmdSmiMemoryPageStatus
    AmdSmiXgmiStatus = AmdSmiXgmiStatus

    def __init__(self, gpus: list[FakeGpu] | None = None, process_api: str = "dicts",
                 init_error: int | None = None, library_lacks: tuple[str, ...] = ()):
        self.library_lacks = frozenset(library_lacks)
        self.calls: dict[str, int] = {}
        self.gpus = list(gpus) if gpus is not None else [FakeGpu()]
        self.process_api = process_api
        self.init_error = init_error
        self.initialised = False
        self.shut_down = False
        if not self.gpus or not any(g.memory_usage_api for g in self.gpus):
            # Old libraries: no amdsmi_get_gpu_memory_usage/total.
            self.amdsmi_get_gpu_memory_usage = None  # type: ignore[assignment]
            self.amdsmi_get_gpu_memory_total = None  # type: ignore[assignment]

    # ---- lifecycle ------------------------------------------------------------------
    def amdsmi_init(self, flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        if self.init_error is not None:
            raise AmdSmiLibraryException(self.init_error)
        self.initialised = True

    def amdsmi_shut_down(self) -> None:
        self.initialised = False
        self.shut_down = True

    def amdsmi_get_processor_handles(self) -> list[FakeHandle]:
        self._check_init()
        return [FakeHandle(g) for g in self.gpus]

    # ---- identity -------------------------------------------------------------------
    def amdsmi_get_gpu_device_uuid(self, handle: FakeHandle) -> str:
        return self._gpu(handle).uuid

    def amdsmi_get_gpu_device_bdf(self, handle: FakeHandle) -> str:
        return self._gpu(handle).bdf

    def amdsmi_get_gpu_asic_info(self, handle: FakeHandle) -> dict:
        gpu = self._gpu(handle)
        return {"market_name": gpu.market_name, "vendor_id": "0x1002", "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
                "device_id": "0x74a1", "rev_id": "0x00", "asic_serial": gpu.asic_serial, "oam_id": 0}

    def amdsmi_get_gpu_board_info(self, handle: FakeHandle) -> dict:
        gpu = self._gpu(handle)
        return {"model_number": "102-G30211-00", "product_serial": "692251001124", "fru_id": NA,
                "product_name": gpu.market_name, "manufacturer_name": "AMD"}

    def amdsmi_get_gpu_driver_info(self, handle: FakeHandle) -> dict:
        gpu = self._gpu(handle)
        return {"driver_name": "amdgpu", "driver_version": gpu.driver_version, "driver_date": "2015/01/01 00:00"}

    # ---- readings -------------------------------------------------------------------
    def amdsmi_get_gpu_activity(self, handle: FakeHandle) -> dict:
        gpu = self._gpu(handle)
        return {"gfx_activity": self._v(gpu.gfx_activity), "umc_activity": self._v(gpu.umc_activity),
                "mm_activity": NA}

    def amdsmi_get_gpu_memory_usage(self, handle: FakeHandle, mem_type: AmdSmiMemoryType) -> int:
        if not isinstance(mem_type, AmdSmiMemoryType):
            raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
        return self._v(self._gpu(handle).vram_used_bytes)

    def amdsmi_get_gpu_memory_total(self, handle: FakeHandle, mem_type: AmdSmiMemoryType) -> int:
        if not isinstance(mem_type, AmdSmiMemoryType):
            raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
        return self._v(self._gpu(handle).vram_total_bytes)

    def amdsmi_get_gpu_vram_usage(self, handle: FakeHandle) -> dict:
        gpu = self._gpu(handle)
        return {"vram_total": self._v(gpu.vram_total_bytes) // 2**20, "vram_used": self._v(gpu.vram_used_bytes) // 2**20}

    def amdsmi_get_power_info(self, handle: FakeHandle, sensor_ind: int = 0) -> dict:
        gpu = self._gpu(handle)
        limit = self._v(gpu.power_limit_watts)
        if gpu.power_limit_microwatts and isinstance(limit, (int, float)):
            limit = int(limit * 1_000_000)
        return {"current_socket_power": self._v(gpu.current_socket_power),
                "average_socket_power": self._v(gpu.average_socket_power),
                "gfx_voltage": NA, "soc_voltage": NA, "mem_voltage": NA, "power_limit": limit}

    def amdsmi_get_energy_count(self, handle: FakeHandle) -> dict:
        gpu = self._gpu(handle)
        ticks = self._v(gpu.energy_ticks)
        out: dict[str, Any] = {"counter_resolution": gpu.counter_resolution, "timestamp": 1_700_000_000_000}
        if gpu.energy_key in ("power", "both"):
            out["power"] = ticks
        if gpu.energy_key in ("energy_accumulator", "both"):
            out["energy_accumulator"] = ticks
        return out

    def amdsmi_get_temp_metric(self, handle: FakeHandle, sensor_type: AmdSmiTemperatureType,
                               metric: AmdSmiTemperatureMetric) -> int:
        if not isinstance(sensor_type, AmdSmiTemperatureType):
            raise AmdSmiParameterException(sensor_type, AmdSmiTemperatureType)
        if not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException(metric, AmdSmiTemperatureMetric)
        gpu = self._gpu(handle)
        name = "JUNCTION" if sensor_type == AmdSmiTemperatureType.JUNCTION else sensor_type.name
        value = gpu.temperatures.get(name, NA)
        if value == NA:
            # The real library raises NOT_SUPPORTED for a sensor the card lacks.
            raise AmdSmiLibraryException(AmdSmiRetCode.ERR_NOT_SUPPORTED)
        return self._v(value)

    def amdsmi_get_clock_info(self, handle: FakeHandle, clock_type: AmdSmiClkType) -> dict:
        if not isinstance(clock_type, AmdSmiClkType):
            raise AmdSmiParameterException(clock_type, AmdSmiClkType)
        gpu = self._gpu(handle)
        mhz = self._v(gpu.gfx_mhz if clock_type == AmdSmiClkType.GFX else gpu.mem_mhz)
        if gpu.clock_key == "clk":
            return {"clk": mhz, "min_clk": 500, "max_clk": 2100, "clk_locked": NA, "clk_deep_sleep": False}
        return {"cur_clk": mhz, "min_clk": 500, "max_clk": 2100}

    def amdsmi_get_gpu_total_ecc_count(self, handle: FakeHandle) -> dict:
        gpu = self._gpu(handle)
        return {"correctable_count": self._v(gpu.correctable), "uncorrectable_count": self._v(gpu.uncorrectable),
                "deferred_count": self._v(gpu.deferred)}

    # ---- health ---------------------------------------------------------------------
    def amdsmi_get_gpu_ecc_count(self, handle: FakeHandle, block: AmdSmiGpuBlock) -> dict:
        if not isinstance(block, AmdSmiGpuBlock):
            raise AmdSmiParameterException(block, AmdSmiGpuBlock)
        key = f"amdsmi_get_gpu_ecc_count:{block.name}"
        self.calls[key] = self.calls.get(key, 0) + 1
        counts = self._v(self._gpu(handle).ecc_blocks.get(block.name))
        if counts is None:
            raise AmdSmiLibraryException(AmdSmiRetCode.ERR_NOT_SUPPORTED)
        corrected, uncorrected, deferred = counts
        return {"correctable_count": self._v(corrected), "uncorrectable_count": self._v(uncorrected),
                "deferred_count": self._v(deferred)}

    def amdsmi_get_gpu_bad_page_info(self, handle: FakeHandle) -> Any:
        pages = self._v(self._gpu(handle).bad_pages)
        return list(pages) if isinstance(pages, list) else pages

    def amdsmi_get_pcie_info(self, handle: FakeHandle) -> dict:
        return self._v(self._gpu(handle).pcie)

    def amdsmi_gpu_xgmi_error_status(self, handle: FakeHandle) -> AmdSmiXgmiStatus:
        return self._v(self._gpu(handle).xgmi_status)

    @staticmethod
    def bad_page(value: int, status: AmdSmiMemoryPageStatus = AmdSmiMemoryPageStatus.RESERVED) -> dict:
        """One ``amdsmi_get_gpu_bad_page_info`` record."""
        return {"value": value, "page_address": 0x1000 * (value + 1), "page_size": 4096, "status": status}

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if not name.startswith("amdsmi_"):
            return value
        if name in object.__getattribute__(self, "library_lacks"):
            raise AttributeError(name)
        if not callable(value):
            return value
        calls = object.__getattribute__(self, "calls")

        @functools.wraps(value)
        def counted(*args: Any, **kwargs: Any) -> Any:  # counted when called, not when looked up
            calls[name] = calls.get(name, 0) + 1
            return value(*args, **kwargs)

        return counted

    # ---- processes ------------------------------------------------------------------
    def amdsmi_get_gpu_process_list(self, handle: FakeHandle) -> list:
        gpu = self._gpu(handle)
        if gpu.process_list_error is not None:
            raise gpu.process_list_error
        if self.process_api == "handles":
            return [FakeProcessHandle(p) for p in gpu.processes]
        return [self._process_dict(p) for p in gpu.processes]

    def amdsmi_get_gpu_process_info(self, handle: FakeHandle, process: FakeProcessHandle) -> dict:
        self._gpu(handle)
        if self.process_api != "handles":
            raise AttributeError("amdsmi_get_gpu_process_info was removed in ROCm 6.2")
        if not isinstance(process, FakeProcessHandle):
            raise AmdSmiParameterException(process, FakeProcessHandle)
        return self._process_dict(process.process, old=True)

    @staticmethod
    def _process_dict(p: FakeProcess, old: bool = False) -> dict:
        info = {
            "name": p.name or NA,
            "pid": p.pid,
            "mem": p.vram_bytes,
            "engine_usage": {"gfx": p.gfx_ns, "enc": p.enc_ns},
            "memory_usage": {"gtt_mem": 2 * 2**20, "cpu_mem": 8 * 2**20, "vram_mem": p.vram_bytes},
        }
        if not old:
            info["cu_occupancy"] = NA
        return info

    # ---- helpers --------------------------------------------------------------------
    def _check_init(self) -> None:
        if not self.initialised:
            raise AmdSmiLibraryException(AmdSmiRetCode.NOT_INIT)

    def _gpu(self, handle: Any) -> FakeGpu:
        if not isinstance(handle, FakeHandle):
            raise AmdSmiParameterException(handle, FakeHandle)
        self._check_init()
        if handle.gpu.hang is not None:
            handle.gpu.hang.wait()
        if handle.gpu.lost:
            raise AmdSmiLibraryException(AmdSmiRetCode.DRM_ERROR)
        return handle.gpu

    @staticmethod
    def _v(value: Any) -> Any:
        if isinstance(value, BaseException):
            raise value
        return value
