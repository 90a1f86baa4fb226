"""The health stage of a pass: each physical GPU's verdict, MIG instances their parent's.

Pure, beside `exporter.collect.derive`: the collector calls `health_step` once per pass with the
pass's devices and the keys of the devices left unread by a stuck driver call, and keeps
the returned `HealthStageState` for the next pass. The policy itself is `exporter.health`;
this only feeds it per GPU:

* the device's health read (``DeviceSample.health_signals``, None on passes without one: the last
  read's reasons stand),
* the XIDs new in this pass (``Snapshot.new_xids``, from the one baseline the incident
  engine reads too, `exporter.collect.xids`; a code whose count grew by n counts n times). A
  GPU the stage has no memory of (its first pass, or back after missing from one) starts
  afresh, with every XID it has reported since the agent started,
* its utilisation (a PCIe generation below its maximum is a downgrade only while busy),
* whether a call into the driver for it is stuck.

A down GPU gets a verdict too (from what it reported and what was left). Per device key it
also adds up ``gpu_unhealthy_seconds_total``: the device's capacity-seconds while its verdict
is ``unhealthy``, what a team claims back from its cloud provider.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from exporter.core.model import DeviceSample
from exporter.health import HEALTHY_VERDICT, HealthSignals, HealthState, Verdict, assess, inherit
from exporter.health.checks import DEFAULT_CONFIG, HealthConfig
from exporter.health.policy import UNHEALTHY

#: The reason of a GPU with a call into the driver stuck (`exporter.health.policy`).
STUCK_REASON = "stuck_in_driver_call"


@dataclass(frozen=True)
class HealthStageState:
    """What the health stage remembers between passes (``HealthStageState()`` at start).

    Attributes:
        last_now: the previous pass's time (None before the first).
        gpus: per physical GPU key, its verdict's memory.
        unhealthy_seconds: per device key, capacity-seconds spent unhealthy so far.
        signals: per physical GPU key, its last health read.
        verdicts: per physical GPU key, its last verdict.
    """

    last_now: float | None = None
    gpus: Mapping[str, HealthState] = field(default_factory=dict)
    unhealthy_seconds: Mapping[str, float] = field(default_factory=dict)
    signals: Mapping[str, HealthSignals] = field(default_factory=dict)
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthPass:
    """What one pass's health stage gives the snapshot.

    Attributes:
        verdicts: per device key (whole GPUs and MIG instances), its verdict.
        transitions: per device key, how often its (parent's) verdict state changed.
        unhealthy_seconds: per device key, ``gpu_unhealthy_seconds_total``.
        problems: bad driver answers first met in this pass, one line each, to log once.
        signals: per physical GPU key that is up, its last health read (the raw signal
            series come from it: between reads the last one stands).
    """

    verdicts: Mapping[str, Verdict] = field(default_factory=dict)
    transitions: Mapping[str, int] = field(default_factory=dict)
    unhealthy_seconds: Mapping[str, float] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    signals: Mapping[str, HealthSignals] = field(default_factory=dict)


def xid_codes(events: Mapping[str, int]) -> list[object]:
    """The XID codes of ``events`` (how many of each code), once per event, by code.

    A code that is not a number is passed on as it is: the policy reports it and ignores it.
    """
    codes: list[object] = []
    for code, count in sorted(events.items()):
        if int(count) <= 0:
            continue
        value: object = int(code) if str(code).isdigit() else code
        codes.extend([value] * min(int(count), 64))  # a storm: enough to count as repeats
    return codes


def parent_keys(devices: Sequence[DeviceSample]) -> dict[str, str]:
    """Per MIG instance's key, its parent GPU's key (same vendor and index, no instance)."""
    whole = {(d.vendor, d.index): d.key for d in devices if not d.gpu_instance}
    return {d.key: whole[(d.vendor, d.index)] for d in devices
            if d.gpu_instance and (d.vendor, d.index) in whole}


def _unchanged(gpu: HealthState | None, verdict: Verdict | None, signals: HealthSignals | None,
               codes: list[object], stuck: bool) -> bool:
    """True when a GPU's verdict cannot differ from its last one: no health read and no
    XID in this pass, none active or recent, and no call stuck now or then. (`assess`
    would return the same state and verdict; most passes of a healthy node are such.)"""
    return (gpu is not None and verdict is not None and signals is None and not codes and not stuck
            and not gpu.xids and not gpu.recent and not verdict.problems
            and STUCK_REASON not in verdict.reason_names)


def health_step(state: HealthStageState, now: float, devices: Sequence[DeviceSample],
                new_xids: Mapping[str, Mapping[str, int]], stuck: Collection[str] = (),
                config: HealthConfig = DEFAULT_CONFIG) -> tuple[HealthStageState, HealthPass]:
    """One pass of the health stage.

    Args:
        state: what the previous pass left.
        now: the pass's monotonic time, seconds.
        devices: this pass's samples (down ones included).
        new_xids: per device key, its XID events new in this pass (`exporter.collect.xids`).
        stuck: keys of the devices a stuck driver call leaves unread.
        config: the policy's thresholds and windows.
    """
    dt = 0.0 if state.last_now is None else max(0.0, now - state.last_now)
    gpus: dict[str, HealthState] = {}
    verdicts: dict[str, Verdict] = {}
    transitions: dict[str, int] = {}
    problems: list[str] = []
    signals = dict(state.signals)
    for device in devices:
        if device.gpu_instance:
            continue
        key = device.key
        last, last_verdict = state.gpus.get(key), state.verdicts.get(key)
        codes = xid_codes(device.xid_errors if last is None else new_xids.get(key, {}))
        if _unchanged(last, last_verdict, device.health_signals, codes, key in stuck):
            assert last is not None and last_verdict is not None
            gpus[key], verdict = last, last_verdict
        else:
            gpus[key], verdict = assess(last or HealthState(), now, device.health_signals, codes,
                                        device.utilization if device.up else None, key in stuck, config)
        if device.health_signals is not None:
            signals[key] = device.health_signals
        verdicts[key] = verdict
        transitions[key] = gpus[key].transitions
        problems += [f"GPU {device.index} ({key}): {line}" for line in verdict.problems]
    for mig, parent in parent_keys(devices).items():
        verdicts[mig] = inherit(verdicts[parent])
        transitions[mig] = transitions[parent]
    unhealthy = dict(state.unhealthy_seconds)
    for device in devices:
        verdict = verdicts.setdefault(device.key, HEALTHY_VERDICT)
        transitions.setdefault(device.key, 0)
        seconds = unhealthy.get(device.key, 0.0)
        if verdict.state == UNHEALTHY:
            seconds += max(0.0, device.capacity) * dt
        unhealthy[device.key] = seconds
    signals = {key: read for key, read in signals.items() if key in gpus}
    new_state = HealthStageState(now, gpus, unhealthy, signals, {key: verdicts[key] for key in gpus})
    shown = {d.key: signals[d.key] for d in devices if d.up and d.key in signals}
    return new_state, HealthPass(verdicts, transitions, {d.key: unhealthy[d.key] for d in devices},
                                 tuple(problems), shown)
