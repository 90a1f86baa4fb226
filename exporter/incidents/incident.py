"""What an incident is: its kinds, the Xid classes that tell a cause, the thresholds and the
record itself (docs/INCIDENTS.md). `exporter.incidents.engine` makes them from the passes."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.core.model import Workload
from exporter.health.policy import XIDS

__all__ = ["AMEND_MATCH", "AMEND_WINDOW", "APPLICATION_XIDS", "CALLER_XIDS", "CAUSE_BASES", "EVENT_REASONS", "GIB",
           "HOST_TOOLS", "KINDS", "REASON_KINDS", "Incident", "IncidentConfig", "xid_action"]

KINDS = ("memory_exhausted", "xid", "gpu_lost", "row_remap_failure", "nvlink_errors", "stuck_in_driver_call")
REASON_KINDS = ("gpu_lost", "row_remap_failure", "nvlink_errors", "stuck_in_driver_call")
# Xids whose kernel-log line names the process at fault (NVIDIA's XID catalog).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 69, 94, 109})
# Xids whose named process is the caller that noticed (nvidia-smi, the agent): not a cause.
CALLER_XIDS = frozenset({119})
# Host tools that open a GPU briefly to read it: never a workload that shares it.
HOST_TOOLS = frozenset({"nvidia-smi", "nvidia-persistenced", "nv-hostengine", "dcgmi", "nvtop", "nvitop"})
# How the cause of an incident is known (`Incident.cause_basis`).
CAUSE_BASES = ("kernel_log", "sole_holder", "memory_growth")
GIB = 2**30
# The reasons of the Kubernetes Events an incident posts on its pods.
EVENT_REASONS = frozenset({"GPUMemoryExhausted", "GPUFaultCaused", "GPUFaultAffected"})
# Seconds after NVML's Xid was reported (its kernel-log line not read within the hold)
# during which the line, read late behind a backlog of kernel records, amends that incident
# (cause, basis, Events) instead of opening a second one. The same as how long a PID's
# processes are remembered: a line logged longer ago than this could no longer name its
# process, so it is counted ``late`` and opens nothing.
AMEND_WINDOW = 600.0
# A late line amends NVML's incident only where its own stamp lies this many seconds before
# the pass that counted NVML's Xid (or up to the clocks' margin after): the same fault.
AMEND_MATCH = 10.0


@dataclass(frozen=True)
class IncidentConfig:
    """Thresholds (docs/INCIDENTS.md).

    Attributes:
        free_ratio, free_bytes: a GPU is full while its free memory is under the larger.
        window: seconds after the GPU filled within which an exit or drop counts.
        growth_window: seconds before the GPU filled over which growth is measured.
        drop_ratio: a workload's memory falling by this share or more counts as a drop.
        pid_memory: seconds a PID's owner is remembered after its process is gone.
        history: incidents kept in memory (``--incident-history``).
        xid_hold: seconds an NVML Xid waits for the kernel log's line (which names the
            process) before it is reported without it; 0 without a kernel log.
        clock_margin: seconds by which the kernel log's clock and the passes' may differ: a
            record that close to the moment a PID changed hands names no one.
        agent_pid: the agent's own PID, which holds a GPU only to read it (not a workload).
    """

    free_ratio: float = 0.02
    free_bytes: int = GIB
    window: float = 10.0
    growth_window: float = 60.0
    drop_ratio: float = 0.5
    pid_memory: float = 600.0
    history: int = 256
    xid_hold: float = 0.0
    clock_margin: float = 1.0
    agent_pid: int | None = None


@dataclass(frozen=True)
class Incident:
    """One incident (the ``/api/v1/incidents`` entries are `messages.incident_json` of these)."""

    kind: str
    time: float  # wall clock, Unix seconds
    node: str
    gpu: int
    uuid: str
    gpu_instance: str
    xid: int | None
    action: str
    caused_by: tuple[Workload, ...]
    affected: tuple[Workload, ...]
    detail: str
    cause_known: bool
    cause_basis: str = ""  # one of CAUSE_BASES where the cause is known, else ""
    # For an amendment (a late kernel-log line told the cause): the incident as first
    # reported, which this one replaces under the same id; None for a new incident.
    previous: Incident | None = field(default=None, compare=False, repr=False)


def xid_action(code: int) -> tuple[str, str]:
    """(action, description) of an Xid code: NVIDIA's catalog, or a hardware check for one not in it."""
    rule = XIDS.get(code)
    return (rule.action, rule.description) if rule is not None else ("inspect_hardware", "not in NVIDIA's catalog")
