"""The devices' one schedule of slow re-reads, and what a backend that reads health declares."""

from __future__ import annotations

import argparse

import pytest

from exporter import devices
from exporter.core.model import DeviceSample
from exporter.devices.base import Backend
from exporter.devices.schedule import DEFAULT_HEALTH_INTERVAL, HealthReads, Schedule


def test_every_gpu_reads_on_its_first_pass_then_the_gpus_are_staggered_over_the_period():
    schedule = Schedule()
    assert [schedule.due(i, 4, 0.0, 8.0) for i in range(4)] == [True] * 4
    due_at: dict[int, list[float]] = {i: [] for i in range(4)}
    for t in range(1, 17):
        for i in range(4):
            if schedule.due(i, 4, float(t), 8.0):
                due_at[i].append(float(t))
    assert due_at == {0: [2.0, 10.0], 1: [4.0, 12.0], 2: [6.0, 14.0], 3: [8.0, 16.0]}


def test_each_read_of_a_gpu_has_its_own_due_time_and_period_zero_is_every_pass():
    schedule = Schedule()
    assert schedule.due(0, 1, 0.0, 10.0, "ecc") and schedule.due(0, 1, 0.0, 0.0, "pcie")
    assert not schedule.due(0, 1, 1.0, 10.0, "ecc") and schedule.due(0, 1, 1.0, 0.0, "pcie")


class _Vendor(HealthReads, Backend):
    """A new vendor that reads health: nothing of --health-interval written here."""

    name = "vendor"

    def __init__(self, health_interval: float | None = DEFAULT_HEALTH_INTERVAL):
        super().__init__(health_interval)

    def sample(self, now: float) -> list[DeviceSample]:
        return [DeviceSample(index=i, uuid=f"V-{i}") for i in range(2) if self.health_due(i, 2, now)]


def test_a_backend_that_reads_health_gets_the_flag_from_the_registry(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(devices, "registry", lambda: {"vendor": _Vendor})
    parser = argparse.ArgumentParser()
    devices.add_arguments(parser, devices.SAMPLING_FLAGS)
    options = devices.options_from(parser.parse_args(["--health-interval", "10s"]))
    assert options == {"vendor": {"health_interval": 10.0}}
    backend = _Vendor(**options["vendor"])
    assert [d.index for d in backend.sample(0.0)] == [0, 1]  # every GPU on the first pass
    assert [d.index for d in backend.sample(5.0)] == [0] and [d.index for d in backend.sample(10.0)] == [1]
    off = _Vendor(**devices.options_from(parser.parse_args(["--health-interval", "off"]))["vendor"])
    assert off.sample(0.0) == [] and off.sample(100.0) == []


def test_no_health_flag_without_a_backend_that_reads_health(monkeypatch: pytest.MonkeyPatch):
    class Plain(Backend):
        name = "plain"

        def sample(self, now: float) -> list[DeviceSample]:
            return []

    monkeypatch.setattr(devices, "registry", lambda: {"plain": Plain})
    parser = argparse.ArgumentParser()
    devices.add_arguments(parser, devices.SAMPLING_FLAGS)
    assert "--health-interval" not in parser.format_help()
    assert devices.options_from(parser.parse_args([])) == {"plain": {}}
