"""The DCGM fields made from a GPU's last health read, in dcgm-exporter's units.

`exporter.output.dcgm.fields` serves them like its other fields (NVIDIA GPUs only, device series only).
Violation times are microseconds, as dcgm-exporter reports them (``etc/dcp-metrics-included.csv``:
"Throttling duration due to power constraints (in us)", type counter); the NVLink error
counts are totals over the GPU's links; remapped rows and PCIe replays are counters, the
remap failure a 0/1 gauge. A value the read did not report gives no series.
"""

from __future__ import annotations

from typing import Callable, Union

from exporter.health import HealthSignals
from exporter.health.signals import as_count, as_seconds

Value = Union[float, int, None]
HealthGetter = Callable[[HealthSignals], Value]

US_PER_SECOND = 1e6


def _count(value: object) -> Value:
    return as_count(value)  # garbage as the policy and the native families see it


def _count_or_flag(value: object) -> Value:
    return int(value) if isinstance(value, bool) else as_count(value)  # a flag (remap failure) as 0 or 1


def _rows(attribute: str) -> HealthGetter:
    def get(s: HealthSignals) -> Value:
        return None if s.row_remap is None else _count_or_flag(getattr(s.row_remap, attribute))

    return get


def _replays(s: HealthSignals) -> Value:
    return None if s.pcie is None else _count(s.pcie.replays)


def _nvlink_total(attribute: str) -> HealthGetter:
    def get(s: HealthSignals) -> Value:
        counts = [_count(getattr(link, attribute)) for link in s.nvlinks]
        known = [c for c in counts if c is not None]
        return sum(known) if known else None

    return get


def _violation_us(attribute: str) -> HealthGetter:
    def get(s: HealthSignals) -> Value:
        seconds = None if s.violations is None else as_seconds(getattr(s.violations, attribute))
        return None if seconds is None else seconds * US_PER_SECOND

    return get


# DCGM field, type, unit, from l9gpu (docs), value from the health read
HEALTH_FIELDS: tuple[tuple[str, str, str, str, HealthGetter], ...] = (
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "rows",
     "`gpu_remapped_rows_total{type=\"uncorrectable\"}`", _rows("uncorrectable")),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "rows",
     "`gpu_remapped_rows_total{type=\"correctable\"}`", _rows("correctable")),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "0/1", "`gpu_row_remap_failure`", _rows("failure")),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "replays", "`gpu_pcie_replays_total`", _replays),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "errors",
     "`gpu_nvlink_errors_total{type=\"crc_flit\"}` summed over links", _nvlink_total("crc_flit")),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "errors",
     "`gpu_nvlink_errors_total{type=\"crc_data\"}` summed over links", _nvlink_total("crc_data")),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "errors",
     "`gpu_nvlink_errors_total{type=\"replay\"}` summed over links", _nvlink_total("replay")),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "errors",
     "`gpu_nvlink_errors_total{type=\"recovery\"}` summed over links", _nvlink_total("recovery")),
    ("DCGM_FI_DEV_POWER_VIOLATION", "counter", "µs",
     "`gpu_violation_seconds_total{reason=\"power\"}` × 10^6", _violation_us("power")),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "µs",
     "`gpu_violation_seconds_total{reason=\"thermal\"}` × 10^6", _violation_us("thermal")),
    ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "counter", "µs",
     "`gpu_violation_seconds_total{reason=\"sync_boost\"}` × 10^6", _violation_us("sync_boost")),
    ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "counter", "µs",
     "`gpu_violation_seconds_total{reason=\"board_limit\"}` × 10^6", _violation_us("board_limit")),
    ("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "counter", "µs",
     "`gpu_violation_seconds_total{reason=\"low_utilization\"}` × 10^6", _violation_us("low_utilization")),
    ("DCGM_FI_DEV_RELIABILITY_VIOLATION", "counter", "µs",
     "`gpu_violation_seconds_total{reason=\"reliability\"}` × 10^6", _violation_us("reliability")),
)
