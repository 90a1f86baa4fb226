"""What each metric family means on each vendor's GPUs, for docs/METRICS.md's "Per vendor" table.

Notes are keyed by vendor, as `DeviceSample.vendor` names it; a vendor a family has no note
for cannot provide it (the table shows "—" and its series are absent, never 0). A new
vendor is a column in `VENDORS` and a note on the families it provides; a family whose meaning
does not differ by vendor needs no note. Docs only: nothing here changes what is served.
"""

from __future__ import annotations

from exporter.output.catalogue import GPM_FAMILIES

# vendor (`DeviceSample.vendor`) -> its column's title, in the table's order
VENDORS: dict[str, str] = {
    "nvidia": "NVIDIA (`nvml`)",
    "amd": "AMD (`amd`, amdsmi)",
    "gaudi": "Intel Gaudi (`gaudi`, hl-smi)",
}
# what a vendor cannot provide
NOT_PROVIDED = "—"

# family -> vendor -> what the family means there, in the table's order
NOTES: dict[str, dict[str, str]] = {
    "gpu_info": {
        "nvidia": "`vendor=\"nvidia\"`; `pci_bus_id` from NVML; `serial` board serial",
        "amd": "`vendor=\"amd\"`; `pci_bus_id` is the AMD device plugin's device id; `serial` ASIC serial",
        "gaudi": "`vendor=\"gaudi\"`; `serial` is the Habana device plugin's device id",
    },
    "gpu_up": {
        "nvidia": "device handle readable",
        "amd": "any amdsmi read succeeds",
        "gaudi": "device listed by hl-smi",
    },
    "gpu_stuck_call_seconds": {
        "nvidia": "an NVML call about this GPU past the read timeout (1 s)",
        "amd": "an amdsmi call past the read timeout (the backend is read as one part: every AMD GPU)",
        "gaudi": "hl-smi or the /proc scan past `--hl-smi-timeout` plus 5 s (every device)",
    },
    "gpu_utilization_ratio": {
        "nvidia": "NVML GPU utilisation (kernel running)",
        "amd": "`gfx_activity` (graphics/compute engine busy)",
        "gaudi": "`utilization.aip` (AIP busy)",
    },
    "gpu_memory_utilization_ratio": {
        "nvidia": "NVML memory-controller utilisation",
        "amd": "`umc_activity` (memory controller busy)",
    },
    "gpu_memory_used_bytes": {
        "nvidia": "framebuffer used",
        "amd": "VRAM used",
        "gaudi": "HBM used (`memory.used`, MiB converted)",
    },
    "gpu_memory_total_bytes": {
        "nvidia": "framebuffer total",
        "amd": "VRAM total",
        "gaudi": "HBM total (`memory.total`, MiB converted)",
    },
    "gpu_temperature_celsius": {
        "nvidia": "GPU die",
        "amd": "junction (hotspot) sensor, edge where there is none",
        "gaudi": "`temperature.aip`",
    },
    "gpu_memory_temperature_celsius": {"nvidia": "HBM (data-centre cards)", "amd": "VRAM (HBM) sensor"},
    "gpu_power_watts": {
        "nvidia": "board power",
        "amd": "socket power (current on MI300+, average before)",
        "gaudi": "`power.draw`",
    },
    "gpu_power_limit_watts": {"nvidia": "enforced limit", "amd": "`power_limit`"},
    "gpu_energy_joules_total": {
        "nvidia": "NVML energy counter, read every 30 s; in between, integrated power is added (never decreasing; "
            "within 1% of the counter)",
        "amd": "amdsmi energy accumulator",
        "gaudi": "integrated from `power.draw`",
    },
    "gpu_sm_clock_hertz": {"nvidia": "SM clock", "amd": "GFX clock"},
    "gpu_memory_clock_hertz": {"nvidia": "memory clock", "amd": "memory (MEM) clock"},
    "gpu_pcie_tx_bytes_total": {
        "nvidia": "field value `PCIE_COUNT_TX_BYTES` (driver counter); absent where the field is NOT_SUPPORTED "
            "(older drivers): the blocking PCIe throughput call is never made, so there is no PCIe series "
            "there",
    },
    "gpu_pcie_rx_bytes_total": {
        "nvidia": "field value `PCIE_COUNT_RX_BYTES` (driver counter); absent where the field is NOT_SUPPORTED, as "
            "for tx",
    },
    "gpu_fan_speed_ratio": {"nvidia": "fan speed (cards with fans)"},
    "gpu_ecc_errors_total": {
        "nvidia": "aggregate ECC counts (kept across driver reloads, read every 10 s)",
        "amd": "RAS total correctable/uncorrectable counts",
    },
    "gpu_xid_errors_total": {"nvidia": "XID events"},
    "gpu_clock_throttle_active": {"nvidia": "clock event reasons"},
    "container_gpu_memory_used_bytes": {
        "nvidia": "per-process used memory",
        "amd": "per-process VRAM (`vram_mem`)",
        "gaudi": "— (hl-smi has no per-process memory)",
    },
    "container_gpu_utilization_ratio": {
        "nvidia": "per-process SM samples",
        "amd": "per-process GFX engine time over the interval",
        "gaudi": "— (no per-process utilisation)",
    },
    "container_gpu_processes": {
        "nvidia": "NVML compute and graphics processes",
        "amd": "amdsmi process list",
        "gaudi": "processes holding `/dev/accel/accel<N>` open",
    },
    "container_gpu_idle_seconds": {
        "nvidia": "memory held or GPU allocated at 0 SM; MIG: allocated with no process only",
        "amd": "VRAM held or GPU allocated at 0 GFX time",
        "gaudi": "allocated with no process only",
    },
    "container_gpu_usage_seconds_total": {"nvidia": "integral of SM share", "amd": "integral of GFX-time share"},
    "container_gpu_allocation_seconds_total": {
        "nvidia": "replicas held of those allocatable (GPU or MIG UUID, time-slicing `::<n>`), else share of the "
            "memory held",
        "amd": "allocated (PCI bus id), else share of the VRAM held",
        "gaudi": "allocated (serial), else an equal share among the processes holding `/dev/accel/accel<N>` open",
    },
    "gpu_capacity_seconds_total": {
        "nvidia": "wall time; a MIG instance its compute slices' share (NVML device attributes), the parent the "
            "slices in no instance",
        "amd": "wall time",
        "gaudi": "wall time",
    },
    "gpu_unallocated_seconds_total": {
        "nvidia": "free replicas, no holder, or the GPU down",
        "amd": "no holder, or the GPU down",
        "gaudi": "no holder, or the device down",
    },
    "container_gpu_allocated": {
        "nvidia": "`nvidia.com/gpu` and MIG resources: `GPU-<uuid>` (time-slicing `::<n>` replicas: one series per "
            "container) or `MIG-<uuid>`",
        "amd": "`amd.com/gpu`: the PCI bus id",
        "gaudi": "`habana.ai/gaudi`: the device serial",
    },
    "container_gpu_energy_joules_total": {
        "nvidia": "split by SM and memory share",
        "amd": "split by GFX and VRAM share",
        "gaudi": "split equally among the processes holding the device",
    },
    "gpu_process_memory_used_bytes": {"nvidia": "as NVML reports", "amd": "`vram_mem`"},
    "gpu_process_utilization_ratio": {
        "nvidia": "NVML per-process SM samples",
        "amd": "GFX engine time over the interval",
    },
    **{f"gpu_{name}": {"nvidia": f"GPM `{key}`, Hopper and newer; per MIG instance in MIG mode"}
       for key, name, _, _ in GPM_FAMILIES},
    "gpu_health": {"nvidia": "every GPU; MIG instances inherit", "amd": "every GPU", "gaudi": "every device"},
    "gpu_health_action": {"nvidia": "every GPU", "amd": "every GPU", "gaudi": "every device"},
    "gpu_health_reason": {
        "nvidia": "every reason of docs/HEALTH.md",
        "amd": "ECC, pages, PCIe, XGMI, stuck calls",
        "gaudi": "pending rows, PCIe, stuck calls",
    },
    "gpu_health_transitions_total": {"nvidia": "every GPU", "amd": "every GPU", "gaudi": "every device"},
    "gpu_unhealthy_seconds_total": {
        "nvidia": "every GPU and MIG instance",
        "amd": "every GPU",
        "gaudi": "every device",
    },
    "gpu_row_remap_pending": {
        "nvidia": "`nvmlDeviceGetRemappedRows` (Ampere and newer; absent in MIG mode where NOT_SUPPORTED)",
        "gaudi": "pending rows",
    },
    "gpu_row_remap_failure": {"nvidia": "`nvmlDeviceGetRemappedRows`"},
    "gpu_remapped_rows_total": {"nvidia": "`nvmlDeviceGetRemappedRows`"},
    "gpu_pcie_link_generation": {
        "nvidia": "`nvmlDeviceGetCurrPcieLinkGeneration`",
        "amd": "from `amdsmi_get_pcie_info` speed",
        "gaudi": "hl-smi `pcie.link.gen.current`",
    },
    "gpu_pcie_link_generation_max": {"nvidia": "`nvmlDeviceGetMaxPcieLinkGeneration`", "amd": "from the maximum speed"},
    "gpu_pcie_link_width": {
        "nvidia": "`nvmlDeviceGetCurrPcieLinkWidth`",
        "amd": "`pcie_width`",
        "gaudi": "hl-smi `pcie.link.width.current`",
    },
    "gpu_pcie_link_width_max": {"nvidia": "`nvmlDeviceGetMaxPcieLinkWidth`", "amd": "`max_pcie_width`"},
    "gpu_pcie_replays_total": {"nvidia": "field `NVML_FI_DEV_PCIE_REPLAY_COUNTER`", "amd": "`pcie_replay_count_acc`"},
    "gpu_nvlink_up": {"nvidia": "`nvmlDeviceGetNvLinkState` per link"},
    "gpu_nvlink_errors_total": {
        "nvidia": "`nvmlDeviceGetNvLinkErrorCounter` per link",
        "amd": "— (XGMI: one status flag)",
    },
    "gpu_violation_seconds_total": {
        "nvidia": "the `NVML_FI_DEV_PERF_POLICY_*` field values, else `nvmlDeviceGetViolationStatus` (ns, converted)",
        "amd": "where amdsmi reports it",
    },
}


def note(family: str, vendor: str) -> str:
    """What ``family`` means on ``vendor``'s GPUs; `NOT_PROVIDED` where it has no note."""
    return NOTES[family].get(vendor, NOT_PROVIDED)
