"""THE health policy table: every reason a GPU can be distrusted, its action, and its source.

One row per reason. The verdict (:mod:`exporter.health.verdict`) reads nothing else, and
docs/HEALTH.md's policy table is generated from it (``python -m exporter.health
--markdown``; a test fails when the doc drifts).

XID rows follow NVIDIA's Xid catalog, column "Resolution Bucket (Immediate Action)"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). Where other agents
(gpud, NVSentinel, k8s-device-plugin) or the issue's own list disagree, the catalog wins and
the row's note says so. Catalog codes whose immediate action is IGNORE (or that are unused)
raise no reason: they are still counted in ``gpu_xid_errors_total``. An XID not in the table
raises ``xid_other``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from exporter.health.signals import VENDOR_COVERAGE

HEALTHY, DEGRADED, UNHEALTHY = "healthy", "degraded", "unhealthy"
STATES: tuple[str, ...] = (HEALTHY, DEGRADED, UNHEALTHY)

NONE = "none"
RESTART_APP = "restart_app"
RESET_GPU = "reset_gpu"
REBOOT_NODE = "reboot_node"
DRAIN_AND_RESET = "drain_and_reset"
INSPECT_HARDWARE = "inspect_hardware"
CONTACT_SUPPORT = "contact_support"
# Ordered by severity: the verdict's action is the last of its reasons' actions in this order.
ACTIONS: tuple[str, ...] = (NONE, RESTART_APP, RESET_GPU, REBOOT_NODE, DRAIN_AND_RESET,
                            INSPECT_HARDWARE, CONTACT_SUPPORT)

# How a reason clears.
CAUSE = "cause"    # when the signal that raised it says so (persistent driver state)
WINDOW = "window"  # after the application window (default 10 min) with no repeat
RESET = "reset"    # after the driver shows the GPU was reset or the node rebooted
FIELD = "field"    # like RESET, or when the driver's recovery action field reads none again

CLEARS_TEXT = {
    CAUSE: "when the signal does",
    WINDOW: "after the window with no repeat",
    RESET: "after a GPU reset or node reboot",
    FIELD: "after a reset, or when the recovery action field reads none",
}

XID_CATALOG = "NVIDIA Xid catalog"
MEMORY_ERRORS = "NVIDIA GPU Memory Error Management (docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt)"
PAGE_RETIREMENT = "NVIDIA Dynamic Page Retirement (docs.nvidia.com/deploy/dynamic-page-retirement)"
DCGM_HEALTH = "DCGM health watches (GpuHardwareLimits.h, DcgmHealthWatch.cpp)"
NVML_API = "NVML API reference (docs.nvidia.com/deploy/nvml-api)"

# DCGM's health-watch limits (dcgm: dcgmlib/src/GpuHardwareLimits.h).
PCIE_REPLAYS_PER_MINUTE = 8.0       # DCGM_LIMIT_MAX_PCIREPLAY_RATE: WARN above it
NVLINK_ERRORS_PER_READ = 1          # DCGM_LIMIT_MAX_NVLINK_ERROR: replay/recovery FAIL at >= 1
NVLINK_CRC_PER_SECOND = 100.0       # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR: CRC FAIL at >= 100/s
RETIRED_PAGES_LIMIT = 63            # DCGM_LIMIT_MAX_RETIRED_PAGES: FAIL beyond it


@dataclass(frozen=True)
class Rule:
    """One reason: what it means, what to do, how bad, how it clears, and who says so."""

    reason: str
    action: str
    state: str
    clears: str
    text: str
    source: str
    note: str = ""


@dataclass(frozen=True)
class XidRule:
    """One XID of the catalog: its immediate-action bucket and what the verdict makes of it."""

    code: int
    mnemonic: str
    description: str
    category: str  # "application" (the workload's fault) or "device"
    bucket: str    # the catalog's Resolution Bucket (Immediate Action), verbatim
    action: str
    state: str
    clears: str
    note: str = ""

    @property
    def reason(self) -> str:
        return f"xid_{self.code}"


SIGNAL_RULES: tuple[Rule, ...] = (
    Rule("row_remap_pending", RESET_GPU, DEGRADED, CAUSE,
         "a memory row waits for a GPU reset to be remapped",
         MEMORY_ERRORS + "; nvmlDeviceGetRemappedRows",
         "work goes on meanwhile (containment and page offlining cover the row); clears when "
         "pending reads 0, after the reset that applies the remap"),
    Rule("row_remap_failure", CONTACT_SUPPORT, UNHEALTHY, CAUSE,
         "a memory row could not be remapped: an RMA criterion", MEMORY_ERRORS,
         "the flag is sticky in the InfoROM"),
    Rule("row_remap_no_spare", CONTACT_SUPPORT, UNHEALTHY, CAUSE,
         "a memory bank has no spare rows left: an RMA criterion",
         MEMORY_ERRORS + "; nvmlDeviceGetRowRemapperHistogram (bucket none)"),
    Rule("retired_pages_pending", RESET_GPU, DEGRADED, CAUSE,
         "a retired memory page waits for a reset or driver reload", PAGE_RETIREMENT),
    Rule("retired_pages_limit", CONTACT_SUPPORT, UNHEALTHY, CAUSE,
         f"more than {RETIRED_PAGES_LIMIT} memory pages retired", DCGM_HEALTH + " (DCGM_LIMIT_MAX_RETIRED_PAGES)"),
    Rule("sram_threshold", CONTACT_SUPPORT, UNHEALTHY, CAUSE,
         "the SRAM uncorrectable-error threshold is exceeded: run field diag, RMA",
         XID_CATALOG + " (Xid 48); nvmlDeviceGetSramEccErrorStatus"),
    Rule("ecc_uncorrectable", RESET_GPU, DEGRADED, CAUSE,
         "uncorrectable ECC errors since the last reset", XID_CATALOG + " (Xid 48, 94)",
         "from the volatile count, which a reset brings back to 0"),
    Rule("pcie_downgraded", INSPECT_HARDWARE, DEGRADED, CAUSE,
         "the PCIe link runs below its maximum generation or width", NVML_API,
         "generation only while the GPU is busy (links train down at idle to save power); "
         "width once it lasts several health reads"),
    Rule("pcie_replays", INSPECT_HARDWARE, DEGRADED, CAUSE,
         f"PCIe replays above {PCIE_REPLAYS_PER_MINUTE:g} per minute",
         DCGM_HEALTH + " (DCGM_LIMIT_MAX_PCIREPLAY_RATE, WARN)",
         "the rate between reads, not the lifetime count; clears after a quiet window"),
    Rule("nvlink_down", RESET_GPU, UNHEALTHY, CAUSE,
         "an NVLink is down while the GPU's other links are up",
         "NVIDIA Health Validation nvlink_active (drain, reset_gpu, then service)"),
    Rule("nvlink_errors", RESET_GPU, UNHEALTHY, CAUSE,
         "NVLink replay/recovery errors rising, or CRC errors at 100/s or more",
         DCGM_HEALTH + " (DCGM_LIMIT_MAX_NVLINK_ERROR, DCGM_LIMIT_MAX_NVLINK_CRC_ERROR, FAIL); "
         + XID_CATALOG + " (Xid 74)",
         "the rise between reads, not the lifetime count; clears after a quiet window"),
    Rule("xgmi_errors", INSPECT_HARDWARE, DEGRADED, CAUSE,
         "the XGMI links report errors", "amdsmi_gpu_xgmi_error_status"),
    Rule("recovery_action", RESET_GPU, UNHEALTHY, CAUSE,
         "the driver asks for a recovery action",
         NVML_API + " (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION); " + XID_CATALOG + " (Xid 154)",
         "the action is the field's: GPU reset, node reboot, drain P2P or drain and reset "
         "(drain_and_reset); clears when the field reads none"),
    Rule("fabric_unhealthy", INSPECT_HARDWARE, UNHEALTHY, CAUSE,
         "the GPU's NVSwitch fabric registration failed or its fabric health is degraded",
         NVML_API + " (nvmlDeviceGetGpuFabricInfoV); " + DCGM_HEALTH,
         "a registration still in progress counts once it lasts several health reads"),
    Rule("gpu_lost", REBOOT_NODE, UNHEALTHY, CAUSE,
         "the driver has lost the GPU", NVML_API + " (NVML_ERROR_GPU_IS_LOST); " + XID_CATALOG + " (Xid 79)"),
    Rule("reset_required", RESET_GPU, UNHEALTHY, CAUSE,
         "the driver requires a GPU reset", NVML_API + " (NVML_ERROR_RESET_REQUIRED)"),
    Rule("stuck_in_driver_call", REBOOT_NODE, UNHEALTHY, CAUSE,
         "a call into the driver has not returned", "docs/HEALTH.md (stuck driver calls)",
         "clears when the call returns; a reset needs the driver, which is stuck"),
    Rule("xid_other", INSPECT_HARDWARE, DEGRADED, WINDOW,
         "an XID the catalog does not list", XID_CATALOG),
)

_BUCKETS = {  # the catalog's immediate-action bucket -> (action, state, clears)
    "RESTART_APP": (RESTART_APP, DEGRADED, WINDOW),
    "IGNORE": (NONE, HEALTHY, WINDOW),
    "RESET_GPU": (RESET_GPU, UNHEALTHY, RESET),
    "RESTART_BM": (REBOOT_NODE, UNHEALTHY, RESET),
    "RESTART_VM": (REBOOT_NODE, UNHEALTHY, RESET),
    "CONTACT_SUPPORT": (CONTACT_SUPPORT, UNHEALTHY, RESET),
    "CHECK_MECHANICALS": (INSPECT_HARDWARE, UNHEALTHY, RESET),
    "CHECK_UVM": (INSPECT_HARDWARE, DEGRADED, WINDOW),
    "UPDATE_SWFW": (INSPECT_HARDWARE, DEGRADED, WINDOW),
    "WORKFLOW_XID_45": (RESTART_APP, DEGRADED, WINDOW),
    "WORKFLOW_XID_48": (RESET_GPU, UNHEALTHY, RESET),
    "WORKFLOW_NVLINK_ERR": (RESET_GPU, UNHEALTHY, RESET),
    "WORKFLOW_NVLINK5_ERR": (RESET_GPU, UNHEALTHY, FIELD),
    "XID_154": (RESET_GPU, UNHEALTHY, FIELD),
}
_APP = "application"
_DEV = "device"


def _x(code: int, mnemonic: str, description: str, bucket: str, category: str = _DEV,
       note: str = "") -> XidRule:
    action, state, clears = _BUCKETS[bucket]
    return XidRule(code, mnemonic, description, category, bucket, action, state, clears, note)


def _copy_engines(pairs: tuple[tuple[int, int], ...]) -> tuple[XidRule, ...]:
    """Copy-engine XIDs (code, engine number): the catalog restarts the application for each."""
    return tuple(_x(code, f"ROBUST_CHANNEL_CE{n}_ERROR", f"CE{n}: Unknown Error", "RESTART_APP")
                 for code, n in pairs)


_NVLINK5 = ("the catalog decodes the action from the line's subcode (IGNORE for non-fatal, "
            "RESET_GPU for fatal ones), which NVML's XID event does not carry: the row takes "
            "RESET_GPU, and clears as soon as the driver's recovery action field reads none")

XID_RULES: tuple[XidRule, ...] = (
    _x(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP"),
    _x(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream", "RESTART_APP", _APP),
    _x(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", "RESTART_APP", _APP),
    _x(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", "Invalid or illegal push buffer stream", "RESTART_APP", _APP),
    _x(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP", _APP),
    _x(32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", "RESTART_APP"),
    _x(37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", "Driver firmware error", "IGNORE"),
    _x(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", "IGNORE"),
    *(_x(39 + n, f"ROBUST_CHANNEL_CE{n}_ERROR", "Copy Engine Exception", "RESTART_APP") for n in range(3)),
    _x(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE", _APP,
       "the issue's list puts it with 13/31 as restart_app; the catalog says IGNORE: the "
       "application that hit it has already terminated and the GPU stays healthy"),
    _x(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", "Graphics Engine fault during context switch", "IGNORE"),
    _x(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors",
       "WORKFLOW_XID_45", _APP, "seen with other XIDs, whose rows then decide; alone: the application was torn down"),
    _x(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", "RESET_GPU"),
    _x(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", "WORKFLOW_XID_48",
       note="reset_gpu alone; drain_and_reset when Xid 63 or 64 comes within the window "
            "(the catalog's Xid 48 workflow)"),
    _x(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power is not connected to the GPU board",
       "CHECK_MECHANICALS"),
    _x(60, "ROBUST_CHANNEL_SEC2_ERROR", "Video processor exception", "RESTART_APP"),
    _x(62, "PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU"),
    _x(63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", "IGNORE",
       note="the pending remap it announces raises row_remap_pending from the driver's state"),
    _x(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", "RESET_GPU",
       note="the failure itself raises row_remap_failure (contact_support) from the driver's state"),
    _x(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", "Illegal access by driver", "IGNORE"),
    _x(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", "Illegal access by driver", "IGNORE"),
    _x(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", "RESTART_APP"),
    _x(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", "RESTART_APP", _APP),
    *_copy_engines(((70, 3), (71, 4), (72, 5))),
    _x(74, "NVLINK_ERROR", "NVLINK Error", "WORKFLOW_NVLINK_ERR",
       note="the catalog: a GPU reset or node reboot is needed to clear it"),
    *_copy_engines(((75, 6), (76, 7), (77, 8))),
    _x(78, "VGPU_START_ERROR", "vGPU Start Error", "UPDATE_SWFW"),
    _x(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM"),
    _x(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", "Corrupted data sent to GPU", "RESTART_APP"),
    *tuple(_x(c, m, d, "RESTART_APP") for c, m, d in (
        (82, "ROBUST_CHANNEL_NVJPG0_ERROR", "NVJPG0 Error"),
        (83, "ROBUST_CHANNEL_NVDEC1_ERROR", "NVDEC1 Error"),
        (84, "ROBUST_CHANNEL_NVDEC2_ERROR", "NVDEC2 Error"),
        (85, "ROBUST_CHANNEL_CE9_ERROR", "CE9: Unknown Error"),
        (86, "ROBUST_CHANNEL_OFA0_ERROR", "OFA Exception"),
        (88, "ROBUST_CHANNEL_NVDEC3_ERROR", "NVDEC3 Error"),
        (89, "ROBUST_CHANNEL_NVDEC4_ERROR", "NVDEC4 Error"))),
    _x(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE",
       note="the catalog's investigatory action is CONTACT_SUPPORT if it repeats"),
    _x(93, "INFOROM_ERASE_LIMIT_EXCEEDED", "Non-fatal violation of provisioned InfoROM wear limit", "IGNORE"),
    _x(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", "RESTART_APP",
       note="only the application that met it must restart; reset the GPU when convenient"),
    _x(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU"),
    *tuple(_x(c, f"ROBUST_CHANNEL_NVDEC{n}_ERROR", f"NVDEC{n} Error", "RESTART_APP")
           for c, n in ((96, 5), (97, 6), (98, 7))),
    *tuple(_x(99 + n - 1, f"ROBUST_CHANNEL_NVJPG{n}_ERROR", f"NVJPG{n} Error", "RESTART_APP")
           for n in range(1, 8)),
    _x(106, "SMBPBI_TEST_MESSAGE", "SMBPBI Test Message", "IGNORE"),
    _x(107, "SMBPBI_TEST_MESSAGE_SILENT", "SMBPBI Test Message Silent", "IGNORE"),
    _x(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", "RESET_GPU",
       note="k8s-device-plugin counts it among the application XIDs that never mark a device "
            "unhealthy; the catalog says RESET_GPU"),
    _x(110, "SEC_FAULT_ERROR", "Security Fault Error", "RESET_GPU"),
    _x(119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", "RESET_GPU",
       note="a node power cycle if it persists after the reset"),
    _x(120, "GSP_ERROR", "GSP Error", "RESET_GPU", note="a node power cycle if it persists after the reset"),
    _x(121, "C2C_ERROR", "C2C Error (corrected)", "IGNORE"),
    *_copy_engines(tuple((116 + n, n) for n in range(10, 20))),
    _x(136, "ALI_TRAINING_FAIL", "Link Training Failed", "RESET_GPU"),
    _x(137, "NVLINK_PRIV_ERR", "NVLink Privilege Error", "IGNORE", _APP),
    _x(139, "ROBUST_CHANNEL_OFA1_ERROR", "OFA1 Error", "RESTART_APP"),
    _x(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", "RESET_GPU"),
    _x(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", "CUDA Fast Path Error", "IGNORE"),
    _x(142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", "CONTACT_SUPPORT"),
    _x(143, "GPU_INIT_ERROR", "GPU Initialization Error", "RESET_GPU"),
    *tuple(_x(c, m, d, "WORKFLOW_NVLINK5_ERR", note=_NVLINK5) for c, m, d in (
        (144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error"),
        (145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error"),
        (146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error"),
        (147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error"),
        (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error"),
        (149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error"),
        (150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error"))),
    _x(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", "RESTART_VM"),
    _x(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", "XID_154",
       note="the action printed in the line is the driver's recovery action field: where that "
            "field is readable it raises recovery_action and this row stays quiet; without it, "
            "reset_gpu"),
    _x(155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", "RESET_GPU"),
    _x(156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", "RESET_GPU"),
    _x(157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", "IGNORE"),
    _x(158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", "RESET_GPU"),
    _x(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", "CHI Non-Data Error", "CHECK_UVM"),
)

XIDS: dict[int, XidRule] = {rule.code: rule for rule in XID_RULES}
RULES: dict[str, Rule] = {rule.reason: rule for rule in SIGNAL_RULES}
XID_OTHER = "xid_other"
# The bounded set of reasons: the signal reasons and one per catalog XID that acts.
REASONS: tuple[str, ...] = tuple(sorted(
    [r.reason for r in SIGNAL_RULES] + [x.reason for x in XID_RULES if x.action != NONE]))


def severity(action: str) -> int:
    """The rank of an action in :data:`ACTIONS` (0 for none)."""
    return ACTIONS.index(action)


def worst_action(actions: list[str] | tuple[str, ...]) -> str:
    """The most severe of some actions (none for none)."""
    return max(actions, key=severity, default=NONE)


def worst_state(states: list[str] | tuple[str, ...]) -> str:
    """The worst of some states (healthy for none)."""
    return max(states, key=STATES.index, default=HEALTHY)


def xid_reason(code: int) -> str | None:
    """The reason an XID raises: ``xid_<code>``, ``xid_other``, or None for a catalog IGNORE."""
    rule = XIDS.get(code)
    if rule is None:
        return XID_OTHER
    return rule.reason if rule.action != NONE else None


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """The policy tables for docs/HEALTH.md, in Markdown."""
    lines = ["| reason | action | state | clears | meaning | source |", "|---|---|---|---|---|---|"]
    for r in SIGNAL_RULES:
        meaning = r.text + (f" ({r.note})" if r.note else "")
        lines.append(f"| `{r.reason}` | `{r.action}` | {r.state} | {CLEARS_TEXT[r.clears]} | "
                     f"{_cell(meaning)} | {_cell(r.source)} |")
    lines += ["", "XIDs, from the catalog's immediate action (codes it marks unused are left out; any "
              "XID not listed raises `xid_other`):", "",
              "| XID | mnemonic | description | category | catalog | action | clears | note |",
              "|---|---|---|---|---|---|---|---|"]
    for x in XID_RULES:
        clears = CLEARS_TEXT[x.clears] if x.action != NONE else "counted only"
        lines.append(f"| {x.code} | `{x.mnemonic}` | {_cell(x.description)} | {x.category} | {x.bucket} | "
                     f"`{x.action}` | {clears} | {_cell(x.note)} |")
    lines += ["", "What each backend can read (a signal a vendor lacks raises no reason there):", ""]
    header, *rows = VENDOR_COVERAGE
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m exporter.health --markdown``: print the policy tables."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["--markdown"]:
        print("usage: python -m exporter.health --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
