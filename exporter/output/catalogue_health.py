"""The health families of the catalogue: the verdict and the raw signals it is made from.

Each row carries what renders it (an extractor of `exporter.output.render_health`) and the
dcgm-exporter fields served from its series (`DcgmAlias`, with their unit factor), so adding
a health family is an edit of its row here: `exporter.output.catalogue` takes the rows as
they are, `render` and the DCGM schema (`exporter.output.dcgm.fields`) read them. The verdict
families are modelled as kube-state-metrics models a state: one series per state (or action)
of a fixed set, 1 for the current one, 0 for the others; one series per active reason, value
1. The signal families exist only where the last health read reported the value: absent,
never 0, where the GPU, its mode or its driver does not (docs/HEALTH.md).
"""

from __future__ import annotations

from exporter.core.labels import DEVICE_LABELS
from exporter.output.extract import Extractor, PerDevice, by_device
from exporter.output.render_health import count, flag, seconds, signal, signals, transitions, verdict
from exporter.output.spec import COUNTER, GAUGE, HEALTH, DcgmAlias, MetricSpec

# dcgm-exporter's violation times are microseconds (its etc/dcp-metrics-included.csv:
# "Throttling duration due to power constraints (in us)").
US_PER_SECOND = 1e6
# NVLink data-link error counters, in NVML's order (`gpu_nvlink_errors_total{type}`).
NVLINK_ERRORS: tuple[str, ...] = ("replay", "recovery", "crc_flit", "crc_data")


def _verdict(name: str, kind: str, unit: str, labels: tuple[str, ...], text: str, extract: Extractor) -> MetricSpec:
    """A family of the verdict: every GPU has one, up or down."""
    return MetricSpec(name, kind, unit, text, DEVICE_LABELS + labels, HEALTH, extract)


def _signal(name: str, kind: str, unit: str, labels: tuple[str, ...], text: str, extract: PerDevice,
            *dcgm: DcgmAlias) -> MetricSpec:
    """A family of the last health read, and the DCGM fields served from it (the first is the
    nearest, named in docs/METRICS.md)."""
    return MetricSpec(name, kind, unit, text, DEVICE_LABELS + labels, HEALTH, extract,
                      vendors_note="absent where the GPU or its driver does not report it", dcgm_fields=dcgm)


HEALTH_FAMILIES: tuple[MetricSpec, ...] = (
    _verdict("gpu_health", GAUGE, "", ("state",),
             "The GPU's health verdict: one series per state (healthy, degraded, unhealthy), 1 for the current "
             "one, 0 for the others. A MIG instance has its parent GPU's. Why: gpu_health_reason; what to do: "
             "gpu_health_action (docs/HEALTH.md).",
             verdict(lambda v: (((state,), float(value)) for state, value in v.state_values()))),
    _verdict("gpu_health_action", GAUGE, "", ("action",),
             "What the verdict asks for: one series per action (none, restart_app, reset_gpu, reboot_node, "
             "drain_and_reset, inspect_hardware, contact_support), 1 for the verdict's, 0 for the others.",
             verdict(lambda v: (((action,), float(value)) for action, value in v.action_values()))),
    _verdict("gpu_health_reason", GAUGE, "", ("reason",),
             "1 for each reason the verdict is not healthy (row_remap_pending, pcie_downgraded, nvlink_errors, "
             "xid_<code>, stuck_in_driver_call, ...; the bounded set is in docs/HEALTH.md); no series for a "
             "reason that is not active.",
             verdict(lambda v: (((reason,), 1.0) for reason in dict.fromkeys(v.reason_names)))),
    _verdict("gpu_health_transitions_total", COUNTER, "", (),
             "How often the verdict's state changed since the agent started (for GPUHealthFlapping).",
             PerDevice(transitions)),
    _verdict("gpu_unhealthy_seconds_total", COUNTER, "seconds", (),
             "Capacity-seconds of this device during which its verdict was unhealthy (as "
             "gpu_capacity_seconds_total counts them): the GPU time a team claims back from its cloud provider.",
             by_device(lambda snapshot: snapshot.device_unhealthy_seconds)),
    _signal("gpu_row_remap_pending", GAUGE, "", (),
            "1 while a memory row waits for a GPU reset to be remapped, 0 when none does.",
            signal(lambda s: s.row_remap and s.row_remap.pending, flag)),
    _signal("gpu_row_remap_failure", GAUGE, "", (),
            "1 if a memory row remap has failed (sticky in the InfoROM: an RMA criterion), else 0.",
            signal(lambda s: s.row_remap and s.row_remap.failure, flag),
            DcgmAlias("DCGM_FI_DEV_ROW_REMAP_FAILURE", GAUGE, "0/1")),
    _signal("gpu_remapped_rows_total", COUNTER, "", ("type",),
            "Memory rows remapped over the board's life, by the errors that caused it (correctable, uncorrectable).",
            signals(lambda s: (((kind,), getattr(s.row_remap, kind)) for kind in ("correctable", "uncorrectable"))
                    if s.row_remap else (), count),
            DcgmAlias("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", COUNTER, "rows", where=(("type", "uncorrectable"),)),
            DcgmAlias("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", COUNTER, "rows", where=(("type", "correctable"),))),
    _signal("gpu_pcie_link_generation", GAUGE, "", (),
            "The PCIe link's current generation (links train down at idle to save power).",
            signal(lambda s: s.pcie and s.pcie.generation, count)),
    _signal("gpu_pcie_link_generation_max", GAUGE, "", (),
            "The highest PCIe generation the GPU and its slot support together.",
            signal(lambda s: s.pcie and s.pcie.generation_max, count)),
    _signal("gpu_pcie_link_width", GAUGE, "", (), "The PCIe link's current width in lanes.",
            signal(lambda s: s.pcie and s.pcie.width, count)),
    _signal("gpu_pcie_link_width_max", GAUGE, "", (), "The PCIe link's maximum width in lanes.",
            signal(lambda s: s.pcie and s.pcie.width_max, count)),
    _signal("gpu_pcie_replays_total", COUNTER, "", (),
            "PCIe link-level retries (replays) over the board's life.",
            signal(lambda s: s.pcie and s.pcie.replays, count),
            DcgmAlias("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", COUNTER, "replays")),
    _signal("gpu_nvlink_up", GAUGE, "", ("link",), "1 while the NVLink link is up, 0 while it is down.",
            signals(lambda s: (((str(link.link),), link.up) for link in s.nvlinks), flag)),
    _signal("gpu_nvlink_errors_total", COUNTER, "", ("link", "type"),
            "NVLink data-link errors per link, by type (replay, recovery, crc_flit, crc_data).",
            signals(lambda s: (((str(link.link), kind), getattr(link, kind)) for link in s.nvlinks
                               for kind in NVLINK_ERRORS), count),
            *(DcgmAlias(field, COUNTER, "errors", where=(("type", kind),)) for field, kind in (
                ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "replay"),
                ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "crc_flit"),
                ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "crc_data"),
                ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "recovery")))),
    _signal("gpu_violation_seconds_total", COUNTER, "seconds", ("reason",),
            "Seconds the clocks were held down, by policy (power, thermal, reliability, board_limit, sync_boost, "
            "low_utilization), as the driver counts them.",
            signals(lambda s: (((reason,), value) for reason, value in s.violations.items()) if s.violations else (),
                    seconds),
            *(DcgmAlias(field, COUNTER, "µs", US_PER_SECOND, where=(("reason", reason),)) for field, reason in (
                ("DCGM_FI_DEV_POWER_VIOLATION", "power"), ("DCGM_FI_DEV_THERMAL_VIOLATION", "thermal"),
                ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "sync_boost"),
                ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "board_limit"),
                ("DCGM_FI_DEV_LOW_UTIL_VIOLATION", "low_utilization"),
                ("DCGM_FI_DEV_RELIABILITY_VIOLATION", "reliability")))),
)
