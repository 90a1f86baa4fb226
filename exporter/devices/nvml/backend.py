"""The NVML backend: its lifecycle and its pass (`NvmlBackend`).

A pass is parts the collector runs through its bulkhead (`NvmlBackend.reads`): the XID
event drain (`events`), one part per GPU (MIG instances are part of their GPU's, `mig`),
and last the GPM cleanup (`gpm`). A GPU's part reads its core values every pass, the
costly or slowly changing ones on the schedule in `common`, its energy counter as in
`energy`, and its processes as in `processes`. PCIe traffic comes from the cumulative byte
counters (field values ``PCIE_COUNT_TX_BYTES``/``RX_BYTES``, read in the same
``nvmlDeviceGetFieldValues`` call as the memory temperature); ``nvmlDeviceGetPcieThroughput``,
which blocks while the driver samples, is never called. What each call costs on an H200,
and so why the schedule is as it is: docs/PERFORMANCE.md.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from exporter.core.bulkhead import Read
from exporter.core.model import DeviceSample, ProcessSample, frozen_mapping
from exporter.core.parsing import argtype, parse_duration_or_seconds
from exporter.core.shares import READ_ALL, PassPlan
from exporter.devices.base import SAMPLING_FLAGS, Backend, BackendUnavailable
from exporter.devices.capabilities import CallTiming, GpmStatus, ProcessShareReads, Timings
from exporter.devices.nvml.common import ECC_PERIOD, ENERGY_COUNTER_PERIOD, PCIE_PERIOD, SLOW_PERIOD
from exporter.devices.nvml.energy import EnergyEstimate, EnergyMixin
from exporter.devices.nvml.events import XidMixin
from exporter.devices.nvml.gpm import DEFAULT_INTERVAL_SECONDS, GpmReader
from exporter.devices.nvml.health import HealthMixin, health_fields
from exporter.devices.nvml.libnvml import (
    CALL_PREFIXES,
    NA,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_SUCCESS,
    THROTTLE_FUNCTIONS,
    VALUE_MEMBERS,
    DeviceDown,
    Nvml,
    handle_key,
    int_or_none,
    ratio,
    scaled,
    text,
    throttle_reasons_mapping,
)
from exporter.devices.nvml.mig import MigMixin
from exporter.devices.schedule import BOOT_ID_PATH, DEFAULT_HEALTH_INTERVAL, HealthReads, Schedule
from exporter.health.signals import HealthSignals

log = logging.getLogger(__name__)


def parse_gpm_interval(text: str) -> float | None:
    """``--gpm-interval``: a duration (0 = every pass), or ``off`` (None)."""
    if str(text).strip().lower() == "off":
        return None
    return parse_duration_or_seconds(text)


class NvmlBackend(
    MigMixin, XidMixin, EnergyMixin, HealthMixin, HealthReads, Backend, Timings, GpmStatus, ProcessShareReads
):
    """NVIDIA GPUs (and MIG instances) through NVML.

    Args:
        nvml: a module with the ``pynvml`` API. Default: ``import pynvml`` (the
            ``nvidia-ml-py`` package) in `open`. Tests pass a fake.
        energy_counter_period: seconds between reads of the energy counter (power is
            integrated in between); 0 reads it every pass.
        gpm: read GPM metrics (SM, tensor-core, DRAM activity) where the GPU has them.
        gpm_interval: seconds between two GPM samples of a device (see `gpm`).
        health_interval: seconds between two health reads of a GPU (`health`); None: never.
        boot_id_path: where the node's boot id is read (once, at `open`).
        gpm_keys: the GPM metrics to ask (`DeviceSample.gpm` keys; None: all; empty: GPM
            is not read), from the families the agent exports (`exporter.app.wiring.gpm_keys`).
    """

    name = "nvml"
    call_prefixes = CALL_PREFIXES

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
        """``--gpm-interval`` (off turns GPM off)."""
        if args.gpm_interval is None:
            return {"gpm": False}
        return {"gpm": True, "gpm_interval": args.gpm_interval}

    def __init__(self, nvml: Any = None, energy_counter_period: float = ENERGY_COUNTER_PERIOD,
                 gpm: bool = True, gpm_interval: float = DEFAULT_INTERVAL_SECONDS,
                 health_interval: float | None = DEFAULT_HEALTH_INTERVAL, boot_id_path: str = BOOT_ID_PATH,
                 gpm_keys: Collection[str] | None = None):
        super().__init__(health_interval, boot_id_path)
        self._module = nvml
        self._energy_period = energy_counter_period
        self._gpm_enabled = gpm and (gpm_keys is None or bool(gpm_keys))
        self._gpm_interval = gpm_interval
        self._gpm_keys = gpm_keys
        self._gpm: GpmReader | None = None
        self._nvml: Nvml | None = None
        self._count = 0
        self._handles: dict[int, Any] = {}
        self._static: dict[int, dict[str, Any]] = {}
        self._driver_version = ""
        self._event_set: Any = None
        self._xid_devices: dict[Any, int] = {}
        self._xid_counts: dict[int, Counter[str]] = defaultdict(Counter)
        self._last_seen: dict[int, int] = {}
        # per GPU (or MIG instance), its processes as the last pass listed them
        self._last_processes: dict[tuple[int, Any], Any] = {}
        self._errors: Counter[str] = Counter()
        self._initialized = False
        self._schedule = Schedule()  # when each GPU's slow values are re-read
        self._slow_values: dict[tuple[Any, ...], Any] = {}
        self._energy: dict[int, EnergyEstimate] = {}
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
        self._nvlinks: dict[int, int] = {}
        self._pcie_max: dict[int, tuple[int | None, int | None]] = {}

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
        nvml = Nvml(module)
        self._nvml = nvml
        try:
            nvml.module.nvmlInit()
        except nvml.error as exc:
            raise BackendUnavailable(self._init_message(nvml, exc)) from exc
        except OSError as exc:
            raise BackendUnavailable(f"cannot load the NVIDIA management library: {exc}") from exc
        self._initialized = True
        self.open_health()
        if self._gpm_enabled:
            self._gpm = GpmReader(nvml, self._gpm_interval, NA, keys=self._gpm_keys)
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
            self._driver_version = text(nvml.call("nvmlSystemGetDriverVersion"))
        except nvml.error:
            log.debug("NVML driver version unavailable", exc_info=True)
        for index in range(self._count):
            self._get_handle(index)
        self._register_xid_events()
        self._parts = None
        log.info("NVML: %d GPU(s), driver %s", self._count, self._driver_version or "unknown")

    @staticmethod
    def _init_message(nvml: Nvml, exc: BaseException) -> str:
        code = nvml.code(exc)
        if code == nvml.const("NVML_ERROR_LIBRARY_NOT_FOUND", NVML_ERROR_LIBRARY_NOT_FOUND):
            return (
                "the NVIDIA management library (libnvidia-ml.so.1) was not found: install the "
                "NVIDIA driver, or run the container with the NVIDIA container runtime so the "
                "driver libraries are mounted"
            )
        if code == nvml.const("NVML_ERROR_DRIVER_NOT_LOADED", NVML_ERROR_DRIVER_NOT_LOADED):
            return "the NVIDIA kernel driver is not loaded (is there an NVIDIA GPU, and is the driver installed?)"
        if code == nvml.const("NVML_ERROR_NO_PERMISSION", NVML_ERROR_NO_PERMISSION):
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

    def timings(self, reset: bool = False) -> dict[str, CallTiming]:
        """Per NVML function: calls, wall and CPU seconds, the slowest call's wall seconds.

        Empty unless `enable_timings` was called; ``reset`` starts counting afresh.
        """
        nvml = self._nvml
        if nvml is None or nvml.timings is None:
            return {}
        out = {name: CallTiming(int(e[0]), e[1], e[2], e[3]) for name, e in nvml.timings.items()}
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
        """This pass as parts the collector can give up on one by one (`exporter.core.bulkhead`).

        The XID event drain (key ``"events"``), one part per GPU (key: its index; MIG
        instances are part of their GPU's), and last the GPM cleanup (``"gpm"``). A
        GPU stuck in a call is not asked anything else (its XID events, GPM buffers and
        counters stay as they are) until the call returns; then it is read afresh, as
        after a lost GPU: a new energy reading, new GPM windows.

        Args:
            now: monotonic seconds of this pass (see `sample`).
            plan: the GPUs whose per-process samples their part reads (the others' are
                left to `process_share_reads`, `exporter.core.shares`).
        """
        self._require()
        self._pass_now, self._plan = now, plan
        if self._gpm is not None:
            self._gpm.begin_pass(now)
        parts = self._parts
        if parts is None:  # the same parts every pass (they read the pass's time from here)
            parts = []
            if self._event_set is not None:
                parts.append(Read("events", "NVML XID events", self._read_xid_events, calls=CALL_PREFIXES))
            for index in range(self._count):
                parts.append(Read(index, f"GPU {index}", functools.partial(self._read_gpu_part, index),
                                  calls=CALL_PREFIXES, down=functools.partial(self._down_samples, index)))
            if self._gpm is not None:
                parts.append(Read("gpm", "NVML GPM buffers", self._end_gpm_pass, calls=CALL_PREFIXES, last=True))
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

    def _read_gpu(self, nvml: Nvml, index: int, now: float) -> list[DeviceSample]:
        """One GPU's part of a pass; a GPU that cannot be read comes back down."""
        if index in self._unfinished:
            # Its last read never finished (given up on while stuck in a call, which has
            # returned since): start afresh, as after a lost GPU.
            self._forget_gpu(index)
        self._unfinished.add(index)
        try:
            samples = self._sample_gpu(nvml, index, now)
        except DeviceDown as down:
            samples = self._went_down(index, down)
        self._unfinished.discard(index)
        if self._gpm is not None:
            self._gpm.gpu_read(index)
        return samples

    def _went_down(self, index: int, down: DeviceDown) -> list[DeviceSample]:
        """A GPU that could not be read: counted, forgotten, reported down."""
        self._errors[down.reason] += 1
        self._forget_gpu(index)
        self._handles.pop(index, None)  # get a fresh handle next pass
        log.debug("GPU %d not readable: %s", index, down)
        sample = self._down_sample(index, str(down))
        if down.reason in ("gpu_lost", "reset_required"):
            sample = replace(sample, health_signals=HealthSignals(gpu_lost=down.reason == "gpu_lost",
                                                          reset_required=down.reason == "reset_required",
                                                          boot_id=self._boot_id))
        return [sample]

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
        if self._event_set is not None and handle_key(handle) not in self._xid_devices:
            self._register_xid(nvml, index, handle)
        return handle

    def _static_info(self, nvml: Nvml, index: int, handle: Any) -> dict[str, Any]:
        """Facts that do not change while the driver is loaded; read once per GPU."""
        static = self._static.get(index)
        if static is not None and static.get("uuid"):
            return static
        uuid = text(nvml.call("nvmlDeviceGetUUID", handle))
        model = text(nvml.call("nvmlDeviceGetName", handle))
        serial = text(self._opt(nvml, "nvmlDeviceGetSerial", handle))
        pci = self._opt(nvml, "nvmlDeviceGetPciInfo", handle)
        bus_id = text(getattr(pci, "busId", None)) if pci is not NA else ""
        static = {"uuid": uuid, "model": model, "serial": serial, "pci_bus_id": bus_id}
        self._static[index] = static
        return static

    def _sample_gpu(self, nvml: Nvml, index: int, now: float) -> list[DeviceSample]:
        handle = self._get_handle(index)
        if handle is None:
            raise DeviceDown("device_error", "no NVML handle for this GPU")
        try:
            static = self._static_info(nvml, index, handle)
            memory = self._memory_info(nvml, handle)
            utilization = nvml.call("nvmlDeviceGetUtilizationRates", handle)
        except nvml.error as exc:
            raise self._down(nvml, exc) from exc

        mig_enabled = self._slow(index, "mig_mode", now, SLOW_PERIOD, self._read_mig_mode, nvml, index, handle)

        throttle = self._guard(nvml, nvml.first, THROTTLE_FUNCTIONS, handle)
        power_watts = scaled(self._opt(nvml, "nvmlDeviceGetPowerUsage", handle), 1e-3)
        health_due = self.health_due(index, self._count, now)
        fields = self._field_values(nvml, index, handle, now, health_fields(nvml) if health_due else ())

        values: dict[str, Any] = {
            "utilization": ratio(getattr(utilization, "gpu", None)) if utilization is not NA else None,
            "memory_utilization": ratio(getattr(utilization, "memory", None)) if utilization is not NA else None,
            "memory_used_bytes": int_or_none(getattr(memory, "used", None)) if memory is not NA else None,
            "memory_total_bytes": int_or_none(getattr(memory, "total", None)) if memory is not NA else None,
            "temperature_celsius": scaled(self._temperature(nvml, handle), 1.0),
            "memory_temperature_celsius": fields.get(nvml.const("NVML_FI_DEV_MEMORY_TEMP")),
            "power_watts": power_watts,
            "power_limit_watts": self._slow(index, "power_limit", now, SLOW_PERIOD, self._power_limit, nvml, handle),
            "energy_joules": self._energy_joules(nvml, index, handle, now, power_watts),
            "sm_clock_hertz": scaled(
                self._opt(nvml, "nvmlDeviceGetClockInfo", handle, nvml.const("NVML_CLOCK_SM")), 1e6
            ),
            "memory_clock_hertz": scaled(
                self._opt(nvml, "nvmlDeviceGetClockInfo", handle, nvml.const("NVML_CLOCK_MEM")), 1e6
            ),
            "pcie_tx_bytes_total": int_or_none(fields.get(nvml.const("NVML_FI_DEV_PCIE_COUNT_TX_BYTES"))),
            "pcie_rx_bytes_total": int_or_none(fields.get(nvml.const("NVML_FI_DEV_PCIE_COUNT_RX_BYTES"))),
            "fan_speed_ratio": ratio(self._opt(nvml, "nvmlDeviceGetFanSpeed", handle)),
            "ecc_errors": self._slow(index, "ecc", now, ECC_PERIOD, self._ecc_mapping, nvml, handle),
            "throttle_reasons": throttle_reasons_mapping(int(throttle)) if throttle is not NA else frozen_mapping(),
            "xid_errors": frozen_mapping(self._xid_counts.get(index)),
            # GPM of the whole GPU; in MIG mode each instance has its own (below).
            "gpm": self._read_gpm(nvml, handle, index) if not mig_enabled else frozen_mapping(),
        }
        processes: tuple[ProcessSample, ...] = ()
        if not mig_enabled:
            processes = self._processes(nvml, index, handle, per_process_util=True, now=now,
                                        utilization=values["utilization"])
        parent = DeviceSample(
            index=index,
            uuid=static["uuid"],
            model=static["model"],
            vendor="nvidia",
            driver_version=self._driver_version,
            pci_bus_id=static["pci_bus_id"],
            serial=static["serial"],
            processes=processes,
            health_signals=self._read_health(nvml, index, handle, bool(mig_enabled), fields, values["ecc_errors"])
            if health_due else None,
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

    def _field_values(self, nvml: Nvml, index: int, handle: Any, now: float,
                      extra: tuple[int, ...] = ()) -> dict[int, float]:
        """Memory temperature every pass and the PCIe byte counters every `PCIE_PERIOD`,
        in one field-values call (the counters cost far more than the temperature,
        docs/PERFORMANCE.md); between counter reads the last counter values are served.
        ``extra``: more fields asked in the same call (a health read's, `health.health_fields`).

        A field the device answers NOT_SUPPORTED for is not asked again.
        """
        skip = self._fields_unsupported[index]
        pcie = (nvml.const("NVML_FI_DEV_PCIE_COUNT_TX_BYTES"), nvml.const("NVML_FI_DEV_PCIE_COUNT_RX_BYTES"))
        candidates: tuple[int, ...] = (nvml.const("NVML_FI_DEV_MEMORY_TEMP"),)
        last_pcie: dict[int, float] = self._slow_values.get((index, "pcie"), {})
        if self._due(index, "pcie", now, PCIE_PERIOD):
            candidates += pcie
            last_pcie = {}
        candidates += extra
        wanted = [field for field in candidates if field not in skip]
        if not wanted:
            return dict(last_pcie)
        values = self._opt(nvml, "nvmlDeviceGetFieldValues", handle, wanted)
        if values is NA or not values:
            return dict(last_pcie)
        out: dict[int, float] = dict(last_pcie)
        for field, value in zip(wanted, values):
            ret = getattr(value, "nvmlReturn", NVML_SUCCESS)
            if ret != NVML_SUCCESS:
                if ret in nvml.na_codes:
                    skip.add(field)
                continue
            member = VALUE_MEMBERS.get(getattr(value, "valueType", 1), "uiVal")
            number = getattr(getattr(value, "value", None), member, None)
            if number is not None:
                out[field] = number
        if pcie[0] in wanted or pcie[1] in wanted:
            self._slow_values[(index, "pcie")] = {f: v for f, v in out.items() if f in pcie}
        return out

    def _memory_info(self, nvml: Nvml, handle: Any) -> Any:
        """Memory info, version 2 where the driver has it (``used`` without reserved)."""
        version = getattr(nvml.module, "nvmlMemory_v2", None)
        if version is not None:
            try:
                memory = nvml.call("nvmlDeviceGetMemoryInfo", handle, version=version)
            except TypeError:  # a binding without the version argument
                memory = NA
            except nvml.error as exc:
                # ARGUMENT_VERSION_MISMATCH and friends: the driver predates version 2.
                if nvml.code(exc) == nvml.const("NVML_ERROR_GPU_IS_LOST", NVML_ERROR_GPU_IS_LOST):
                    raise
                memory = NA
            if memory is not NA:
                return memory
        return nvml.call("nvmlDeviceGetMemoryInfo", handle)

    def _temperature(self, nvml: Nvml, handle: Any) -> Any:
        sensor = nvml.const("NVML_TEMPERATURE_GPU")
        value = self._opt(nvml, "nvmlDeviceGetTemperatureV", handle, sensor)
        if value is NA:
            value = self._opt(nvml, "nvmlDeviceGetTemperature", handle, sensor)
        return value

    def _power_limit(self, nvml: Nvml, handle: Any) -> float | None:
        return scaled(self._opt(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle), 1e-3)

    def _ecc_mapping(self, nvml: Nvml, handle: Any) -> Mapping[str, int]:
        return frozen_mapping(self._ecc(nvml, handle))

    def _ecc(self, nvml: Nvml, handle: Any) -> dict[str, int]:
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
