"""The catalogue is the one table: names follow the conventions and the doc matches it."""

import re
from pathlib import Path

import pytest

from exporter import catalogue as cat
from exporter.model import DeviceSample, Snapshot
from exporter.render import families

DOC = Path(__file__).resolve().parent.parent / "docs" / "METRICS.md"


def test_metrics_doc_is_generated_from_the_catalogue():
    assert DOC.read_text(encoding="utf-8") == cat.markdown(), (
        "docs/METRICS.md is stale: run `python -m exporter.catalogue > docs/METRICS.md`")


@pytest.mark.parametrize("spec", cat.METRICS, ids=lambda s: s.name)
def test_names_follow_prometheus_conventions(spec):
    assert re.fullmatch(r"[a-z_][a-z0-9_]*", spec.name)
    assert spec.name.endswith("_total") == (spec.type == cat.COUNTER)
    if spec.type == cat.INFO:
        assert spec.name.endswith("_info")
    if spec.unit:
        base = spec.name[: -len("_total")] if spec.type == cat.COUNTER else spec.name
        assert base.endswith("_" + spec.unit), f"{spec.name} should end with its unit {spec.unit}"
    assert "percent" not in spec.name
    assert spec.ucum  # every unit maps to UCUM for OTLP
    assert spec.help.strip()


def test_device_and_workload_series_carry_the_identity_labels():
    for spec in cat.METRICS:
        if spec.scope in (cat.DEVICE, cat.UNATTRIBUTED):
            assert spec.labels[:5] == ("node", "gpu", "uuid", "model", "gpu_instance")
        if spec.scope == cat.WORKLOAD:
            assert spec.labels == cat.WORKLOAD_LABELS


def test_label_attribute_mapping_uses_semantic_conventions():
    assert cat.otel_attribute("pod") == "k8s.pod.name"
    assert cat.otel_attribute("namespace") == "k8s.namespace.name"
    assert cat.otel_attribute("container") == "k8s.container.name"
    assert cat.otel_attribute("node") == "k8s.node.name"
    assert cat.otel_attribute("uuid") == "gpu.id"
    assert cat.otel_attribute("model") == "gpu.model"
    assert cat.otel_attribute("slurm_job_id") == "slurm.job.id"
    assert cat.otel_attribute("label_team") == "k8s.pod.label.team"
    assert cat.get("gpu_power_watts").ucum == "W"
    assert cat.get("container_gpu_memory_used_bytes").ucum == "By"
    assert cat.get("gpu_temperature_celsius").ucum == "Cel"


def _full_snapshot():
    device = DeviceSample(index=0, uuid="GPU-x", model="m", utilization=0.5, memory_used_bytes=1,
                          memory_total_bytes=2, power_watts=100.0, ecc_errors={"corrected": 1},
                          throttle_reasons={"gpu_idle": False}, xid_errors={"79": 1})
    return Snapshot(seq=1, node="n", timestamp=0.0, devices=(device,), device_energy_joules={"GPU-x": 5.0})


def test_all_off_exports_nothing_and_each_family_can_be_disabled():
    snap = _full_snapshot()
    assert list(families(snap, frozenset())) == []
    everything = cat.enabled_names([s.name for s in cat.METRICS])
    names = {f.name for f in families(snap, everything)}
    assert len(names) == len(cat.METRICS) - len(cat.REGISTERED_ELSEWHERE)
    without_power = cat.enabled_names(disable=["gpu_power_watts"])
    assert "gpu_power_watts" not in {f.name for f in families(snap, without_power)}


def test_opt_in_families_are_off_by_default_and_unknown_names_are_rejected():
    defaults = cat.enabled_names()
    assert "gpu_process_memory_used_bytes" not in defaults
    assert "gpu_power_watts" in defaults
    with pytest.raises(ValueError, match="unknown metric 'gpu_bogus'"):
        cat.enabled_names(["gpu_bogus"])
