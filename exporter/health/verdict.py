"""The per-GPU health verdict: a pure state machine over health reads, XIDs and stuck calls.

Call :func:`assess` once per pass for each physical GPU with that pass's XIDs; pass the health
read's signals on the passes that made one (the slow schedule), ``None`` on the others: the
reasons from the last read stand until the next one. Counters are not this module's business:
they keep counting wherever they are kept; only the verdict changes.

Clearing (see :mod:`exporter.health.policy` for each reason's kind):

* reasons from the driver's own state (pending remap, remap failure, recovery action, GPU
  lost, link width, ...) are re-derived from every read, so they clear when the driver says
  so, and an agent restart neither forgets them nor has to remember them;
* an application XID clears after the window with no repeat;
* a reset or reboot XID clears when the driver shows that the GPU was reset or the node
  rebooted (:func:`checks.evaluate`: boot id changed, energy or volatile ECC counters went
  back, the recovery action field went back to none). An agent restart is not a reset: a new
  agent starts with an empty :class:`HealthState` and only sees XIDs that happen after it
  registered for them, so it invents nothing from history.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from exporter.health import policy as p
from exporter.health.checks import DEFAULT_CONFIG, HealthConfig, ReadMemory, Reason, evaluate
from exporter.health.signals import HealthSignals, RecoveryAction

_COMBINED_WITH_48 = (63, 64)  # the catalog's Xid 48 workflow: with a remap event, drain and reset


@dataclass(frozen=True)
class ActiveXid:
    """An XID whose reason is active: when it was first and last seen."""

    code: int
    reason: str
    first_seen: float
    last_seen: float
    drain: bool = False


@dataclass(frozen=True)
class HealthState:
    """One GPU's health memory between passes. ``HealthState()`` is a new agent's.

    Attributes:
        transitions: how often the verdict's state (healthy/degraded/unhealthy) changed, for
            ``gpu_health_transitions_total`` and the ``GPUHealthFlapping`` alert.
    """

    read: ReadMemory = ReadMemory()
    signal_reasons: tuple[Reason, ...] = ()
    recovery_field_readable: bool = False
    xids: tuple[ActiveXid, ...] = ()
    recent: tuple[tuple[int, float], ...] = ()
    verdict_state: str | None = None
    transitions: int = 0
    reported: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Verdict:
    """Whether a GPU can be trusted, why, and what to do.

    Attributes:
        state: ``healthy``, ``degraded`` or ``unhealthy`` (healthy iff there are no reasons).
        action: the most severe of the reasons' actions (``none`` when healthy).
        reasons: the active reasons, sorted by name.
        problems: bad driver answers first met in this pass, one line each, for the caller
            to log (each field is reported once per agent run).
    """

    state: str
    action: str
    reasons: tuple[Reason, ...]
    problems: tuple[str, ...] = ()

    @property
    def reason_names(self) -> tuple[str, ...]:
        return tuple(r.reason for r in self.reasons)

    def state_values(self) -> tuple[tuple[str, int], ...]:
        """``gpu_health{state}``: 1 for the current state, 0 for the others."""
        return tuple((s, int(s == self.state)) for s in p.STATES)

    def action_values(self) -> tuple[tuple[str, int], ...]:
        """``gpu_health_action{action}``: 1 for the verdict's action, 0 for the others."""
        return tuple((a, int(a == self.action)) for a in p.ACTIONS)


HEALTHY_VERDICT = Verdict(p.HEALTHY, p.NONE, ())


def _reason_state(reason: str) -> str:
    rule = p.RULES.get(reason)
    if rule is not None:
        return rule.state
    return p.XIDS[int(reason.removeprefix("xid_"))].state


def _xid_kind(code: int) -> str:
    rule = p.XIDS.get(code)
    return rule.clears if rule is not None else p.RULES[p.XID_OTHER].clears


def _still_active(x: ActiveXid, now: float, cfg: HealthConfig, reset_seen: bool,
                  field_none: bool) -> bool:
    kind = _xid_kind(x.code)
    if kind == p.WINDOW:
        return now - x.last_seen < cfg.app_window_s
    if reset_seen:
        return False
    return not (kind == p.FIELD and field_none and now - x.last_seen >= cfg.field_settle_s)


def _xid_text(x: ActiveXid, cfg: HealthConfig) -> str:
    rule = p.XIDS.get(x.code)
    what = rule.description if rule is not None else "not in the catalog"
    kind = _xid_kind(x.code)
    if kind == p.WINDOW:
        return f"XID {x.code}: {what} (clears after {cfg.app_window_s / 60:g} min without a repeat)"
    return f"XID {x.code}: {what} (clears {p.CLEARS_TEXT[kind]})"


def _xid_action(x: ActiveXid) -> str:
    if x.drain:
        return p.DRAIN_AND_RESET
    rule = p.XIDS.get(x.code)
    return rule.action if rule is not None else p.RULES[p.XID_OTHER].action


def _valid_codes(xids: Iterable[object]) -> tuple[list[int], list[tuple[str, str]]]:
    codes, problems = [], []
    for code in xids:
        if isinstance(code, int) and not isinstance(code, bool) and code > 0:
            codes.append(code)
        else:
            problems.append(("xid", f"xid: the driver reported XID {code!r}, not a positive number; ignored"))
    return codes, problems


def _add_xids(active: list[ActiveXid], codes: list[int], now: float, field_readable: bool) -> list[ActiveXid]:
    by_reason = {x.reason: x for x in active}
    for code in codes:
        reason = p.xid_reason(code)
        if reason is None or (code == 154 and field_readable):
            continue  # counted only; or the recovery action field speaks for Xid 154
        old = by_reason.get(reason)
        by_reason[reason] = (replace(old, code=code, last_seen=now) if old is not None
                             else ActiveXid(code, reason, now, now))
    return list(by_reason.values())


def assess(state: HealthState, now: float, signals: HealthSignals | None, xids: Iterable[object] = (),
           utilization: float | None = None, stuck: bool = False,
           config: HealthConfig = DEFAULT_CONFIG) -> tuple[HealthState, Verdict]:
    """One pass of one GPU's verdict.

    Args:
        state: what the previous pass left (``HealthState()`` for a new agent).
        now: the pass's time in seconds, read once per pass (the same clock every pass).
        signals: this pass's health read, or None on passes without one.
        xids: the XID codes the driver reported since the previous pass.
        utilization: the GPU's utilisation this pass, 0-1; above
            ``config.busy_utilization`` a PCIe generation below its maximum is a downgrade.
        stuck: a call into the driver for this GPU has not returned.
        config: thresholds and windows.

    Returns:
        The new state and the verdict. Never raises on what the driver answered.
    """
    read, signal_reasons, readable = state.read, state.signal_reasons, state.recovery_field_readable
    reset_seen, problems = False, []
    if signals is not None:
        result = evaluate(signals, state.read, now, utilization, config)
        read, signal_reasons, readable = result.memory, result.reasons, result.recovery_field_readable
        reset_seen, problems = result.reset_seen, list(result.problems)
    codes, xid_problems = _valid_codes(xids)
    problems += xid_problems
    field_none = signals is not None and readable and signals.recovery_action == RecoveryAction.NONE
    kept = [x for x in state.xids if _still_active(x, now, config, reset_seen, field_none)]
    active = _add_xids(kept, codes, now, readable)
    recent = tuple((c, t) for c, t in state.recent if now - t < config.app_window_s) + tuple((c, now) for c in codes)
    if any(c in _COMBINED_WITH_48 for c, _ in recent):
        active = [replace(x, drain=True) if x.code == 48 else x for x in active]
    reasons = list(signal_reasons)
    if stuck:
        reasons.append(Reason("stuck_in_driver_call", p.RULES["stuck_in_driver_call"].action,
                              p.RULES["stuck_in_driver_call"].text))
    reasons += [Reason(x.reason, _xid_action(x), _xid_text(x, config)) for x in active]
    reasons.sort(key=lambda r: r.reason)
    verdict_state = p.worst_state([_reason_state(r.reason) for r in reasons])
    new_problems = [(key, msg) for key, msg in problems if key not in state.reported]
    verdict = Verdict(verdict_state, p.worst_action([r.action for r in reasons]), tuple(reasons),
                      tuple(dict(new_problems).values()))
    changed = state.verdict_state is not None and state.verdict_state != verdict_state
    new_state = HealthState(read, tuple(signal_reasons), readable, tuple(active), recent, verdict_state,
                            state.transitions + int(changed),
                            state.reported | {key for key, _ in new_problems})
    return new_state, verdict


def inherit(parent: Verdict) -> Verdict:
    """A MIG instance's verdict: its parent GPU's (health is read on the physical GPU)."""
    return replace(parent, problems=())


def mig_verdicts(parents: Mapping[str, Verdict], instances: Mapping[str, str]) -> dict[str, Verdict]:
    """Each MIG instance's verdict from its parent's.

    Args:
        parents: verdict by physical GPU uuid.
        instances: parent GPU uuid by MIG instance uuid.
    """
    return {mig: inherit(parents[parent]) for mig, parent in instances.items() if parent in parents}


def is_busy(utilization: float | None, config: HealthConfig = DEFAULT_CONFIG) -> bool:
    """Whether a utilisation (0-1) counts as busy for the PCIe generation rule."""
    return utilization is not None and math.isfinite(utilization) and utilization > config.busy_utilization
