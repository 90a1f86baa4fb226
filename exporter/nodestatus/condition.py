"""What the Node should say about its GPUs, from one snapshot (pure).

`node_verdict` turns the per-GPU health verdicts of a pass into the node's condition,
following node-problem-detector's convention (a problem type that is ``True`` while the
problem lasts, so that remediation tools can match on it):

* ``True`` while any GPU's action is beyond restarting the application (`NODE_ACTIONS`:
  reset_gpu, reboot_node, drain_and_reset, inspect_hardware, contact_support), with the
  highest such action as the reason in CamelCase (`REASONS`: ``ResetGPU``, ``RebootNode``,
  ...) and a message naming each such GPU (index, UUID, reasons, action, since when);
* ``False`` with reason ``GPUsHealthy`` otherwise (a GPU degraded with restart_app included:
  restarting the workload is the workload's business, not the node's).

The optional taint follows the same verdict: on while the condition is ``True``.

`gpu_transitions` compares two passes' verdicts per GPU for the Node's Events (Warning when
a GPU becomes degraded or unhealthy, Normal when it recovers), naming the workloads that
held the GPU in the pass that saw it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.core.escape import for_terminal
from exporter.core.model import Snapshot
from exporter.health import policy as p
from exporter.output.snapshot_json import describe_owner, rfc3339

DEFAULT_CONDITION_TYPE = "GPUUnhealthy"
HEALTHY_REASON = "GPUsHealthy"
HEALTHY_MESSAGE = "every GPU is healthy, or needs at most its application restarted"
# Actions that make the node's condition True (and the taint, where it is on), most severe last.
NODE_ACTIONS: tuple[str, ...] = tuple(a for a in p.ACTIONS if p.ACTIONS.index(a) > p.ACTIONS.index(p.RESTART_APP))
# The condition's reason for each: CamelCase, as the API expects of a reason.
REASONS: Mapping[str, str] = {
    p.RESET_GPU: "ResetGPU", p.REBOOT_NODE: "RebootNode", p.DRAIN_AND_RESET: "DrainAndReset",
    p.INSPECT_HARDWARE: "InspectHardware", p.CONTACT_SUPPORT: "ContactSupport",
}
# Longest condition message sent (the API server takes longer ones; a describe stays readable).
MAX_MESSAGE = 4096


@dataclass(frozen=True)
class GpuProblem:
    """One GPU that makes the condition True."""

    index: int
    uuid: str
    reasons: tuple[str, ...]
    action: str
    since: float  # Unix seconds: the first pass that saw this action on this GPU

    def describe(self) -> str:
        return (f"GPU {self.index} ({self.uuid}): {', '.join(self.reasons)}; action {self.action}; "
                f"since {rfc3339(self.since)}")


@dataclass(frozen=True)
class NodeVerdict:
    """The condition (and the taint) one pass asks for."""

    status: str  # "True" | "False"
    reason: str
    message: str
    problems: tuple[GpuProblem, ...] = ()

    @property
    def problem(self) -> bool:
        """A GPU needs more than its application restarted: condition True, taint on."""
        return self.status == "True"


HEALTHY = NodeVerdict("False", HEALTHY_REASON, HEALTHY_MESSAGE)


def needs_node_action(action: str) -> bool:
    """Whether a GPU verdict's action makes the node's condition True."""
    return action in NODE_ACTIONS


def gpu_actions(snap: Snapshot) -> dict[str, str]:
    """Per physical GPU key, its verdict's action where it is one of `NODE_ACTIONS`."""
    return {d.key: snap.verdicts[d.key].action for d in snap.devices
            if not d.gpu_instance and d.key in snap.verdicts and needs_node_action(snap.verdicts[d.key].action)}


def track_since(previous: Mapping[str, tuple[str, float]], snap: Snapshot) -> dict[str, tuple[str, float]]:
    """Per GPU key with a node action: (action, since when), ``since`` kept while the action
    stays, the pass's time where it is new."""
    out = {}
    for key, action in gpu_actions(snap).items():
        old = previous.get(key)
        out[key] = old if old is not None and old[0] == action else (action, snap.timestamp)
    return out


def node_verdict(snap: Snapshot, since: Mapping[str, tuple[str, float]]) -> NodeVerdict:
    """The node's condition for ``snap`` (``since`` from `track_since`)."""
    problems = []
    for device in sorted(snap.devices, key=lambda d: d.index):
        if device.gpu_instance or device.key not in snap.verdicts:
            continue
        verdict = snap.verdicts[device.key]
        if not needs_node_action(verdict.action):
            continue
        started = since.get(device.key, (verdict.action, snap.timestamp))[1]
        problems.append(GpuProblem(device.index, device.uuid or device.key, verdict.reason_names, verdict.action,
                                   started))
    if not problems:
        return HEALTHY
    worst = max((g.action for g in problems), key=p.ACTIONS.index)
    lines = "; ".join(g.describe() for g in problems)
    count = f"{len(problems)} GPUs need" if len(problems) > 1 else "1 GPU needs"
    message = for_terminal(f"{count} more than an application restart: {lines}")
    return NodeVerdict("True", REASONS[worst], message[:MAX_MESSAGE], tuple(problems))


# The reason of the Node's Event when a GPU's verdict becomes each state.
EVENT_REASONS: Mapping[str, str] = {p.HEALTHY: "GPURecovered", p.DEGRADED: "GPUDegraded", p.UNHEALTHY: "GPUUnhealthy"}


@dataclass(frozen=True)
class GpuTransition:
    """A GPU whose verdict state changed between two passes, for an Event on the Node."""

    index: int
    uuid: str
    before: str
    after: str
    reasons: tuple[str, ...]
    action: str
    holders: tuple[str, ...]  # the workloads that held the GPU in the pass that saw it

    @property
    def event_type(self) -> str:
        return "Normal" if self.after == p.HEALTHY else "Warning"

    @property
    def event_reason(self) -> str:
        return EVENT_REASONS[self.after]

    def message(self) -> str:
        held = ", ".join(self.holders) if self.holders else "no workload"
        if self.after == p.HEALTHY:
            text = f"GPU {self.index} ({self.uuid}) is healthy again (was {self.before}); held by {held}"
        else:
            text = (f"GPU {self.index} ({self.uuid}) became {self.after} (was {self.before}): "
                    f"{', '.join(self.reasons)}; action {self.action}; held by {held}")
        return for_terminal(text)


def gpu_states(snap: Snapshot) -> dict[str, str]:
    """Per physical GPU key, its verdict's state."""
    return {d.key: snap.verdicts[d.key].state for d in snap.devices if not d.gpu_instance and d.key in snap.verdicts}


def holders(snap: Snapshot, key: str) -> tuple[str, ...]:
    """The workloads holding GPU ``key`` (and its MIG instances) in ``snap``, as people name them."""
    parents = {d.key: d for d in snap.devices}
    gpu = parents.get(key)
    keys = {key} | {d.key for d in snap.devices
                    if gpu is not None and d.gpu_instance and d.vendor == gpu.vendor and d.index == gpu.index}
    names = {describe_owner(row.workload) for row in snap.processes
             if row.device_key in keys and row.workload.attributed}
    return tuple(sorted(names))


def gpu_transitions(before: Mapping[str, str], snap: Snapshot,
                    last_up: Mapping[str, Snapshot] | None = None) -> list[GpuTransition]:
    """The GPUs whose verdict state differs from ``before`` (GPUs new in ``snap`` are not
    transitions: a new agent has seen no change).

    A GPU that is down in ``snap`` (fallen off the bus: its processes can no longer be read)
    is said to be held by the workloads of the last snapshot that saw it up (``last_up``, per
    GPU key), the ones that were on it when it failed.
    """
    out = []
    for device in sorted(snap.devices, key=lambda d: d.index):
        key = device.key
        if device.gpu_instance or key not in snap.verdicts or key not in before:
            continue
        verdict = snap.verdicts[key]
        if verdict.state == before[key]:
            continue
        seen = snap if device.up or last_up is None else last_up.get(key, snap)
        out.append(GpuTransition(device.index, device.uuid or key, before[key], verdict.state, verdict.reason_names,
                                 verdict.action, holders(seen, key)))
    return out
