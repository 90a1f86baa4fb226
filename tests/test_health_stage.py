"""The health stage through the real Collector with the simulated backend: verdict series,
signal series, clearing, MIG inheritance, the snapshot JSON and the report's unhealthy hours."""

from __future__ import annotations

import pytest
import yaml

from exporter.collect.collector import Collector
from exporter.collect.health_stage import HealthStageState, health_step, xid_codes
from exporter.collect.xids import XidBaseline, xid_growth, xid_step
from exporter.core.model import DeviceSample
from exporter.devices.simulated.backend import ScenarioError, SimulatedBackend, parse_scenario
from exporter.health import HEALTHY_VERDICT
from exporter.output import catalogue as cat
from exporter.output.render import families
from exporter.output.snapshot_json import snapshot_document


def _collector(tmp_path, doc=None):
    t = [0.0]
    path = None
    if doc is not None:
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump(doc))
    backend = SimulatedBackend(path, clock=lambda: t[0])
    backend.open()
    return Collector([backend], "n1", clock=lambda: t[0], wall=lambda: 1e9 + t[0]), t


def _series(snap, name, detail=False):
    """``name``'s series as the default output serves them, or whole (``--detail``)."""
    found = families(snap, cat.enabled_names(detail=detail), detailed=cat.detailed_names(detail))
    family = next(f for f in found if f.name == name.removesuffix("_total"))
    return [(dict(s.labels), s.value) for s in family.samples if s.name == name]


def _passes(collector, t, n, dt=1.0):
    snap = None
    for _ in range(n):
        t[0] += dt
        snap = collector.collect_once()
    return snap


def test_the_demo_node_shows_a_pending_remap_and_a_narrow_link(tmp_path):
    collector, t = _collector(tmp_path)
    snap = _passes(collector, t, 4)
    states = {lab["gpu"]: lab["state"] for lab, v in _series(snap, "gpu_health") if v == 1}
    assert states == {"0": "healthy", "1": "healthy", "2": "healthy", "3": "degraded", "4": "degraded",
                      "5": "healthy", "6": "healthy", "7": "healthy"}
    # the default serves each GPU's current state and action; --detail every state with 0 or 1
    assert len(_series(snap, "gpu_health")) == 8 and len(_series(snap, "gpu_health_action")) == 8
    assert {v for _, v in _series(snap, "gpu_health") + _series(snap, "gpu_health_action")} == {1.0}
    assert len(_series(snap, "gpu_health", detail=True)) == 8 * 3
    assert len(_series(snap, "gpu_health_action", detail=True)) == 8 * 7
    assert [(lab, v) for lab, v in _series(snap, "gpu_health", detail=True) if v == 1] == _series(snap, "gpu_health")
    reasons = sorted((lab["gpu"], lab["reason"], v) for lab, v in _series(snap, "gpu_health_reason"))
    assert reasons == [("3", "pcie_downgraded", 1.0), ("4", "row_remap_pending", 1.0)]
    actions = {lab["gpu"]: lab["action"] for lab, v in _series(snap, "gpu_health_action") if v == 1}
    assert actions["3"] == "inspect_hardware" and actions["4"] == "reset_gpu" and actions["0"] == "none"
    assert {lab["gpu"]: v for lab, v in _series(snap, "gpu_row_remap_pending")} == {"4": 1.0}  # set only
    pending = {lab["gpu"]: v for lab, v in _series(snap, "gpu_row_remap_pending", detail=True)}
    assert pending["4"] == 1.0 and pending["0"] == 0.0
    width = {lab["gpu"]: v for lab, v in _series(snap, "gpu_pcie_link_width")}
    assert width["3"] == 8.0 and width["2"] == 16.0
    assert {v for _, v in _series(snap, "gpu_pcie_link_width_max")} == {16.0}
    rows = {(lab["gpu"], lab["type"]): v for lab, v in _series(snap, "gpu_remapped_rows_total", detail=True)}
    assert rows[("4", "uncorrectable")] == 1.0
    summed = {lab["gpu"]: v for lab, v in _series(snap, "gpu_remapped_rows_total")}
    assert summed["4"] == rows[("4", "uncorrectable")] + rows[("4", "correctable")] and len(summed) == 8
    links = _series(snap, "gpu_nvlink_errors_total", detail=True)
    assert {lab["gpu"] for lab, _ in links} == {"0", "1"} and len(links) == 2 * 18 * 4
    per_gpu = {lab["gpu"]: v for lab, v in _series(snap, "gpu_nvlink_errors_total")}  # every link and type summed
    assert per_gpu == {gpu: sum(v for lab, v in links if lab["gpu"] == gpu) for gpu in ("0", "1")}
    assert all("link" not in lab and "type" not in lab for lab, _ in _series(snap, "gpu_nvlink_errors_total"))
    assert _series(snap, "gpu_health_transitions_total")[3][1] == 1.0  # GPU 3: healthy -> degraded once
    doc = snapshot_document(snap)
    gpu4 = next(g for g in doc["gpus"] if g["index"] == 4)
    assert gpu4["health"]["state"] == "degraded" and gpu4["health"]["action"] == "reset_gpu"
    assert gpu4["health"]["reasons"][0]["reason"] == "row_remap_pending" and gpu4["health"]["reasons"][0]["text"]
    assert doc["schema_version"] == 1


def test_a_pending_remap_clears_after_the_reset_and_unhealthy_time_is_counted(tmp_path):
    doc = {"gpus": {"count": 2}, "processes": [],
           "health": [{"gpus": [0], "row_remap": {"pending": True}, "until": "5s"},
                      {"gpus": [1], "row_remap": {"failure": True}, "until": "5s"}]}
    collector, t = _collector(tmp_path, doc)
    snap = _passes(collector, t, 3)
    assert snap.verdicts[snap.devices[0].key].reason_names == ("row_remap_pending",)
    assert snap.verdicts[snap.devices[1].key].state == "unhealthy"
    snap = _passes(collector, t, 4)
    assert all(v.state == "healthy" and v.reasons == () for v in snap.verdicts.values())
    assert _series(snap, "gpu_row_remap_pending") == []  # cleared: nothing to say by default
    assert {lab["gpu"]: v for lab, v in _series(snap, "gpu_row_remap_pending", detail=True)} == {"0": 0.0, "1": 0.0}
    unhealthy = {lab["gpu"]: v for lab, v in _series(snap, "gpu_unhealthy_seconds_total")}
    # unhealthy in the passes at t=1..4 (the scenario lifts it at 5 s): the intervals ending at t=2, 3, 4
    assert unhealthy["0"] == 0.0 and unhealthy["1"] == pytest.approx(3.0)
    assert snap.health_transitions[snap.devices[1].key] == 1  # unhealthy from the first pass, then healthy


def test_mig_instances_inherit_their_parents_verdict_and_down_gpus_get_one():
    parent = DeviceSample(index=0, uuid="GPU-a", vendor="nvidia", capacity=0.0)
    mig = DeviceSample(index=0, uuid="MIG-a", vendor="nvidia", gpu_instance="1", capacity=0.5, xid_errors={"79": 1})
    other = DeviceSample(index=1, uuid="GPU-b", vendor="nvidia", up=False, error="lost", xid_errors={"79": 1})
    baseline, new = xid_step(XidBaseline(), [parent, mig, other])
    state, got = health_step(HealthStageState(), 1.0, [parent, mig, other], new)
    assert got.verdicts["MIG-a"] == got.verdicts["GPU-a"] == HEALTHY_VERDICT
    assert got.verdicts["GPU-b"].reason_names == ("xid_79",) and got.verdicts["GPU-b"].action == "reboot_node"
    baseline, new = xid_step(baseline, [parent, mig, other])
    state, got = health_step(state, 2.0, [parent, mig, other], new, stuck={"GPU-a"})
    assert got.verdicts["MIG-a"].reason_names == ("stuck_in_driver_call",)
    assert got.verdicts["MIG-a"].problems == ()
    assert got.transitions["MIG-a"] == got.transitions["GPU-a"] == 1
    # the XID count did not grow: no new XID, the reboot verdict stays until the driver shows a reboot
    assert got.verdicts["GPU-b"].reason_names == ("xid_79",)
    assert got.unhealthy_seconds["GPU-b"] == pytest.approx(1.0)


def test_new_xids_are_the_growth_of_the_cumulative_counts():
    assert xid_codes(xid_growth({}, {"31": 2, "79": 1})) == [31, 31, 79]
    assert xid_codes(xid_growth({"31": 2}, {"31": 2, "13": 1})) == [13]


@pytest.mark.parametrize("entry,message", [
    ({"gpus": [0], "row_remap": {"pending": "yes"}}, "health[0].row_remap.pending: expected true or false"),
    ({"gpus": [0], "pcie": {"width": 64}}, "health[0].pcie.width: expected a whole number 1-32"),
    ({"gpus": [0], "pcie": {"lanes": 8}}, "health[0].pcie.lanes: unknown field"),
    ({"gpus": [9], "pcie": {"width": 8}}, "health[0].gpus: expected a non-empty list of GPU indexes 0-0"),
    ({"gpus": [0], "until": "soon"}, "health[0].until:"),
    ({"gpus": [0], "colour": 1}, "health[0].colour: unknown field"),
])
def test_bad_health_entries_name_the_field(entry, message):
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario({"gpus": {"count": 1}, "processes": [], "health": [entry]}, "s.yaml")


@pytest.mark.parametrize("scenario", [None, "incidents"])
def test_a_verdict_kept_from_the_last_pass_is_the_one_assessed_afresh(scenario):
    """Passes without a health read, an XID or a stuck call keep the last verdict instead of
    assessing it again: over the demo nodes' health reads (every 10 s a GPU), XIDs (and
    stuck calls made up here), every pass's verdicts, transitions and unhealthy seconds are those of assessing
    every GPU every pass."""
    from dataclasses import replace

    from exporter.core.model import updated

    t = [0.0]
    backend = SimulatedBackend(scenario, clock=lambda: t[0])
    backend.open()
    kept, fresh = HealthStageState(), HealthStageState()
    baseline = XidBaseline()
    shortcuts = 0
    for n in range(240):
        t[0] = float(n)
        # health read every 10 s per GPU, staggered, as the NVML backend reads it
        devices = [d if n % 10 == d.index else updated(d, health_signals=None) for d in backend.sample(t[0])]
        stuck = {devices[2].key} if 100 <= n < 104 else set()
        before = dict(kept.verdicts)
        baseline, new = xid_step(baseline, devices)
        kept, got = health_step(kept, t[0], devices, new, stuck)
        fresh, want = health_step(replace(fresh, verdicts={}), t[0], devices, new, stuck)
        assert got.verdicts == want.verdicts, n
        assert got.transitions == want.transitions and got.unhealthy_seconds == want.unhealthy_seconds, n
        assert got.problems == want.problems and got.signals == want.signals, n
        shortcuts += sum(got.verdicts[key] is verdict for key, verdict in before.items())
    assert shortcuts > 240 * 8 // 4  # many passes of many GPUs kept their verdict
