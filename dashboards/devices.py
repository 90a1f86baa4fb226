"""The devices dashboard (l9gpu-devices.json): per-GPU health verdict and signals, utilisation, memory, power, energy,
temperature, clocks, PCIe, errors and throttling, and the health of the l9gpu agents.

Each row is one function that adds its title and panels to the board; ROWS lists them in the
order they appear, so a new row is a function and one entry there.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from dashboards.panels import (
    DASHED,
    DEV,
    GPU_VAR,
    NODE_VAR,
    WITH_NODE,
    Board,
    bargauge,
    by_regexp,
    dashboard,
    stat,
    table,
    target,
    timeseries,
)

BARS = common.GraphDrawStyle.BARS
# Every per-GPU series is named by its node and GPU index.
LEG = "{{node}} gpu {{gpu}}"


def _overview(b: Board) -> None:
    b.row("Overview")
    b.add(stat("GPUs up", [target(f"sum(gpu_up{{{DEV}}})", instant=True)], "none",
               "GPUs read successfully in the agent's last pass."), 4, 4)
    b.add(stat("GPUs down", [target(f"count(gpu_up{{{DEV}}} == 0) or vector(0)", instant=True)], "none",
               "GPUs the agent could not read (lost, driver error).", steps=[("green", None), ("red", 1)]), 4, 4)
    b.add(stat("Mean utilisation", [target(f"avg(gpu_utilization_ratio{{{DEV}}})", instant=True)], "percentunit"),
          4, 4)
    b.add(stat("Power", [target(f"sum(gpu_power_watts{{{DEV}}})", instant=True)], "watt"), 4, 4)
    b.add(stat("Energy (time range)",
               [target(f"sum(increase(gpu_energy_joules_total{{{DEV}}}[$__range])) / 3.6e6", instant=True)],
               "kwatth", decimals=2), 4, 4)
    b.add(stat("XID errors (time range)",
               [target(f"sum(increase(gpu_xid_errors_total{{{DEV}}}[$__range])) or vector(0)", instant=True)],
               "none", steps=[("green", None), ("red", 1)]), 4, 4)
    b.add(table("GPUs", [target(f"gpu_info{{{DEV}}}", instant=True, table=True)],
                "Model, driver, PCI bus id and serial of each GPU.", hide=["Value"]), 24, 6)


def _utilisation_and_memory(b: Board) -> None:
    b.row("Utilisation and memory")
    b.add(timeseries("GPU utilisation", [target(f"gpu_utilization_ratio{{{DEV}}}", LEG)], "percentunit",
                     "Fraction of time one or more kernels ran.", maximum=1), 12, 8)
    b.add(timeseries("Memory controller utilisation", [target(f"gpu_memory_utilization_ratio{{{DEV}}}", LEG)],
                     "percentunit", "Fraction of time device memory was read or written.", maximum=1), 12, 8)
    b.add(timeseries("Memory used", [target(f"gpu_memory_used_bytes{{{DEV}}}", LEG),
                                     target(f"gpu_memory_total_bytes{{{DEV}}}", LEG + " total", ref="B"),
                                     target(f"gpu_memory_peak_bytes{{{DEV}}}", LEG + " peak", ref="C")],
                     "bytes", "The peak is the most in use over the agent's --peak-window (30 s): a spike between "
                     "two scrapes.", overrides=[by_regexp(".* (total|peak)", custom__lineStyle=DASHED,
                                                          custom__fillOpacity=0)]), 12, 8)
    b.add(bargauge("Memory used / total",
                   [target(f"gpu_memory_used_bytes{{{DEV}}} / gpu_memory_total_bytes{{{DEV}}}", LEG, instant=True)],
                   "percentunit", maximum=1), 12, 8)
    b.add(timeseries("Share of each GPU nobody holds",
                     [target(f"rate(gpu_unallocated_seconds_total{{{DEV}}}[$__rate_interval])"
                             f" / rate(gpu_capacity_seconds_total{{{DEV}}}[$__rate_interval])", LEG)],
                     "percentunit", "Unallocated GPU time over the GPU's capacity: time-slicing replicas nobody was "
                                    "given, a GPU with no holder, or a GPU that is down. A MIG instance counts its "
                                    "slices of the GPU; the parent the slices in no instance.", maximum=1), 24, 8)


def _activity(b: Board) -> None:
    b.row("Activity: SM, tensor cores, memory bandwidth (GPM: Hopper and newer)")
    gpm_note = (" NVML GPM, averaged between two samples (--gpm-interval); absent on GPUs before Hopper. In MIG mode "
                "per MIG instance.")
    b.add(timeseries("Graphics engine active vs utilisation",
                     [target(f"gpu_graphics_active_ratio{{{DEV}}}", LEG + " engine active"),
                      target(f"gpu_utilization_ratio{{{DEV}}}", LEG + " utilisation", ref="B")], "percentunit",
                     "Utilisation counts time any kernel ran; the engine-active ratio is the GPM counterpart."
                     + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("SM active", [target(f"gpu_sm_active_ratio{{{DEV}}}", LEG)], "percentunit",
                     "Fraction of time the SMs had work resident, averaged over all SMs: how much of the GPU the "
                     "kernels spread over." + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("SM occupancy", [target(f"gpu_sm_occupancy_ratio{{{DEV}}}", LEG)], "percentunit",
                     "Resident warps as a fraction of the SMs' maximum." + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("Tensor cores active", [target(f"gpu_tensor_active_ratio{{{DEV}}}", LEG)], "percentunit",
                     "Fraction of time any tensor-core pipe was active." + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("Tensor pipes by kind",
                     [target(f"gpu_tensor_hmma_active_ratio{{{DEV}}}", LEG + " HMMA (FP16/BF16)"),
                      target(f"gpu_tensor_imma_active_ratio{{{DEV}}}", LEG + " IMMA (INT8)", ref="B"),
                      target(f"gpu_tensor_dfma_active_ratio{{{DEV}}}", LEG + " DFMA (FP64)", ref="C")],
                     "percentunit", "Half-precision, integer and double-precision tensor-core pipes." + gpm_note,
                     maximum=1), 8, 8)
    b.add(timeseries("DRAM bandwidth used", [target(f"gpu_dram_active_ratio{{{DEV}}}", LEG)], "percentunit",
                     "Device-memory bandwidth used as a fraction of the peak." + gpm_note, maximum=1), 8, 8)
    b.add(timeseries("FP pipes (non-tensor)",
                     [target(f"gpu_fp16_active_ratio{{{DEV}}}", LEG + " FP16"),
                      target(f"gpu_fp32_active_ratio{{{DEV}}}", LEG + " FP32", ref="B"),
                      target(f"gpu_fp64_active_ratio{{{DEV}}}", LEG + " FP64", ref="C")],
                     "percentunit", "Fraction of time the SMs' FP16, FP32 and FP64 pipes were active." + gpm_note,
                     maximum=1), 8, 8)
    b.add(timeseries("PCIe traffic (GPM)",
                     [target(f"gpu_gpm_pcie_rx_bytes_per_second{{{DEV}}}", LEG + " rx"),
                      target(f"-gpu_gpm_pcie_tx_bytes_per_second{{{DEV}}}", LEG + " tx", ref="B")],
                     "Bps", "Receive up, transmit down; averaged over the GPM window." + gpm_note, minimum=None),
          8, 8)
    b.add(timeseries("NVLink traffic",
                     [target(f"gpu_nvlink_rx_bytes_per_second{{{DEV}}}", LEG + " rx"),
                      target(f"-gpu_nvlink_tx_bytes_per_second{{{DEV}}}", LEG + " tx", ref="B")],
                     "Bps", "All links together; receive up, transmit down. Absent on cards without NVLink."
                     + gpm_note, minimum=None), 8, 8)
    b.add(timeseries("Stalled: busy with no work",
                     [target(f"gpu_stalled{{{DEV}}}", LEG + " stalled"),
                      target(f"rate(gpu_stalled_seconds_total{{{DEV}}}[$__rate_interval])", LEG + " stalled s/s",
                             ref="B")],
                     "none", "1 while the agent calls the GPU stalled: a kernel resident and no work done for "
                     "--stall-after, as a training job's wedged collective looks (docs/TRAINING.md); the rate of "
                     "the stalled seconds beside it. The Training jobs dashboard shows the job's ranks.",
                     maximum=1), 8, 8)


def _power_and_temperature(b: Board) -> None:
    b.row("Power and temperature")
    b.add(timeseries("Power vs limit", [target(f"gpu_power_watts{{{DEV}}}", LEG),
                                        target(f"gpu_power_limit_watts{{{DEV}}}", LEG + " limit", ref="B")],
                     "watt", overrides=[by_regexp(".* limit", custom__lineStyle=DASHED,
                                                  custom__fillOpacity=0)]), 12, 8)
    b.add(bargauge("Energy per GPU (time range)",
                   [target(f"increase(gpu_energy_joules_total{{{DEV}}}[$__range])", LEG, instant=True)],
                   "joule", "Energy each GPU used over the dashboard's time range."), 6, 8)
    b.add(timeseries("Energy rate (average power)",
                     [target(f"rate(gpu_energy_joules_total{{{DEV}}}[$__rate_interval])", LEG)], "watt",
                     "From the energy counter: the average power between scrapes, not a point sample."), 6, 8)
    b.add(timeseries("GPU temperature", [target(f"gpu_temperature_celsius{{{DEV}}}", LEG)], "celsius",
                     steps=[("green", None), ("orange", 80), ("red", 90)], minimum=None), 12, 8)
    b.add(timeseries("Memory (HBM) temperature", [target(f"gpu_memory_temperature_celsius{{{DEV}}}", LEG)], "celsius",
                     "Absent on consumer NVIDIA cards.", steps=[("green", None), ("orange", 85), ("red", 95)],
                     minimum=None), 12, 8)
    b.add(timeseries("Fan speed", [target(f"gpu_fan_speed_ratio{{{DEV}}}", LEG)], "percentunit",
                     "Cards with fans only; absent on passively cooled data-centre GPUs.", maximum=1), 12, 6)


def _clocks_and_pcie(b: Board) -> None:
    b.row("Clocks and PCIe")
    b.add(timeseries("SM clock", [target(f"gpu_sm_clock_hertz{{{DEV}}}", LEG)], "hertz"), 8, 8)
    b.add(timeseries("Memory clock", [target(f"gpu_memory_clock_hertz{{{DEV}}}", LEG)], "hertz"), 8, 8)
    b.add(timeseries("PCIe throughput", [target(f"rate(gpu_pcie_rx_bytes_total{{{DEV}}}[$__rate_interval])",
                                                LEG + " rx"),
                                         target(f"-rate(gpu_pcie_tx_bytes_total{{{DEV}}}[$__rate_interval])",
                                                LEG + " tx", ref="B")],
                     "Bps", "Receive up, transmit down (from the driver's PCIe byte counters).", minimum=None), 8, 8)
    b.add(timeseries("Clock throttle reasons (active)",
                     [target(f"max by (node, gpu, reason) (gpu_clock_throttle_active{{{DEV}}}) > 0",
                             LEG + " {{reason}}")], "none",
                     "Reasons holding the clocks down; gpu_idle is normal on an idle GPU. NVIDIA only.",
                     stack=True, draw=BARS), 24, 7)


def _errors(b: Board) -> None:
    b.row("Errors")
    b.add(timeseries("ECC errors (increase)",
                     [target(f"sum by (node, gpu, type) (increase(gpu_ecc_errors_total{{{DEV}}}[$__rate_interval]))",
                             LEG + " {{type}}")], "none", "Corrected and uncorrected ECC errors.", draw=BARS), 8, 7)
    b.add(timeseries("XID errors (increase)",
                     [target(f"sum by (node, gpu, xid) (increase(gpu_xid_errors_total{{{DEV}}}[$__rate_interval]))",
                             LEG + " xid {{xid}}")], "none", "XID events by code. NVIDIA only.", draw=BARS), 8, 7)
    b.add(timeseries("GPU up", [target(f"gpu_up{{{DEV}}}", LEG)], "none", "1 read, 0 failed.", maximum=1,
                     ), 8, 7)
    b.add(timeseries("Stuck in a driver call", [target(f"gpu_stuck_call_seconds{{{DEV}}}", LEG + " {{call}}")], "s",
                     "How long a GPU has not returned from a call into the vendor library (the call is named): the "
                     "GPU is reported down meanwhile and the other GPUs go on (GPUStuckInDriverCall, "
                     "docs/HEALTH.md).", steps=[("green", None), ("red", 30)]), 24, 7)


def _gpu_health(b: Board) -> None:
    b.row("Health")
    b.add(stat("GPUs not healthy", [target(f'count(gpu_health{{{DEV},state!="healthy"}} == 1) or vector(0)',
                                           instant=True)], "none",
               "GPUs whose verdict is degraded or unhealthy (docs/HEALTH.md).",
               steps=[("green", None), ("orange", 1)]), 4, 7)
    b.add(table("Verdict per GPU", [
        target(f'gpu_health{{{DEV}}} == 1', instant=True, table=True),
        target(f'gpu_health_action{{{DEV}}} == 1', instant=True, table=True, ref="B")],
        "Each GPU's state (healthy, degraded, unhealthy) and what to do about it (GPUUnhealthy).",
        hide=["Value #A", "Value #B"], sort="state"), 10, 7)
    b.add(table("Active reasons", [target(f'gpu_health_reason{{{DEV}}} == 1', instant=True, table=True)],
                "Why a GPU is not healthy: one row per active reason (row_remap_pending, pcie_downgraded, "
                "nvlink_errors, xid_<code>, ...).", hide=["Value"]), 10, 7)
    b.add(timeseries("PCIe link width vs max", [
        target(f"gpu_pcie_link_width{{{DEV}}}", LEG),
        target(f"gpu_pcie_link_width_max{{{DEV}}}", LEG + " max", ref="B")], "none",
        "Lanes now and at most: a width below max that lasts is a downgrade (GPUPCIeLinkDowngraded)."), 8, 7)
    b.add(timeseries("PCIe link generation vs max", [
        target(f"gpu_pcie_link_generation{{{DEV}}}", LEG),
        target(f"gpu_pcie_link_generation_max{{{DEV}}}", LEG + " max", ref="B")], "none",
        "Links train down at idle to save power: below max counts only while the GPU is busy."), 8, 7)
    b.add(timeseries("Row remaps pending", [target(f"gpu_row_remap_pending{{{DEV}}}", LEG)], "none",
                     "1 while a memory row waits for a GPU reset (GPURowRemapPending).", maximum=1), 8, 7)
    b.add(timeseries("NVLink errors (rate)", [
        target(f"sum by (node, gpu, type) (rate(gpu_nvlink_errors_total{{{DEV}}}[$__rate_interval]))",
               LEG + " {{type}}")], "none", "Replay, recovery and CRC errors per second (GPUNVLinkErrors).",
        draw=BARS), 12, 7)
    b.add(timeseries("Clock violation time (rate)", [
        target(f"sum by (node, gpu, reason) (rate(gpu_violation_seconds_total{{{DEV}}}[$__rate_interval]))",
               LEG + " {{reason}}")], "percentunit",
        "Fraction of time the clocks were held down, by policy (power, thermal, board limit, ...).", stack=True),
        12, 7)


def _agent_health(b: Board) -> None:
    b.row("Agent health")
    b.add(timeseries("Collector success", [
        target(f"min by (node, collector) (l9gpu_collector_success * {WITH_NODE})", "{{node}} {{collector}}")],
        "none", "1 when the named collector succeeded in the agent's last pass.", maximum=1), 8, 7)
    b.add(timeseries("Collector duration", [
        target(f"max by (node, collector) (l9gpu_collector_duration_seconds * {WITH_NODE})", "{{node}} {{collector}}")],
        "s"), 8, 7)
    b.add(timeseries("Snapshot age", [
        target(f"max by (node) (l9gpu_snapshot_age_seconds * {WITH_NODE})", "{{node}}")], "s",
        "Age of the snapshot served; far above the interval means the collector is stuck.",
        steps=[("green", None), ("orange", 30), ("red", 60)]), 8, 7)
    b.add(timeseries("Unattributed GPU processes",
                     [target('l9gpu_unattributed_processes{node=~"$node"}', "{{node}}")], "none",
                     "GPU processes that belong to no pod or Slurm job.", draw=BARS), 8, 7)
    b.add(stat("Host PIDs visible", [target('min(l9gpu_host_pids_visible{node=~"$node"})', instant=True)], "none",
               "0 on a node means the agent cannot see host PIDs: run with hostPID: true or mount the host's /proc "
               "and pass --proc-root.", steps=[("red", None), ("green", 1)]), 4, 7)
    b.add(timeseries("Backend errors", [
        target(f"sum by (node, backend, reason) (rate(l9gpu_backend_errors_total[$__rate_interval]) * {WITH_NODE})",
               "{{node}} {{backend}} {{reason}}")], "none", "Errors a device backend survived, per second."), 4, 7)
    b.add(table("Agent versions", [target(f"l9gpu_build_info * {WITH_NODE}", instant=True, table=True)],
                "Version of the agent on each node.", hide=["Value"]), 12, 6)
    b.add(timeseries("OTLP pushes", [
        target(f"sum by (node, result) (rate(l9gpu_otlp_exports_total[$__rate_interval]) * {WITH_NODE})",
               "{{node}} {{result}}")], "none",
        "OTLP pushes per second by result; present only where OTLP push is on.", draw=BARS), 12, 6)
    b.add(timeseries("Connections turned away", [
        target(f"sum by (node, reason) (rate(l9gpu_http_rejections_total[$__rate_interval]) * {WITH_NODE})",
               "{{node}} {{reason}}")], "none",
        "Connections and requests the agent's HTTP listener turned away per second, by reason: its connection "
        "limit, header deadline and size, accept failures (out of file descriptors), and the web config's refusals "
        "(certificate, rate limit, queued password checks, failed logins). Alert L9gpuListenerUnderFlood.",
        draw=BARS), 24, 6)
    b.add(timeseries("Kernel log records", [
        target(f"sum by (node, outcome) (rate(l9gpu_kernel_log_records_total[$__rate_interval]) * {WITH_NODE})",
               "{{node}} {{outcome}}")], "none",
        "Kernel log records read per second with --kernel-log, by outcome (xid: an NVIDIA Xid line; overwritten: "
        "lost before they were read); present only where the kernel log is read.", draw=BARS), 12, 6)
    b.add(timeseries("Kubernetes Events about incidents", [
        target(f"sum by (node, outcome) (rate(l9gpu_kubernetes_events_total[$__rate_interval]) * {WITH_NODE})",
               "{{node}} {{outcome}}")], "none",
        "Events the agent posted on pods about GPU incidents per second, by outcome (posted, aggregated into a "
        "repeat, rate_limited, forbidden, throttled, failed); present only where the agent uses the Kubernetes API.",
        draw=BARS), 12, 6)
    b.add(timeseries("Node condition and taint writes", [
        target(f"sum by (node, outcome) (rate(l9gpu_kubernetes_node_updates_total[$__rate_interval]) * {WITH_NODE})",
               "{{node}} {{outcome}}")], "none",
        "Requests per second that write the GPU condition (and the opt-in taint) on the agent's Node, by outcome "
        "(updated, forbidden: the ClusterRole lacks patch on nodes/status, conflict, throttled, server_error, "
        "timeout, failed); present only where the agent writes the node condition.", draw=BARS), 24, 6)


ROWS = [_overview, _gpu_health, _utilisation_and_memory, _activity, _power_and_temperature, _clocks_and_pcie,
        _errors, _agent_health]


def devices() -> model.Dashboard:
    return dashboard("l9gpu-devices", "l9gpu / GPU devices",
                     "Per-GPU utilisation, memory, power, energy, temperature, clocks, PCIe, ECC, XID and throttling, "
                     "and the health of the l9gpu agents.", ["l9gpu", "gpu"], [NODE_VAR, GPU_VAR], ROWS)
