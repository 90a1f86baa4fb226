"""The health families of the catalogue: the verdict and the raw signals it is made from.

Each row carries what renders it (an extractor of `exporter.output.render_health`) and the
dcgm-exporter fields served from its series (`DcgmAlias`, with their unit factor), so adding
a health family is an edit of its row here: `exporter.output.catalogue` takes the rows as
they are, `render` and the DCGM schema (`exporter.output.dcgm.fields`) read them. The verdict
families are a state set: by default only the current state (or action) is served, value 1,
and ``--detail`` serves every state of the fixed set with 0 for the others, as
kube-state-metrics does; one series per active reason, value 1. The signal families exist
only where the last health read reported the value: absent, never 0, where the GPU, its mode
or its driver does not (docs/HEALTH.md); each row's shape says what the default leaves out.
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


# What the default output's shape of a family costs (`MetricSpec.cost`, docs/METRICS.md).
STATE_SET = ("only the current {what} is served (value 1), as a series whose label says it: the others are "
             "0 and cost a series each per GPU. Queries compare with `== 1` or test that a series exists; "
             "`--detail` serves every {what} with 0 or 1, as kube-state-metrics does.")
FLAG_SET = ("served only while it is 1: a healthy GPU pays no series for it; absent means not set or not "
            "reported (`--detail` serves the 0, telling the two apart). Alerts read `== 1`.")


def _verdict(name: str, kind: str, unit: str, labels: tuple[str, ...], text: str, extract: Extractor,
             sparse: bool = False, cost: str = "") -> MetricSpec:
    """A family of the verdict: every GPU has one, up or down."""
    return MetricSpec(name, kind, unit, text, DEVICE_LABELS + labels, HEALTH, extract, sparse=sparse, cost=cost)


def _signal(name: str, kind: str, unit: str, labels: tuple[str, ...], text: str, extract: PerDevice,
            *dcgm: DcgmAlias, summed: tuple[str, ...] = (), sparse: bool = False, detail: bool = False,
            cost: str = "") -> MetricSpec:
    """A family of the last health read, and the DCGM fields served from it (the first is the
    nearest, named in docs/METRICS.md); ``summed``, ``sparse``, ``detail`` and ``cost``: its
    default output (`MetricSpec`). The DCGM fields read every series, whatever the shape."""
    return MetricSpec(name, kind, unit, text, DEVICE_LABELS + labels, HEALTH, extract,
                      vendors_note="absent where the GPU or its driver does not report it", dcgm_fields=dcgm,
                      summed=summed, sparse=sparse, detail=detail, cost=cost)


HEALTH_FAMILIES: tuple[MetricSpec, ...] = (
    _verdict("gpu_health", GAUGE, "", ("state",),
             "The GPU's health verdict: its current state (healthy, degraded, unhealthy), value 1 (with "
             "--detail every state, 0 for the others). A MIG instance has its parent GPU's. Why: "
             "gpu_health_reason; what to do: gpu_health_action (docs/HEALTH.md).",
             verdict(lambda v: (((state,), float(value)) for state, value in v.state_values())),
             sparse=True, cost=STATE_SET.format(what="state")),
    _verdict("gpu_health_action", GAUGE, "", ("action",),
             "What the verdict asks for: one series per action (none, restart_app, reset_gpu, reboot_node, "
             "drain_and_reset, inspect_hardware, contact_support): the verdict's, value 1 (with --detail every "
             "action, 0 for the others).",
             verdict(lambda v: (((action,), float(value)) for action, value in v.action_values())),
             sparse=True, cost=STATE_SET.format(what="action")),
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
            "1 while a memory row waits for a GPU reset to be remapped (absent, or 0 with --detail, when none does).",
            signal(lambda s: s.row_remap and s.row_remap.pending, flag), sparse=True, cost=FLAG_SET),
    _signal("gpu_row_remap_failure", GAUGE, "", (),
            "1 if a memory row remap has failed (sticky in the InfoROM: an RMA criterion); absent, or 0 with "
            "--detail, if not.",
            signal(lambda s: s.row_remap and s.row_remap.failure, flag),
            DcgmAlias("DCGM_FI_DEV_ROW_REMAP_FAILURE", GAUGE, "0/1"), sparse=True, cost=FLAG_SET),
    _signal("gpu_remapped_rows_total", COUNTER, "", ("type",),
            "Memory rows remapped over the board's life (with --detail by the errors that caused it: correctable, "
            "uncorrectable).",
            signals(lambda s: (((kind,), getattr(s.row_remap, kind)) for kind in ("correctable", "uncorrectable"))
                    if s.row_remap else (), count),
            DcgmAlias("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", COUNTER, "rows", where=(("type", "uncorrectable"),)),
            DcgmAlias("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", COUNTER, "rows", where=(("type", "correctable"),)),
            summed=("type",),
            cost="one series per GPU, both causes summed (the health verdict judges each cause from the driver's "
                 "own answer, and `--metric-schema dcgm` still serves DCGM's two fields); `--detail` serves the "
                 "two causes apart."),
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
            signals(lambda s: (((str(link.link),), link.up) for link in s.nvlinks), flag), detail=True,
            cost="off by default: 18 series per HGX GPU, 1 almost always; a link that is down makes the verdict "
                 "unhealthy with reason nvlink_down (gpu_health_reason, alert GPUUnhealthy)."),
    _signal("gpu_nvlink_errors_total", COUNTER, "", ("link", "type"),
            "NVLink data-link errors over the GPU's links (with --detail per link and by type: replay, recovery, "
            "crc_flit, crc_data).",
            signals(lambda s: (((str(link.link), kind), getattr(link, kind)) for link in s.nvlinks
                               for kind in NVLINK_ERRORS), count),
            *(DcgmAlias(field, COUNTER, "errors", where=(("type", kind),)) for field, kind in (
                ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "replay"),
                ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "crc_flit"),
                ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "crc_data"),
                ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "recovery"))),
            summed=("link", "type"),
            cost="one series per GPU with NVLinks, every link and type summed (an HGX H100 has 18 links x 4 types: "
                 "72 series, nearly all 0); the health verdict judges each link from the driver's answers "
                 "(reason nvlink_errors), `sum by (node, gpu, uuid)` reads both shapes alike, and `--metric-schema "
                 "dcgm` still serves DCGM's per-type fields; `--detail` serves each link and type."),
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
                ("DCGM_FI_DEV_RELIABILITY_VIOLATION", "reliability"))),
            sparse=True,
            cost="a reason is served once the driver has counted time for it (a GPU whose clocks were never held "
                 "down pays no series); rate() of a reason's first sample is lost, at most one scrape interval "
                 "of held-down time. `sum by (node, gpu, uuid)` reads both shapes alike; `--detail` serves the "
                 "zeros too."),
)
