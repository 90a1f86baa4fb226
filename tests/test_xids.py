"""The pass's new XIDs: one baseline, read alike by the health stage and the incident engine."""

from __future__ import annotations

from exporter.collect.collector import Collector
from exporter.collect.xids import XidBaseline, xid_step
from exporter.core.labels import label_schema
from exporter.core.model import DeviceSample
from exporter.devices.base import Backend
from exporter.incidents.engine import IncidentTracker
from exporter.incidents.watch import IncidentWatch


def _gpu(key: str, xids: dict[str, int], up: bool = True) -> DeviceSample:
    return DeviceSample(index=0, uuid=key, model="H100", vendor="nvidia", up=up, xid_errors=xids)


def test_a_device_first_pass_is_its_baseline_then_growth_counts_and_a_reset_counts_from_its_new_low():
    baseline, new = xid_step(XidBaseline(), [_gpu("GPU-a", {"79": 1})])
    assert dict(new) == {}  # nothing to compare with: the counts are the baseline
    baseline, new = xid_step(baseline, [_gpu("GPU-a", {"79": 1, "31": 3})])
    assert dict(new["GPU-a"]) == {"31": 3}
    baseline, new = xid_step(baseline, [_gpu("GPU-a", {"31": 1})])  # the driver reloaded: counts fell
    assert dict(new["GPU-a"]) == {}
    baseline, new = xid_step(baseline, [_gpu("GPU-a", {"31": 2, "79": 1})])  # counted from the new low
    assert dict(new["GPU-a"]) == {"31": 1, "79": 1}


def test_a_device_missing_from_a_pass_keeps_its_baseline():
    baseline, _ = xid_step(XidBaseline(), [_gpu("GPU-a", {"31": 2}), _gpu("GPU-b", {})])
    baseline, new = xid_step(baseline, [_gpu("GPU-b", {})])
    assert set(new) == {"GPU-b"}
    _, new = xid_step(baseline, [_gpu("GPU-a", {"31": 3}), _gpu("GPU-b", {"48": 1})])
    assert dict(new["GPU-a"]) == {"31": 1} and dict(new["GPU-b"]) == {"48": 1}


class _Scripted(Backend):
    """One GPU whose cumulative XID counts the test sets before each pass."""

    name = "scripted"

    def __init__(self) -> None:
        self.xids: dict[str, int] = {}

    def sample(self, now: float) -> list[DeviceSample]:
        return [DeviceSample(index=0, uuid="GPU-0", model="H100", vendor="nvidia", pci_bus_id="00000000:3B:00.0",
                             memory_total_bytes=80 << 30, memory_used_bytes=1 << 30, xid_errors=dict(self.xids))]


def test_a_counter_reset_is_seen_alike_by_the_health_verdict_and_the_incidents():
    """A GPU's XID 31 count rises, falls to zero (the driver reloaded) and rises again: both
    the health stage and the incident engine see two events at first, none at the reset and
    one after it, because both read the pass's one reading of the XIDs (`Snapshot.new_xids`).
    Had either kept the count from before the reset as its baseline, it would have missed
    the XID after it: no incident then, and the verdict would clear ten quiet minutes after
    the first XIDs instead of after the last."""
    now = [1.0]
    backend = _Scripted()
    names, labeller = label_schema([])
    collector = Collector([backend], "n1", labeller=labeller, clock=lambda: now[0], wall=lambda: 1.7e9 + now[0])
    watch = IncidentWatch("n1", labeller, names, tracker=IncidentTracker("n1"), clock=lambda: now[0])

    def pass_at(t: float, xids: dict[str, int]) -> tuple[dict[str, int] | None, list[int], tuple[str, ...]]:
        now[0], backend.xids = t, xids
        before = len(watch.recent_json())
        snap = collector.collect_once()
        watch.observe(snap)
        incidents = [doc["xid"] for doc in watch.recent_json()[: len(watch.recent_json()) - before]]
        new = snap.new_xids.get("GPU-0")
        return (dict(new) if new is not None else None), incidents, snap.verdicts["GPU-0"].reason_names

    try:
        assert pass_at(1.0, {}) == (None, [], ())  # the first pass: the baseline
        assert pass_at(2.0, {"31": 2}) == ({"31": 2}, [31], ("xid_31",))
        assert pass_at(3.0, {}) == ({}, [], ("xid_31",))  # the reset: no event
        assert pass_at(400.0, {"31": 1}) == ({"31": 1}, [31], ("xid_31",))  # counted from the reset
        assert pass_at(700.0, {"31": 1}) == ({}, [], ("xid_31",))  # the XID at 400 s restarted the window
        assert pass_at(1001.0, {"31": 1}) == ({}, [], ())  # ten quiet minutes after it
    finally:
        watch.close()
