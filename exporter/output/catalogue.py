"""The table of every metric l9gpu exports.

Everything else derives from this table: each row carries what renders it (its extractor,
`exporter.output.extract`), so `render` builds the families from the rows alone; the OTLP
bridge takes units and attribute names from it, the DCGM schema the fields it serves from a
family's series, and ``docs/METRICS.md`` is generated from it (``python -m
exporter.output.catalogue > docs/METRICS.md``, by `exporter.output.metrics_doc`; a test fails
when the doc drifts). Adding a family is adding its row (a health family's row is in
`exporter.output.catalogue_health`).

Names follow the Prometheus conventions: base units in the name (``_bytes``, ``_watts``,
``_joules``, ``_celsius``, ``_hertz``, ``_seconds``), 0-1 ``_ratio`` rather than percent,
``_total`` only on counters, string facts in an ``_info`` gauge whose value is 1.
"""

from __future__ import annotations

import sys
from typing import Iterable

# The label names and their order come from the label schema (exporter/core/labels.py).
from exporter.core.labels import DEVICE_LABELS, OWNER_LABELS, PROCESS_LABELS, WORKLOAD_ID_LABELS, WORKLOAD_LABELS
from exporter.output.catalogue_health import HEALTH_FAMILIES
from exporter.output.extract import (
    PerDevice,
    build_info,
    by_device,
    device,
    device_gpm,
    node_info,
    process,
    snapshot_age,
    sole_workload_gpm,
    stuck_calls,
    unattributed,
    workload,
)
from exporter.output.spec import (
    COUNTER,
    DEVICE,
    GAUGE,
    HEALTH,
    INCIDENT,
    INFO,
    LABEL_ATTRIBUTES,
    PROCESS,
    SELF,
    UCUM,
    UNATTRIBUTED,
    WORKLOAD,
    WORKLOAD_GPM,
    MetricSpec,
    otel_attribute,
)

__all__ = [
    "BY_NAME", "COUNTER", "DEVICE", "DEVICE_LABELS", "GAUGE", "GPM_FAMILIES", "HEALTH", "INCIDENT", "INFO",
    "LABEL_ATTRIBUTES", "METRICS", "OWNER_LABELS", "PROCESS", "PROCESS_LABELS", "REGISTERED_ELSEWHERE", "SELF",
    "UCUM", "UNATTRIBUTED", "WORKLOAD", "WORKLOAD_GPM", "WORKLOAD_ID_LABELS", "WORKLOAD_LABELS",
    "MetricSpec", "enabled_names", "get", "otel_attribute",
]

# The incident watch registers these families itself: it follows the published snapshots.
_WATCH = "exporter.incidents.watch"
# The stall watch registers these: it follows the published snapshots too.
_STALL = "exporter.stall.watch"

D = DEVICE_LABELS
W = WORKLOAD_LABELS

# NVML GPM metrics (`DeviceSample.gpm`, Hopper and newer): key, family name without the
# ``gpu_``/``container_gpu_`` prefix, what it measures, and the DCGM profiling field it
# matches (DCGM's PROF fields are ratios 0-1 and bytes per second too, so the factor is 1).
GPM_FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("graphics_active", "graphics_active_ratio",
     "Fraction of time the graphics or compute engine was active (any kernel resident)",
     "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    ("sm_active", "sm_active_ratio",
     "Fraction of time the SMs had at least one warp resident, averaged over all SMs: how much of the GPU the "
     "kernels spread over",
     "DCGM_FI_PROF_SM_ACTIVE"),
    ("sm_occupancy", "sm_occupancy_ratio",
     "Resident warps as a fraction of the SMs' maximum, averaged over time and SMs",
     "DCGM_FI_PROF_SM_OCCUPANCY"),
    ("tensor_active", "tensor_active_ratio",
     "Fraction of time any tensor-core pipe was active: the matrix math of training and inference",
     "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    ("tensor_hmma_active", "tensor_hmma_active_ratio",
     "Fraction of time the half-precision (FP16, BF16) tensor-core pipe was active",
     "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE"),
    ("tensor_imma_active", "tensor_imma_active_ratio",
     "Fraction of time the integer (INT8, INT4) tensor-core pipe was active",
     "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE"),
    ("tensor_dfma_active", "tensor_dfma_active_ratio",
     "Fraction of time the double-precision (FP64) tensor-core pipe was active",
     "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE"),
    ("dram_active", "dram_active_ratio",
     "Device-memory bandwidth used as a fraction of the peak",
     "DCGM_FI_PROF_DRAM_ACTIVE"),
    ("fp16_active", "fp16_active_ratio",
     "Fraction of time the SMs' non-tensor FP16 pipe was active",
     "DCGM_FI_PROF_PIPE_FP16_ACTIVE"),
    ("fp32_active", "fp32_active_ratio",
     "Fraction of time the SMs' non-tensor FP32 pipe was active",
     "DCGM_FI_PROF_PIPE_FP32_ACTIVE"),
    ("fp64_active", "fp64_active_ratio",
     "Fraction of time the SMs' non-tensor FP64 pipe was active",
     "DCGM_FI_PROF_PIPE_FP64_ACTIVE"),
    ("pcie_tx_bytes_per_second", "gpm_pcie_tx_bytes_per_second",
     "PCIe bytes sent by the GPU per second (all traffic, headers included)",
     "DCGM_FI_PROF_PCIE_TX_BYTES"),
    ("pcie_rx_bytes_per_second", "gpm_pcie_rx_bytes_per_second",
     "PCIe bytes received by the GPU per second (all traffic, headers included)",
     "DCGM_FI_PROF_PCIE_RX_BYTES"),
    ("nvlink_tx_bytes_per_second", "nvlink_tx_bytes_per_second",
     "NVLink bytes sent per second, all links together",
     "DCGM_FI_PROF_NVLINK_TX_BYTES"),
    ("nvlink_rx_bytes_per_second", "nvlink_rx_bytes_per_second",
     "NVLink bytes received per second, all links together",
     "DCGM_FI_PROF_NVLINK_RX_BYTES"),
)
_GPM_WINDOW = " (NVML GPM, averaged between two GPM samples; see --gpm-interval)."
_GPM_NOTE = "NVIDIA Hopper and newer (NVML GPM); absent on older GPUs"


def _gpm_specs() -> tuple[MetricSpec, ...]:
    device = tuple(
        MetricSpec("gpu_" + name, GAUGE, "ratio" if name.endswith("_ratio") else "bytes_per_second",
                   text + _GPM_WINDOW, D, DEVICE, device_gpm(key), (dcgm, 1.0), vendors_note=_GPM_NOTE)
        for key, name, text, dcgm in GPM_FAMILIES
    )
    workload = tuple(
        MetricSpec("container_gpu_" + name, GAUGE, "ratio" if name.endswith("_ratio") else "bytes_per_second",
                   f"The device's `gpu_{name}`, labelled with the workload on a GPU or MIG instance whose "
                   "processes all belong to this one workload; absent on a shared GPU.",
                   W, WORKLOAD_GPM, sole_workload_gpm(key), (dcgm, 1.0), vendors_note=_GPM_NOTE)
        for key, name, text, dcgm in GPM_FAMILIES
    )
    return device + workload


METRICS: tuple[MetricSpec, ...] = (
    # ---- device -------------------------------------------------------------------
    MetricSpec("gpu_info", INFO, "", "Facts about a GPU; value is always 1.",
               D + ("vendor", "driver_version", "pci_bus_id", "serial"), DEVICE,
               PerDevice(lambda _, gpu: (((gpu.vendor, gpu.driver_version, gpu.pci_bus_id, gpu.serial), 1.0),))),
    MetricSpec("gpu_up", GAUGE, "", "1 if the GPU was read in the last pass, 0 if it failed (lost, driver error).",
               D, DEVICE, device("up", kept_when_down=True)),
    MetricSpec("gpu_stuck_call_seconds", GAUGE, "seconds",
               "How long a call into the vendor library about this GPU (label call, e.g. "
               "nvmlDeviceGetPowerUsage) has gone unanswered, in seconds. Present only while the call is "
               "past its deadline; the GPU is reported down meanwhile and the others are read without it.",
               D + ("call",), DEVICE, stuck_calls),
    MetricSpec("gpu_utilization_ratio", GAUGE, "ratio",
               "Fraction of the last sample period during which one or more kernels ran on the GPU.",
               D, DEVICE, device("utilization"), ("DCGM_FI_DEV_GPU_UTIL", 100.0)),
    MetricSpec("gpu_memory_utilization_ratio", GAUGE, "ratio",
               "Fraction of the last sample period during which device memory was read or written.",
               D, DEVICE, device("memory_utilization"), ("DCGM_FI_DEV_MEM_COPY_UTIL", 100.0)),
    MetricSpec("gpu_memory_used_bytes", GAUGE, "bytes", "Device memory in use, in bytes.",
               D, DEVICE, device("memory_used_bytes"), ("DCGM_FI_DEV_FB_USED", 1.0 / 2**20)),
    MetricSpec("gpu_memory_total_bytes", GAUGE, "bytes", "Total device memory, in bytes.",
               D, DEVICE, device("memory_total_bytes"), ("DCGM_FI_DEV_FB_TOTAL", 1.0 / 2**20)),
    MetricSpec("gpu_temperature_celsius", GAUGE, "celsius", "GPU die temperature, in degrees Celsius.",
               D, DEVICE, device("temperature_celsius"), ("DCGM_FI_DEV_GPU_TEMP", 1.0)),
    MetricSpec("gpu_memory_temperature_celsius", GAUGE, "celsius", "Device memory (HBM) temperature, in degrees Celsius.",
               D, DEVICE, device("memory_temperature_celsius"), ("DCGM_FI_DEV_MEMORY_TEMP", 1.0),
               vendors_note="not on consumer NVIDIA cards"),
    MetricSpec("gpu_power_watts", GAUGE, "watts", "Power draw, in watts.",
               D, DEVICE, device("power_watts"), ("DCGM_FI_DEV_POWER_USAGE", 1.0)),
    MetricSpec("gpu_power_limit_watts", GAUGE, "watts", "Enforced power limit, in watts.",
               D, DEVICE, device("power_limit_watts"), ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 1.0)),
    MetricSpec("gpu_energy_joules_total", COUNTER, "joules",
               "Energy consumed by the GPU, in joules (the device counter where it has one, else integrated power).",
               D, DEVICE, by_device(lambda snapshot: snapshot.device_energy_joules),
               ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000.0)),
    MetricSpec("gpu_capacity_seconds_total", COUNTER, "seconds",
               "GPU time this device has offered since the agent started, in GPU-seconds: wall time for a "
               "whole GPU, its compute slices' share for a MIG instance (a 1g.10gb of an H100 counts 1/7), for a "
               "GPU in MIG mode the slices in no instance. Per GPU, the workloads' allocation seconds plus "
               "gpu_unallocated_seconds_total add up to it.",
               D, DEVICE, by_device(lambda snapshot: snapshot.device_capacity_seconds)),
    MetricSpec("gpu_sm_clock_hertz", GAUGE, "hertz", "SM (graphics engine) clock, in hertz.",
               D, DEVICE, device("sm_clock_hertz"), ("DCGM_FI_DEV_SM_CLOCK", 1e-6)),
    MetricSpec("gpu_memory_clock_hertz", GAUGE, "hertz", "Memory clock, in hertz.",
               D, DEVICE, device("memory_clock_hertz"), ("DCGM_FI_DEV_MEM_CLOCK", 1e-6)),
    MetricSpec("gpu_pcie_tx_bytes_total", COUNTER, "bytes",
               "Bytes the GPU sent over PCIe, as the driver counts them (take rate() for throughput).",
               D, DEVICE, device("pcie_tx_bytes_total"), ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 1.0 / 1024),
               vendors_note="absent where the driver has no PCIe byte counters (see the per-vendor table)"),
    MetricSpec("gpu_pcie_rx_bytes_total", COUNTER, "bytes",
               "Bytes the GPU received over PCIe, as the driver counts them (take rate() for throughput).",
               D, DEVICE, device("pcie_rx_bytes_total"), ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 1.0 / 1024),
               vendors_note="absent where the driver has no PCIe byte counters (see the per-vendor table)"),
    MetricSpec("gpu_fan_speed_ratio", GAUGE, "ratio", "Fan speed as a fraction of its maximum (cards with fans only).",
               D, DEVICE, device("fan_speed_ratio"), ("DCGM_FI_DEV_FAN_SPEED", 100.0),
               vendors_note="absent on passively cooled data-centre cards"),
    MetricSpec("gpu_ecc_errors_total", COUNTER, "", "ECC errors over the board's lifetime, by type (corrected, uncorrected).",
               D + ("type",), DEVICE, device("ecc_errors"), ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1.0)),
    MetricSpec("gpu_xid_errors_total", COUNTER, "", "XID error events seen since the agent started, by XID code.",
               D + ("xid",), DEVICE, device("xid_errors", kept_when_down=True), ("DCGM_FI_DEV_XID_ERRORS", 1.0),
               vendors_note="NVIDIA only"),
    MetricSpec("gpu_clock_throttle_active", GAUGE, "", "1 while the named reason is holding the clocks down, else 0.",
               D + ("reason",), DEVICE, device("throttle_reasons"), ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0),
               vendors_note="NVIDIA only"),
    # ---- device: health verdict and signals (docs/HEALTH.md) -------------------------
    *HEALTH_FAMILIES,
    # ---- device and workload: GPM activity (Hopper and newer) ----------------------
    *_gpm_specs(),
    # ---- workload -----------------------------------------------------------------
    MetricSpec("container_gpu_memory_used_bytes", GAUGE, "bytes",
               "Device memory held by the workload's processes on this GPU, in bytes.",
               W, WORKLOAD, workload("memory_used_bytes"), ("DCGM_FI_DEV_FB_USED", 1.0 / 2**20)),
    MetricSpec("container_gpu_utilization_ratio", GAUGE, "ratio",
               "The workload's share of this GPU's SM time over the last interval, from per-process samples.",
               W, WORKLOAD, workload("utilization"), ("DCGM_FI_DEV_GPU_UTIL", 100.0)),
    MetricSpec("container_gpu_processes", GAUGE, "", "Number of the workload's processes on this GPU.",
               W, WORKLOAD, workload("processes")),
    MetricSpec("container_gpu_idle_seconds", GAUGE, "seconds",
               "How long the workload has held GPU memory, or had the GPU allocated, with zero SM utilisation "
               "(0 while it computes).",
               W, WORKLOAD, workload("idle_seconds")),
    MetricSpec("container_gpu_usage_seconds_total", COUNTER, "seconds",
               "Integral of the workload's SM share over time: GPU-seconds of compute.",
               W, WORKLOAD, workload("usage_seconds_total")),
    MetricSpec("container_gpu_allocation_seconds_total", COUNTER, "seconds",
               "The workload's share of this GPU's time, in GPU-seconds: k/N of it while it holds k of the N "
               "device-plugin replicas (a whole GPU: 1 of 1), else its share of the memory held there; a GPU's "
               "holders and its unallocated time add up to its capacity (docs/CHARGEBACK.md).",
               W, WORKLOAD, workload("allocation_seconds_total")),
    MetricSpec("container_gpu_allocated", GAUGE, "",
               "1 while the kubelet has this GPU allocated to the container (device plugin, pod-resources; one "
               "series per container sharing a time-sliced GPU), 0 for a pod's container running on a GPU it "
               "was not allocated. Absent where allocations are unknown (no pod-resources socket, Slurm jobs).",
               W, WORKLOAD, workload("allocated")),
    MetricSpec("container_gpu_energy_joules_total", COUNTER, "joules",
               "The workload's share of the GPU's energy, in joules (busy energy by SM share, idle energy by memory share).",
               W, WORKLOAD, workload("energy_joules_total")),
    # ---- unattributed -------------------------------------------------------------
    MetricSpec("gpu_unattributed_memory_used_bytes", GAUGE, "bytes",
               "Device memory held by GPU processes that belong to no workload (host processes, unresolved PIDs).",
               D, UNATTRIBUTED, unattributed("memory_used_bytes")),
    MetricSpec("gpu_unattributed_energy_joules_total", COUNTER, "joules",
               "Energy of this GPU that belongs to no workload: idle with no holder, or used by unattributed processes.",
               D, UNATTRIBUTED, unattributed("energy_joules_total")),
    MetricSpec("gpu_unallocated_seconds_total", COUNTER, "seconds",
               "GPU-seconds of this device's capacity that no workload held: time-slicing replicas nobody was "
               "allocated, no holder at all, or the GPU down. What the platform pays for itself.",
               D, UNATTRIBUTED, unattributed("unallocated_seconds_total")),
    # ---- per process (opt-in, for debugging) --------------------------------------
    MetricSpec("gpu_process_memory_used_bytes", GAUGE, "bytes", "Device memory held by one process, in bytes.",
               PROCESS_LABELS, PROCESS, process("used_memory_bytes"), default_enabled=False),
    MetricSpec("gpu_process_utilization_ratio", GAUGE, "ratio", "One process's share of the GPU's SM time over the last interval.",
               PROCESS_LABELS, PROCESS, process("sm_utilization"), default_enabled=False),
    # ---- self ---------------------------------------------------------------------
    MetricSpec("l9gpu_collector_success", GAUGE, "", "1 if the named collector succeeded in the last pass.",
               ("collector",), SELF,
               lambda frame, _: (((c.name,), 1.0 if c.success else 0.0) for c in frame.snapshot.collectors)),
    MetricSpec("l9gpu_collector_duration_seconds", GAUGE, "seconds", "Duration of the named collector in the last pass.",
               ("collector",), SELF,
               lambda frame, _: (((c.name,), c.duration_seconds) for c in frame.snapshot.collectors)),
    MetricSpec("l9gpu_backend_errors_total", COUNTER, "",
               "Errors a device backend met and survived (bad tool output, timeouts, lost devices), by reason.",
               ("backend", "reason"), SELF,
               lambda frame, _: ((key, float(n)) for key, n in sorted(frame.snapshot.backend_errors.items()))),
    MetricSpec("l9gpu_snapshot_age_seconds", GAUGE, "seconds", "Age of the snapshot this scrape serves.",
               (), SELF, snapshot_age),
    MetricSpec("l9gpu_unattributed_processes", GAUGE, "", "GPU processes on this node that belong to no workload.",
               ("node",), SELF, node_info("unattributed_processes", 0.0)),
    MetricSpec("l9gpu_host_pids_visible", GAUGE, "",
               "1 if the agent sees the host's PIDs (GPU processes exist under --proc-root), 0 if not: then no "
               "process can be attributed; run with hostPID: true or mount the host's /proc and pass --proc-root.",
               ("node",), SELF, node_info("host_pids_visible")),
    MetricSpec("l9gpu_build_info", INFO, "", "Version of the agent; value is always 1.",
               ("version", "python_version"), SELF, build_info),
    MetricSpec("l9gpu_http_rejections_total", COUNTER, "",
               "Connections and requests the agent's HTTP listener turned away, by reason: connection_limit_evicted "
               "(an idle or unfinished connection closed to admit a new one), connection_limit_refused (a new one "
               "closed, every open one busy), header_timeout (408), header_too_large (431), accept_failed (out of "
               "file descriptors), and with --web-config client_cert_not_allowed (403), rate_limited (429), "
               "auth_busy (503) and auth_failed (401).",
               ("reason",), SELF, registered_by="the HTTP listener (exporter.web)"),
    MetricSpec("container_gpu_incidents_total", COUNTER, "",
               "GPU incidents this workload took part in (docs/INCIDENTS.md), by kind (memory_exhausted, xid, "
               "gpu_lost, row_remap_failure, nvlink_errors, stuck_in_driver_call) and role: caused (it raised "
               "the application Xid, or grew most before the GPU filled) or affected (it held the GPU).",
               W + ("kind", "role"), INCIDENT, registered_by=_WATCH),
    MetricSpec("container_gpu_memory_peak_bytes", GAUGE, "bytes",
               "The most device memory the workload's processes held on this GPU over the last --peak-window "
               "(default 30s, longer than a scrape interval): a spike between two scrapes.",
               W, WORKLOAD, registered_by=_WATCH),
    MetricSpec("gpu_memory_peak_bytes", GAUGE, "bytes",
               "The most device memory in use on this GPU over the last --peak-window (default 30s).",
               D, DEVICE, registered_by=_WATCH),
    MetricSpec("gpu_stalled", GAUGE, "",
               "1 while the GPU is stalled: busy with no work (a kernel resident, no tensor or DRAM activity, no "
               "PCIe or NVLink traffic, power far under its limit, clocks not held down) for --stall-after, as a "
               "training job's wedged collective looks (docs/TRAINING.md); 0 for every other GPU the agent reads. "
               "Absent with --stall-after off.",
               D, DEVICE, registered_by=_STALL),
    MetricSpec("gpu_stalled_seconds_total", COUNTER, "seconds",
               "Seconds the GPU spent in stalls, each counted from when its signature began once it is declared "
               "(so a stall adds --stall-after at once, then one second per second).",
               D, DEVICE, registered_by=_STALL),
    MetricSpec("container_gpu_stalled", GAUGE, "",
               "1 while the GPU this workload holds is stalled (gpu_stalled), else 0: count a training job's "
               "stalled ranks by its workload labels.",
               W, WORKLOAD, registered_by=_STALL),
    MetricSpec("l9gpu_kernel_log_records_total", COUNTER, "",
               "Kernel log records read with --kernel-log, by outcome: read, xid (an NVIDIA Xid line), "
               "overwritten (lost before they were read), malformed, truncated.",
               ("outcome",), SELF, registered_by=_WATCH),
    MetricSpec("l9gpu_kubernetes_events_total", COUNTER, "",
               "Kubernetes Events about GPU incidents (on pods) and GPU verdict changes (on the Node), by outcome: "
               "posted, aggregated (a repeat patched into its Event), rate_limited, queue_full, forbidden (403), throttled (429 or 503: posting pauses for its "
               "Retry-After), failed.",
               ("outcome",), SELF, registered_by=_WATCH),
    MetricSpec("l9gpu_kubernetes_node_updates_total", COUNTER, "",
               "Requests that write this node's GPU condition and taint on its Node, by outcome: updated, "
               "forbidden (403), conflict (409), throttled (429 or 503), server_error, timeout, failed. Present "
               "only where the agent writes the node condition.",
               ("outcome",), SELF, registered_by="exporter.nodestatus"),
    MetricSpec("l9gpu_otlp_exports_total", COUNTER, "",
               "OTLP pushes by result (success, failure); a failed batch is dropped, not retried later. "
               "Present only while OTLP push is on.",
               ("result",), SELF, registered_by="the OTLP push (bridge.push)"),
)


# Families a part registers on the registry itself instead of `render` building them from
# the snapshot (their rows' `registered_by`).
REGISTERED_ELSEWHERE: frozenset[str] = frozenset(spec.name for spec in METRICS if spec.registered_by)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in METRICS}


def get(name: str) -> MetricSpec:
    """Return the spec of a family by name (KeyError when unknown)."""
    return BY_NAME[name]


def enabled_names(enable: Iterable[str] = (), disable: Iterable[str] = ()) -> frozenset[str]:
    """The families to export: defaults, plus ``enable``, minus ``disable``.

    Raises:
        ValueError: naming an unknown family.
    """
    enable, disable = list(enable), list(disable)
    for name in enable + disable:
        if name not in BY_NAME:
            raise ValueError(f"unknown metric {name!r} (see docs/METRICS.md)")
    names = {spec.name for spec in METRICS if spec.default_enabled}
    return frozenset((names | set(enable)) - set(disable))


if __name__ == "__main__":
    from exporter.output.metrics_doc import markdown

    sys.stdout.write(markdown())
