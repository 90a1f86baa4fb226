"""AMD GPU health reads (`exporter.health.HealthSignals`), every ``--health-interval`` per GPU.

What is asked (amdsmi Python names) and how it lands in `HealthSignals`:

* ``amdsmi_get_gpu_ecc_count(handle, block)`` for each ``AmdSmiGpuBlock`` (not INVALID,
  RESERVED or LAST) -> `EccBlock` per block (``correctable_count``, ``uncorrectable_count``,
  ``deferred_count``); a block that answers NOT_SUPPORTED is not asked again;
* ``amdsmi_get_gpu_total_ecc_count`` -> `Ecc` aggregate corrected / uncorrected and
  deferred (the RAS counts live in the EEPROM across driver loads);
* ``amdsmi_get_gpu_bad_page_info`` (a list of records; ``"No bad pages found."`` in older
  libraries) -> `RetiredPages`: ``double_bit`` the retired pages (AMD retires a page on an
  uncorrectable error), ``pending`` a record whose ``status`` is PENDING;
  ``amdsmi_get_gpu_memory_reserved_pages`` is asked only where the bad-page call is not;
* ``amdsmi_get_pcie_info`` -> `Pcie`: width and speed (MT/s, converted with
  `pcie_generation_from_speed`) now (``pcie_metric``) and at most (``pcie_static``), and
  ``pcie_replay_count``;
* ``amdsmi_gpu_xgmi_error_status`` -> ``xgmi_status`` (`XgmiStatus`).

Not read: ``amdsmi_get_violation_status`` (ROCm 6.3+, MI300 and later) gives throttle
accumulators and percentages (``acc_ppt_pwr``, ``per_socket_thrm``, ...) but no time unit for
them, so it cannot fill `Violations` (seconds); AMD GPUs report no recovery action, no
persistence mode and no fabric state.

A call the library lacks, or that answers NOT_SUPPORTED (or NOT_IMPLEMENTED, NO_DATA),
leaves its field None and is not asked again for that GPU; another error leaves the field
None for this read and is logged once. "N/A" strings and the all-ones sentinels become None;
any other value is passed on as the library gives it (`exporter.health.checks` rejects garbage).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from exporter.core.bulkhead import check_abandoned
from exporter.health.signals import Ecc, EccBlock, HealthSignals, Pcie, RetiredPages, pcie_generation_from_speed

log = logging.getLogger(__name__)

_SKIPPED_BLOCKS = frozenset({"INVALID", "RESERVED", "LAST"})
_PAGE_PENDING = "PENDING"  # AmdSmiMemoryPageStatus.PENDING
_PAGE_PENDING_VALUE = 1
_ABSENT = object()


def _count(value: Any, convert: Callable[[Any], float | None]) -> int | None:
    number = convert(value)
    if number is None:
        return None
    try:
        return int(number)
    except (OverflowError, ValueError):  # inf
        return None


class AmdHealth:
    """The health reads of one `AmdBackend` (see the module doc).

    Args:
        lib: the amdsmi module (or its stand-in).
        errors: the exception types amdsmi raises.
        is_unsupported: whether an exception means "this GPU cannot tell".
        number: amdsmi's value -> float, None for "N/A" and sentinels.
        log_once: the backend's log-once.
    """

    def __init__(self, lib: Any, errors: tuple[type[BaseException], ...],
                 is_unsupported: Callable[[BaseException], bool], number: Callable[[Any], float | None],
                 log_once: Callable[..., None]):
        self._lib = lib
        self._errors = errors
        self._is_unsupported = is_unsupported
        self._number = number
        self._log_once = log_once
        self._unsupported: set[tuple[int, str]] = set()
        self.asked: dict[str, int] = {}  # call -> times asked (for tests and benchmarks)

    def read(self, index: int, handle: Any, boot_id: str | None, energy_joules: float | None) -> HealthSignals:
        """One GPU's health read."""
        return HealthSignals(
            ecc=self._ecc(index, handle),
            retired_pages=self._pages(index, handle),
            pcie=self._pcie(index, handle),
            xgmi_status=self._int(self._ask(index, "amdsmi_gpu_xgmi_error_status", handle)),
            boot_id=boot_id,
            energy_mj=None if energy_joules is None else int(energy_joules * 1000),
        )

    # ---- calls ----------------------------------------------------------------------
    def _ask(self, index: int, name: str, *args: Any, key: str = "") -> Any:
        """``lib.<name>(*args)``; `_ABSENT` where it is missing, unsupported (remembered) or failed."""
        what = key or name
        if (index, what) in self._unsupported:
            return _ABSENT
        fn = getattr(self._lib, name, None)
        if fn is None:
            self._unsupported.add((index, what))
            return _ABSENT
        self.asked[what] = self.asked.get(what, 0) + 1
        try:
            value = fn(*args)
            check_abandoned()
        except self._errors as exc:
            if self._is_unsupported(exc):
                self._unsupported.add((index, what))
                self._log_once(f"unsupported:{what}", logging.DEBUG, "amd: %s is not supported here (%s)", what, exc)
            else:
                self._log_once(f"failed:{what}", logging.WARNING, "amd: health read %s failed: %s", what, exc)
            return _ABSENT
        return value

    def _int(self, value: Any) -> int | None:
        return None if value is _ABSENT else _count(value, self._number)

    # ---- fields ---------------------------------------------------------------------
    def _ecc(self, index: int, handle: Any) -> Ecc | None:
        blocks = []
        for block in self._blocks():
            counts = self._ask(index, "amdsmi_get_gpu_ecc_count", handle, block, key=f"ecc_count:{block.name}")
            if isinstance(counts, Mapping):
                blocks.append(EccBlock(block=block.name.lower(),
                                       corrected=_count(counts.get("correctable_count"), self._number),
                                       uncorrected=_count(counts.get("uncorrectable_count"), self._number),
                                       deferred=_count(counts.get("deferred_count"), self._number)))
        total = self._ask(index, "amdsmi_get_gpu_total_ecc_count", handle)
        total = total if isinstance(total, Mapping) else {}
        ecc = Ecc(aggregate_corrected=_count(total.get("correctable_count"), self._number),
                  aggregate_uncorrected=_count(total.get("uncorrectable_count"), self._number),
                  deferred=_count(total.get("deferred_count"), self._number), blocks=tuple(blocks))
        return None if ecc == Ecc() else ecc

    def _blocks(self) -> list[Any]:
        enum = getattr(self._lib, "AmdSmiGpuBlock", None)
        if enum is None:
            return []
        return [block for block in enum if block.name not in _SKIPPED_BLOCKS]

    def _pages(self, index: int, handle: Any) -> RetiredPages | None:
        records = self._ask(index, "amdsmi_get_gpu_bad_page_info", handle)
        if records is _ABSENT:
            records = self._ask(index, "amdsmi_get_gpu_memory_reserved_pages", handle)
        if isinstance(records, str):  # "No bad pages found." (older libraries)
            records = [] if "no bad pages" in records.lower() else _ABSENT
        if not isinstance(records, (list, tuple)):
            return None
        pending = False
        for record in records:
            status = record.get("status") if isinstance(record, Mapping) else None
            name = getattr(status, "name", status)
            if name == _PAGE_PENDING or (isinstance(status, int) and status == _PAGE_PENDING_VALUE):
                pending = True
        return RetiredPages(double_bit=len(records), pending=pending)

    def _pcie(self, index: int, handle: Any) -> Pcie | None:
        info = self._ask(index, "amdsmi_get_pcie_info", handle)
        if not isinstance(info, Mapping):
            return None
        static, metric = info.get("pcie_static"), info.get("pcie_metric")
        static = static if isinstance(static, Mapping) else {}
        metric = metric if isinstance(metric, Mapping) else {}
        link = Pcie(generation=pcie_generation_from_speed(_count(metric.get("pcie_speed"), self._number)),
                    generation_max=pcie_generation_from_speed(_count(static.get("max_pcie_speed"), self._number)),
                    width=_count(metric.get("pcie_width"), self._number),
                    width_max=_count(static.get("max_pcie_width"), self._number),
                    replays=_count(metric.get("pcie_replay_count"), self._number))
        return None if link == Pcie() else link


__all__ = ["AmdHealth"]
