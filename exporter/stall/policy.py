"""THE stall thresholds: each number the stall signature uses, in one table with its source.

A GPU is *stalled* (docs/TRAINING.md) when, on every pass for ``--stall-after``, a kernel is
resident (utilisation high) while the GPU does no work: no tensor-core and no DRAM activity,
no PCIe or NVLink traffic, power far under its enforced limit, clocks not held down. That is
what a collective waiting for a rank that never comes looks like from the node: NCCL's
kernel spins on a flag. The signature (`exporter.stall.signature`) reads nothing but this
table; docs/TRAINING.md's threshold table is generated from it (``python -m exporter.stall
--markdown``; a test fails when the doc drifts).
"""

from __future__ import annotations

from dataclasses import dataclass

SICHEK = "sichek"
PYTORCH = "PyTorch"
MARIN = "marin #7344"
DLROVER = "DLRover (as reported)"
OURS = "l9gpu"
# Each source in full, listed under the table in docs/TRAINING.md.
SOURCES: dict[str, str] = {
    SICHEK: "scitix/sichek `components/hang/config/default_spec.yaml`: hang after `duration_threshold: 60s`, then "
            "rechecked (`abnormal_detected_times: 10`, `query_interval_after_abnormal: 10s`); `sm` >= 95, `mem` < 5, "
            "`rxpci`/`txpci` < 20 MB/s, `pwr` < 100 W (160 W on the H100, `0x233010de`), `pviol` < 5, `gclk`/`smclk` "
            ">= 1400 MHz (1900 on the H100)",
    PYTORCH: "PyTorch `torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp`: `kProcessGroupNCCLDefaultTimeout = "
             "std::chrono::milliseconds(10 * 60 * 1000)`, the NCCL default of `init_process_group(timeout=)`",
    MARIN: "marin-community/marin #7344: a 512-GPU GB200 job wedged in a collective with no error, no Xid and no "
           "timeout, power frozen (232-280 W of a 1200 W limit at pinned clocks, as issue 47 quotes it)",
    DLROVER: "DLRover's hang check as issue 47 reports it: the job's average `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE` <= "
             "0.001 with 900 s allowed for a checkpoint; our search did not find it in DLRover's source, so it is "
             "taken as reported",
    OURS: "l9gpu's own choice, argued in the row",
}


@dataclass(frozen=True)
class Threshold:
    """One number of the signature.

    Attributes:
        name: the signal it bounds (the key in the stall's ``signals``).
        value: the bound, in ``unit``.
        unit: what the number is in.
        rule: when the signal says "no work" (or "busy", for utilisation).
        why: why this value.
        source: who uses or reports it.
    """

    name: str
    value: float
    unit: str
    rule: str
    why: str
    source: str


# Default ``--stall-after``: under PyTorch's 10-minute NCCL timeout, so the node names the
# stall before the watchdog (where it is on) kills the job, and long after a pass's noise.
STALL_AFTER = 300.0
# A declared stall ends after this many passes in a row without the signature (one pass of
# noise does not end it); it ends at once when no process holds the GPU or the GPU is down.
CLEAR_PASSES = 2
# PCIe bytes counters (NVML field values, re-read every 10 s by the NVML backend) turn
# into a rate over at least this long of passes; GPM's PCIe rate needs no window.
COUNTER_WINDOW = 30.0

BUSY = Threshold(
    "utilization", 0.95, "ratio", ">= (a kernel is resident)",
    "A waiting NCCL kernel is resident the whole time: NVML's utilisation (time with a kernel running) reads "
    "~100%. A checkpoint, an evaluation step on the CPU or a data-loader stall leaves the GPU without a kernel "
    "and utilisation falls, so none of them can match. Where NVML has no utilisation (a MIG instance) GPM's "
    "graphics-engine activity stands in.", SICHEK)
TENSOR = Threshold(
    "tensor_active", 0.01, "ratio", "<=",
    "A spin-wait issues no matrix instruction; a training step keeps the tensor pipes tens of percent busy. "
    "1% per GPU (not DLRover's 0.1% job average) leaves room for GPM's averaging over a pass. GPM only "
    "(Hopper and newer).", DLROVER)
DRAM = Threshold(
    "dram_active", 0.05, "ratio", "<=",
    "A flag poll hits L2, not DRAM; real compute at low tensor use (FP32, elementwise, embedding lookups) moves "
    "memory. GPM's DRAM activity where present, else NVML's memory utilisation (the same bus, coarser).",
    SICHEK)
PCIE = Threshold(
    "pcie_bytes_per_second", 20e6, "bytes/s", "<= (each direction)",
    "A wedged rank moves nothing to the host or the NIC (GPUDirect RDMA crosses PCIe); a data loader or a "
    "checkpoint moves GB/s. GPM's PCIe rate, else the PCIe byte counters over the last half minute.", SICHEK)
NVLINK = Threshold(
    "nvlink_bytes_per_second", 20e6, "bytes/s", "<= (each direction)",
    "The collective's own bytes: none move while it waits. No source gives a floor; the PCIe one is used, "
    "orders of magnitude under any collective's traffic. GPM only.", OURS)
POWER = Threshold(
    "power_ratio", 0.35, "of the enforced limit", "<=",
    "Judged against the GPU's own enforced limit, not in watts: sichek's 100 W of an A100's 400 W and 160 W of "
    "an H100's 700 W are 0.25 and 0.23; the wedged GB200s read 0.19-0.23. 0.35 keeps a margin above them and "
    "well under any real compute, which draws half the limit or more.", f"{SICHEK}, {MARIN}")
THROTTLE = Threshold(
    "throttled", 0.0, "reasons active", "== (no clock slowdown)",
    "A GPU held down by a power cap, a thermal or a hardware slowdown is slow, not wedged (a hardware "
    "straggler: the job waits for it). sichek asks for high clocks and no power violation; the throttle "
    "reasons say the same on every model, where clock floors in MHz differ by model.", SICHEK)

THRESHOLDS: tuple[Threshold, ...] = (BUSY, TENSOR, DRAM, PCIE, NVLINK, POWER, THROTTLE)
# Clock-event reasons (`DeviceSample.throttle_reasons`) that hold clocks down: a throttled GPU is not stalled.
SLOWDOWN_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown")


def markdown() -> str:
    """docs/TRAINING.md's threshold table (between its ``thresholds`` markers)."""
    lines = ["| signal | stalled when | value | why | source |", "|---|---|---|---|---|",
             f"| held for | `--stall-after` | {STALL_AFTER:g} s | Under PyTorch's NCCL timeout, so the node names "
             "the stall before the watchdog ends the job; far above sichek's 60 s hold. | "
             f"{PYTORCH}, {SICHEK} |"]
    for t in THRESHOLDS:
        lines.append(f"| `{t.name}` | {t.rule} | {t.value:g} {t.unit} | {t.why} | {t.source} |")
    lines.append(f"| ends after | {CLEAR_PASSES} passes without the signature | {CLEAR_PASSES} passes | One pass "
                 "of noise does not end a stall; no process left on the GPU, or the GPU down, ends it at once. | "
                 f"{OURS} |")
    lines += ["", "Sources:", ""] + [f"- **{name}**: {text}" for name, text in SOURCES.items()]
    return "\n".join(lines) + "\n"
