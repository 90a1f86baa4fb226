"""The health families of the catalogue: the verdict and the raw signals it is made from.

`exporter.output.catalogue` builds its `MetricSpec` rows from `HEALTH_FAMILIES` (scope ``health``,
rendered by `exporter.output.render_health`); the per-vendor notes join the catalogue's. The
verdict families are modelled as kube-state-metrics models a state: one series per state
(or action) of a fixed set, 1 for the current one, 0 for the others; one series per active
reason, value 1. The signal families exist only where the last health read reported the
value: absent, never 0, where the GPU, its mode or its driver does not (docs/HEALTH.md).
"""

from __future__ import annotations

# name, type ("gauge"/"counter"), unit word, labels after the device labels, help, DCGM field, factor
HEALTH_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...], str, str, float], ...] = (
    ("gpu_health", "gauge", "", ("state",),
     "The GPU's health verdict: one series per state (healthy, degraded, unhealthy), 1 for the current one, "
     "0 for the others. A MIG instance has its parent GPU's. Why: gpu_health_reason; what to do: "
     "gpu_health_action (docs/HEALTH.md).", "", 1.0),
    ("gpu_health_action", "gauge", "", ("action",),
     "What the verdict asks for: one series per action (none, restart_app, reset_gpu, reboot_node, "
     "drain_and_reset, inspect_hardware, contact_support), 1 for the verdict's, 0 for the others.", "", 1.0),
    ("gpu_health_reason", "gauge", "", ("reason",),
     "1 for each reason the verdict is not healthy (row_remap_pending, pcie_downgraded, nvlink_errors, "
     "xid_<code>, stuck_in_driver_call, ...; the bounded set is in docs/HEALTH.md); no series for a "
     "reason that is not active.", "", 1.0),
    ("gpu_health_transitions_total", "counter", "", (),
     "How often the verdict's state changed since the agent started (for GPUHealthFlapping).", "", 1.0),
    ("gpu_unhealthy_seconds_total", "counter", "seconds", (),
     "Capacity-seconds of this device during which its verdict was unhealthy (as gpu_capacity_seconds_total "
     "counts them): the GPU time a team claims back from its cloud provider.", "", 1.0),
    ("gpu_row_remap_pending", "gauge", "", (),
     "1 while a memory row waits for a GPU reset to be remapped, 0 when none does.", "", 1.0),
    ("gpu_row_remap_failure", "gauge", "", (),
     "1 if a memory row remap has failed (sticky in the InfoROM: an RMA criterion), else 0.",
     "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0),
    ("gpu_remapped_rows_total", "counter", "", ("type",),
     "Memory rows remapped over the board's life, by the errors that caused it (correctable, uncorrectable).",
     "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0),
    ("gpu_pcie_link_generation", "gauge", "", (),
     "The PCIe link's current generation (links train down at idle to save power).", "", 1.0),
    ("gpu_pcie_link_generation_max", "gauge", "", (),
     "The highest PCIe generation the GPU and its slot support together.", "", 1.0),
    ("gpu_pcie_link_width", "gauge", "", (), "The PCIe link's current width in lanes.", "", 1.0),
    ("gpu_pcie_link_width_max", "gauge", "", (), "The PCIe link's maximum width in lanes.", "", 1.0),
    ("gpu_pcie_replays_total", "counter", "", (),
     "PCIe link-level retries (replays) over the board's life.", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0),
    ("gpu_nvlink_up", "gauge", "", ("link",), "1 while the NVLink link is up, 0 while it is down.", "", 1.0),
    ("gpu_nvlink_errors_total", "counter", "", ("link", "type"),
     "NVLink data-link errors per link, by type (replay, recovery, crc_flit, crc_data).",
     "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 1.0),
    ("gpu_violation_seconds_total", "counter", "seconds", ("reason",),
     "Seconds the clocks were held down, by policy (power, thermal, reliability, board_limit, sync_boost, "
     "low_utilization), as the driver counts them.", "DCGM_FI_DEV_POWER_VIOLATION", 1e6),
)

HEALTH_VENDOR_NOTES: dict[str, tuple[str, str, str]] = {
    "gpu_health": ("every GPU; MIG instances inherit", "every GPU", "every device"),
    "gpu_health_action": ("every GPU", "every GPU", "every device"),
    "gpu_health_reason": ("every reason of docs/HEALTH.md", "ECC, pages, PCIe, XGMI, stuck calls",
                          "pending rows, PCIe, stuck calls"),
    "gpu_health_transitions_total": ("every GPU", "every GPU", "every device"),
    "gpu_unhealthy_seconds_total": ("every GPU and MIG instance", "every GPU", "every device"),
    "gpu_row_remap_pending": ("`nvmlDeviceGetRemappedRows` (Ampere and newer; absent in MIG mode where "
                              "NOT_SUPPORTED)", "—", "pending rows"),
    "gpu_row_remap_failure": ("`nvmlDeviceGetRemappedRows`", "—", "—"),
    "gpu_remapped_rows_total": ("`nvmlDeviceGetRemappedRows`", "—", "—"),
    "gpu_pcie_link_generation": ("`nvmlDeviceGetCurrPcieLinkGeneration`", "from `amdsmi_get_pcie_info` speed",
                                 "hl-smi `pcie.link.gen.current`"),
    "gpu_pcie_link_generation_max": ("`nvmlDeviceGetMaxPcieLinkGeneration`", "from the maximum speed", "—"),
    "gpu_pcie_link_width": ("`nvmlDeviceGetCurrPcieLinkWidth`", "`pcie_width`", "hl-smi `pcie.link.width.current`"),
    "gpu_pcie_link_width_max": ("`nvmlDeviceGetMaxPcieLinkWidth`", "`max_pcie_width`", "—"),
    "gpu_pcie_replays_total": ("field `NVML_FI_DEV_PCIE_REPLAY_COUNTER`", "`pcie_replay_count_acc`", "—"),
    "gpu_nvlink_up": ("`nvmlDeviceGetNvLinkState` per link", "—", "—"),
    "gpu_nvlink_errors_total": ("`nvmlDeviceGetNvLinkErrorCounter` per link", "— (XGMI: one status flag)", "—"),
    "gpu_violation_seconds_total": ("`nvmlDeviceGetViolationStatus` (ns, converted)", "where amdsmi reports it",
                                    "—"),
}
