"""AMD Instinct and Radeon GPUs through the ``amdsmi`` Python package (ROCm).

Every value is converted to the same base units as the NVML backend, so a dashboard
never needs to know which vendor it shows:

* activity (``gfx_activity``, ``umc_activity``) is a percentage -> ratio 0-1;
* VRAM comes in bytes from ``amdsmi_get_gpu_memory_usage/total`` or, on libraries that
  lack them, in MiB from ``amdsmi_get_gpu_vram_usage`` -> bytes;
* power is watts; the socket power field depends on the card: MI300 and later report
  ``current_socket_power`` (and ``socket_power`` from ROCm 7), MI200 and Radeon cards
  ``average_socket_power``; the first that holds a number is used;
* the power limit is watts in current libraries but microwatts in some ROCm 6.x
  releases; a value above 100 000 can only be microwatts and is scaled;
* energy is ``counter × counter_resolution`` microjoules (``energy_accumulator`` from
  ROCm 6.4, ``power`` before) -> joules;
* ``gpu_temperature_celsius`` is the junction (hotspot) sensor, because MI300 parts have
  no edge sensor and the junction is the die temperature that throttling acts on; the
  edge sensor is the fallback on cards without a junction sensor. The VRAM (HBM) sensor
  feeds ``gpu_memory_temperature_celsius``. Readings above 1000 are millidegrees and are
  scaled (some library builds document millidegrees);
* clocks are MHz (``clk`` from ROCm 6.1, ``cur_clk`` before) -> hertz;
* per process: from ROCm 6.2 ``amdsmi_get_gpu_process_list`` returns dicts, before it
  returns handles read with ``amdsmi_get_gpu_process_info``; both carry cumulative GFX
  engine nanoseconds (``engine_usage.gfx``) and VRAM bytes (``memory_usage.vram_mem``).
  A process's SM share is the growth of its engine time over the wall time between two
  passes; on first sight it is None.

"N/A" strings and the library's all-ones "not available" sentinels become None, never 0.
A read that answers NOT_SUPPORTED (a sensor the card lacks) is None and is not asked of that
device again, as NVML's wrapper does (`exporter.devices.nvml.libnvml`). A device whose every
read fails comes back with ``up=False``; the others carry on.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from exporter.core.bulkhead import Read, check_abandoned
from exporter.core.model import DeviceSample, ProcessSample, frozen_mapping
from exporter.core.shares import READ_ALL, PassPlan
from exporter.devices.amd.health import AmdHealth
from exporter.devices.base import Backend, BackendUnavailable
from exporter.devices.schedule import BOOT_ID_PATH, DEFAULT_HEALTH_INTERVAL, HealthReads

log = logging.getLogger(__name__)

VENDOR = "amd"

# The library fills fields it cannot read with the all-ones value of the C type.
_SENTINELS = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})
# A power limit above this is in microwatts (no socket draws 100 kW).
_MICROWATT_THRESHOLD = 100_000.0
# A temperature above this is in millidegrees Celsius.
_MILLIDEGREE_THRESHOLD = 1000.0
# Return codes that mean "this card or driver has no such sensor": expected, not errors.
_UNSUPPORTED_NAMES = (
    "ERR_NOT_SUPPORTED", "STATUS_NOT_SUPPORTED", "NOT_SUPPORTED",
    "NOT_IMPLEMENTED", "STATUS_NOT_YET_IMPLEMENTED", "NO_DATA", "STATUS_NO_DATA",
)
_AMDSMI_STATUS_NOT_SUPPORTED = 2  # amdsmi.h, used when the enum cannot be read
# What amdsmi's function names start with, to name the call a stuck read is in.
_CALL_PREFIXES = ("amdsmi_",)


def number(value: Any) -> float | None:
    """Return ``value`` as a float, or None for "N/A", sentinels and non-numbers."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        if math.isnan(value) or value in _SENTINELS:  # NaN or "not available"
            return None
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if not text or text.upper() in ("N/A", "NA", "NOT SUPPORTED"):
            return None
        try:
            return number(float(text))
        except ValueError:
            return None
    return None


def ratio_from_percent(value: Any) -> float | None:
    """Percent (0-100) -> ratio clipped to 0-1; None when not a number."""
    pct = number(value)
    if pct is None:
        return None
    return min(max(pct / 100.0, 0.0), 1.0)


def power_limit_watts(value: Any) -> float | None:
    """The ``power_limit`` field in watts, whichever unit the library used."""
    limit = number(value)
    if limit is None or limit <= 0:
        return None
    return limit / 1e6 if limit > _MICROWATT_THRESHOLD else limit


def celsius(value: Any) -> float | None:
    """A temperature reading in degrees Celsius (millidegrees are scaled)."""
    temp = number(value)
    if temp is None:
        return None
    return temp / 1000.0 if abs(temp) > _MILLIDEGREE_THRESHOLD else temp


def energy_joules(info: Mapping[str, Any] | None) -> float | None:
    """``amdsmi_get_energy_count`` -> joules (counter × resolution µJ)."""
    if not isinstance(info, Mapping):
        return None
    counter = number(info.get("energy_accumulator"))
    if counter is None:
        counter = number(info.get("power"))  # the key before ROCm 6.4
    resolution = number(info.get("counter_resolution"))
    if counter is None or resolution is None:
        return None
    return counter * resolution / 1e6


def socket_power_watts(info: Mapping[str, Any] | None) -> float | None:
    """The socket power the card reports (current, unified or average), in watts."""
    if not isinstance(info, Mapping):
        return None
    for key in ("current_socket_power", "socket_power", "average_socket_power"):
        watts = number(info.get(key))
        if watts is not None:
            return watts
    return None


def clock_hertz(info: Mapping[str, Any] | None) -> float | None:
    """``amdsmi_get_clock_info`` (MHz) -> hertz."""
    if not isinstance(info, Mapping):
        return None
    mhz = number(info.get("clk", info.get("cur_clk")))
    return None if mhz is None else mhz * 1e6


class _Unsupported(Exception):
    """A read the card does not support (kept apart from real failures)."""


class AmdBackend(HealthReads, Backend):
    """Reads AMD GPUs through ``amdsmi``.

    Args:
        amdsmi: the ``amdsmi`` module, or a stand-in with the same functions; None
            imports the real one in `open`.
        health_interval, boot_id_path: its health reads' (`HealthReads`).
    """

    name = "amd"
    call_prefixes = _CALL_PREFIXES

    def __init__(self, amdsmi: Any = None, health_interval: float | None = DEFAULT_HEALTH_INTERVAL,
                 boot_id_path: str = BOOT_ID_PATH):
        super().__init__(health_interval, boot_id_path)
        # Health reads (`exporter.devices.amd.health`): ECC per block, bad pages, PCIe, XGMI.
        self._health_reader: AmdHealth | None = None
        self._lib = amdsmi
        self._handles: list[Any] = []
        self._static: dict[int, dict[str, str]] = {}
        # (device index, pid) -> (GFX engine ns, pass time) for per-process shares.
        self._engine: dict[tuple[int, int], tuple[float, float]] = {}
        self._errors: dict[str, int] = {}
        self._logged: set[str] = set()
        self._own_pid = os.getpid()
        # (device index, read) that answered NOT_SUPPORTED: never asked again (as `nvml.libnvml.Nvml`)
        self._unsupported: set[tuple[int, str]] = set()

    # ---- lifecycle ------------------------------------------------------------------
    def open(self) -> None:
        """Load amdsmi, initialise it for GPUs and list the devices.

        Raises:
            BackendUnavailable: amdsmi is not installed, cannot load libamd_smi, the
                amdgpu driver is not loaded, or there are no AMD GPUs.
        """
        if self._lib is None:
            try:
                import amdsmi  # type: ignore[import-not-found]
            except Exception as exc:  # a broken install raises OSError, not only ImportError
                raise BackendUnavailable(
                    f"the amdsmi Python package cannot be loaded ({exc}); install ROCm's "
                    "amd-smi-lib (pip install amdsmi matching your ROCm) and make sure "
                    "libamd_smi.so is on the library path"
                ) from exc
            self._lib = amdsmi
        lib = self._lib
        try:
            flags = getattr(lib, "AmdSmiInitFlags", None)
            gpus = getattr(flags, "INIT_AMD_GPUS", None) if flags is not None else None
            if gpus is not None:
                lib.amdsmi_init(gpus)
            else:
                lib.amdsmi_init()
            self._handles = list(lib.amdsmi_get_processor_handles())
            self._unsupported.clear()  # a new enumeration: ask every device everything again
        except self._exception_types() as exc:
            raise BackendUnavailable(
                f"amdsmi could not initialise ({_describe(exc)}); is the amdgpu driver "
                "loaded and /dev/kfd and /dev/dri visible to the agent?"
            ) from exc
        if not self._handles:
            self._shutdown()
            raise BackendUnavailable("amdsmi found no AMD GPUs on this node")
        for index, handle in enumerate(self._handles):
            self._static[index] = self._read_static(handle)
        self.open_health()
        self._health_reader = AmdHealth(lib, self._exception_types(), self._is_unsupported, number, self._log_once)
        log.info("amd: %d GPU(s) found", len(self._handles))

    def close(self) -> None:
        """Shut amdsmi down."""
        self._shutdown()
        self._handles = []

    def errors(self) -> Mapping[str, int]:
        """Cumulative counts of problems survived, by reason."""
        return dict(self._errors)

    # ---- sampling -------------------------------------------------------------------
    def sample(self, now: float) -> list[DeviceSample]:
        """Read every GPU once; a failing GPU comes back with ``up=False``."""
        samples: list[DeviceSample] = []
        for read in self.reads(now):
            samples.extend(read.run())
        return samples

    def reads(self, now: float, plan: PassPlan = READ_ALL) -> list[Read]:
        """This pass as parts the collector can give up on one by one (`exporter.core.bulkhead`):
        one per GPU (key: its index), then forgetting the engine counters of processes
        gone from the GPUs that were read. A GPU stuck in an amdsmi call is asked nothing
        else until the call returns; its processes' counters start afresh then."""
        seen: set[tuple[int, int]] = set()
        read_gpus: set[int] = set()
        parts = [Read(index, f"GPU {index}", functools.partial(self._read_device, index, handle, now, seen, read_gpus),
                      calls=_CALL_PREFIXES, down=functools.partial(self._down_samples, index))
                 for index, handle in enumerate(self._handles)]
        parts.append(Read("processes", "amdsmi process counters",
                          functools.partial(self._forget_gone, seen, read_gpus), calls=_CALL_PREFIXES, last=True))
        return parts

    def _read_device(self, index: int, handle: Any, now: float, seen: set[tuple[int, int]],
                     read_gpus: set[int]) -> list[DeviceSample]:
        try:
            sample = self._sample_device(index, handle, now, seen)
        except Exception as exc:  # noqa: BLE001 - one GPU must not stop the others
            self._count("gpu_lost")
            self._log_once(f"gpu{index}:{type(exc).__name__}", logging.WARNING,
                           "amd: GPU %d could not be read: %s", index, _describe(exc))
            sample = self._down_sample(index, _describe(exc))
        read_gpus.add(index)
        return [sample]

    def _forget_gone(self, seen: set[tuple[int, int]], read_gpus: set[int]) -> list[DeviceSample]:
        """Forget the engine counters of processes gone from the GPUs read this pass."""
        for key in list(self._engine):
            if key not in seen and key[0] in read_gpus:
                del self._engine[key]
        return []

    def _down_samples(self, index: int, error: str) -> list[DeviceSample]:
        return [self._down_sample(index, error)]

    def _down_sample(self, index: int, error: str) -> DeviceSample:
        static = self._static.get(index, {})
        return DeviceSample(index=index, uuid=static.get("uuid", ""), model=static.get("model", ""), vendor=VENDOR,
                            driver_version=static.get("driver_version", ""), pci_bus_id=static.get("pci_bus_id", ""),
                            serial=static.get("serial", "")).down(error)

    def _sample_device(self, index: int, handle: Any, now: float,
                       seen: set[tuple[int, int]]) -> DeviceSample:
        lib = self._lib
        static = self._static.get(index) or {}
        if not static.get("uuid"):
            static = self._static[index] = self._read_static(handle)
        reads = _Reads(self, index)

        activity = reads.get("activity", lib.amdsmi_get_gpu_activity, handle)
        used, total = self._memory(reads, handle)
        power = reads.get("power", lib.amdsmi_get_power_info, handle)
        energy = reads.get("energy", getattr(lib, "amdsmi_get_energy_count", None), handle)
        temp = self._temperature(reads, handle, ("JUNCTION", "HOTSPOT"))
        if temp is None:
            temp = self._temperature(reads, handle, ("EDGE",))
        mem_temp = self._temperature(reads, handle, ("VRAM",))
        clk_type = getattr(lib, "AmdSmiClkType", None)
        clock_info = getattr(lib, "amdsmi_get_clock_info", None)
        sm_clock = mem_clock = None
        if clk_type is not None and clock_info is not None:
            sm_clock = clock_hertz(reads.get("clock_gfx", clock_info, handle, clk_type.GFX))
            mem_clock = clock_hertz(reads.get("clock_mem", clock_info, handle, clk_type.MEM))
        ecc = reads.get("ecc", getattr(lib, "amdsmi_get_gpu_total_ecc_count", None), handle)
        processes = self._processes(reads, index, handle, now, seen)

        if reads.failures and not reads.successes:
            # Every read failed for real (not "unsupported"): the GPU is gone.
            raise reads.failures[0]

        ecc_counts: dict[str, int] = {}
        if isinstance(ecc, Mapping):
            for ours, theirs in (("corrected", "correctable_count"),
                                 ("uncorrected", "uncorrectable_count")):
                count = number(ecc.get(theirs))
                if count is not None:
                    ecc_counts[ours] = int(count)
        activity = activity if isinstance(activity, Mapping) else {}
        joules = energy_joules(energy)
        health = None
        if self._health_reader is not None and self.health_due(index, len(self._handles), now):
            health = self._health_reader.read(index, handle, self._boot_id, joules)
        return DeviceSample(
            index=index,
            uuid=static.get("uuid", ""),
            model=static.get("model", ""),
            vendor=VENDOR,
            driver_version=static.get("driver_version", ""),
            pci_bus_id=static.get("pci_bus_id", ""),
            serial=static.get("serial", ""),
            utilization=ratio_from_percent(activity.get("gfx_activity")),
            memory_utilization=ratio_from_percent(activity.get("umc_activity")),
            memory_used_bytes=used,
            memory_total_bytes=total,
            temperature_celsius=temp,
            memory_temperature_celsius=mem_temp,
            power_watts=socket_power_watts(power),
            power_limit_watts=power_limit_watts(power.get("power_limit"))
            if isinstance(power, Mapping) else None,
            energy_joules=joules,
            sm_clock_hertz=sm_clock,
            memory_clock_hertz=mem_clock,
            ecc_errors=frozen_mapping(ecc_counts),
            processes=tuple(processes),
            health_signals=health,
        )

    def _memory(self, reads: _Reads, handle: Any) -> tuple[int | None, int | None]:
        """VRAM used and total in bytes."""
        lib = self._lib
        mem_type = getattr(getattr(lib, "AmdSmiMemoryType", None), "VRAM", None)
        used = total = None
        if mem_type is not None and hasattr(lib, "amdsmi_get_gpu_memory_usage"):
            used = number(reads.get("memory_used", lib.amdsmi_get_gpu_memory_usage, handle, mem_type))
            total = number(reads.get("memory_total", getattr(lib, "amdsmi_get_gpu_memory_total", None),
                                     handle, mem_type))
        if (used is None or total is None) and hasattr(lib, "amdsmi_get_gpu_vram_usage"):
            vram = reads.get("vram_usage", lib.amdsmi_get_gpu_vram_usage, handle)
            if isinstance(vram, Mapping):  # MiB
                mib_used, mib_total = number(vram.get("vram_used")), number(vram.get("vram_total"))
                if used is None and mib_used is not None:
                    used = mib_used * 2**20
                if total is None and mib_total is not None:
                    total = mib_total * 2**20
        return (None if used is None else int(used)), (None if total is None else int(total))

    def _temperature(self, reads: _Reads, handle: Any, sensors: Iterable[str]) -> float | None:
        lib = self._lib
        types = getattr(lib, "AmdSmiTemperatureType", None)
        metric = getattr(getattr(lib, "AmdSmiTemperatureMetric", None), "CURRENT", None)
        read = getattr(lib, "amdsmi_get_temp_metric", None)
        if types is None or metric is None or read is None:
            return None
        for sensor in sensors:
            kind = getattr(types, sensor, None)
            if kind is None:
                continue
            value = celsius(reads.get(f"temperature_{sensor.lower()}", read, handle, kind, metric))
            if value is not None:
                return value
        return None

    def _processes(self, reads: _Reads, index: int, handle: Any, now: float,
                   seen: set[tuple[int, int]]) -> list[ProcessSample]:
        lib = self._lib
        entries = reads.get("process_list", getattr(lib, "amdsmi_get_gpu_process_list", None), handle)
        if not entries:
            return []
        by_pid: dict[int, ProcessSample] = {}
        for entry in entries:
            if isinstance(entry, Mapping):
                info: Any = entry  # ROCm 6.2 and later
            else:  # a process handle (before ROCm 6.2)
                info = reads.get("process_info", getattr(lib, "amdsmi_get_gpu_process_info", None),
                                 handle, entry)
            if not isinstance(info, Mapping):
                continue
            pid_value = number(info.get("pid"))
            if pid_value is None or pid_value <= 0 or int(pid_value) == self._own_pid:
                # The agent itself shows up once amdsmi opens the device; it holds no work.
                continue
            pid = int(pid_value)
            usage = info.get("memory_usage")
            vram = number(usage.get("vram_mem")) if isinstance(usage, Mapping) else number(info.get("mem"))
            engine = info.get("engine_usage")
            gfx_ns = number(engine.get("gfx")) if isinstance(engine, Mapping) else None
            share = None
            key = (index, pid)
            if gfx_ns is not None:
                previous = self._engine.get(key)
                if previous is not None and now > previous[1] and gfx_ns >= previous[0]:
                    share = min(max((gfx_ns - previous[0]) / ((now - previous[1]) * 1e9), 0.0), 1.0)
                self._engine[key] = (gfx_ns, now)
                seen.add(key)
            by_pid[pid] = ProcessSample(
                pid=pid, used_memory_bytes=None if vram is None else int(vram), sm_utilization=share,
            )
        return list(by_pid.values())

    def _read_static(self, handle: Any) -> dict[str, str]:
        """Identity facts that do not change while the driver is loaded."""
        lib = self._lib
        reads = _Reads(self)
        asic = reads.get("asic_info", getattr(lib, "amdsmi_get_gpu_asic_info", None), handle)
        board = reads.get("board_info", getattr(lib, "amdsmi_get_gpu_board_info", None), handle)
        driver = reads.get("driver_info", getattr(lib, "amdsmi_get_gpu_driver_info", None), handle)
        asic = asic if isinstance(asic, Mapping) else {}
        board = board if isinstance(board, Mapping) else {}
        driver_version = driver.get("driver_version") if isinstance(driver, Mapping) else None
        if driver_version is None and hasattr(lib, "amdsmi_get_gpu_driver_version"):
            driver_version = reads.get("driver_version", lib.amdsmi_get_gpu_driver_version, handle)
        return {
            "uuid": _text(reads.get("uuid", getattr(lib, "amdsmi_get_gpu_device_uuid", None), handle)),
            # The AMD GPU device plugin names devices by PCI bus id (pod-resources ids).
            "pci_bus_id": _text(reads.get("bdf", getattr(lib, "amdsmi_get_gpu_device_bdf", None), handle)),
            "model": _text(asic.get("market_name")) or _text(board.get("product_name")),
            "serial": _text(asic.get("asic_serial")) or _text(board.get("product_serial")),
            "driver_version": _text(driver_version),
        }

    # ---- helpers --------------------------------------------------------------------
    def _exception_types(self) -> tuple[type[BaseException], ...]:
        base = getattr(self._lib, "AmdSmiException", None)
        return (base,) if isinstance(base, type) and issubclass(base, BaseException) else (Exception,)

    def _is_unsupported(self, exc: BaseException) -> bool:
        code = getattr(exc, "err_code", None)
        if code is None:
            return False
        codes = set()
        ret = getattr(self._lib, "AmdSmiRetCode", None)
        for name in _UNSUPPORTED_NAMES:
            value = getattr(ret, name, None)
            if value is not None:
                codes.add(int(value))
        if not codes:
            codes.add(_AMDSMI_STATUS_NOT_SUPPORTED)
        try:
            return abs(int(code)) in codes
        except (TypeError, ValueError):
            return False

    def _shutdown(self) -> None:
        if self._lib is None:
            return
        try:
            self._lib.amdsmi_shut_down()
        except Exception:  # shutting down must not fail the agent
            log.debug("amdsmi_shut_down failed", exc_info=True)

    def _count(self, reason: str) -> None:
        self._errors[reason] = self._errors.get(reason, 0) + 1

    def _log_once(self, key: str, level: int, msg: str, *args: object) -> None:
        if key in self._logged:
            log.debug(msg, *args)
            return
        self._logged.add(key)
        log.log(level, msg, *args)


class _Reads:
    """One device's reads in one pass: unsupported -> None (and not asked again of that
    device, where ``index`` names it), failures remembered."""

    def __init__(self, backend: AmdBackend, index: int | None = None):
        self.backend = backend
        self.index = index
        self.failures: list[BaseException] = []
        self.successes = 0
        self._errors = backend._exception_types()

    def get(self, what: str, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """Call ``fn(*args)``; None when the library lacks it or the card cannot say (then,
        for a device, from this pass on without asking: ``what`` names the read and its
        arguments, e.g. ``temperature_edge``)."""
        if fn is None:
            return None
        unsupported = self.backend._unsupported
        if self.index is not None and (self.index, what) in unsupported:
            return None
        try:
            value = fn(*args)
            check_abandoned()  # the pass gave up on this read while the call hung: stop here
        except self._errors as exc:
            if self.backend._is_unsupported(exc):
                if self.index is not None:
                    unsupported.add((self.index, what))
                self.backend._log_once(f"unsupported:{what}", logging.DEBUG,
                                       "amd: %s is not supported here (%s)", what, _describe(exc))
                return None
            self.failures.append(exc)
            self.backend._count("read_error")
            self.backend._log_once(f"failed:{what}", logging.WARNING,
                                   "amd: reading %s failed: %s", what, _describe(exc))
            return None
        self.successes += 1
        return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    text = str(value).strip()
    return "" if text.upper() == "N/A" else text


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


__all__ = ["VENDOR", "AmdBackend"]
