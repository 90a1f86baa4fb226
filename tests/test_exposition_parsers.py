"""Every schema in every format a scraper can negotiate, read by strict parsers.

/metrics is rendered by the agent's own `Exposition`, set up as ``l9gpu serve`` sets it
up, for the l9gpu schema, the DCGM schema with every field l9gpu can serve (so every
counter field is in), and both; each answer is read by the parser of its format:
prometheus_client's OpenMetrics parser (strict: it rejects a whole exposition over one
badly named counter), and for the text format prometheus_client's text parser and
``promtool check metrics``. Series keep the names dashboards query in every format.

With the DCGM schema a client that accepts the text format gets it (dcgm-exporter
answers nothing else, and there its counters are typed counter); one that accepts only
OpenMetrics gets OpenMetrics, with those counters typed unknown.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import need_tool
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from test_encode import ACCEPT

from exporter.app import cli, wiring
from exporter.devices import close_backends
from exporter.output.dcgm import fields as dcgm
from exporter.web.exposition import Exposition

SCHEMAS = ("l9gpu", "dcgm", "l9gpu,dcgm")
# served as counters whatever the counters file says: their series carry no _total
DCGM_COUNTERS = {f.name for f in dcgm.FIELDS if f.type == "counter"}


def _counters_file(path: Path) -> Path:
    """A counters file naming every field l9gpu serves, with its own type."""
    path.write_text("".join(f"{f.name}, {f.type}, {f.name} help.\n" for f in dcgm.FIELDS))
    return path


def _registry(schema: str, counters: Path):  # type: ignore[no-untyped-def]
    argv = ["serve", "--backend", "simulated", "--metric-schema", schema]
    if "dcgm" in schema:
        argv += ["--collectors", str(counters)]
    args = cli.build_parser().parse_args(argv)
    backends, attributor = wiring.open_sources(args)
    try:
        collector, extra = wiring.build_collector(args, backends, attributor)
        collector.collect_once()
        snapshot = collector.collect_once()  # GPM needs two passes
    finally:
        attributor.close()
        close_backends(backends)
    selection = wiring.select_dcgm_fields(args)
    registry = wiring.build_registry(lambda: snapshot, wiring.enabled_families(args), extra, selection)
    return Exposition(registry, lambda: snapshot, prefer_text=selection is not None)


@pytest.fixture(scope="module")
def expositions(tmp_path_factory) -> dict[str, Exposition]:
    counters = _counters_file(tmp_path_factory.mktemp("counters") / "all-fields.csv")
    return {schema: _registry(schema, counters) for schema in SCHEMAS}


def _series(text: str) -> set[str]:
    """Each series as Prometheus stores it: ``name{labels}`` as written (a parser such as
    prometheus_client's may rename a counter's series; Prometheus takes the line's name)."""
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def _openmetrics_only(accept: str) -> bool:
    return all(entry.split(";")[0].strip() == "application/openmetrics-text" for entry in accept.split(","))


def _keeps_names(accept: str) -> bool:
    """Formats in which series names are written as they are (no dots/values escaping)."""
    return not re.search(r"escaping=(dots|values)", accept)


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("accept", ACCEPT)
def test_every_answer_parses_under_the_strict_parser_of_its_format(schema: str, accept: str, expositions) -> None:
    body, content_type = expositions[schema].render(accept, False)
    text = body.decode()
    openmetrics = content_type.startswith("application/openmetrics-text")
    if "dcgm" in schema:
        assert openmetrics == (accept != "" and _openmetrics_only(accept)), content_type
    else:
        assert openmetrics == accept.startswith("application/openmetrics-text"), content_type
    if openmetrics:
        families = {f.name: f for f in parse_openmetrics(text)}
    else:
        families = {f.name: f for f in parse_text(text)}
    assert families
    if not _keeps_names(accept):
        return
    names = {key.split("{", 1)[0] for key in _series(text)}
    if "dcgm" in schema:
        assert DCGM_COUNTERS | {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED"} <= names, "the names dashboards query"
        assert not {n for n in names if n.startswith("DCGM_") and n.endswith("_total")}
        for name in DCGM_COUNTERS:
            if openmetrics:
                # OpenMetrics: a counter's series must end in _total; dcgm-exporter's
                # counters keep their names, typed unknown
                assert families[name].type == "unknown", name
                assert f"# TYPE {name} unknown\n" in text
            else:
                assert f"# TYPE {name} counter\n{name}{{" in text, "the text format: as dcgm-exporter writes it"
    if "l9gpu" in schema:
        assert {"gpu_energy_joules_total", "container_gpu_usage_seconds_total", "gpu_up"} <= names
        assert families["gpu_energy_joules"].type == "counter"  # family names drop the _total


def test_series_are_the_same_in_every_format(expositions) -> None:
    for schema, exposition in expositions.items():
        seen = {accept: _series(exposition.render(accept, False)[0].decode()) for accept in ACCEPT
                if _keeps_names(accept)}
        first = next(iter(seen.values()))
        assert len(first) > 100
        assert all(series == first for series in seen.values()), schema


# What promtool says about dcgm-exporter's own output, and so about the DCGM schema: its
# counters have no _total suffix, its `modelName` label is camelCase, and its PCIe replay
# counter is named DCGM_FI_DEV_PCIE_REPLAY_COUNTER. Anything else
# is a fault.
_DCGM_LINT = re.compile(r'(?P<name>DCGM_\w+) (counter metrics should have "_total" suffix'
                        r"|label names should be written in 'snake_case' not 'camelCase')"
                        r"|(?P<counter_name>DCGM_+FI_+DEV_+PCIE_+REPLAY_+COUNTER) metric name should not include type "
                        r"'counter'")


@pytest.mark.parametrize("schema", SCHEMAS)
def test_promtool_checks_the_text_format(schema: str, expositions) -> None:
    promtool = need_tool("promtool")
    checked = 0
    for accept in ACCEPT:
        body, content_type = expositions[schema].render(accept, False)
        if not content_type.startswith("text/plain"):
            continue
        checked += 1
        result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
        problems = (result.stdout + result.stderr).decode().splitlines()
        if "dcgm" not in schema:
            assert result.returncode == 0 and not problems, (accept, problems)
            continue
        assert result.returncode == 3, (accept, problems)  # 3: lint problems only, the exposition parsed
        assert [p for p in problems if not _DCGM_LINT.fullmatch(p)] == [], accept
        if _keeps_names(accept):
            suffix = {m["name"] for p in problems if (m := _DCGM_LINT.fullmatch(p)) and "_total" in p}
            assert suffix == DCGM_COUNTERS, accept
    assert checked == (6 if schema == "l9gpu" else 8)  # the DCGM schema: Prometheus 2 and 3 get text too


PROMETHEUS_2 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_3 = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


@pytest.mark.parametrize(("accept", "dcgm_gets", "l9gpu_gets"), [
    (PROMETHEUS_2, "text/plain; version=0.0.4", "application/openmetrics-text; version=1.0.0"),
    (PROMETHEUS_3, "text/plain; version=1.0.0; charset=utf-8; escaping=allow-utf-8",
     "application/openmetrics-text; version=1.0.0; charset=utf-8; escaping=allow-utf-8"),
    ("application/openmetrics-text;version=1.0.0", "application/openmetrics-text; version=1.0.0",
     "application/openmetrics-text; version=1.0.0"),
    ("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0", "application/openmetrics-text",
     "application/openmetrics-text"),
    ("application/openmetrics-text; version=1.0.0, */*; q=0.1", "text/plain; version=0.0.4",
     "application/openmetrics-text"),
    ("", "text/plain; version=0.0.4", "text/plain; version=0.0.4"),
])
def test_what_each_scraper_gets(accept: str, dcgm_gets: str, l9gpu_gets: str, expositions) -> None:
    """The DCGM schema answers text to every client that takes it (as dcgm-exporter does);
    the l9gpu schema alone answers what the client prefers."""
    assert expositions["dcgm"].render(accept, False)[1].startswith(dcgm_gets)
    assert expositions["l9gpu,dcgm"].render(accept, False)[1].startswith(dcgm_gets)
    assert expositions["l9gpu"].render(accept, False)[1].startswith(l9gpu_gets)
