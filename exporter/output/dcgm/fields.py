"""dcgm-exporter's metric schema: DCGM field names, types, units and labels.

With ``--metric-schema dcgm`` the agent serves the series NVIDIA's dcgm-exporter serves,
under the same names (``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ...),
in the same units (MHz, °C, W, mJ, KB, %, MiB, 0-1 ratios) and with the same label names
(``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
``DCGM_FI_DRIVER_VERSION``; ``namespace``, ``pod``, ``container`` or ``hpc_job`` for a
workload), so dashboards and alerts written for dcgm-exporter keep working. The node's
label is ``Hostname`` as in dcgm-exporter 4.5.3-4.8.2 and before, or as the release being
replaced names it (``--dcgm-hostname-label``: ``hostname`` after May 2026, ``none``).

Which series carry workload labels (see docs/MIGRATING-FROM-DCGM.md):

* Every field has exactly one *device* series per GPU (or MIG instance), without
  workload labels, holding the device's value, as dcgm-exporter's does on an
  unshared GPU.
* A few fields also have one *workload* series per pod container (``namespace``, ``pod``,
  ``container``) or Slurm job (``hpc_job``) on that GPU, holding that workload's own
  share: ``DCGM_FI_DEV_FB_USED`` (its processes' memory), ``DCGM_FI_DEV_GPU_UTIL`` (its
  processes' SM share), ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (the device's value split in
  proportion to the processes' SM shares) and ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
  (its share of the energy, as ``container_gpu_energy_joules_total``). On a GPU shared
  by time-slicing the pods' series differ and add up to the device's, instead of
  each being a copy of the device's numbers as dcgm-exporter's are.

Only NVIDIA GPUs get DCGM series: AMD and Gaudi devices keep the l9gpu schema alone
(DCGM fields describe NVIDIA hardware, and dcgm-exporter never exported them).

The fields come from a counters file in dcgm-exporter's CSV format (``DCGM field, type,
help``; ``--collectors FILE``), by default `DEFAULT_COUNTERS`: dcgm-exporter's
``etc/default-counters.csv`` plus the driver version label and the ``DCGM_FI_PROF_*``
fields NVML GPM provides. A field l9gpu cannot provide is named once at start-up and
skipped; a malformed line is an error naming the file and line.
"""

from __future__ import annotations

import csv
import logging
import math
import re
from dataclasses import dataclass
from typing import Callable, Sequence, Union

from exporter.core.labels import DEVICE_LABELS
from exporter.core.model import DeviceSample, Snapshot, WorkloadUsage
from exporter.devices.nvml import THROTTLE_REASONS
from exporter.output import catalogue as cat
from exporter.output.extract import PerDevice
from exporter.output.spec import DcgmAlias, MetricSpec

log = logging.getLogger(__name__)

# --metric-schema values.
L9GPU = "l9gpu"
DCGM = "dcgm"
SCHEMAS: tuple[str, ...] = (L9GPU, DCGM)

# --dcgm-hostname-label values: the node's label as the dcgm-exporter release being
# replaced names it. ``Hostname`` up to 4.5.3-4.8.2 (and in Grafana dashboard 12239);
# ``hostname`` after NVIDIA/dcgm-exporter's "Rename Hostname label to hostname" (May
# 2026); ``none`` as its ``--no-hostname`` (no node label).
HOSTNAME_LABELS: tuple[str, ...] = ("Hostname", "hostname", "none")
DEFAULT_HOSTNAME_LABEL = "Hostname"

MIB = 2**20
KIB = 1024  # NVML's and DCGM's "KB" for PCIe byte counts

# Types a counters file may name (dcgm-exporter accepts the same words).
FILE_TYPES: tuple[str, ...] = ("gauge", "counter", "label", "histogram", "summary")

# dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter), its uncommented lines,
# then the driver version label and every DCGM_FI_PROF_* field NVML GPM can give
# (etc/dcp-metrics-included.csv lists the first five; its dashboard reads two of them).
DEFAULT_COUNTERS = """\
# DCGM FIELD, Prometheus metric type, help message
# Clocks
DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).
# Temperature
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).
# Power
DCGM_FI_DEV_POWER_USAGE,              gauge, Power draw (in W).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).
# PCIE
DCGM_FI_DEV_PCIE_TX_THROUGHPUT,  counter, Total number of bytes transmitted through PCIe TX (in KB) via NVML.
DCGM_FI_DEV_PCIE_RX_THROUGHPUT,  counter, Total number of bytes received through PCIe RX (in KB) via NVML.
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.
# Utilization (the sample period varies depending on the product)
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_ENC_UTIL,      gauge, Encoder utilization (in %).
DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).
# Errors and violations
DCGM_FI_DEV_XID_ERRORS,            gauge,   Value of the last XID error encountered.
# Memory usage
DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).
DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).
# NVLink
DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,            counter, Total number of NVLink bandwidth counters for all lanes
# VGPU License status
DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status
# Remapped rows
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,   counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge,   Whether remapping of rows has failed
# Static configuration information: a label on the other series
DCGM_FI_DRIVER_VERSION, label, Driver Version
# DCP (profiling) metrics, from NVML GPM on Hopper and newer
DCGM_FI_PROF_GR_ENGINE_ACTIVE,   gauge, Ratio of time the graphics engine is active.
DCGM_FI_PROF_SM_ACTIVE,          gauge, The ratio of cycles an SM has at least 1 warp assigned.
DCGM_FI_PROF_SM_OCCUPANCY,       gauge, The ratio of number of warps resident on an SM.
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.
DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE, gauge, Ratio of cycles the tensor (IMMA) pipe is active.
DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE, gauge, Ratio of cycles the tensor (DFMA) pipe is active.
DCGM_FI_PROF_DRAM_ACTIVE,        gauge, Ratio of cycles the device memory interface is active sending or receiving data.
DCGM_FI_PROF_PIPE_FP64_ACTIVE,   gauge, Ratio of cycles the fp64 pipes are active.
DCGM_FI_PROF_PIPE_FP32_ACTIVE,   gauge, Ratio of cycles the fp32 pipes are active.
DCGM_FI_PROF_PIPE_FP16_ACTIVE,   gauge, Ratio of cycles the fp16 pipes are active.
DCGM_FI_PROF_PCIE_TX_BYTES,      gauge, The rate of data transmitted over the PCIe bus - including both \
protocol headers and data payloads - in bytes per second.
DCGM_FI_PROF_PCIE_RX_BYTES,      gauge, The rate of data received over the PCIe bus - including both \
protocol headers and data payloads - in bytes per second.
DCGM_FI_PROF_NVLINK_TX_BYTES,    gauge, The rate of data transmitted over NVLink - including both \
protocol headers and data payloads - in bytes per second.
DCGM_FI_PROF_NVLINK_RX_BYTES,    gauge, The rate of data received over NVLink - including both \
protocol headers and data payloads - in bytes per second.
"""


def parse_schemas(text: str) -> tuple[str, ...]:
    """Parse ``--metric-schema``: ``l9gpu``, ``dcgm`` or both, comma-separated.

    Raises:
        ValueError: empty, or naming an unknown schema.
    """
    names = [name.strip().lower() for name in str(text).split(",") if name.strip()]
    if not names:
        raise ValueError("empty metric schema; use l9gpu, dcgm or l9gpu,dcgm")
    for name in names:
        if name not in SCHEMAS:
            raise ValueError(f"unknown metric schema {name!r}; use l9gpu, dcgm or l9gpu,dcgm")
    return tuple(dict.fromkeys(names))


# ---- the field table ------------------------------------------------------------------


class FieldDevice:
    """One device as one render sees it: the sample plus what the snapshot adds."""

    __slots__ = ("sample", "energy_joules", "last_xid", "sm_share_total", "snapshot", "family_sums")

    def __init__(self, sample: DeviceSample, energy_joules: float | None, last_xid: int | None,
                 snapshot: Snapshot | None = None):
        self.sample = sample
        self.snapshot = snapshot  # what the catalogue's rows read (the GPU's health read, its verdict)
        # (family, label positions) -> those labels' values -> the sum of the family's series with
        # them on this device: a family is read once for all the fields made from it
        self.family_sums: dict[tuple[str, tuple[int, ...]], dict[tuple[str, ...], float]] = {}
        # the agent's monotonic energy counter (gpu_energy_joules_total), joules
        self.energy_joules = energy_joules
        self.last_xid = last_xid
        # sum of the processes' SM shares (0-1 each); 0 when the device samples none; the
        # device's utilisation where one owner holds it and its share was read off the device
        self.sm_share_total = (sample.utilization or 0.0) if sample.sm_share_from_device else sum(
            p.sm_utilization or 0.0 for p in sample.processes)


Value = Union[float, int, str, None]
DeviceGetter = Callable[[FieldDevice], Value]
WorkloadGetter = Callable[[WorkloadUsage, FieldDevice], Union[float, None]]


@dataclass(frozen=True)
class DcgmField:
    """One DCGM field l9gpu can serve.

    Attributes:
        name: the DCGM field name, which is also the series name.
        type: "gauge", "counter", or "label" (a label on every other series).
        unit: DCGM's unit, for the docs ("MHz", "MiB", "ratio", ...).
        l9gpu: the l9gpu family it comes from and the conversion (docs).
        value: the device's value, None where the device does not report it.
        workload: a workload's own share on the device, for the fields that carry
            workload series (None for device-only fields).
        workload_note: how the workload share is computed (docs).
        uses_last_xid: the value is the latest XID, which the renderer works out across
            snapshots (`FieldDevice.last_xid`) only when a selected field asks for it.
    """

    name: str
    type: str
    unit: str
    l9gpu: str
    value: DeviceGetter
    workload: WorkloadGetter | None = None
    workload_note: str = ""
    uses_last_xid: bool = False


def _scaled(attribute: str, factor: float = 1.0) -> DeviceGetter:
    def get(device: FieldDevice) -> Value:
        value = getattr(device.sample, attribute)
        return None if value is None else value * factor

    return get


def _gpm(key: str, factor: float = 1.0) -> DeviceGetter:
    def get(device: FieldDevice) -> Value:
        value = device.sample.gpm.get(key)
        return None if value is None else value * factor

    return get


def _fb_free(device: FieldDevice) -> Value:
    total, used = device.sample.memory_total_bytes, device.sample.memory_used_bytes
    return None if total is None or used is None else max(0, total - used) / MIB


def _energy_mj(device: FieldDevice) -> Value:
    return None if device.energy_joules is None else device.energy_joules * 1000.0


def _xid(device: FieldDevice) -> Value:
    return device.last_xid


def _ecc(kind: str) -> DeviceGetter:
    def get(device: FieldDevice) -> Value:
        return device.sample.ecc_errors.get(kind)

    return get


_THROTTLE_BITS = dict(THROTTLE_REASONS)


def _throttle_mask(device: FieldDevice) -> Value:
    reasons = device.sample.throttle_reasons
    if not reasons:
        return None
    return sum(_THROTTLE_BITS.get(name, 0) for name, active in reasons.items() if active)


def _factor_text(factor: float) -> str:
    """`` × 10^6`` for a factor that is a power of ten, `` × f`` for another, nothing for 1."""
    if factor == 1.0:
        return ""
    exponent = round(math.log10(abs(factor)))
    if 10.0 ** exponent == factor:
        return f" × 10^{exponent}" if exponent > 0 else f" ÷ 10^{-exponent}"
    return f" × {factor:g}"


def _from_family(spec: MetricSpec, alias: DcgmAlias) -> DcgmField:
    """The DCGM field a catalogue row declares (`MetricSpec.dcgm_fields`): its value on a GPU
    is the sum of the family's series there that ``alias.where`` picks, times its factor."""
    extract = spec.extract
    if not isinstance(extract, PerDevice):  # MetricSpec refuses another
        raise TypeError(f"{spec.name}: DCGM fields need a PerDevice extractor")
    own = spec.labels[len(DEVICE_LABELS):]
    read, factor = extract.read, alias.factor
    by = (spec.name, tuple(own.index(label) for label, _ in alias.where))
    wanted = tuple(want for _, want in alias.where)

    def value(device: FieldDevice) -> Value:
        if device.snapshot is None:
            return None
        sums = device.family_sums.get(by)
        if sums is None:
            sums = device.family_sums[by] = {}
            for extra, number in read(device.snapshot, device.sample):
                key = tuple(extra[i] for i in by[1])
                sums[key] = sums.get(key, 0.0) + number
        total = sums.get(wanted)
        return None if total is None else total * factor

    picked = ",".join(f'{label}="{want}"' for label, want in alias.where)
    summed = "".join(f" summed over {label}s" for label in own if label not in dict(alias.where))
    text = f"`{spec.name}{'{' + picked + '}' if picked else ''}`{summed}{_factor_text(factor)}"
    return DcgmField(alias.name, alias.type, alias.unit, text, value)


def _text(attribute: str) -> DeviceGetter:
    def get(device: FieldDevice) -> Value:
        return getattr(device.sample, attribute) or None

    return get


def _workload_memory(usage: WorkloadUsage, device: FieldDevice) -> float | None:
    return None if usage.memory_used_bytes is None else usage.memory_used_bytes / MIB


def _workload_util(usage: WorkloadUsage, device: FieldDevice) -> float | None:
    return None if usage.utilization is None else usage.utilization * 100.0


def _workload_energy(usage: WorkloadUsage, device: FieldDevice) -> float | None:
    return None if usage.energy_joules_total is None else usage.energy_joules_total * 1000.0


def _workload_graphics(usage: WorkloadUsage, device: FieldDevice) -> float | None:
    active = device.sample.gpm.get("graphics_active")
    if active is None or usage.utilization is None:
        return None
    if device.sm_share_total <= 0:
        return 0.0
    return active * usage.utilization / device.sm_share_total


_GPM_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "graphics_active", "ratio 0-1"),
    ("DCGM_FI_PROF_SM_ACTIVE", "sm_active", "ratio 0-1"),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy", "ratio 0-1"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active", "ratio 0-1"),
    ("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "tensor_hmma_active", "ratio 0-1"),
    ("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "tensor_imma_active", "ratio 0-1"),
    ("DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", "tensor_dfma_active", "ratio 0-1"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "dram_active", "ratio 0-1"),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16_active", "ratio 0-1"),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32_active", "ratio 0-1"),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64_active", "ratio 0-1"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_second", "B/s"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_second", "B/s"),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bytes_per_second", "B/s"),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bytes_per_second", "B/s"),
)

FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "gauge", "MHz", "`gpu_sm_clock_hertz` ÷ 10^6",
              _scaled("sm_clock_hertz", 1e-6)),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", "gauge", "MHz", "`gpu_memory_clock_hertz` ÷ 10^6",
              _scaled("memory_clock_hertz", 1e-6)),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "°C", "`gpu_memory_temperature_celsius`",
              _scaled("memory_temperature_celsius")),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "gauge", "°C", "`gpu_temperature_celsius`", _scaled("temperature_celsius")),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "W", "`gpu_power_watts`", _scaled("power_watts")),
    DcgmField("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "W", "`gpu_power_limit_watts`",
              _scaled("power_limit_watts")),
    DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "mJ", "`gpu_energy_joules_total` × 1000",
              _energy_mj, _workload_energy,
              "its share of the energy: `container_gpu_energy_joules_total` × 1000"),
    DcgmField("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "counter", "KB (1024 bytes)",
              "`gpu_pcie_tx_bytes_total` ÷ 1024 (NVML's PCIe byte counter)", _scaled("pcie_tx_bytes_total", 1.0 / KIB)),
    DcgmField("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "counter", "KB (1024 bytes)",
              "`gpu_pcie_rx_bytes_total` ÷ 1024 (NVML's PCIe byte counter)", _scaled("pcie_rx_bytes_total", 1.0 / KIB)),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gauge", "%", "`gpu_utilization_ratio` × 100",
              _scaled("utilization", 100.0), _workload_util,
              "its processes' SM share: `container_gpu_utilization_ratio` × 100"),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "%", "`gpu_memory_utilization_ratio` × 100",
              _scaled("memory_utilization", 100.0)),
    DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "XID code", "the code of the latest `gpu_xid_errors_total` "
              "increase (0 until the first XID since the agent started)", _xid, uses_last_xid=True),
    DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "MiB", "(`gpu_memory_total_bytes` − `gpu_memory_used_bytes`) ÷ 2^20",
              _fb_free),
    DcgmField("DCGM_FI_DEV_FB_USED", "gauge", "MiB", "`gpu_memory_used_bytes` ÷ 2^20",
              _scaled("memory_used_bytes", 1.0 / MIB), _workload_memory,
              "its processes' memory: `container_gpu_memory_used_bytes` ÷ 2^20"),
    DcgmField("DCGM_FI_DEV_FB_TOTAL", "gauge", "MiB", "`gpu_memory_total_bytes` ÷ 2^20",
              _scaled("memory_total_bytes", 1.0 / MIB)),
    DcgmField("DCGM_FI_DEV_FAN_SPEED", "gauge", "%", "`gpu_fan_speed_ratio` × 100", _scaled("fan_speed_ratio", 100.0)),
    DcgmField("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "errors", "`gpu_ecc_errors_total{type=\"corrected\"}`",
              _ecc("corrected")),
    DcgmField("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "errors", "`gpu_ecc_errors_total{type=\"uncorrected\"}`",
              _ecc("uncorrected")),
    DcgmField("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "bit mask",
              "`gpu_clock_throttle_active` as NVML's clock event reason bits", _throttle_mask),
    DcgmField("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "bit mask",
              "`gpu_clock_throttle_active` as NVML's clock event reason bits", _throttle_mask),
    *(DcgmField(name, "gauge", unit, f"NVML GPM `{key}`", _gpm(key),
                _workload_graphics if key == "graphics_active" else None,
                "the device's value × its processes' SM share ÷ all processes' SM share"
                if key == "graphics_active" else "")
      for name, key, unit in _GPM_FIELDS),
    # the fields the catalogue's rows declare (the health families': remapped rows, PCIe replays, NVLink
    # errors, violation times), in the rows' order
    *(_from_family(spec, alias) for spec in cat.METRICS for alias in spec.dcgm_fields),
    DcgmField("DCGM_FI_DRIVER_VERSION", "label", "", "`gpu_info{driver_version}`", _text("driver_version")),
    DcgmField("DCGM_FI_DEV_SERIAL", "label", "", "`gpu_info{serial}`", _text("serial")),
)

BY_NAME: dict[str, DcgmField] = {f.name: f for f in FIELDS}

# DCGM fields dcgm-exporter's shipped counters files list and l9gpu cannot provide, with
# the reason (start-up warning and docs). Any other unknown name is "not a field l9gpu reads".
NOT_PROVIDED: dict[str, str] = {
    "DCGM_FI_DEV_ENC_UTIL": "encoder utilisation is not read",
    "DCGM_FI_DEV_DEC_UTIL": "decoder utilisation is not read",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "no cumulative NVLink counter (rates: DCGM_FI_PROF_NVLINK_TX/RX_BYTES)",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "vGPU licensing is not read",
    "DCGM_FI_DEV_FB_RESERVED": "reserved framebuffer is not read",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "NVML's volatile ECC counts are not read (aggregate: *_AGG_TOTAL)",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "NVML's volatile ECC counts are not read (aggregate: *_AGG_TOTAL)",
    "DCGM_FI_DEV_RETIRED_SBE": "retired pages are not read",
    "DCGM_FI_DEV_RETIRED_DBE": "retired pages are not read",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired pages are not read",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0": "per-link NVLink counters are not read",
    "DCGM_FI_NVML_VERSION": "the NVML version is not read",
    "DCGM_FI_DEV_BRAND": "the brand is not read",
    "DCGM_FI_DEV_OEM_INFOROM_VER": "inforom versions are not read",
    "DCGM_FI_DEV_ECC_INFOROM_VER": "inforom versions are not read",
    "DCGM_FI_DEV_POWER_INFOROM_VER": "inforom versions are not read",
    "DCGM_FI_DEV_INFOROM_IMAGE_VER": "inforom versions are not read",
    "DCGM_FI_DEV_VBIOS_VERSION": "the VBIOS version is not read",
    "DCGM_EXP_XID_ERRORS_COUNT": "dcgm-exporter's own windowed count (l9gpu: gpu_xid_errors_total)",
    "DCGM_EXP_CLOCK_EVENTS_COUNT": "dcgm-exporter's own windowed count (l9gpu: gpu_clock_throttle_active)",
    "DCGM_EXP_GPU_HEALTH_STATUS": "DCGM health checks are not run",
    "DCGM_EXP_P2P_STATUS": "P2P status is not read",
}


# ---- counters files ----------------------------------------------------------------------


class CountersError(ValueError):
    """A counters file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class CounterLine:
    """One ``DCGM field, type, help`` line of a counters file."""

    name: str
    type: str
    help: str
    line: int


_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def parse_counters(text: str, source: str) -> list[CounterLine]:
    """Parse a counters file in dcgm-exporter's CSV format.

    Lines starting with ``#`` and blank lines are skipped; every other line is
    ``DCGM field, Prometheus type, help`` (the help may be quoted to hold commas).

    Args:
        text: the file's content.
        source: the file name, for error messages.

    Raises:
        CountersError: "FILE:LINE: what is wrong", for the first bad line, a field
            listed twice, or a file without fields.
    """
    lines: list[CounterLine] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{source}:{number}"
        try:
            row = [cell.strip() for cell in next(csv.reader([stripped], skipinitialspace=True, strict=True))]
        except csv.Error as exc:
            raise CountersError(f"{where}: not a CSV line ({exc})") from None
        if len(row) != 3:
            shown = stripped if len(stripped) <= 80 else stripped[:77] + "..."
            raise CountersError(f"{where}: expected 3 comma-separated fields (DCGM field, type, help), "
                                f"got {len(row)}: {shown!r}")
        name, kind, help_text = row
        if not _FIELD_NAME.match(name):
            raise CountersError(f"{where}: {name!r} is not a DCGM field name")
        if kind.lower() not in FILE_TYPES:
            raise CountersError(f"{where}: unknown type {kind!r} for {name} (use gauge, counter or label)")
        if name in seen:
            raise CountersError(f"{where}: {name} is listed twice (first on line {seen[name]})")
        seen[name] = number
        lines.append(CounterLine(name, kind.lower(), help_text, number))
    if not lines:
        raise CountersError(f"{source}: no fields (expected lines of: DCGM field, type, help)")
    return lines


def read_counters(path: str) -> list[CounterLine]:
    """Read and parse a counters file (see `parse_counters`).

    Raises:
        CountersError: unreadable file or bad content, naming the file.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise CountersError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CountersError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_counters(text, path)


@dataclass(frozen=True)
class Selection:
    """What a counters file asks for, resolved against what l9gpu can serve.

    Attributes:
        metrics: (field, type, help) of every series family to serve, in file order;
            type and help are the file's, as dcgm-exporter takes them.
        labels: the label fields (type ``label``), added to every series.
        skipped: (field name, reason) for every line l9gpu cannot serve.
        hostname_label: the name of the node's label on every series (one of
            `HOSTNAME_LABELS`; ``none``: no such label).
    """

    metrics: tuple[tuple[DcgmField, str, str], ...]
    labels: tuple[DcgmField, ...]
    skipped: tuple[tuple[str, str], ...]
    hostname_label: str = DEFAULT_HOSTNAME_LABEL


def select(lines: Sequence[CounterLine]) -> Selection:
    """Resolve counters lines against `FIELDS`."""
    metrics: list[tuple[DcgmField, str, str]] = []
    labels: list[DcgmField] = []
    skipped: list[tuple[str, str]] = []
    for line in lines:
        found = BY_NAME.get(line.name)
        if found is None:
            skipped.append((line.name, NOT_PROVIDED.get(line.name, "not a field l9gpu reads")))
        elif line.type in ("histogram", "summary"):
            skipped.append((line.name, f"type {line.type} is not served (use gauge or counter)"))
        elif (found.type == "label") != (line.type == "label"):
            want = "label" if found.type == "label" else found.type
            skipped.append((line.name, f"served as type {want}, not {line.type}"))
        elif found.type == "label":
            labels.append(found)
        else:
            metrics.append((found, line.type, line.help))
    return Selection(tuple(metrics), tuple(labels), tuple(skipped))


def default_selection() -> Selection:
    """The fields served without ``--collectors`` (`DEFAULT_COUNTERS`, less what l9gpu lacks)."""
    return select(parse_counters(DEFAULT_COUNTERS, "built-in default counters"))


def describe_skipped(selection: Selection, source: str) -> str | None:
    """The one start-up line naming the fields that will not be served (None if none)."""
    if not selection.skipped:
        return None
    names = "; ".join(f"{name} ({reason})" for name, reason in selection.skipped)
    return f"{source}: skipping {len(selection.skipped)} field(s) l9gpu cannot provide: {names}"


def markdown_table() -> str:
    """The field table for docs/MIGRATING-FROM-DCGM.md (kept in sync by a test)."""
    default = {line.name for line in parse_counters(DEFAULT_COUNTERS, "default")}
    rows = ["| DCGM field | type | unit | from l9gpu | per-workload series | default |", "|---|---|---|---|---|---|"]
    for spec in FIELDS:
        rows.append(f"| `{spec.name}` | {spec.type} | {spec.unit or '—'} | {spec.l9gpu} | "
                    f"{spec.workload_note or '—'} | {'yes' if spec.name in default else ''} |")
    return "\n".join(rows)


def markdown_not_provided() -> str:
    """The fields l9gpu cannot provide, for the docs."""
    default = {line.name for line in parse_counters(DEFAULT_COUNTERS, "default")}
    rows = ["| DCGM field | why it is left out | in dcgm-exporter's default counters |", "|---|---|---|"]
    rows += [f"| `{name}` | {reason} | {'yes' if name in default else ''} |" for name, reason in NOT_PROVIDED.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    # the two tables of docs/MIGRATING-FROM-DCGM.md
    print(markdown_table() + "\n\n" + markdown_not_provided())
