"""The Grafana dashboards: valid JSON, only names the agent exports, and every expression
evaluated by a real Prometheus that scrapes the agent on the simulated node and, for the
Inference row, inference engines' /metrics on the demo's pods (tests/fakes/inference_engines.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from agent import AgentProcess, ambient_setting
from conftest import need_tool
from fakes.inference_engines import app, demo_engines, scrape_jobs
from loopback_http import LoopbackServer
from promserver import PrometheusServer

from exporter.output.catalogue import METRICS

REPO = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
CHART_COPIES = sorted((REPO / "charts" / "l9gpu" / "dashboards").glob("*.json"))
if str(REPO) not in sys.path:  # dashboards/ is a package of the checkout, not of the wheel
    sys.path.insert(0, str(REPO))
RULES = REPO / "alerts" / "l9gpu.rules.yaml"
INFERENCE_RULES = REPO / "alerts" / "l9gpu-inference.rules.yaml"
TRAINING_RULES = REPO / "alerts" / "l9gpu-training.rules.yaml"
# Read records of training jobs, which the simulated node has none of: its expressions are
# evaluated on a history of training jobs instead (tests/test_training_dashboard.py).
TRAINING = "l9gpu-training.json"
PRICES = REPO / "alerts" / "prices.example.yaml"


def prices_rules() -> str:
    """The example prices as `l9gpu prices` writes them: the series the cost panels multiply by."""
    from exporter.report.prices import load_prices, recording_rules

    return recording_rules(load_prices(PRICES))

# Expressions that may legitimately return nothing on the simulated node, with the reason.
ALLOWED_EMPTY = {
    "gpu_fan_speed_ratio": "the simulated H100s are passively cooled: the family is absent, not 0",
    "gpu_xid_errors_total": "no XID events on the simulated node, and the family has no series until one occurs",
    "l9gpu_backend_errors_total": "the simulated backend meets no errors, so the counter has no series",
    "l9gpu_otlp_exports_total": "OTLP push is off in this test; the family exists only while it is on",
    "l9gpu_kernel_log_records_total": "the kernel log is not read in this test (--kernel-log off)",
    "l9gpu_kernel_log_reader_failures_total": "the kernel log is not read in this test (--kernel-log off)",
    "l9gpu_kubernetes_events_total": "no Kubernetes API on the simulated node: no Events are posted",
    "l9gpu_kubernetes_node_updates_total": "no Kubernetes API on the simulated node: no node condition is written",
    "gpu_up{node=~\".*\", gpu=~\".*\"} == 0": "every simulated GPU is up",
    "gpu_stuck_call_seconds": "no simulated GPU is stuck in a driver call: the family has series only then",
    "gpu_violation_seconds_total": "a policy has a series once the driver has counted time for it (the default leaves "
                                   "the zeros out): in the test's first seconds no simulated GPU's clocks were held "
                                   "down for two scrapes",
}

PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
    "inf", "nan", "atan2",
    # aggregation operators, which may be followed by `by (...)` instead of `(`
    "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
}


def _dashboard(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in doc["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _expressions() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) for every target of every panel."""
    out = []
    for path in DASHBOARDS:
        for panel in _panels(_dashboard(path)):
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
    return out


# The rows of panels on what the agent serves only with --detail (docs/METRICS.md, *Series per GPU*).
DETAIL_ROW = "Detail (served with --detail)"


# Dashboards with no Detail row, and why: nothing they show has a breakdown --detail adds.
NO_DETAIL_ROW = {
    "l9gpu-training.json": "a job's answers from the training rules' records, and its ranks' tensor activity, "
                           "clock and power, all served by default",
}


def _detail_expressions() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) of every target of the panels in a Detail row."""
    out = []
    for path in DASHBOARDS:
        row = ""
        for panel in _panels(_dashboard(path)):
            if panel["type"] == "row":
                row = panel["title"]
            elif row == DETAIL_ROW:
                out += [(path.name, panel["title"], target["expr"]) for target in panel.get("targets", [])]
    return out


def _shaped_names() -> set[str]:
    """The families the default output serves less of than --detail (`MetricSpec.shaped`)."""
    return {spec.name for spec in METRICS if spec.shaped}


def _variable_queries() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARDS:
        for var in _dashboard(path)["templating"]["list"]:
            if var["type"] == "query":
                out.append((path.name, var["name"], var["query"]["query"]))
    return out


def _variable_names() -> set[str]:
    return {var["name"] for path in DASHBOARDS for var in _dashboard(path)["templating"]["list"]}


def substitute(expr: str, window: str = "30s") -> str:
    """What Grafana sends with every variable at "All" (`.*`) and a short time range."""
    expr = re.sub(r"\$__(range|rate_interval|interval)\b", window, expr)
    for name in sorted(_variable_names(), key=len, reverse=True):
        expr = re.sub(r"\$\{" + name + r"(:[a-z]+)?\}|\$" + name + r"\b", ".*", expr)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


_TOKEN = re.compile(r"""
    "(?:[^"\\]|\\.)*" | '(?:[^'\\]|\\.)*'          # strings
  | \{[^}]*\}                                      # label matchers
  | \[[^\]]*\]                                     # range and subquery windows
  | (?:\d+(?:ms|[smhdwy]))+\b                      # durations (offset 5m)
  | \d+(?:\.\d+)?(?:[eE][+-]?\d+)?                 # numbers
  | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\s*(?P<call>\()?
""", re.VERBOSE)
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (functions, keywords, labels and strings skipped)."""
    expr = _GROUPING.sub(r"\1", substitute(expr))
    names = set()
    for match in _TOKEN.finditer(expr):
        name = match.group("name")
        if name and not match.group("call") and name not in PROMQL_KEYWORDS:
            names.add(name)
    return names


def known_names() -> set[str]:
    names = {spec.name for spec in METRICS}
    for path in (RULES, INFERENCE_RULES, TRAINING_RULES):
        rules = yaml.safe_load(path.read_text())
        names |= {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}
    prices = yaml.safe_load(prices_rules())
    names |= {rule["record"] for group in prices["groups"] for rule in group["rules"]}
    # prometheus_client's own process and platform collectors
    names |= {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
              "process_open_fds", "process_max_fds", "process_start_time_seconds", "python_info"}
    return names


def _strip_suffix(name: str) -> str:
    return re.sub(r"_(bucket|sum|count|created)$", "", name)


def test_metric_name_extraction():
    assert metric_names('sum by (namespace) (increase(a_total{x=~"$node"}[$__range])) / 3.6e6') == {"a_total"}
    assert metric_names("b / on (node, uuid) group_left () c > 2^30 and d offset 5m") == {"b", "c", "d"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_is_valid_grafana_json(path):
    doc = _dashboard(path)
    assert 36 <= doc["schemaVersion"] <= 41
    assert doc["uid"] and doc["title"]
    variables = {var["name"]: var for var in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    exprs = " ".join(t["expr"] for panel in _panels(doc) for t in panel.get("targets", []))
    for name in ("node", "gpu") if "$node" in exprs else ("namespace",):
        assert variables[name]["type"] == "query"
        assert variables[name]["query"]["query"].startswith("label_values(")
        assert variables[name]["allValue"] == ".*"
    ids = [panel["id"] for panel in _panels(doc)]
    assert len(ids) == len(set(ids))
    for panel in _panels(doc):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["expr"].strip()
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        unit = panel["fieldConfig"]["defaults"].get("unit")
        if panel["type"] != "table":
            assert unit, f"{panel['title']}: no unit"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_units_follow_the_metric(path):
    """A panel showing one family uses that family's unit (ratios as percentunit, etc.)."""
    expected = {"_ratio": "percentunit", "_bytes": "bytes", "_celsius": "celsius", "_hertz": "hertz",
                "_watts": "watt", "_bytes_per_second": "Bps"}
    for panel in _panels(_dashboard(path)):
        if panel["type"] in ("row", "table"):
            continue
        names = set().union(*(metric_names(t["expr"]) for t in panel["targets"]))
        exprs = " ".join(t["expr"] for t in panel["targets"])
        if len(names) != 1 or re.search(r"\b(count|rate|increase|predict_linear)\(|/", exprs):
            continue
        (name,) = names
        for suffix, unit in sorted(expected.items(), key=lambda kv: -len(kv[0])):
            if name.endswith(suffix):
                assert panel["fieldConfig"]["defaults"]["unit"] == unit, panel["title"]
                break


def _sdk() -> None:
    pytest.importorskip("grafana_foundation_sdk", reason="grafana-foundation-sdk (the test extra) builds the dashboards")


def test_dashboards_are_generated():
    _sdk()
    check = subprocess.run([sys.executable, str(REPO / "dashboards" / "generate.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_generate_check_fails_when_a_committed_file_drifts(tmp_path):
    """A hand edit of the committed JSON, or of the chart's copy, is caught: --check names the file."""
    _sdk()
    shutil.copytree(REPO / "dashboards", tmp_path / "dashboards", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "charts" / "l9gpu" / "dashboards", tmp_path / "charts" / "l9gpu" / "dashboards")

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(tmp_path / "dashboards" / "generate.py"), "--check"],
                              capture_output=True, text=True, cwd=tmp_path)

    assert check().returncode == 0, check().stderr
    copy = tmp_path / "charts" / "l9gpu" / "dashboards" / "l9gpu-devices.json"
    copy.write_text(copy.read_text().replace('"GPUs up"', '"GPUs that are up"', 1))
    drifted = check()
    assert drifted.returncode == 1
    assert "charts/l9gpu/dashboards/l9gpu-devices.json" in drifted.stderr
    assert "dashboards/l9gpu-workloads.json" not in drifted.stderr


@pytest.mark.parametrize("path", DASHBOARDS + CHART_COPIES, ids=lambda p: str(p.relative_to(REPO)))
def test_dashboard_is_valid_against_grafanas_schema(path):
    """Every field, panel type and unit is one the schema grafana-foundation-sdk ships knows."""
    _sdk()
    from dashboards import schema

    assert schema.problems(_dashboard(path)) == []


# The index a panel appended to the devices dashboard gets.
NEXT = len(json.loads((REPO / "dashboards" / "l9gpu-devices.json").read_text())["panels"])


def _broken(edit: Any) -> list[str]:
    """The problems of the devices dashboard, built as generate.py builds it, after `edit(doc)`."""
    _sdk()
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    from dashboards import schema
    from dashboards.devices import devices

    doc = json.loads(json.dumps(devices(), cls=JSONEncoder))
    assert schema.problems(doc) == []
    edit(doc)
    return schema.problems(doc)


def _built_panel(title: str, **kwargs: Any) -> dict[str, Any]:
    """A timeseries panel as the dashboards' own builder makes it, as JSON."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    from dashboards.panels import target, timeseries

    panel = timeseries(title, [target("gpu_power_watts")], **kwargs).id(999)
    return json.loads(json.dumps(panel.build(), cls=JSONEncoder))


def test_a_unit_grafana_does_not_have_fails():
    def edit(doc: dict[str, Any]) -> None:
        doc["panels"].append(_built_panel("Power", unit="watts"))  # Grafana's id is "watt"

    assert _broken(edit) == [f"panels[{NEXT}] 'Power': fieldConfig.defaults: unit 'watts' is not a Grafana unit id"]

    def override(doc: dict[str, Any]) -> None:
        from dashboards.panels import by_name

        panel = _built_panel("Power", unit="watt", overrides=[by_name("limit", unit="kilowatts")])
        doc["panels"].append(panel)

    assert _broken(override) == [f"panels[{NEXT}] 'Power': fieldConfig.overrides[0]: unit 'kilowatts' is not a Grafana "
                                 "unit id"]
    # custom units are Grafana's own grammar, not a typo
    assert _broken(lambda doc: doc["panels"].append(_built_panel("Tokens", unit="suffix: tok/s"))) == []


def test_an_unknown_panel_field_fails():
    def edit(doc: dict[str, Any]) -> None:
        panel = _built_panel("Power", unit="watt")
        panel["fieldConfig"]["defaults"]["colour"] = {"mode": "fixed"}  # Grafana's field is "color"
        panel["options"]["legend"]["position"] = "right"  # it is "placement"
        panel["fieldConfig"]["defaults"]["custom"]["lineWidht"] = 2
        panel["targets"][0]["query"] = "gpu_power_watts"  # a Prometheus query's is "expr"
        doc["panels"].append(panel)

    assert sorted(_broken(edit)) == sorted([
        f"unknown field panels[{NEXT}].fieldConfig.defaults.colour",
        f"unknown field panels[{NEXT}].options.legend.position",
        f"unknown field panels[{NEXT}].fieldConfig.defaults.custom.lineWidht",
        f"unknown field panels[{NEXT}].targets[0].query",
    ])


def test_an_unknown_override_property_fails():
    def edit(doc: dict[str, Any]) -> None:
        from dashboards.panels import DASHED, by_regexp

        doc["panels"].append(_built_panel("Power", unit="watt", overrides=[
            by_regexp(".* limit", custom__lineStyle=DASHED),  # a timeseries' own property
            by_regexp(".* limit", custom__cellOptions={"type": "color-background"}),  # a table's, not a timeseries'
        ]))

    assert _broken(edit) == [f"panels[{NEXT}] 'Power': fieldConfig.overrides[1]: unknown property 'custom.cellOptions' "
                             "(custom.cellOptions)"]


def test_a_panel_type_grafana_dropped_fails():
    def edit(doc: dict[str, Any]) -> None:
        panel = _built_panel("Power", unit="watt")
        panel["type"] = "graph"  # the Angular graph panel, gone since Grafana 11
        doc["panels"].append(panel)

    assert _broken(edit) == [f"panels[{NEXT}] 'Power': panel type 'graph' is not one Grafana has"]


def test_generate_writes_nothing_that_fails_the_schema(monkeypatch, capsys):
    """generate.py refuses to write (or pass --check with) a dashboard the schema rejects."""
    _sdk()
    import dashboards.generate as generate
    from dashboards import panels

    def broken() -> Any:
        def row(board: panels.Board) -> None:
            board.row("Broken")
            board.add(panels.timeseries("Power", [panels.target("gpu_power_watts")], "watts"), 24, 8)
        return panels.dashboard("broken", "broken", "", [], [], [row])

    monkeypatch.setattr(generate, "DASHBOARDS", {"broken.json": broken})
    monkeypatch.setattr(generate, "DESTINATIONS", ())
    assert generate.main([]) == 1
    assert "broken.json: panels[1] 'Power': fieldConfig.defaults: unit 'watts' is not a Grafana unit id" in \
        capsys.readouterr().err


def test_every_name_in_every_expression_is_exported():
    known = known_names()
    unknown = {}
    variable_selectors = [(d, n, re.sub(r"^label_values\((.+),\s*\w+\)$", r"\1", q)) for d, n, q in _variable_queries()]
    for dashboard, title, expr in _expressions() + variable_selectors:
        for name in metric_names(expr):
            if _strip_suffix(name) not in known and name not in known:
                unknown.setdefault(name, []).append(f"{dashboard}: {title}")
    assert not unknown, unknown


def test_core_views_are_present():
    text = {path.name: path.read_text() for path in DASHBOARDS}
    workloads = text["l9gpu-workloads.json"]
    for needle in ("container_gpu_memory_used_bytes", "container_gpu_utilization_ratio", "container_gpu_idle_seconds",
                   "increase(container_gpu_usage_seconds_total", "container_gpu_allocation_seconds_total",
                   "/ 3.6e6", "predict_linear(", "gpu_unattributed_memory_used_bytes", "gpu_memory_total_bytes",
                   'slurm_job_id!=\\"\\"'):
        assert needle in workloads, needle
    devices = text["l9gpu-devices.json"]
    for spec in METRICS:
        if spec.scope == "device" or spec.name.startswith("l9gpu_"):
            assert spec.name in devices, f"{spec.name} is on no device panel"


@pytest.fixture(scope="module")
def prometheus_with_data(tmp_path_factory):
    """Agent on the simulated node (250 ms passes) and the demo's inference engines, scraped every
    second by a real Prometheus with the rules and example prices, ~10 s of data."""
    binary = need_tool("prometheus")
    tmp = tmp_path_factory.mktemp("dashboards")
    agent = AgentProcess(["--backend", "simulated", "--interval", "250ms", "--pod-label", "team"],
                         log_path=tmp / "agent.log")
    # module-scoped, so the per-test guard against ambient L9GPU_*/OTEL_* settings does not apply yet
    agent.env = {k: v for k, v in agent.env.items() if not ambient_setting(k)}
    agent.start()
    prices = tmp / "prices.rules.yaml"
    prices.write_text(prices_rules())
    engines = demo_engines()
    with LoopbackServer(app(engines)) as engine_pods:
        server = PrometheusServer(binary, tmp, [f"127.0.0.1:{agent.port}"], [RULES, INFERENCE_RULES, prices],
                                  jobs=scrape_jobs(engines, engine_pods.base)).start()
        query = server.query_document
        try:
            server.wait_for("count_over_time(gpu_up[1m]) >= 10")
            server.wait_for(f"count(model_name:l9gpu_inference_allocated_cost_per_million_tokens:rate5m) "
                            f">= {len(engines)}")
            yield query
        finally:
            server.stop()
            agent.stop()


def _allowed_empty(expr: str) -> str | None:
    """The reason an expression may be empty: it is listed, or it reads only listed families
    (besides l9gpu_host_pids_visible, which only lends the node label)."""
    if substitute(expr) in ALLOWED_EMPTY:
        return ALLOWED_EMPTY[substitute(expr)]
    names = metric_names(expr) - {"l9gpu_host_pids_visible"}
    if names and names <= ALLOWED_EMPTY.keys():
        return "; ".join(ALLOWED_EMPTY[name] for name in sorted(names))
    return None


def test_every_dashboard_expression_evaluates_on_a_real_prometheus(prometheus_with_data):
    """On the default output every expression has data, but those listed in ALLOWED_EMPTY and,
    in the Detail rows, those that read a family the default serves less of (checked on an
    agent with --detail below)."""
    query = prometheus_with_data
    detail = set(_detail_expressions())
    errors, empty, allowed = [], [], []
    for dashboard, title, expr in _expressions():
        if dashboard == TRAINING:
            continue
        sent = substitute(expr)
        doc = query(sent)
        if doc.get("status") != "success":
            errors.append(f"{dashboard}: {title}: {sent}: {doc.get('error')}")
            continue
        if doc["data"]["result"]:
            continue
        if _allowed_empty(expr):
            allowed.append(sent)
        elif (dashboard, title, expr) in detail and metric_names(expr) & _shaped_names():
            continue
        else:
            empty.append(f"{dashboard}: {title}: {sent}")
    assert not errors, "\n".join(errors)
    assert not empty, "no data for:\n" + "\n".join(empty)
    total = len([e for e in _expressions() if e[0] != TRAINING])
    assert len(allowed) <= total // 10, allowed


def test_every_detail_panel_has_data_with_detail_and_reads_what_only_detail_serves(tmp_path):
    """The Detail rows' panels read what the agent serves only with --detail: on an agent with
    --detail each of their expressions has data; each panel reads at least one such family."""
    binary = need_tool("prometheus")
    expressions = _detail_expressions()
    assert {d for d, _, _ in expressions} == {p.name for p in DASHBOARDS} - set(NO_DETAIL_ROW), \
        "each dashboard has its Detail row"
    for dashboard, title, _ in expressions:
        names = set().union(*(metric_names(e) for d, t, e in expressions if (d, t) == (dashboard, title)))
        assert names & _shaped_names(), f"{dashboard}: {title} reads nothing only --detail serves"
    agent = AgentProcess(["--backend", "simulated", "--interval", "250ms", "--detail"], log_path=tmp_path / "agent.log")
    agent.env = {k: v for k, v in agent.env.items() if not ambient_setting(k)}
    agent.start()
    server = PrometheusServer(binary, tmp_path, [f"127.0.0.1:{agent.port}"]).start()
    try:
        server.wait_for("count_over_time(gpu_sm_occupancy_ratio[1m]) >= 3")
        empty = [f"{dashboard}: {title}: {substitute(expr)}" for dashboard, title, expr in expressions
                 if not server.query(substitute(expr)) and not _allowed_empty(expr)]
        assert not empty, "no data with --detail for:\n" + "\n".join(empty)
    finally:
        server.stop()
        agent.stop()


def test_every_variable_query_finds_values(prometheus_with_data):
    query = prometheus_with_data
    for dashboard, name, definition in _variable_queries():
        if dashboard == TRAINING:
            continue
        match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", definition)
        assert match, definition
        selector, label = substitute(match.group(1)), match.group(2)
        doc = query(selector)
        assert doc["status"] == "success", (dashboard, name, doc)
        values = {series["metric"].get(label, "") for series in doc["data"]["result"]} - {""}
        assert values, f"{dashboard}: variable {name} would be empty"


def test_chargeback_adds_up(prometheus_with_data):
    """Energy by namespace plus unattributed energy is the GPUs' energy, as the chargeback panel claims."""
    query = prometheus_with_data
    window = "8s"

    def scalar(expr: str) -> float:
        result = query(expr)["data"]["result"]
        return sum(float(r["value"][1]) for r in result)

    gpus = scalar(f"sum(increase(gpu_energy_joules_total[{window}]))")
    parts = (scalar(f"sum(increase(container_gpu_energy_joules_total[{window}]))")
             + scalar(f"sum(increase(gpu_unattributed_energy_joules_total[{window}]))"))
    assert gpus > 0
    assert parts == pytest.approx(gpus, rel=0.05)


def test_cost_rules_price_each_namespace_from_the_prices_file(prometheus_with_data):
    """The example prices reach Prometheus: ml-research's reserved H100 rate, the list price elsewhere,
    and every namespace holding GPUs gets a cost per hour of about GPUs held x that price (the exact
    arithmetic is in tests/alerts_test.yaml; here the rule and this query see rates over a few
    seconds of data, evaluated at different instants)."""
    query = prometheus_with_data

    def values(expr: str) -> dict[str, float]:
        doc = query(expr)
        assert doc["status"] == "success", doc
        return {r["metric"].get("namespace", ""): float(r["value"][1]) for r in doc["data"]["result"]}

    prices = values('namespace_model:l9gpu_gpu_hour_price{model="NVIDIA H100 80GB HBM3"}')
    assert prices["ml-research"] == 1.80 and prices["ml-production"] == 2.90 and prices["docs"] == 2.90
    assert values("namespace:l9gpu_kwh_price")["search"] == 0.15
    held = values('sum by (namespace) (rate(container_gpu_allocation_seconds_total{namespace!=""}[5m]))')
    cost = values("namespace:l9gpu_allocated_cost_per_hour:rate5m")
    for namespace, gpus in held.items():
        assert cost[namespace] == pytest.approx(gpus * prices[namespace], rel=0.25), namespace


def test_the_cost_rules_add_up_to_what_the_gpus_cost(prometheus_with_data):
    """The Cost row's stack: the namespaces' allocated cost, the Slurm jobs', the unallocated
    cost and the price overrides are the GPUs' cost per hour, on the simulated node whose GPU 6
    is time-shared (a shared GPU's hour is paid once, not once per tenant)."""
    query = prometheus_with_data

    def scalar(expr: str) -> float:
        doc = query(expr)
        assert doc["status"] == "success" and doc["data"]["result"], (expr, doc)
        return sum(float(r["value"][1]) for r in doc["data"]["result"])

    # (rate5m over the few seconds of data there are: the figures are small, the identity exact)
    gpus = scalar("cluster:l9gpu_gpu_cost_per_hour:rate5m")
    assert gpus > 0
    parts = (scalar("sum(namespace:l9gpu_allocated_cost_per_hour:rate5m)")
             + scalar("cluster:l9gpu_slurm_allocated_cost_per_hour:rate5m")
             + scalar("cluster:l9gpu_unallocated_cost_per_hour:rate5m")
             + scalar("cluster:l9gpu_price_overrides_cost_per_hour:rate5m"))
    assert parts == pytest.approx(gpus, rel=0.02)
    assert scalar("cluster:l9gpu_unallocated_cost_per_hour:rate5m") > 0  # GPU 6's free replica
