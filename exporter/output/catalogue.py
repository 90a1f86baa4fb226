"""The table of every metric l9gpu exports.

Everything else derives from this table: `render` builds the families from it, the OTLP
bridge takes units and attribute names from it, and ``docs/METRICS.md`` is generated from
it (``python -m exporter.output.catalogue > docs/METRICS.md``; a test fails when the doc drifts).

Names follow the Prometheus conventions: base units in the name (``_bytes``, ``_watts``,
``_joules``, ``_celsius``, ``_hertz``, ``_seconds``), 0-1 ``_ratio`` rather than percent,
``_total`` only on counters, string facts in an ``_info`` gauge whose value is 1.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterable

# The label names and their order come from the label schema (exporter/core/labels.py).
from exporter.core.labels import DEVICE_LABELS, OWNER_LABELS, PROCESS_LABELS, WORKLOAD_ID_LABELS, WORKLOAD_LABELS
from exporter.output.catalogue_health import HEALTH_FAMILIES, HEALTH_VENDOR_NOTES

# Prometheus label key -> OpenTelemetry attribute (semantic conventions where they exist).
LABEL_ATTRIBUTES: dict[str, str] = {
    "node": "k8s.node.name",
    "gpu": "gpu.index",
    "uuid": "gpu.id",
    "model": "gpu.model",
    "vendor": "gpu.vendor",
    "gpu_instance": "gpu.mig.instance",
    "driver_version": "gpu.driver.version",
    "pci_bus_id": "gpu.pci.bus_id",
    "serial": "gpu.serial",
    "namespace": "k8s.namespace.name",
    "pod": "k8s.pod.name",
    "container": "k8s.container.name",
    "pod_uid": "k8s.pod.uid",
    "slurm_job_id": "slurm.job.id",
    "slurm_user": "slurm.user",
    "slurm_account": "slurm.account",
    "owner_kind": "k8s.workload.kind",
    "owner_name": "k8s.workload.name",
    "pid": "process.pid",
    "comm": "process.executable.name",
    "collector": "l9gpu.collector",
    "type": "gpu.ecc.type",
    "xid": "gpu.xid",
    "reason": "gpu.throttle.reason",
    "state": "gpu.health.state",
    "action": "gpu.health.action",
    "link": "gpu.nvlink.link",
    "result": "l9gpu.result",
    "backend": "l9gpu.backend",
    "version": "service.version",
}

# Prometheus unit word (as in the metric name) -> UCUM unit for OTLP.
UCUM: dict[str, str] = {
    "bytes": "By",
    "bytes_per_second": "By/s",
    "watts": "W",
    "joules": "J",
    "celsius": "Cel",
    "hertz": "Hz",
    "seconds": "s",
    "ratio": "1",
    "": "1",
}

GAUGE = "gauge"
COUNTER = "counter"
INFO = "info"  # rendered as a gauge named *_info with value 1

# Where a family's values come from; `render` has one loop per scope.
DEVICE = "device"
WORKLOAD = "workload"
WORKLOAD_GPM = "workload_gpm"  # a device's GPM values, labelled with its only workload
UNATTRIBUTED = "unattributed"
HEALTH = "health"  # the verdict and the last health read's signals (exporter.output.render_health)
PROCESS = "process"
INCIDENT = "incident"  # per workload and GPU, by kind and role (exporter.incidents.watch)
SELF = "self"


@dataclass(frozen=True)
class MetricSpec:
    """One metric family.

    Attributes:
        name: the Prometheus family name (counters include ``_total``).
        type: GAUGE, COUNTER or INFO.
        unit: the Prometheus unit word ("bytes", "watts", ...; "" for counts).
        help: the HELP text.
        labels: label names, in order.
        scope: which rows feed it (DEVICE, WORKLOAD, UNATTRIBUTED, PROCESS, SELF).
        source: attribute of the row that holds the value. For a mapping-valued
            attribute the last label takes the mapping's keys (e.g. ECC ``type``);
            ``gpm.<key>`` is one key of `DeviceSample.gpm`.
        dcgm: the nearest DCGM exporter field and the factor from our unit to its unit,
            for users moving dashboards over ("" where DCGM has none).
        default_enabled: exported unless disabled; False means opt-in.
        vendors_note: which vendors cannot provide it (docs only).
    """

    name: str
    type: str
    unit: str
    help: str
    labels: tuple[str, ...]
    scope: str
    source: str = ""
    dcgm: tuple[str, float] = ("", 1.0)
    default_enabled: bool = True
    vendors_note: str = ""

    @property
    def ucum(self) -> str:
        """The OTLP unit (UCUM) for this family."""
        return UCUM[self.unit]

    @property
    def otel_attributes(self) -> tuple[str, ...]:
        """The OTLP attribute key of each label, in label order."""
        return tuple(otel_attribute(label) for label in self.labels)


def otel_attribute(label: str) -> str:
    """Map a Prometheus label key to its OpenTelemetry attribute key.

    Pod labels copied with ``--pod-label`` (``label_team``) become ``k8s.pod.label.team``.
    """
    if label in LABEL_ATTRIBUTES:
        return LABEL_ATTRIBUTES[label]
    if label.startswith("label_"):
        return "k8s.pod.label." + label[len("label_"):]
    return label


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
                   text + _GPM_WINDOW, D, DEVICE, "gpm." + key, (dcgm, 1.0), vendors_note=_GPM_NOTE)
        for key, name, text, dcgm in GPM_FAMILIES
    )
    workload = tuple(
        MetricSpec("container_gpu_" + name, GAUGE, "ratio" if name.endswith("_ratio") else "bytes_per_second",
                   f"The device's `gpu_{name}`, labelled with the workload on a GPU or MIG instance whose "
                   "processes all belong to this one workload; absent on a shared GPU.",
                   W, WORKLOAD_GPM, "gpm." + key, (dcgm, 1.0), vendors_note=_GPM_NOTE)
        for key, name, text, dcgm in GPM_FAMILIES
    )
    return device + workload


def _health_specs() -> tuple[MetricSpec, ...]:
    return tuple(MetricSpec(name, kind, unit, text, D + extra, HEALTH, "", (dcgm, factor),
                            vendors_note="" if name.startswith(("gpu_health", "gpu_unhealthy"))
                            else "absent where the GPU or its driver does not report it")
                 for name, kind, unit, extra, text, dcgm, factor in HEALTH_FAMILIES)


METRICS: tuple[MetricSpec, ...] = (
    # ---- device -------------------------------------------------------------------
    MetricSpec("gpu_info", INFO, "", "Facts about a GPU; value is always 1.",
               D + ("vendor", "driver_version", "pci_bus_id", "serial"), DEVICE),
    MetricSpec("gpu_up", GAUGE, "", "1 if the GPU was read in the last pass, 0 if it failed (lost, driver error).",
               D, DEVICE, "up"),
    MetricSpec("gpu_stuck_call_seconds", GAUGE, "seconds",
               "How long a call into the vendor library about this GPU (label call, e.g. "
               "nvmlDeviceGetPowerUsage) has gone unanswered, in seconds. Present only while the call is "
               "past its deadline; the GPU is reported down meanwhile and the others are read without it.",
               D + ("call",), DEVICE),
    MetricSpec("gpu_utilization_ratio", GAUGE, "ratio",
               "Fraction of the last sample period during which one or more kernels ran on the GPU.",
               D, DEVICE, "utilization", ("DCGM_FI_DEV_GPU_UTIL", 100.0)),
    MetricSpec("gpu_memory_utilization_ratio", GAUGE, "ratio",
               "Fraction of the last sample period during which device memory was read or written.",
               D, DEVICE, "memory_utilization", ("DCGM_FI_DEV_MEM_COPY_UTIL", 100.0)),
    MetricSpec("gpu_memory_used_bytes", GAUGE, "bytes", "Device memory in use, in bytes.",
               D, DEVICE, "memory_used_bytes", ("DCGM_FI_DEV_FB_USED", 1.0 / 2**20)),
    MetricSpec("gpu_memory_total_bytes", GAUGE, "bytes", "Total device memory, in bytes.",
               D, DEVICE, "memory_total_bytes", ("DCGM_FI_DEV_FB_TOTAL", 1.0 / 2**20)),
    MetricSpec("gpu_temperature_celsius", GAUGE, "celsius", "GPU die temperature, in degrees Celsius.",
               D, DEVICE, "temperature_celsius", ("DCGM_FI_DEV_GPU_TEMP", 1.0)),
    MetricSpec("gpu_memory_temperature_celsius", GAUGE, "celsius", "Device memory (HBM) temperature, in degrees Celsius.",
               D, DEVICE, "memory_temperature_celsius", ("DCGM_FI_DEV_MEMORY_TEMP", 1.0),
               vendors_note="not on consumer NVIDIA cards"),
    MetricSpec("gpu_power_watts", GAUGE, "watts", "Power draw, in watts.",
               D, DEVICE, "power_watts", ("DCGM_FI_DEV_POWER_USAGE", 1.0)),
    MetricSpec("gpu_power_limit_watts", GAUGE, "watts", "Enforced power limit, in watts.",
               D, DEVICE, "power_limit_watts", ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 1.0)),
    MetricSpec("gpu_energy_joules_total", COUNTER, "joules",
               "Energy consumed by the GPU, in joules (the device counter where it has one, else integrated power).",
               D, DEVICE, "", ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1000.0)),
    MetricSpec("gpu_capacity_seconds_total", COUNTER, "seconds",
               "GPU time this device has offered since the agent started, in GPU-seconds: wall time for a "
               "whole GPU, its compute slices' share for a MIG instance (a 1g.10gb of an H100 counts 1/7), for a "
               "GPU in MIG mode the slices in no instance. Per GPU, the workloads' allocation seconds plus "
               "gpu_unallocated_seconds_total add up to it.",
               D, DEVICE, ""),
    MetricSpec("gpu_sm_clock_hertz", GAUGE, "hertz", "SM (graphics engine) clock, in hertz.",
               D, DEVICE, "sm_clock_hertz", ("DCGM_FI_DEV_SM_CLOCK", 1e-6)),
    MetricSpec("gpu_memory_clock_hertz", GAUGE, "hertz", "Memory clock, in hertz.",
               D, DEVICE, "memory_clock_hertz", ("DCGM_FI_DEV_MEM_CLOCK", 1e-6)),
    MetricSpec("gpu_pcie_tx_bytes_total", COUNTER, "bytes",
               "Bytes the GPU sent over PCIe, as the driver counts them (take rate() for throughput).",
               D, DEVICE, "pcie_tx_bytes_total", ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 1.0 / 1024),
               vendors_note="absent where the driver has no PCIe byte counters (see the per-vendor table)"),
    MetricSpec("gpu_pcie_rx_bytes_total", COUNTER, "bytes",
               "Bytes the GPU received over PCIe, as the driver counts them (take rate() for throughput).",
               D, DEVICE, "pcie_rx_bytes_total", ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", 1.0 / 1024),
               vendors_note="absent where the driver has no PCIe byte counters (see the per-vendor table)"),
    MetricSpec("gpu_fan_speed_ratio", GAUGE, "ratio", "Fan speed as a fraction of its maximum (cards with fans only).",
               D, DEVICE, "fan_speed_ratio", ("DCGM_FI_DEV_FAN_SPEED", 100.0),
               vendors_note="absent on passively cooled data-centre cards"),
    MetricSpec("gpu_ecc_errors_total", COUNTER, "", "ECC errors over the board's lifetime, by type (corrected, uncorrected).",
               D + ("type",), DEVICE, "ecc_errors", ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1.0)),
    MetricSpec("gpu_xid_errors_total", COUNTER, "", "XID error events seen since the agent started, by XID code.",
               D + ("xid",), DEVICE, "xid_errors", ("DCGM_FI_DEV_XID_ERRORS", 1.0),
               vendors_note="NVIDIA only"),
    MetricSpec("gpu_clock_throttle_active", GAUGE, "", "1 while the named reason is holding the clocks down, else 0.",
               D + ("reason",), DEVICE, "throttle_reasons", ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 1.0),
               vendors_note="NVIDIA only"),
    # ---- device: health verdict and signals (docs/HEALTH.md) -------------------------
    *_health_specs(),
    # ---- device and workload: GPM activity (Hopper and newer) ----------------------
    *_gpm_specs(),
    # ---- workload -----------------------------------------------------------------
    MetricSpec("container_gpu_memory_used_bytes", GAUGE, "bytes",
               "Device memory held by the workload's processes on this GPU, in bytes.",
               W, WORKLOAD, "memory_used_bytes", ("DCGM_FI_DEV_FB_USED", 1.0 / 2**20)),
    MetricSpec("container_gpu_utilization_ratio", GAUGE, "ratio",
               "The workload's share of this GPU's SM time over the last interval, from per-process samples.",
               W, WORKLOAD, "utilization", ("DCGM_FI_DEV_GPU_UTIL", 100.0)),
    MetricSpec("container_gpu_processes", GAUGE, "", "Number of the workload's processes on this GPU.",
               W, WORKLOAD, "processes"),
    MetricSpec("container_gpu_idle_seconds", GAUGE, "seconds",
               "How long the workload has held GPU memory, or had the GPU allocated, with zero SM utilisation "
               "(0 while it computes).",
               W, WORKLOAD, "idle_seconds"),
    MetricSpec("container_gpu_usage_seconds_total", COUNTER, "seconds",
               "Integral of the workload's SM share over time: GPU-seconds of compute.",
               W, WORKLOAD, "usage_seconds_total"),
    MetricSpec("container_gpu_allocation_seconds_total", COUNTER, "seconds",
               "The workload's share of this GPU's time, in GPU-seconds: k/N of it while it holds k of the N "
               "device-plugin replicas (a whole GPU: 1 of 1), else its share of the memory held there; a GPU's "
               "holders and its unallocated time add up to its capacity (docs/CHARGEBACK.md).",
               W, WORKLOAD, "allocation_seconds_total"),
    MetricSpec("container_gpu_allocated", GAUGE, "",
               "1 while the kubelet has this GPU allocated to the container (device plugin, pod-resources; one "
               "series per container sharing a time-sliced GPU), 0 for a pod's container running on a GPU it "
               "was not allocated. Absent where allocations are unknown (no pod-resources socket, Slurm jobs).",
               W, WORKLOAD, "allocated"),
    MetricSpec("container_gpu_energy_joules_total", COUNTER, "joules",
               "The workload's share of the GPU's energy, in joules (busy energy by SM share, idle energy by memory share).",
               W, WORKLOAD, "energy_joules_total"),
    # ---- unattributed -------------------------------------------------------------
    MetricSpec("gpu_unattributed_memory_used_bytes", GAUGE, "bytes",
               "Device memory held by GPU processes that belong to no workload (host processes, unresolved PIDs).",
               D, UNATTRIBUTED, "memory_used_bytes"),
    MetricSpec("gpu_unattributed_energy_joules_total", COUNTER, "joules",
               "Energy of this GPU that belongs to no workload: idle with no holder, or used by unattributed processes.",
               D, UNATTRIBUTED, "energy_joules_total"),
    MetricSpec("gpu_unallocated_seconds_total", COUNTER, "seconds",
               "GPU-seconds of this device's capacity that no workload held: time-slicing replicas nobody was "
               "allocated, no holder at all, or the GPU down. What the platform pays for itself.",
               D, UNATTRIBUTED, "unallocated_seconds_total"),
    # ---- per process (opt-in, for debugging) --------------------------------------
    MetricSpec("gpu_process_memory_used_bytes", GAUGE, "bytes", "Device memory held by one process, in bytes.",
               PROCESS_LABELS, PROCESS, "used_memory_bytes", default_enabled=False),
    MetricSpec("gpu_process_utilization_ratio", GAUGE, "ratio", "One process's share of the GPU's SM time over the last interval.",
               PROCESS_LABELS, PROCESS, "sm_utilization", default_enabled=False),
    # ---- self ---------------------------------------------------------------------
    MetricSpec("l9gpu_collector_success", GAUGE, "", "1 if the named collector succeeded in the last pass.",
               ("collector",), SELF),
    MetricSpec("l9gpu_collector_duration_seconds", GAUGE, "seconds", "Duration of the named collector in the last pass.",
               ("collector",), SELF),
    MetricSpec("l9gpu_backend_errors_total", COUNTER, "",
               "Errors a device backend met and survived (bad tool output, timeouts, lost devices), by reason.",
               ("backend", "reason"), SELF),
    MetricSpec("l9gpu_snapshot_age_seconds", GAUGE, "seconds", "Age of the snapshot this scrape serves.",
               (), SELF),
    MetricSpec("l9gpu_unattributed_processes", GAUGE, "", "GPU processes on this node that belong to no workload.",
               ("node",), SELF),
    MetricSpec("l9gpu_host_pids_visible", GAUGE, "",
               "1 if the agent sees the host's PIDs (GPU processes exist under --proc-root), 0 if not: then no "
               "process can be attributed; run with hostPID: true or mount the host's /proc and pass --proc-root.",
               ("node",), SELF),
    MetricSpec("l9gpu_build_info", INFO, "", "Version of the agent; value is always 1.",
               ("version", "python_version"), SELF),
    MetricSpec("l9gpu_http_rejections_total", COUNTER, "",
               "Connections and requests the agent's HTTP listener turned away, by reason: connection_limit_evicted "
               "(an idle or unfinished connection closed to admit a new one), connection_limit_refused (a new one "
               "closed, every open one busy), header_timeout (408), header_too_large (431), accept_failed (out of "
               "file descriptors), and with --web-config client_cert_not_allowed (403), rate_limited (429), "
               "auth_busy (503) and auth_failed (401).",
               ("reason",), SELF),
    MetricSpec("container_gpu_incidents_total", COUNTER, "",
               "GPU incidents this workload took part in (docs/INCIDENTS.md), by kind (memory_exhausted, xid, "
               "gpu_lost, row_remap_failure, nvlink_errors, stuck_in_driver_call) and role: caused (it raised "
               "the application Xid, or grew most before the GPU filled) or affected (it held the GPU).",
               W + ("kind", "role"), INCIDENT),
    MetricSpec("container_gpu_memory_peak_bytes", GAUGE, "bytes",
               "The most device memory the workload's processes held on this GPU over the last --peak-window "
               "(default 30s, longer than a scrape interval): a spike between two scrapes.",
               W, WORKLOAD),
    MetricSpec("gpu_memory_peak_bytes", GAUGE, "bytes",
               "The most device memory in use on this GPU over the last --peak-window (default 30s).",
               D, DEVICE),
    MetricSpec("l9gpu_kernel_log_records_total", COUNTER, "",
               "Kernel log records read with --kernel-log, by outcome: read, xid (an NVIDIA Xid line), "
               "overwritten (lost before they were read), malformed, truncated.",
               ("outcome",), SELF),
    MetricSpec("l9gpu_kubernetes_events_total", COUNTER, "",
               "Kubernetes Events about GPU incidents (on pods) and GPU verdict changes (on the Node), by outcome: "
               "posted, aggregated (a repeat patched into its Event), rate_limited, queue_full, forbidden (403), throttled (429 or 503: posting pauses for its "
               "Retry-After), failed.",
               ("outcome",), SELF),
    MetricSpec("l9gpu_kubernetes_node_updates_total", COUNTER, "",
               "Requests that write this node's GPU condition and taint on its Node, by outcome: updated, "
               "forbidden (403), conflict (409), throttled (429 or 503), server_error, timeout, failed. Present "
               "only where the agent writes the node condition.",
               ("outcome",), SELF),
    MetricSpec("l9gpu_otlp_exports_total", COUNTER, "",
               "OTLP pushes by result (success, failure); a failed batch is dropped, not retried later. "
               "Present only while OTLP push is on.",
               ("result",), SELF),
)

# Families a part registers on the registry itself instead of `render` building them from
# the snapshot (the OTLP bridge counts its own exports, the HTTP listener what it refused,
# the incident watch its incidents, peaks, kernel log records and Events).
REGISTERED_ELSEWHERE: frozenset[str] = frozenset({
    "l9gpu_otlp_exports_total", "l9gpu_http_rejections_total",
    # the incident watch's (exporter.incidents.watch): it follows the published snapshots
    "container_gpu_incidents_total", "container_gpu_memory_peak_bytes", "gpu_memory_peak_bytes",
    "l9gpu_kernel_log_records_total", "l9gpu_kubernetes_events_total",
    # the node's GPU condition (exporter.nodestatus)
    "l9gpu_kubernetes_node_updates_total",
})

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


# What each family means on each vendor (docs only): family -> (NVIDIA, AMD, Gaudi).
# "—" marks a family the vendor cannot provide; its series are then absent, never 0.
VENDORS: tuple[str, ...] = ("NVIDIA (`nvml`)", "AMD (`amd`, amdsmi)", "Intel Gaudi (`gaudi`, hl-smi)")
VENDOR_NOTES: dict[str, tuple[str, str, str]] = {
    "gpu_info": ("`vendor=\"nvidia\"`; `pci_bus_id` from NVML; `serial` board serial",
                 "`vendor=\"amd\"`; `pci_bus_id` is the AMD device plugin's device id; `serial` ASIC serial",
                 "`vendor=\"gaudi\"`; `serial` is the Habana device plugin's device id"),
    "gpu_up": ("device handle readable", "any amdsmi read succeeds", "device listed by hl-smi"),
    "gpu_stuck_call_seconds": ("an NVML call about this GPU past the read timeout (1 s)",
                               "an amdsmi call past the read timeout (the backend is read as one part: "
                               "every AMD GPU)",
                               "hl-smi or the /proc scan past `--hl-smi-timeout` plus 5 s (every device)"),
    "gpu_utilization_ratio": ("NVML GPU utilisation (kernel running)", "`gfx_activity` (graphics/compute engine busy)",
                              "`utilization.aip` (AIP busy)"),
    "gpu_memory_utilization_ratio": ("NVML memory-controller utilisation", "`umc_activity` (memory controller busy)", "—"),
    "gpu_memory_used_bytes": ("framebuffer used", "VRAM used", "HBM used (`memory.used`, MiB converted)"),
    "gpu_memory_total_bytes": ("framebuffer total", "VRAM total", "HBM total (`memory.total`, MiB converted)"),
    "gpu_temperature_celsius": ("GPU die", "junction (hotspot) sensor, edge where there is none", "`temperature.aip`"),
    "gpu_memory_temperature_celsius": ("HBM (data-centre cards)", "VRAM (HBM) sensor", "—"),
    "gpu_power_watts": ("board power", "socket power (current on MI300+, average before)", "`power.draw`"),
    "gpu_power_limit_watts": ("enforced limit", "`power_limit`", "—"),
    "gpu_energy_joules_total": ("NVML energy counter, read every 30 s; in between, integrated power is added "
                                "(never decreasing; within 1% of the counter)", "amdsmi energy accumulator", "integrated from `power.draw`"),
    "gpu_sm_clock_hertz": ("SM clock", "GFX clock", "—"),
    "gpu_memory_clock_hertz": ("memory clock", "memory (MEM) clock", "—"),
    "gpu_pcie_tx_bytes_total": ("field value `PCIE_COUNT_TX_BYTES` (driver counter); absent where the field "
                                "is NOT_SUPPORTED (older drivers): the blocking PCIe throughput call is never "
                                "made, so there is no PCIe series there", "—", "—"),
    "gpu_pcie_rx_bytes_total": ("field value `PCIE_COUNT_RX_BYTES` (driver counter); absent where the field "
                                "is NOT_SUPPORTED, as for tx", "—", "—"),
    "gpu_fan_speed_ratio": ("fan speed (cards with fans)", "—", "—"),
    "gpu_ecc_errors_total": ("aggregate ECC counts (kept across driver reloads, read every 10 s)", "RAS total correctable/uncorrectable counts", "—"),
    "gpu_xid_errors_total": ("XID events", "—", "—"),
    "gpu_clock_throttle_active": ("clock event reasons", "—", "—"),
    "container_gpu_memory_used_bytes": ("per-process used memory", "per-process VRAM (`vram_mem`)",
                                        "— (hl-smi has no per-process memory)"),
    "container_gpu_utilization_ratio": ("per-process SM samples", "per-process GFX engine time over the interval",
                                        "— (no per-process utilisation)"),
    "container_gpu_processes": ("NVML compute and graphics processes", "amdsmi process list",
                                "processes holding `/dev/accel/accel<N>` open"),
    "container_gpu_idle_seconds": ("memory held or GPU allocated at 0 SM; MIG: allocated with no process only",
                                   "VRAM held or GPU allocated at 0 GFX time",
                                   "allocated with no process only"),
    "container_gpu_usage_seconds_total": ("integral of SM share", "integral of GFX-time share", "—"),
    "container_gpu_allocation_seconds_total": ("replicas held of those allocatable (GPU or MIG UUID, "
                                               "time-slicing `::<n>`), else share of the memory held",
                                               "allocated (PCI bus id), else share of the VRAM held",
                                               "allocated (serial), else an equal share among the processes "
                                               "holding `/dev/accel/accel<N>` open"),
    "gpu_capacity_seconds_total": ("wall time; a MIG instance its compute slices' share (NVML device "
                                   "attributes), the parent the slices in no instance", "wall time", "wall time"),
    "gpu_unallocated_seconds_total": ("free replicas, no holder, or the GPU down", "no holder, or the GPU down",
                                      "no holder, or the device down"),
    "container_gpu_allocated": ("`nvidia.com/gpu` and MIG resources: `GPU-<uuid>` (time-slicing `::<n>` "
                                "replicas: one series per container) or `MIG-<uuid>`",
                                "`amd.com/gpu`: the PCI bus id", "`habana.ai/gaudi`: the device serial"),
    "container_gpu_energy_joules_total": ("split by SM and memory share", "split by GFX and VRAM share",
                                          "split equally among the processes holding the device"),
    "gpu_process_memory_used_bytes": ("as NVML reports", "`vram_mem`", "—"),
    "gpu_process_utilization_ratio": ("NVML per-process SM samples", "GFX engine time over the interval", "—"),
    **{f"gpu_{name}": (f"GPM `{key}`, Hopper and newer; per MIG instance in MIG mode", "—", "—")
       for key, name, _, _ in GPM_FAMILIES},
    **HEALTH_VENDOR_NOTES,
}

# docs/METRICS.md: what the GPM families are, where they exist and how they are read.
GPM_DOC: tuple[str, ...] = (
    "## GPM activity: how much of the GPU the kernels use",
    "",
    "`gpu_utilization_ratio` is the fraction of time *any* kernel ran: one tiny kernel keeps it at "
    "100%. The GPM families say how much of the GPU that work used, from NVML's GPU Performance "
    "Monitoring (the counters behind DCGM's `DCGM_FI_PROF_*` profiling fields, without DCGM's host "
    "engine). Checked on an H200 with a bf16 matmul job at a ~60% duty cycle: utilisation 0.65, "
    "graphics active 0.59, SM active 0.55, SM occupancy 0.08, tensor active 0.53, DRAM 0.11.",
    "",
    "- **Which GPUs.** NVIDIA Hopper and newer (H100, H200, H800, GH200, B100, B200, GB200) with a "
    "driver and an nvidia-ml-py that have GPM. On older GPUs (A100, A10, L4, L40, V100, T4, ...) "
    "the families are absent, the reason is logged once at start and `l9gpu snapshot` shows it. "
    "AMD and Gaudi: absent.",
    "- **Window.** Each value is the average between two GPM samples of the device, taken "
    "`--gpm-interval` apart (default 5 s; `0` samples every pass, `off` turns GPM off). The first "
    "value appears one window after start; between samples the last window's values stay.",
    "- **MIG.** In MIG mode each MIG instance (`gpu_instance` label) has its own values; the parent "
    "GPU has none.",
    "- **A metric a device does not report** (NVLink on a card without it) is absent, never 0.",
    "- **Per workload.** `container_gpu_*` copies of these families exist only on a GPU or MIG "
    "instance whose processes all belong to one workload: GPM counts the whole device and cannot "
    "be split by process, so on a shared (time-sliced) GPU only the device series and each pod's "
    "`container_gpu_utilization_ratio` exist (see docs/ATTRIBUTION.md).",
    "",
)


def _fmt_scale(scale: float) -> str:
    if scale == 1.0:
        return ""
    if scale == 1.0 / 1024:
        return " (÷ 1024, KB)"
    if scale == 1.0 / 2**20:
        return " (÷ 2^20, MiB)"
    if scale == 1.0 / 1024:
        return " (÷ 1024, KB/s)"
    return f" (× {scale:g})"


# docs/METRICS.md's sections, one per scope, in this order. `markdown` refuses a family
# whose scope has none, so no family can be left out of the reference.
SECTIONS: dict[str, str] = {
    DEVICE: "Device",
    HEALTH: "Health (per GPU; a MIG instance has its parent's; see docs/HEALTH.md)",
    WORKLOAD: "Workload",
    WORKLOAD_GPM: "Workload: GPM activity on a GPU or MIG instance used by one workload",
    INCIDENT: "Incidents (per workload and GPU; see docs/INCIDENTS.md)",
    UNATTRIBUTED: "Unattributed (per GPU)",
    PROCESS: "Per process (opt-in: `--process-metrics`)",
    SELF: "Agent self-metrics",
}


def _dcgm_section() -> list[str]:
    """The series `--metric-schema dcgm` serves, from the DCGM field table (exporter/output/dcgm/fields.py)."""
    from exporter.output.dcgm import fields as dcgm

    out = ["## DCGM-compatible names (`--metric-schema dcgm`)", "",
           "Served instead of (or, with `--metric-schema l9gpu,dcgm`, beside) the families above, with "
           "dcgm-exporter's units and labels; the labels, the per-workload series and the fields left out are "
           "in docs/MIGRATING-FROM-DCGM.md.", "",
           "| name | type | unit | from l9gpu |", "|---|---|---|---|"]
    out += [f"| `{field.name}` | {field.type} | {field.unit or '—'} | {field.l9gpu} |"
            for field in dcgm.FIELDS if field.type != "label"]
    return out + [""]


def _runtime_section() -> list[str]:
    """The agent process's own families, from the prometheus_client collectors it registers
    beside its own (exporter/app/wiring.py): CPU, memory and file descriptors, the Python runtime."""
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    families = sorted(registry.collect(), key=lambda family: family.name)
    out = ["## The agent process (prometheus_client)", "", "| name | type | description |", "|---|---|---|"]
    out += [f"| `{family.name}{'_total' if family.type == COUNTER else ''}` | {family.type} | "
            f"{family.documentation} |" for family in families]
    return out + [""]


def markdown() -> str:
    """Render the catalogue as docs/METRICS.md."""
    out = [
        "# Metrics",
        "",
        "Generated from `exporter/output/catalogue.py` by `python -m exporter.output.catalogue > docs/METRICS.md`;",
        "do not edit by hand (a test fails when this file and the catalogue disagree).",
        "",
        "Every GPU series carries `" + "`, `".join(DEVICE_LABELS) + "`; workload series add `"
        + "`, `".join(WORKLOAD_ID_LABELS) + "` (empty where not applicable), plus `"
        + "`, `".join(OWNER_LABELS[:-1]) + "`, `" + OWNER_LABELS[-1] + "` and `label_<key>` when configured. Values a "
        "device cannot provide are omitted, never exported as 0.",
        "",
    ]
    untitled = sorted({spec.scope for spec in METRICS} - set(SECTIONS))
    if untitled:  # every family is listed: a new scope needs its section
        raise ValueError(f"docs/METRICS.md has no section for the families of scope {untitled}")
    for scope, title in SECTIONS.items():
        out += [f"## {title}", "", "| name | type | unit (OTLP) | labels | description | DCGM exporter equivalent |",
                "|---|---|---|---|---|---|"]
        for spec in METRICS:
            if spec.scope != scope:
                continue
            base = {DEVICE: D, HEALTH: D, WORKLOAD: W, WORKLOAD_GPM: W, INCIDENT: W,
                    PROCESS: PROCESS_LABELS}.get(scope, ())
            extra = spec.labels[len(base):] if base and spec.labels[: len(base)] == base else spec.labels
            labels = {DEVICE: "device", HEALTH: "device", WORKLOAD: "workload", WORKLOAD_GPM: "workload",
                      INCIDENT: "workload", PROCESS: "workload"}.get(scope, "")
            label_text = ", ".join(filter(None, [f"*{labels}*" if labels else ""] + [f"`{x}`" for x in extra]))
            dcgm = f"`{spec.dcgm[0]}`{_fmt_scale(spec.dcgm[1])}" if spec.dcgm[0] else ""
            help_text = spec.help + (f" Note: {spec.vendors_note}." if spec.vendors_note else "")
            out.append(f"| `{spec.name}` | {spec.type} | {spec.ucum} | {label_text} | {help_text} | {dcgm} |")
        out.append("")
    out += _dcgm_section() + _runtime_section()
    out += list(GPM_DOC)
    out += ["## Per vendor", "", "What each family means on each backend; \u2014 where the vendor cannot provide it "
            "(the series is absent, never 0).", "", "| family | " + " | ".join(VENDORS) + " |",
            "|---|" + "---|" * len(VENDORS)]
    out += [f"| `{name}` | " + " | ".join(texts) + " |" for name, texts in VENDOR_NOTES.items()]
    out += [""]
    out += ["## OTLP attribute names", "", "| Prometheus label | OTLP attribute |", "|---|---|"]
    out += [f"| `{k}` | `{v}` |" for k, v in LABEL_ATTRIBUTES.items()]
    out += ["| `label_<key>` | `k8s.pod.label.<key>` |", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(markdown())
