"""What one health read of one GPU returns: small frozen records, vendor-neutral.

Every field may be ``None``: the GPU, its mode (MIG) or its driver does not support that read.
A ``None`` field yields no series and no verdict, never a 0. The backend fills what its vendor
gives (see :data:`VENDOR_COVERAGE`) and converts units here, not in the policy:

* NVIDIA (nvidia-ml-py): ``nvmlDeviceGetRemappedRows``, ``nvmlDeviceGetRowRemapperHistogram``,
  ``nvmlDeviceGetRetiredPages_v2`` / ``nvmlDeviceGetRetiredPagesPendingStatus``,
  ``nvmlDeviceGetTotalEccErrors`` / ``nvmlDeviceGetSramEccErrorStatus``,
  ``nvmlDeviceGetCurr/MaxPcieLinkGeneration/Width``, ``NVML_FI_DEV_PCIE_REPLAY_COUNTER``,
  ``nvmlDeviceGetNvLinkState`` / ``nvmlDeviceGetNvLinkErrorCounter``,
  the ``NVML_FI_DEV_PERF_POLICY_*`` field values, else ``nvmlDeviceGetViolationStatus``
  (nanoseconds, converted to seconds),
  ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, ``nvmlDeviceGetPersistenceMode``,
  ``nvmlDeviceGetGpuFabricInfoV``, and ``NVML_ERROR_GPU_IS_LOST`` / ``NVML_ERROR_RESET_REQUIRED``
  from any call.
* AMD (amdsmi): ``amdsmi_get_gpu_ecc_count`` per block, ``amdsmi_get_gpu_total_ecc_count``
  (with deferred), ``amdsmi_get_gpu_bad_page_info`` / reserved pages, ``amdsmi_get_pcie_info``
  (width and speed in MT/s vs max, replay count), ``amdsmi_gpu_xgmi_error_status``.
* Gaudi (hl-smi): ECC mode and the volatile and aggregate corrected/uncorrected totals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum


class RecoveryAction(IntEnum):
    """``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` values (nvmlDeviceGpuRecoveryAction_t, pynvml)."""

    NONE = 0
    GPU_RESET = 1
    NODE_REBOOT = 2
    DRAIN_P2P = 3
    DRAIN_AND_RESET = 4
    RECOVER_IMEX_DOMAIN = 5
    BUS_RESET = 6
    SYSTEM_REBOOT = 7


class FabricState(IntEnum):
    """``nvmlGpuFabricInfoV_t.state`` (NVML_GPU_FABRIC_STATE_*)."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


class XgmiStatus(IntEnum):
    """``amdsmi_gpu_xgmi_error_status`` values (amdsmi_xgmi_status_t)."""

    NO_ERRORS = 0
    ERROR = 1
    MULTIPLE_ERRORS = 2


@dataclass(frozen=True)
class RowRemap:
    """Row remapper (Ampere and newer; Gaudi's hl-smi gives pending rows only).

    Attributes:
        correctable: rows remapped for correctable errors (lifetime count).
        uncorrectable: rows remapped for uncorrectable errors (lifetime count).
        pending: a remap waits for a GPU reset to take effect.
        failure: a remap has failed at some time (sticky in the InfoROM).
        banks_no_spare: banks with no spare row left (histogram bucket ``none``).
    """

    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None
    banks_no_spare: int | None = None


@dataclass(frozen=True)
class RetiredPages:
    """Dynamic page retirement (pre-Ampere NVIDIA; AMD bad/reserved pages).

    Attributes:
        single_bit: pages retired for multiple single-bit errors.
        double_bit: pages retired for a double-bit error.
        pending: a retirement waits for a driver reload or reset.
    """

    single_bit: int | None = None
    double_bit: int | None = None
    pending: bool | None = None


@dataclass(frozen=True)
class EccBlock:
    """One AMD RAS block's ECC counts (``amdsmi_get_gpu_ecc_count``): umc, sdma, gfx, ..."""

    block: str
    corrected: int | None = None
    uncorrected: int | None = None
    deferred: int | None = None


@dataclass(frozen=True)
class Ecc:
    """ECC counts by type and counter.

    Volatile counts restart at 0 when the driver loads or the GPU is reset; aggregate counts
    live in the InfoROM for the board's life.
    """

    volatile_corrected: int | None = None
    volatile_uncorrected: int | None = None
    aggregate_corrected: int | None = None
    aggregate_uncorrected: int | None = None
    deferred: int | None = None
    sram_threshold_exceeded: bool | None = None
    enabled: bool | None = None
    blocks: tuple[EccBlock, ...] = ()


@dataclass(frozen=True)
class Pcie:
    """PCIe link now and at most, and the replay counter (link-level retries, lifetime).

    AMD reports speed in MT/s: convert it with :func:`pcie_generation_from_speed`.
    """

    generation: int | None = None
    generation_max: int | None = None
    width: int | None = None
    width_max: int | None = None
    replays: int | None = None


@dataclass(frozen=True)
class NvLink:
    """One NVLink (or XGMI) link: state and its data-link error counters (lifetime)."""

    link: int
    up: bool | None = None
    replay: int | None = None
    recovery: int | None = None
    crc_flit: int | None = None
    crc_data: int | None = None


@dataclass(frozen=True)
class Violations:
    """Seconds the clocks were held down, per policy (NVML: the perf-policy field values or
    ``nvmlDeviceGetViolationStatus``, ns -> s)."""

    power: float | None = None
    thermal: float | None = None
    reliability: float | None = None
    board_limit: float | None = None
    sync_boost: float | None = None
    low_utilization: float | None = None

    def items(self) -> tuple[tuple[str, float | None], ...]:
        """(reason label, seconds) in a fixed order, for ``gpu_violation_seconds_total{reason}``."""
        return (("power", self.power), ("thermal", self.thermal), ("reliability", self.reliability),
                ("board_limit", self.board_limit), ("sync_boost", self.sync_boost),
                ("low_utilization", self.low_utilization))


@dataclass(frozen=True)
class Fabric:
    """NVSwitch fabric (``nvmlDeviceGetGpuFabricInfoV``): registration state and health.

    Attributes:
        state: where the GPU's fabric registration stands.
        status_ok: the registration's own status (``status == NVML_SUCCESS``).
        degraded: the health mask says bandwidth is degraded, a route is unhealthy or the
            configuration is incorrect (None where the mask is not reported).
    """

    state: FabricState | None = None
    status_ok: bool | None = None
    degraded: bool | None = None


@dataclass(frozen=True)
class HealthSignals:
    """Everything one slow-schedule health read returned for one (physical) GPU.

    Attributes:
        boot_id: the node's ``/proc/sys/kernel/random/boot_id``, read by the caller once per
            pass and passed in as data: a change means the node rebooted.
        energy_mj: the driver's total-energy counter (mJ since the driver loaded); it going
            back is evidence that the driver reloaded or the GPU was reset.
        gpu_lost: a call returned ``NVML_ERROR_GPU_IS_LOST`` (or the vendor's equivalent).
        reset_required: a call returned ``NVML_ERROR_RESET_REQUIRED``.
    """

    row_remap: RowRemap | None = None
    retired_pages: RetiredPages | None = None
    ecc: Ecc | None = None
    pcie: Pcie | None = None
    nvlinks: tuple[NvLink, ...] = ()
    violations: Violations | None = None
    recovery_action: int | None = None
    persistence_mode: bool | None = None
    fabric: Fabric | None = None
    xgmi_status: int | None = None
    gpu_lost: bool = False
    reset_required: bool = False
    boot_id: str | None = None
    energy_mj: int | None = None


# PCIe transfer rate per lane (MT/s) for each generation: 2.5, 5, 8, 16, 32, 64 GT/s.
_PCIE_MTS = (2500, 5000, 8000, 16000, 32000, 64000)


def pcie_generation_from_speed(mt_per_s: int | None) -> int | None:
    """The PCIe generation of a link speed in MT/s (amdsmi's ``pcie_speed``), None if unknown."""
    if mt_per_s is None or mt_per_s <= 0:
        return None
    for generation, rate in enumerate(_PCIE_MTS, start=1):
        if mt_per_s <= rate * 1.05:
            return generation
    return None


# What each vendor's backend can fill, for docs/HEALTH.md ("what AMD and Gaudi lack").
VENDOR_COVERAGE: tuple[tuple[str, str, str, str], ...] = (
    ("signal", "NVIDIA (NVML)", "AMD (amdsmi)", "Gaudi (hl-smi)"),
    ("row remapping", "correctable, uncorrectable, pending, failure, banks without spare rows",
     "no (bad/reserved pages instead)", "no (hl-smi's row replacement query is not read)"),
    ("retired pages", "by cause and pending (pre-Ampere)", "bad and reserved pages", "no"),
    ("ECC", "volatile/aggregate, corrected/uncorrected, SRAM threshold",
     "per block and total, with deferred", "mode and totals only"),
    ("PCIe", "generation and width vs max, replays", "width and speed vs max, replays",
     "no (hl-smi has no link fields)"),
    ("GPU interconnect", "NVLink state and replay/recovery/CRC counters per link",
     "XGMI error status (one flag, no per-link counters)", "no"),
    ("violation time", "power, thermal, reliability, board limit, sync boost, low utilisation",
     "no (amdsmi's violation status is throttle counters, not time)", "no"),
    ("recovery action, fabric", "recovery action field (R565+), fabric state and health", "no", "no"),
    ("GPU lost / reset required", "NVML error codes", "amdsmi error codes", "hl-smi failure"),
)


def count_problem(value: object) -> str | None:
    """Why a driver's answer cannot be a count (an error total, a replay count, a number of
    rows), or None when it can: the one rule the policy, the native and the DCGM renderings
    apply, so a value is garbage everywhere or nowhere.

    A count is a whole number, zero or more: not a bool, not text, not NaN or infinite, not
    a fraction, not negative. ``None`` (not read) is no problem and no count.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "not a number"
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        return "not a whole number"
    if value < 0:
        return "a negative count"
    return None


def as_count(value: object) -> int | None:
    """``value`` as a count; None where it was not read or `count_problem` rejects it."""
    if value is None or count_problem(value) is not None:
        return None
    return int(value)  # type: ignore[call-overload]  # a finite whole int or float here


def seconds_problem(value: object) -> str | None:
    """Why a driver's answer cannot be a duration (violation time), or None when it can:
    a finite number of seconds, zero or more (a fraction is fine). ``None`` is no problem."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return "not a duration"
    return None


def as_seconds(value: object) -> float | None:
    """``value`` as seconds; None where it was not read or `seconds_problem` rejects it."""
    if value is None or seconds_problem(value) is not None:
        return None
    return float(value)  # type: ignore[arg-type]  # a finite int or float here
