"""GPU health reads (`exporter.health.HealthSignals`), every ``--health-interval`` per GPU.

What is asked (nvidia-ml-py names) and how it lands in `HealthSignals`:

* ``nvmlDeviceGetRemappedRows`` -> `RowRemap` correctable / uncorrectable / pending /
  failure; ``nvmlDeviceGetRowRemapperHistogram`` -> ``banks_no_spare`` (its ``none``
  bucket: banks with no spare row left; asked only once a row was remapped, 0 before);
* pre-Ampere, only where remapped rows are NOT_SUPPORTED on a GPU not in MIG mode:
  ``nvmlDeviceGetRetiredPages_v2`` per cause -> `RetiredPages` single / double bit (page
  counts), ``nvmlDeviceGetRetiredPagesPendingStatus`` -> pending;
* ECC -> `Ecc`: the volatile totals from the field values ``NVML_FI_DEV_ECC_SBE/DBE_VOL_TOTAL``
  (in the pass's one field-values call), the aggregate ones from the pass's own
  ``nvmlDeviceGetTotalEccErrors`` reads, and ``nvmlDeviceGetSramEccErrorStatus`` (newer bindings);
* ``nvmlDeviceGetCurr/MaxPcieLinkGeneration/Width`` (the maximum read once: it does not
  change) and ``nvmlDeviceGetPcieReplayCounter`` -> `Pcie`;
* per NVLink, from link 0 up to the first that answers NOT_SUPPORTED or INVALID_ARGUMENT
  (found on the first read, then only those links are asked; a GPU without NVLink asks
  nothing again): ``nvmlDeviceGetNvLinkState`` and ``nvmlDeviceGetNvLinkErrorCounter``
  (DL replay, recovery, CRC flit, CRC data) -> `NvLink`;
* the violation time per policy, nanoseconds -> seconds: the field values
  ``NVML_FI_DEV_PERF_POLICY_*`` (in the pass's one field-values call), and
  ``nvmlDeviceGetViolationStatus`` for a policy whose field does not answer;
* ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (in the pass's one field-values call; a binding
  without the constant never asks it), ``nvmlDeviceGetPersistenceMode``,
  ``nvmlDeviceGetGpuFabricInfoV`` (or ``...FabricInfo``) -> `Fabric` on NVSwitch systems;
* the node's boot id (read at open) and the energy counter's last reading (mJ).

Every call goes through `Nvml.call`: NOT_SUPPORTED leaves the field None and is not asked
again. A GPU-lost or reset-required answer takes the GPU down (`common`), and its down
sample then carries ``gpu_lost`` / ``reset_required`` so that it still gets a verdict.
Values are passed on as the driver gives them; `exporter.health.checks` rejects garbage.
"""

from __future__ import annotations

import ctypes
from typing import Any

from exporter.devices.nvml.common import NvmlState
from exporter.devices.nvml.energy import EnergyEstimate
from exporter.devices.nvml.libnvml import NA, Nvml
from exporter.health.signals import (
    Ecc,
    Fabric,
    FabricState,
    HealthSignals,
    NvLink,
    Pcie,
    RetiredPages,
    RowRemap,
    Violations,
)

NVML_ERROR_INVALID_ARGUMENT = 2
NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS in nvml.h (Blackwell)
RECOVERY_ACTION_FIELD = "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"

# (Violations member, NVML_PERF_POLICY_* name and nvml.h value, the field of the same
# counter: NVML_FI_DEV_PERF_POLICY_* name and nvml.h value)
_POLICIES = (("power", "NVML_PERF_POLICY_POWER", 0, "NVML_FI_DEV_PERF_POLICY_POWER", 74),
             ("thermal", "NVML_PERF_POLICY_THERMAL", 1, "NVML_FI_DEV_PERF_POLICY_THERMAL", 75),
             ("sync_boost", "NVML_PERF_POLICY_SYNC_BOOST", 2, "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST", 76),
             ("board_limit", "NVML_PERF_POLICY_BOARD_LIMIT", 3, "NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT", 77),
             ("low_utilization", "NVML_PERF_POLICY_LOW_UTILIZATION", 4,
              "NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION", 78),
             ("reliability", "NVML_PERF_POLICY_RELIABILITY", 5, "NVML_FI_DEV_PERF_POLICY_RELIABILITY", 79))
# (NvLink member, NVML_NVLINK_ERROR_* name, nvml.h value)
_NVLINK_COUNTERS = (("replay", "NVML_NVLINK_ERROR_DL_REPLAY", 0), ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY", 1),
                    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT", 2), ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA", 3))
# Fabric health mask: (shift, width, the value that means trouble) for degraded bandwidth,
# unhealthy route; the incorrect-configuration field is trouble at any value above NONE (1).
_FABRIC_TROUBLE = ((0, 0x3, 1), (4, 0x3, 1))
_FABRIC_CONFIG_SHIFT, _FABRIC_CONFIG_MASK = 8, 0xF


def _count(value: Any) -> int | None:
    """An NVML answer (a Python or ctypes integer) as an int; the policy judges its value."""
    if value is NA or value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # not a number, NaN, infinite
        return None


def _flag(value: Any) -> bool | None:
    number = _count(value)
    return None if number is None else number != 0


class HealthMixin(NvmlState):
    """The NVML backend's health reads (see the module doc); state set in `NvmlBackend.__init__`."""

    _nvlinks: dict[int, int]  # GPU -> how many NVLinks answer (0: none)
    _pcie_max: dict[int, tuple[int | None, int | None]]
    _boot_id: str | None
    _energy: dict[int, EnergyEstimate]

    def _read_health(self, nvml: Nvml, index: int, handle: Any, mig_enabled: bool, fields: dict[int, float],
                     aggregate_ecc: Any) -> HealthSignals:
        """One GPU's health read. ``fields``: the pass's field values, which carry the
        recovery action and the volatile ECC totals (`health_fields`); ``aggregate_ecc``:
        the aggregate ECC totals the pass read on its own schedule."""
        row_remap = self._row_remap(nvml, handle)
        retired = None
        if row_remap is None and not mig_enabled:
            retired = self._retired_pages(nvml, handle)
        estimate = self._energy.get(index)
        return HealthSignals(
            row_remap=row_remap,
            retired_pages=retired,
            ecc=self._health_ecc(nvml, handle, fields, aggregate_ecc),
            pcie=self._pcie(nvml, index, handle),
            nvlinks=self._nvlink_health(nvml, index, handle),
            violations=self._violations(nvml, handle, fields),
            recovery_action=_count(fields.get(recovery_action_field(nvml) or -1)),
            persistence_mode=_flag(self._opt(nvml, "nvmlDeviceGetPersistenceMode", handle)),
            fabric=self._fabric(nvml, index, handle),
            boot_id=self._boot_id,
            energy_mj=int(estimate.reading * 1000) if estimate is not None else None,
        )

    def _row_remap(self, nvml: Nvml, handle: Any) -> RowRemap | None:
        rows = self._opt(nvml, "nvmlDeviceGetRemappedRows", handle)
        if rows is NA or rows is None:
            return None
        try:
            corrected, uncorrected, pending, failure = tuple(rows)[:4]
        except (TypeError, ValueError):
            return None
        banks: int | None = 0
        if _count(corrected) != 0 or _count(uncorrected) != 0:
            # Only a bank that spent its spare rows is in the "none" bucket: without a
            # remapped row there is none, and the histogram is not asked.
            histogram = self._opt(nvml, "nvmlDeviceGetRowRemapperHistogram", handle)
            banks = _count(getattr(histogram, "none", None)) if histogram is not NA else None
        return RowRemap(correctable=_count(corrected), uncorrectable=_count(uncorrected), pending=_flag(pending),
                        failure=_flag(failure), banks_no_spare=banks)

    def _retired_pages(self, nvml: Nvml, handle: Any) -> RetiredPages | None:
        counts = []
        for name, default in (("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
                              ("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)):
            pages = self._opt(nvml, "nvmlDeviceGetRetiredPages_v2", handle, nvml.const(name, default))
            counts.append(None if pages is NA or pages is None else len(pages))
        pending = _flag(self._opt(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", handle))
        if counts == [None, None] and pending is None:
            return None
        return RetiredPages(single_bit=counts[0], double_bit=counts[1], pending=pending)

    def _health_ecc(self, nvml: Nvml, handle: Any, fields: dict[int, float], aggregate: Any) -> Ecc | None:
        aggregate = aggregate if isinstance(aggregate, dict) or hasattr(aggregate, "get") else {}
        sram = self._struct_call(nvml, handle, "nvmlDeviceGetSramEccErrorStatus", "c_nvmlEccSramErrorStatus_v1_t",
                                 "nvmlEccSramErrorStatus_v1")
        ecc = Ecc(volatile_corrected=_count(fields.get(nvml.const("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", 3))),
                  volatile_uncorrected=_count(fields.get(nvml.const("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 4))),
                  aggregate_corrected=_count(aggregate.get("corrected")),
                  aggregate_uncorrected=_count(aggregate.get("uncorrected")),
                  sram_threshold_exceeded=_flag(getattr(sram, "bThresholdExceeded", None)) if sram is not NA else None)
        return None if ecc == Ecc() else ecc

    def _pcie(self, nvml: Nvml, index: int, handle: Any) -> Pcie | None:
        maximum = self._pcie_max.get(index)
        if maximum is None:
            maximum = (_count(self._opt(nvml, "nvmlDeviceGetMaxPcieLinkGeneration", handle)),
                       _count(self._opt(nvml, "nvmlDeviceGetMaxPcieLinkWidth", handle)))
            self._pcie_max[index] = maximum
        link = Pcie(generation=_count(self._opt(nvml, "nvmlDeviceGetCurrPcieLinkGeneration", handle)),
                    generation_max=maximum[0],
                    width=_count(self._opt(nvml, "nvmlDeviceGetCurrPcieLinkWidth", handle)),
                    width_max=maximum[1],
                    replays=_count(self._opt(nvml, "nvmlDeviceGetPcieReplayCounter", handle)))
        return None if link == Pcie() else link

    def _nvlink_state(self, nvml: Nvml, handle: Any, link: int) -> Any:
        """A link's state; None where the link does not exist (NOT_SUPPORTED, INVALID_ARGUMENT)."""
        try:
            state = nvml.call("nvmlDeviceGetNvLinkState", handle, link)
        except nvml.error as exc:
            if nvml.code(exc) == nvml.const("NVML_ERROR_INVALID_ARGUMENT", NVML_ERROR_INVALID_ARGUMENT):
                return None
            return self._guard(nvml, self._raise, exc)
        return None if state is NA else state

    @staticmethod
    def _raise(exc: BaseException) -> Any:
        raise exc

    def _nvlink_health(self, nvml: Nvml, index: int, handle: Any) -> tuple[NvLink, ...]:
        known = self._nvlinks.get(index)
        links: list[NvLink] = []
        for link in range(nvml.const("NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS) if known is None else known):
            state = self._nvlink_state(nvml, handle, link)
            if state is None and known is None:
                break
            counters = {member: _count(self._opt(nvml, "nvmlDeviceGetNvLinkErrorCounter", handle, link,
                                                 nvml.const(name, default)))
                        for member, name, default in _NVLINK_COUNTERS}
            links.append(NvLink(link=link, up=_flag(state), **counters))
        if known is None:
            self._nvlinks[index] = len(links)
        return tuple(links)

    def _violations(self, nvml: Nvml, handle: Any, fields: dict[int, float]) -> Violations | None:
        """Each policy's violation time from the pass's field values (one call for the six,
        `health_fields`); ``nvmlDeviceGetViolationStatus`` only for a policy whose field
        did not answer (a driver without the fields)."""
        seconds: dict[str, float | None] = {}
        for member, name, default, field_name, field_default in _POLICIES:
            ns = _count(fields.get(nvml.const(field_name, field_default)))
            if ns is None:
                status = self._opt(nvml, "nvmlDeviceGetViolationStatus", handle, nvml.const(name, default))
                ns = _count(getattr(status, "violationTime", None)) if status is not NA else None
            seconds[member] = None if ns is None else ns / 1e9
        if all(v is None for v in seconds.values()):
            return None
        return Violations(**seconds)

    def _struct_call(self, nvml: Nvml, handle: Any, name: str, struct_name: str, version_name: str) -> Any:
        """A call that fills a versioned struct the caller passes (pynvml's signature):
        the struct, or `NA` where the binding lacks either or the GPU cannot tell."""
        struct_type = getattr(nvml.module, struct_name, None)
        if struct_type is None or not nvml.has(name) or nvml.unsupported(name, handle):
            return NA
        info = struct_type()
        version = getattr(nvml.module, version_name, None) if version_name else None
        if isinstance(version, int):
            info.version = version
        argument = ctypes.byref(info) if isinstance(info, ctypes.Structure) else info
        try:
            answer = self._opt(nvml, name, handle, argument)
        except TypeError:  # a binding with another signature
            answer = NA
        if answer is NA:
            nvml.remember_unsupported(name, handle)
            return NA
        return info

    def _fabric(self, nvml: Nvml, index: int, handle: Any) -> Fabric | None:
        """Fabric state and health; a GPU whose driver cannot tell (NOT_SUPPORTED: no
        NVSwitch, or an H100 without fabric health) is not asked again."""
        for name, struct_name, version_name in (
                ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t", "nvmlGpuFabricInfo_v2"),
                ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t", "")):
            info = self._struct_call(nvml, handle, name, struct_name, version_name)
            if info is not NA:
                return self._fabric_of(info)
        return None

    @staticmethod
    def _fabric_of(info: Any) -> Fabric | None:
        state = _count(getattr(info, "state", None))
        if state is None or state == FabricState.NOT_SUPPORTED:
            return None
        mask = _count(getattr(info, "healthMask", None))
        degraded = None
        if mask is not None:
            degraded = any((mask >> shift) & width == bad for shift, width, bad in _FABRIC_TROUBLE) or (
                (mask >> _FABRIC_CONFIG_SHIFT) & _FABRIC_CONFIG_MASK) > 1
        status = _count(getattr(info, "status", None))
        return Fabric(state=FabricState(state) if state in tuple(FabricState) else None,
                      status_ok=None if status is None else status == 0, degraded=degraded)


def health_fields(nvml: Nvml) -> tuple[int, ...]:
    """The field values a health read adds to the pass's one field-values call: the
    volatile ECC totals (single-bit = corrected, double-bit = uncorrected), the six
    violation times (nanoseconds; on an H200 one call for the six cost a sixth of six
    ``nvmlDeviceGetViolationStatus`` calls, docs/PERFORMANCE.md) and the recovery action
    where the binding has it."""
    fields = (nvml.const("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", 3), nvml.const("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 4),
              *(nvml.const(field_name, field_default) for *_, field_name, field_default in _POLICIES))
    recovery = recovery_action_field(nvml)
    return fields if recovery is None else (*fields, recovery)


def recovery_action_field(nvml: Nvml) -> int | None:
    """The recovery-action field id, None where the binding lacks the constant (never asked)."""
    value = getattr(nvml.module, RECOVERY_ACTION_FIELD, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = ["NVLINK_MAX_LINKS", "HealthMixin", "health_fields", "recovery_action_field"]
