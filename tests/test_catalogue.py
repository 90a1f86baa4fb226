"""The catalogue is the one table: names follow the conventions and the doc matches it."""

import re
from pathlib import Path

import pytest
from waiting import wait_until

from exporter.core.model import DeviceSample, Snapshot, StuckCall
from exporter.output import catalogue as cat
from exporter.output import metrics_doc
from exporter.output.render import families

DOC = Path(__file__).resolve().parent.parent / "docs" / "METRICS.md"


def test_metrics_doc_is_generated_from_the_catalogue():
    assert DOC.read_text(encoding="utf-8") == metrics_doc.markdown(), (
        "docs/METRICS.md is stale: run `python -m exporter.output.metrics_doc > docs/METRICS.md`")


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


# --- every family of the table has a way to render, and renders something --------------------


def _sampled(snapshot: Snapshot, now: float, extra: tuple[str, ...] = ()) -> set[str]:
    """The families with at least one series for ``snapshot``, every family enabled and whole (``--detail``)."""
    out = set()
    every = frozenset(spec.name for spec in cat.METRICS)
    for family in families(snapshot, every, extra, now=now, detailed=every):
        if family.samples:
            out |= {family.name, family.name + "_total"}  # a counter family drops its _total
    return out


def _simulated_node(scenario: str | None, passes: int = 61) -> set[str]:
    """The families the simulated node gives a series in any of ``passes`` passes a second apart."""
    from exporter.app.cli import build_parser
    from exporter.attribution import build_attributor
    from exporter.collect.collector import Collector
    from exporter.core.labels import label_schema
    from exporter.devices.simulated.backend import SimulatedBackend

    t = [1000.0]
    backend = SimulatedBackend(scenario, clock=lambda: t[0])
    backend.open()
    node = backend.node_name()
    attributor = build_attributor(build_parser().parse_args(["serve", "--backend", "simulated"]), node,
                                   scenario=backend.scenario)
    extra, labeller = label_schema([])
    collector = Collector([backend], node, attributor=attributor, labeller=labeller, clock=lambda: t[0],
                          wall=lambda: 1.8e9 + t[0])
    seen: set[str] = set()
    try:
        for n in range(passes):
            t[0] = 1000.0 + n
            seen |= _sampled(collector.collect_once(), 1.8e9 + t[0], extra)
    finally:
        attributor.close()
    return seen


# Families whose value no simulated scenario has: a fan (data-centre cards have none), a
# driver call stuck past its deadline, an error a backend survived.
NO_SCENARIO_HAS = {"gpu_fan_speed_ratio", "gpu_stuck_call_seconds", "l9gpu_backend_errors_total"}


def _what_the_simulation_lacks() -> Snapshot:
    """A node with what the simulated scenarios never show: a GPU with a fan, a driver call
    stuck past its deadline, an error a backend survived."""
    gpu = DeviceSample(index=0, uuid="GPU-x", model="m", fan_speed_ratio=0.4)
    stuck = StuckCall(backend="nvml", what="GPU 0", call="nvmlDeviceGetPowerUsage", since=0.0, seconds=2.0,
                      devices=(gpu.key,))
    return Snapshot(seq=1, node="n", timestamp=0.0, devices=(gpu,), stuck=(stuck,),
                    backend_errors={("gaudi", "timeout"): 1})


def test_every_family_declares_how_it_is_rendered():
    """A row says what renders it (its extractor) or which part registers it; a row with
    neither cannot be written, so no family comes out empty for want of a renderer."""
    for spec in cat.METRICS:
        assert (spec.extract is None) == bool(spec.registered_by), spec.name
    assert {spec.name for spec in cat.METRICS if spec.scope == cat.HEALTH} <= \
        {spec.name for spec in cat.METRICS if spec.extract is not None}
    with pytest.raises(ValueError, match="give exactly one"):
        cat.MetricSpec("gpu_new_health_ratio", cat.GAUGE, "ratio", "A family nothing renders.", cat.DEVICE_LABELS,
                       cat.HEALTH)


def test_every_family_renders_series_where_its_value_exists():
    """Every family the snapshot renders, health families included, gives series on the
    simulated nodes (the demo and the incidents scenario), or, for what no scenario has,
    on a node that has it: an extractor that reads the wrong place comes out empty here."""
    rendered = {spec.name for spec in cat.METRICS if spec.extract is not None}
    simulated = _simulated_node(None) | _simulated_node("incidents")
    lacking = rendered - simulated
    assert sorted(lacking - NO_SCENARIO_HAS) == [], "these families give no series on the simulated nodes"
    assert sorted(NO_SCENARIO_HAS - lacking) == [], "the simulated nodes give these now: take them off NO_SCENARIO_HAS"
    empty = sorted(NO_SCENARIO_HAS - _sampled(_what_the_simulation_lacks(), now=5.0))
    assert empty == [], "these families render nothing where their value exists"


def test_opt_in_families_are_off_by_default_and_unknown_names_are_rejected():
    defaults = cat.enabled_names()
    assert "gpu_process_memory_used_bytes" not in defaults
    assert "gpu_power_watts" in defaults
    with pytest.raises(ValueError, match="unknown metric 'gpu_bogus'"):
        cat.enabled_names(["gpu_bogus"])


# --- docs/METRICS.md lists everything the agent serves and every series an alert asks for --

RULES = sorted((DOC.parent.parent / "alerts").glob("*.rules.yaml"))


def documented() -> set[str]:
    """The family names docs/METRICS.md lists (the first column of its tables)."""
    return set(re.findall(r"^\| `([A-Za-z_:][A-Za-z0-9_:]*)` \|", DOC.read_text(encoding="utf-8"), re.M))


def test_every_family_of_the_catalogue_has_its_section():
    assert {spec.name for spec in cat.METRICS} <= documented()
    assert {spec.scope for spec in cat.METRICS} <= set(metrics_doc.SECTIONS)


def test_a_family_of_a_scope_without_a_section_cannot_be_left_out(monkeypatch):
    orphan = cat.MetricSpec("gpu_orphan_ratio", cat.GAUGE, "ratio", "A family of a new scope.", (), "new_scope",
                            lambda frame, spec: ())
    monkeypatch.setattr(cat, "METRICS", cat.METRICS + (orphan,))
    with pytest.raises(ValueError, match="no section for the families of scope"):
        metrics_doc.markdown()


def _served(agent) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+)", agent.scrape(), re.M))


# Every way of running the agent that adds families: the demo node with every opt-in family,
# both schemas and OTLP push on (its export counter; nothing listens there), and the
# incidents demo with its kernel log.
EVERYTHING_ON = ["--metric-schema", "l9gpu,dcgm", "--process-metrics", "--pod-label", "team",
                 "--otlp-endpoint", "127.0.0.1:9", "--otlp-insecure", "--otlp-interval", "200ms",
                 *(arg for spec in cat.METRICS if not spec.default_enabled for arg in ("--enable-metric", spec.name))]


@pytest.mark.parametrize("scenario", [[], ["--scenario", "incidents", "--kernel-log", "auto"]],
                         ids=["demo", "incidents-demo"])
def test_every_family_the_agent_serves_is_documented(agent_factory, scenario):
    pytest.importorskip("opentelemetry.sdk.metrics", reason="the OTLP push needs opentelemetry-sdk")
    agent = agent_factory("--backend", "simulated", "--interval", "200ms", *scenario, *EVERYTHING_ON)
    # the OTLP export counter appears with the first push
    wait_until(lambda: "l9gpu_otlp_exports_total" in _served(agent), what="an OTLP export")
    served = _served(agent)
    assert {"container_gpu_incidents_total", "gpu_memory_peak_bytes", "DCGM_FI_DEV_FB_USED",
            "gpu_process_memory_used_bytes", "process_resident_memory_bytes"} <= served
    if scenario:
        assert "l9gpu_kernel_log_records_total" in served
    assert sorted(served - documented()) == [], "docs/METRICS.md leaves out families the agent serves"


def _queried_series(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, keywords or labels)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, regexes
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # ranges
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = re.findall(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(?!\s*\()", expr)
    keywords = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                "group_right", "inf", "nan"}
    return {name for name in names if name.lower() not in keywords}


def test_the_series_extraction_reads_promql():
    assert _queried_series('sum by (namespace) (rate(container_gpu_usage_seconds_total{namespace!=""}[5m]))') \
        == {"container_gpu_usage_seconds_total"}
    assert _queried_series('a:b:rate5m / on (pod) group_left () (gpu_up == 0) and bool x_total offset 5m') \
        == {"a:b:rate5m", "gpu_up", "x_total"}


@pytest.mark.parametrize("rules_file", RULES, ids=lambda p: p.name)
def test_every_series_a_shipped_alert_queries_is_documented(rules_file):
    """An alert's series is one the agent serves (listed in docs/METRICS.md) or a recording
    rule of the shipped rules files."""
    yaml = pytest.importorskip("yaml")
    rules = [rule for path in RULES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]
    records = {rule["record"] for rule in rules if "record" in rule}
    alerts = [rule for group in yaml.safe_load(rules_file.read_text())["groups"] for rule in group["rules"]
              if "alert" in rule]
    queried = {name for rule in alerts for name in _queried_series(rule["expr"])}
    assert sorted(queried - documented() - records) == [], \
        f"{rules_file.name}'s alerts query series docs/METRICS.md does not list"
