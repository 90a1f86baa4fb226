"""Gaudi health reads: the second, slow-schedule hl-smi query, against the stand-in hl-smi."""

from __future__ import annotations

import logging
from pathlib import Path

from exporter.devices.gaudi.backend import GaudiBackend
from exporter.devices.gaudi.health import HEALTH_FIELDS, parse_health_csv
from exporter.health.signals import Ecc

FAKE_HL_SMI = str(Path(__file__).parent / "fakes" / "hl-smi")


def backend(tmp_path: Path, monkeypatch, interval: float | None = 30.0) -> tuple[GaudiBackend, Path]:
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_HL_SMI_CALLS", str(calls))
    (tmp_path / "proc").mkdir()
    (tmp_path / "boot_id").write_text("0b0e1d00-0000-4000-8000-000000000042\n")
    gaudi = GaudiBackend(hl_smi=FAKE_HL_SMI, proc_root=str(tmp_path / "proc"), health_interval=interval,
                         boot_id_path=str(tmp_path / "boot_id"))
    gaudi.open()
    return gaudi, calls


def health_calls(calls: Path) -> int:
    return sum(",".join(HEALTH_FIELDS) in line for line in calls.read_text().splitlines())


def test_health_values_arrive_in_the_sample(tmp_path, monkeypatch):
    gaudi, calls = backend(tmp_path, monkeypatch)
    dev0, dev1 = gaudi.sample(100.0)
    assert dev0.health_signals.ecc == Ecc(enabled=True, volatile_corrected=2, volatile_uncorrected=0,
                                  aggregate_corrected=5, aggregate_uncorrected=0)
    assert dev1.health_signals.ecc == Ecc(enabled=True, volatile_corrected=0, volatile_uncorrected=0,
                                  aggregate_corrected=0, aggregate_uncorrected=0)
    assert dev0.health_signals.boot_id == "0b0e1d00-0000-4000-8000-000000000042"
    # hl-smi has none of these.
    assert dev0.health_signals.pcie is None and dev0.health_signals.nvlinks == () and dev0.health_signals.recovery_action is None
    assert dev0.health_signals.fabric is None and dev0.health_signals.violations is None
    assert health_calls(calls) == 1


def test_health_query_only_every_interval(tmp_path, monkeypatch):
    gaudi, calls = backend(tmp_path, monkeypatch, interval=30.0)
    read = {0: [], 1: []}
    for now in (100.0, 105.0, 114.0, 116.0, 129.0, 131.0, 146.0):
        for dev in gaudi.sample(now):
            if dev.health_signals is not None:
                read[dev.index].append(now)
    assert read == {0: [100.0, 116.0, 146.0], 1: [100.0, 131.0]}
    assert health_calls(calls) == 4  # passes at 100, 116, 131, 146


def test_health_off_runs_no_health_query(tmp_path, monkeypatch):
    gaudi, calls = backend(tmp_path, monkeypatch, interval=None)
    for now in (100.0, 200.0):
        assert all(dev.up and dev.health_signals is None for dev in gaudi.sample(now))
    assert health_calls(calls) == 0


def test_a_tool_without_a_field_fails_only_the_health_query(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_HL_SMI_HEALTH_EXIT", "1")
    gaudi, _ = backend(tmp_path, monkeypatch, interval=0.0)
    caplog.set_level(logging.DEBUG, logger="exporter.devices.gaudi.backend")
    for now in (100.0, 101.0, 102.0):
        samples = gaudi.sample(now)
        assert [dev.up for dev in samples] == [True, True]
        assert samples[0].utilization == 0.17
        assert all(dev.health_signals is None for dev in samples)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "health query" in warnings[0].getMessage()
    assert gaudi.errors() == {"health_query": 3}


def test_garbage_is_passed_on_without_a_crash(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_HL_SMI_HEALTH_OUTPUT", "0, maybe, -3, lots, N/A, 1e30\nnot a line\n1, Disabled\n")
    gaudi, _ = backend(tmp_path, monkeypatch)
    dev0, dev1 = gaudi.sample(100.0)
    assert dev0.up and dev1.up
    assert dev0.health_signals.ecc == Ecc(enabled=None, volatile_corrected=-3, volatile_uncorrected=None,
                                  aggregate_corrected=None, aggregate_uncorrected=int(1e30))
    assert dev1.health_signals is not None and dev1.health_signals.ecc is None


def test_parse_health_csv_is_total():
    assert parse_health_csv("") == {}
    assert parse_health_csv("x, Enabled, 1, 1, 1, 1\n0, Enabled, 1, 1, 1, 1\n0, Disabled, 0, 0, 0, 0\n") == {
        0: Ecc(enabled=True, volatile_corrected=1, volatile_uncorrected=1, aggregate_corrected=1,
               aggregate_uncorrected=1)}
    assert parse_health_csv('0, "unterminated, 1, 1, 1, 1\n') == {}
