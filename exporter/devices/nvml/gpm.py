"""NVML GPM (GPU Performance Monitoring): SM, tensor-core and DRAM activity on Hopper and newer.

``nvmlDeviceGetUtilizationRates`` says whether *any* kernel ran; GPM says how much of
the GPU the kernels used: graphics-engine and SM activity, SM occupancy, tensor-core
activity (any, and by kind: HMMA half/bf16, IMMA integer, DFMA double), DRAM bandwidth,
the non-tensor FP16/FP32/FP64 pipes, and PCIe and NVLink traffic. These are the same
counters as DCGM's profiling fields (``DCGM_FI_PROF_*``), read through NVML alone.

How GPM works. ``nvmlGpmSampleGet(handle, sample)`` snapshots the GPU's performance
counters into a buffer from ``nvmlGpmSampleAlloc``; ``nvmlGpmMetricsGet`` computes each
metric as the average between two such samples. (``nvmlGpmMigSampleGet(parent handle,
gpu instance id, sample)`` does the same for one MIG GPU instance.) So a value needs two
samples: the first pass after start-up (or after a lost GPU comes back) has none.

Cadence. A sample is cheap and the metrics cost more (figures in docs/PERFORMANCE.md,
"GPM"). Because the metrics average over whatever window two samples span, nothing is
lost by reading them less often than the collection interval: `GpmReader` takes a sample
only when ``interval`` seconds have passed since the device's previous one
(``--gpm-interval``, default 5 s; 0 = every pass), and between those passes the device
keeps the values of its last complete window: never more than one ``nvmlGpmMetricsGet``
per GPU (or MIG instance) per pass.

What is asked. Only the metrics of families the agent exports (``keys``, from the enabled
families: `exporter.app.wiring.gpm_keys`): what ``nvmlGpmMetricsGet`` costs depends on
which are asked, not on how many. On an H200 graphics activity alone cost 1.4 ms of the
1.7 ms of all fifteen, any other one alone about 0.001 ms, so ``--disable-metric`` of
the graphics-activity families gives most of a GPM read back.

Units. NVML gives activity in percent (0-100) and traffic in MiB per second; here they
become ratios 0-1 and bytes per second. A metric whose entry carries an error
(``nvmlReturn`` != SUCCESS, e.g. NVLink on a card without it) is left out, never 0.

Not supported. Pre-Hopper GPUs (``nvmlGpmQueryDeviceSupport`` answers
``isSupportedDevice = 0``), drivers or bindings without the GPM functions, and
devices whose ``nvmlGpmSampleGet`` answers NOT_SUPPORTED get no GPM values; the reason is
logged once (grouped by reason) and kept for `l9gpu snapshot` (`GpmReader.status`).
Nothing else about the device changes.

Lifetime. Sample buffers are allocated once per device (two per GPU or MIG instance,
used alternately), freed when a MIG instance disappears, when a GPU is lost
(`GpmReader.forget`) and on `GpmReader.close`.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.core.model import GPM_RATE_KEYS, GPM_RATIO_KEYS, frozen_mapping

log = logging.getLogger(__name__)

# DeviceSample.gpm key -> (pynvml constant, its nvml.h value, factor from NVML's unit).
# Percent -> ratio 0-1; MiB/s -> bytes/s.
_PERCENT = 0.01
_MIB_PER_SECOND = float(2**20)
METRICS: tuple[tuple[str, str, int, float], ...] = (
    ("graphics_active", "NVML_GPM_METRIC_GRAPHICS_UTIL", 1, _PERCENT),
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL", 2, _PERCENT),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY", 3, _PERCENT),
    ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5, _PERCENT),
    ("tensor_dfma_active", "NVML_GPM_METRIC_DFMA_TENSOR_UTIL", 6, _PERCENT),
    ("tensor_hmma_active", "NVML_GPM_METRIC_HMMA_TENSOR_UTIL", 7, _PERCENT),
    ("tensor_imma_active", "NVML_GPM_METRIC_IMMA_TENSOR_UTIL", 9, _PERCENT),
    ("dram_active", "NVML_GPM_METRIC_DRAM_BW_UTIL", 10, _PERCENT),
    ("fp64_active", "NVML_GPM_METRIC_FP64_UTIL", 11, _PERCENT),
    ("fp32_active", "NVML_GPM_METRIC_FP32_UTIL", 12, _PERCENT),
    ("fp16_active", "NVML_GPM_METRIC_FP16_UTIL", 13, _PERCENT),
    ("pcie_tx_bytes_per_second", "NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20, _MIB_PER_SECOND),
    ("pcie_rx_bytes_per_second", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21, _MIB_PER_SECOND),
    ("nvlink_rx_bytes_per_second", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", 60, _MIB_PER_SECOND),
    ("nvlink_tx_bytes_per_second", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", 61, _MIB_PER_SECOND),
)
assert {m[0] for m in METRICS} == set(GPM_RATIO_KEYS) | set(GPM_RATE_KEYS)
_RATIO_KEYS = frozenset(GPM_RATIO_KEYS)

_NVML_SUCCESS = 0
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_GPU_IS_LOST = 15
_NVML_ERROR_RESET_REQUIRED = 16
_GPM_METRICS_GET_VERSION = 1

DEFAULT_INTERVAL_SECONDS = 5.0

# `GpmReader.status` values besides "unsupported: <reason>".
ACTIVE = "active"
WARMING_UP = "first sample taken; values after the next"

# The functions GPM needs from the binding.
_FUNCTIONS = ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet",
              "nvmlGpmMetricsGet")

DeviceKey = tuple[int, str]  # (GPU index, MIG GPU instance id or "")


@dataclass
class _Window:
    """GPM state of one GPU or MIG instance: two sample buffers used in turn."""

    buffers: list[Any] = field(default_factory=list)
    previous: int | None = None  # which buffer holds the last sample
    sampled_at: float | None = None
    values: Mapping[str, float] = field(default_factory=frozen_mapping)
    request: Any = None  # the reused c_nvmlGpmMetricsGet_t


class GpmReader:
    """GPM samples and metrics for the GPUs of one `NvmlBackend`.

    Driven through the backend's `_Nvml` facade (``call`` folds NOT_SUPPORTED and
    missing functions into its NA sentinel; other NVML errors are raised). A lost GPU
    (``NVML_ERROR_GPU_IS_LOST``, ``RESET_REQUIRED``) is raised to the backend, which
    reports the device down and calls `forget`.

    Args:
        nvml: the backend's `_Nvml` facade.
        interval: seconds between two GPM samples of a device (0: every pass).
        na: the facade's "not available" sentinel (`nvml.NA`), which ``call`` returns
            for NOT_SUPPORTED and missing functions.
    """

    def __init__(self, nvml: Any, interval: float = DEFAULT_INTERVAL_SECONDS, na: Any = None,
                 keys: Collection[str] | None = None):
        self._nvml = nvml
        self._na = na
        self.interval = max(0.0, float(interval))
        # The metrics asked (`METRICS` rows; ``keys`` None: all of them). What a metrics read
        # costs depends on which are asked: on an H200 graphics activity is 1.4 ms of 1.7.
        self._asked = tuple(m for m in METRICS if keys is None or m[0] in keys)
        self._support: dict[int, str] = {}  # GPU index -> "" (supported) or the reason it is not
        self._unsupported: dict[DeviceKey, str] = {}  # devices whose sampling NVML refused
        self._windows: dict[DeviceKey, _Window] = {}
        self._seen: set[DeviceKey] = set()
        self._read_gpus: set[int] = set()
        self._now = 0.0
        self._logged: set[tuple[int, str]] = set()
        self._new_reasons: dict[str, list[str]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        missing = [name for name in _FUNCTIONS if not nvml.has(name)]
        self._binding_reason = (
            f"the installed nvidia-ml-py has no GPM ({', '.join(missing)} missing); upgrade nvidia-ml-py"
            if missing else ""
        )

    # ---- one pass -------------------------------------------------------------------

    def begin_pass(self, now: float) -> None:
        """Start a collection pass at monotonic time ``now`` (seconds)."""
        self._now = now
        self._seen = set()
        self._read_gpus = set()

    def gpu_read(self, index: int) -> None:
        """GPU ``index`` was read completely this pass: its devices not read are gone."""
        self._read_gpus.add(index)

    def end_pass(self) -> None:
        """Free the buffers of devices that were not read this pass on a GPU that was (a MIG
        instance that went away, a MIG mode change); log new reasons once.

        A GPU whose read did not complete (stuck in a call, see `exporter.core.bulkhead`) keeps
        its buffers: no call is made about it until its stuck call returns.
        """
        read, seen = self._read_gpus, self._seen
        for key in [k for k in list(self._windows) if k not in seen and k[0] in read]:
            self._free(self._windows.pop(key))
        for reason, devices in self._new_reasons.items():
            log.info("no GPM metrics (SM, tensor-core, DRAM activity) on GPU %s: %s", ", ".join(devices), reason)
        self._new_reasons.clear()

    def read(self, handle: Any, index: int, gpu_instance: int | None = None) -> Mapping[str, float]:
        """GPM values of a GPU (or, with ``gpu_instance``, of one MIG GPU instance).

        Args:
            handle: the GPU's NVML handle (the parent GPU's for a MIG instance).
            index: the GPU index.
            gpu_instance: the MIG GPU instance id, None for the whole GPU.

        Returns:
            `DeviceSample.gpm`: ratios 0-1 and bytes per second between the device's
            last two samples; empty where GPM is unsupported or only one sample exists.

        Raises:
            NVMLError: a lost GPU (GPU_IS_LOST, RESET_REQUIRED), for the backend.
        """
        key: DeviceKey = (index, "" if gpu_instance is None else str(gpu_instance))
        self._seen.add(key)
        if key in self._unsupported or not self._supported(handle, index):
            return frozen_mapping()
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window()
        if window.sampled_at is not None and self._now - window.sampled_at < self.interval:
            return window.values  # the last complete window until the next sample is due
        try:
            if not self._take(window, handle, gpu_instance):
                self._refuse(key, ("nvmlGpmMigSampleGet" if gpu_instance is not None else "nvmlGpmSampleGet")
                             + " is not supported on this device")
                return frozen_mapping()
        except self._nvml.error as exc:
            if self._lost(exc):
                raise
            self.errors["gpm_error"] += 1
            log.debug("GPM sample of GPU %s failed: %s", key, exc)
            return window.values
        return window.values

    def status(self) -> dict[DeviceKey, str]:
        """Per device read so far: `ACTIVE`, `WARMING_UP` or ``"unsupported: <reason>"``."""
        out: dict[DeviceKey, str] = {}
        for index, reason in self._support.items():
            if reason:
                out[(index, "")] = f"unsupported: {reason}"
        for key, reason in self._unsupported.items():
            out[key] = f"unsupported: {reason}"
        for key, window in self._windows.items():
            out.setdefault(key, ACTIVE if window.values else WARMING_UP)
        return out

    def forget(self, index: int) -> None:
        """A GPU went down: drop its windows (and MIG instances') and ask for support again."""
        # list() copies in one step: after a stuck read, other GPUs may be read concurrently.
        for key in [k for k in list(self._windows) if k[0] == index]:
            self._free(self._windows.pop(key))
        for key in [k for k in list(self._unsupported) if k[0] == index]:
            del self._unsupported[key]
        self._support.pop(index, None)

    def close(self) -> None:
        """Free every sample buffer."""
        for window in self._windows.values():
            self._free(window)
        self._windows.clear()

    # ---- internals ------------------------------------------------------------------

    def _supported(self, handle: Any, index: int) -> bool:
        reason = self._support.get(index)
        if reason is None:
            reason = self._binding_reason or self._query_support(handle)
            self._support[index] = reason
            if reason:
                self._note(index, "", reason)
        return not reason

    def _query_support(self, handle: Any) -> str:
        nvml = self._nvml
        try:
            support = nvml.call("nvmlGpmQueryDeviceSupport", handle)
        except nvml.error as exc:
            if self._lost(exc):
                raise
            return f"nvmlGpmQueryDeviceSupport failed: {exc}"
        if support is self._na:
            return "the driver does not offer GPM (nvmlGpmQueryDeviceSupport not supported)"
        if not int(getattr(support, "isSupportedDevice", 0) or 0):
            return "the GPU does not support GPM (Hopper or newer needed)"
        return ""

    def _refuse(self, key: DeviceKey, reason: str) -> None:
        self._unsupported[key] = reason
        window = self._windows.pop(key, None)
        if window is not None:
            self._free(window)
        self._note(key[0], key[1], reason)

    def _note(self, index: int, gpu_instance: str, reason: str) -> None:
        if (index, reason) in self._logged:
            return
        self._logged.add((index, reason))
        self._new_reasons[reason].append(f"{index}" + (f" (MIG instance {gpu_instance})" if gpu_instance else ""))

    def _take(self, window: _Window, handle: Any, gpu_instance: int | None) -> bool:
        """Sample into the free buffer and compute the window; False if NVML refuses."""
        nvml = self._nvml
        while len(window.buffers) < 2:
            buffer = nvml.call("nvmlGpmSampleAlloc")
            if buffer is self._na:
                return False
            window.buffers.append(buffer)
        current = 0 if window.previous != 0 else 1
        if gpu_instance is None:
            got = nvml.call("nvmlGpmSampleGet", handle, window.buffers[current])
        else:
            got = nvml.call("nvmlGpmMigSampleGet", handle, gpu_instance, window.buffers[current])
        if got is self._na:
            return False
        previous, window.previous, window.sampled_at = window.previous, current, self._now
        if previous is not None:
            window.values = self._metrics(window, window.buffers[previous], window.buffers[current])
        return True

    def _metrics(self, window: _Window, first: Any, second: Any) -> Mapping[str, float]:
        nvml = self._nvml
        request = window.request
        if request is None:
            request = window.request = nvml.module.c_nvmlGpmMetricsGet_t()
            request.version = nvml.const("NVML_GPM_METRICS_GET_VERSION", _GPM_METRICS_GET_VERSION)
            request.numMetrics = len(self._asked)
            for i, (_, constant, default, _) in enumerate(self._asked):
                request.metrics[i].metricId = nvml.const(constant, default)
        request.sample1 = first
        request.sample2 = second
        for i in range(len(self._asked)):
            request.metrics[i].nvmlReturn = _NVML_SUCCESS
            request.metrics[i].value = 0.0
        result = nvml.call("nvmlGpmMetricsGet", request)
        if result is self._na:
            return frozen_mapping()
        values: dict[str, float] = {}
        for i, (key, _, _, factor) in enumerate(self._asked):
            entry = result.metrics[i]
            if int(getattr(entry, "nvmlReturn", _NVML_SUCCESS) or 0) != _NVML_SUCCESS:
                continue
            value = float(entry.value)
            if not math.isfinite(value) or value < 0:
                continue
            value *= factor
            values[key] = min(value, 1.0) if key in _RATIO_KEYS else value
        return frozen_mapping(values)

    def _lost(self, exc: BaseException) -> bool:
        code = self._nvml.code(exc)
        return code in (
            self._nvml.const("NVML_ERROR_GPU_IS_LOST", _NVML_ERROR_GPU_IS_LOST),
            self._nvml.const("NVML_ERROR_RESET_REQUIRED", _NVML_ERROR_RESET_REQUIRED),
        )

    def _free(self, window: _Window) -> None:
        for buffer in window.buffers:
            try:
                self._nvml.call("nvmlGpmSampleFree", buffer)
            except Exception:  # noqa: BLE001 - freeing must not stop the pass or the shutdown
                log.debug("nvmlGpmSampleFree failed", exc_info=True)
        window.buffers.clear()
        window.previous = None


__all__ = ["ACTIVE", "DEFAULT_INTERVAL_SECONDS", "METRICS", "WARMING_UP", "GpmReader"]
