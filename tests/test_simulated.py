"""The simulated node: values are predictable functions of time; bad scenarios say why."""

import math

import pytest

from exporter.devices import open_backends
from exporter.devices.base import BackendUnavailable
from exporter.devices.simulated.backend import GIB, ScenarioError, SimulatedBackend, parse_scenario


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_default_scenario_is_the_documented_node():
    clock = Clock()
    backend = SimulatedBackend(clock=clock)
    backend.open()
    devices = backend.sample(clock.t)
    assert len(devices) == 8
    assert {d.model for d in devices} == {"NVIDIA H100 80GB HBM3"}
    assert all(d.memory_total_bytes == 80 * GIB for d in devices)
    by_index = {d.index: d for d in devices}
    assert 41001 in {p.pid for p in by_index[0].processes} and 41002 in {p.pid for p in by_index[1].processes}
    assert all(len(by_index[i].processes) == 1 for i in range(2, 6))  # one trainer process per GPU
    zombie = [p for p in by_index[6].processes if p.used_memory_bytes == 70 * GIB]
    assert zombie and zombie[0].sm_utilization == 0.0
    assert len(by_index[6].processes) >= 4  # time-sliced: three small pods beside the notebook
    assert len({p.sm_utilization for p in by_index[6].processes}) >= 3
    assert by_index[7].processes == () and by_index[7].utilization == 0.0
    assert by_index[7].power_watts == 72.0


def test_training_memory_creeps_up_and_energy_integrates_power():
    clock = Clock(0.0)
    backend = SimulatedBackend(clock=clock)
    backend.open()
    first = backend.sample(0.0)[2]
    clock.t = 3600.0
    later = backend.sample(3600.0)[2]
    trainer_before = max(p.used_memory_bytes for p in first.processes)
    trainer_after = max(p.used_memory_bytes for p in later.processes)
    assert trainer_after - trainer_before == 12 * GIB
    assert later.energy_joules - first.energy_joules == pytest.approx(later.power_watts * 3600.0)


def test_values_follow_the_scenario_exactly():
    doc = {
        "gpus": {"count": 2, "model": "Test GPU", "memory_gib": 16, "power": {"idle_watts": 50, "max_watts": 250},
                 "reserved_memory_mib": 256},
        "processes": [
            {"name": "a", "gpus": [0], "pid": 100, "memory_gib": 4, "utilization": 0.25},
            {"name": "b", "gpus": [0], "pid": 200, "memory_gib": 2,
             "utilization": {"wave": {"min": 0.1, "max": 0.5, "period": "40s"}}},
        ],
    }
    scenario = parse_scenario(doc)
    procs = {p.pid: p for p in scenario.processes}
    assert procs[100].memory(0) == 4 * GIB
    assert procs[200].utilization(10.0) == pytest.approx(0.3 + 0.2 * math.sin(2 * math.pi * 10 / 40))


@pytest.mark.parametrize("doc,match", [
    ([], "expected a mapping"),
    ({"gpus": 3}, "'gpus' must be a mapping"),
    ({"gpus": {"count": 0}}, "gpus.count"),
    ({"gpus": {"count": 1}, "processes": [{"gpus": [3], "memory_gib": 1}]}, r"processes\[0\].gpus"),
    ({"gpus": {"count": 1}, "processes": [{"gpus": [0]}]}, "needs memory_gib"),
    ({"gpus": {"count": 1}, "processes": [{"gpus": [0], "memory_gib": 1, "utilization": 40}]}, "ratio 0-1"),
    ({"gpus": {"count": 1, "memory_gib": 8}, "processes": [{"gpus": [0], "memory_gib": 9}]}, "more memory than it has"),
    ({"gpus": {"count": 1}, "processes": [{"gpus": [0], "memory_gib": 1, "utilization": {"wave": {"period": "x"}}}]},
     "period"),
])
def test_bad_scenarios_name_the_field(doc, match):
    with pytest.raises(ScenarioError, match=match):
        parse_scenario(doc, "s.yaml")


def test_unreadable_or_invalid_scenario_is_a_clear_backend_error(tmp_path):
    with pytest.raises(BackendUnavailable, match="cannot read scenario"):
        open_backends("simulated", {"simulated": {"scenario": str(tmp_path / "missing.yaml")}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [unclosed\n")
    with pytest.raises(BackendUnavailable, match="not valid YAML"):
        open_backends("simulated", {"simulated": {"scenario": str(bad)}})


def test_unknown_backend_lists_the_choices():
    with pytest.raises(BackendUnavailable, match="unknown backend 'cuda'; choose auto or one of"):
        open_backends("cuda", {})


def test_gpm_follows_the_load_and_a_process_without_math_leaves_the_tensor_cores_idle():
    clock = [0.0]
    backend = SimulatedBackend(clock=lambda: clock[0])
    backend.open()
    assert all(dict(d.gpm) == {} for d in backend.sample(clock[0]))  # one sample: no window yet
    clock[0] += 1.0
    by_index = {d.index: d for d in backend.sample(clock[0])}
    trainer, stuck, idle = by_index[2].gpm, by_index[5].gpm, by_index[7].gpm
    assert trainer["tensor_active"] == pytest.approx(0.85 * 0.92)
    assert stuck["sm_active"] == trainer["sm_active"] == pytest.approx(0.93 * 0.92)
    assert stuck["tensor_active"] == 0.0 and stuck["fp32_active"] == 0.0
    assert idle["sm_active"] == 0.0 and idle["tensor_active"] == 0.0
    with pytest.raises(ScenarioError, match=r"processes\[0\]\.tensor: a ratio 0-1"):
        parse_scenario({"gpus": {"count": 1}, "processes": [{"gpus": [0], "memory_gib": 1, "tensor": 2}]})
