"""One rule for a count the driver may answer with garbage.

A PCIe replay count (any count a health read returns) that is NaN, infinite, a fraction,
negative, a bool or text is garbage for the policy (which names it once), for the native
family `gpu_pcie_replays_total` and for dcgm-exporter's `DCGM_FI_DEV_PCIE_REPLAY_COUNTER`
alike: no series from it anywhere, never a 0 or an infinity. A good count is the same
number in all three.
"""

from __future__ import annotations

import math

import pytest

from exporter.core.model import DeviceSample, Snapshot
from exporter.health import HealthSignals, HealthState, Pcie, Violations, assess
from exporter.health.signals import as_count, count_problem
from exporter.output import catalogue as cat
from exporter.output.dcgm import fields as dcgm
from exporter.output.extract import Frame

GARBAGE = [math.nan, math.inf, -math.inf, 3.5, -1, -0.5, True, "7", b"7", object()]
GOOD = [0, 7, 7.0, 2**63]
DEVICE = DeviceSample(index=0, uuid="GPU-0", vendor="nvidia")


def _snapshot(signals: HealthSignals) -> Snapshot:
    return Snapshot(seq=1, node="n", timestamp=1.0, devices=(DEVICE,), health_signals={DEVICE.key: signals})


def _dcgm(field: str, signals: HealthSignals):
    """The DCGM field's value on the GPU, as --metric-schema dcgm serves it (from the family's row)."""
    return dcgm.BY_NAME[field].value(dcgm.FieldDevice(DEVICE, None, None, _snapshot(signals)))


def _dcgm_replays(signals: HealthSignals):
    return _dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", signals)


def _signals(replays: object) -> HealthSignals:
    return HealthSignals(pcie=Pcie(generation=5, generation_max=5, width=16, width_max=16,
                                   replays=replays))  # type: ignore[arg-type]


def _native(replays: object, family: str = "gpu_pcie_replays_total", signals: HealthSignals | None = None
            ) -> list[float]:
    spec = cat.get(family)
    assert spec.extract is not None
    return [value for _, value in spec.extract(Frame.of(_snapshot(signals or _signals(replays)), 1.0), spec)]


@pytest.mark.parametrize("value", GARBAGE, ids=repr)
def test_garbage_is_garbage_for_the_policy_and_both_renderings(value):
    assert count_problem(value) is not None and as_count(value) is None
    _, verdict = assess(HealthState(), 100.0, _signals(value))
    assert [line for line in verdict.problems if "pcie.replays" in line], verdict.problems
    assert _native(value) == []
    assert _dcgm_replays(_signals(value)) is None


@pytest.mark.parametrize("value", GOOD, ids=repr)
def test_a_count_is_the_same_number_everywhere(value):
    assert count_problem(value) is None and as_count(value) == int(value)
    _, verdict = assess(HealthState(), 100.0, _signals(value))
    assert not [line for line in verdict.problems if "pcie.replays" in line]
    assert _native(value) == [float(int(value))]
    assert _dcgm_replays(_signals(value)) == int(value)


def test_not_read_is_no_problem_and_no_series():
    assert count_problem(None) is None and as_count(None) is None
    assert _native(None) == [] and _dcgm_replays(_signals(None)) is None


@pytest.mark.parametrize("power, seconds", [(2.5, 2.5), (0, 0.0), (7, 7.0), (math.inf, None), (math.nan, None),
                                            (-1.0, None), (True, None), ("2.5", None)], ids=repr)
def test_a_violation_time_is_judged_by_one_rule_too(power, seconds):
    signals = HealthSignals(violations=Violations(power=power))  # type: ignore[arg-type]
    _, verdict = assess(HealthState(), 100.0, signals)
    named = [line for line in verdict.problems if "violations.power" in line]
    assert bool(named) == (seconds is None)
    assert _native(None, "gpu_violation_seconds_total", signals) == ([] if seconds is None else [seconds])
    served = _dcgm("DCGM_FI_DEV_POWER_VIOLATION", signals)
    assert served == (None if seconds is None else pytest.approx(seconds * 1e6))
