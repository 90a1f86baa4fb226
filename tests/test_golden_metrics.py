"""The simulated node's /metrics on a fixed clock, against a kept copy: every family, label
and value of the demo node and of the incidents node after a minute of passes.

The agent's own encoder renders the registry ``l9gpu serve`` builds (the snapshot's
families and the incident watch's), in the Prometheus text format, with the families that
measure the agent itself (pass durations, snapshot age, build info) left out. Values are
compared as numbers, to 1e-9. A change that means to change what users see regenerates the
copies with ``python tests/test_golden_metrics.py`` and says so.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
# name -> (scenario, --detail): the default output of both demos, and the demo node whole
SCENARIOS = {"default": (None, False), "incidents": ("incidents", False), "default-detail": (None, True)}
# Families about the agent's own run, not the node: they differ from run to run.
VOLATILE = ("l9gpu_collector_duration_seconds", "l9gpu_snapshot_age_seconds", "l9gpu_build_info")
PASSES = 61


def render_node(scenario: str | None, passes: int = PASSES, detail: bool = False) -> str:
    """/metrics of the simulated node after ``passes`` passes a second apart (fixed clocks);
    ``detail``: as ``--detail`` serves it (every family whole)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import choose_encoder

    from exporter.app.cli import build_parser
    from exporter.attribution import build_attributor
    from exporter.collect.collector import Collector
    from exporter.core.labels import label_schema
    from exporter.devices.simulated.backend import SimulatedBackend
    from exporter.incidents.engine import IncidentConfig, IncidentTracker
    from exporter.incidents.simulated import scenario_kernel_log
    from exporter.incidents.watch import IncidentFamilies, IncidentWatch
    from exporter.output import catalogue as cat
    from exporter.output.encode import Encoder
    from exporter.output.render import SnapshotCollector

    t = [1000.0]
    backend = SimulatedBackend(scenario, clock=lambda: t[0])
    backend.open()
    args = build_parser().parse_args(["serve", "--backend", "simulated"])
    node = backend.node_name()
    attributor = build_attributor(args, node, scenario=backend.scenario)
    extra, labeller = label_schema([])
    collector = Collector([backend], node, attributor=attributor, labeller=labeller, clock=lambda: t[0],
                          wall=lambda: 1.8e9 + t[0])
    watch = IncidentWatch(node, labeller, extra, tracker=IncidentTracker(node, IncidentConfig(xid_hold=2.0)),
                          kernel_log=scenario_kernel_log(backend), clock=lambda: t[0])
    enabled = cat.enabled_names(detail=detail)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, enabled, extra, cat.detailed_names(detail)))
    registry.register(IncidentFamilies(watch, enabled, extra))
    try:
        for n in range(passes):
            t[0] = 1000.0 + n
            watch.observe(collector.collect_once())
        library, _ = choose_encoder("text/plain")
        text = Encoder(library).encode(registry.collect()).decode()
    finally:
        attributor.close()
        watch.close()
    return "".join(line + "\n" for line in text.splitlines() if not any(v in line for v in VOLATILE))


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


# What a failure says: a change that means to change what users see regenerates the copies.
REGENERATE = ("if the change is meant to change what users see, regenerate the kept copies with "
              "`.venv/bin/python tests/test_golden_metrics.py` and say so in the commit")


def _shape(text: str) -> list[str]:
    """Families, help, types and series (without their values), in order."""
    return [line.rpartition(" ")[0] if not line.startswith("#") else line for line in text.splitlines()]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_metrics_of_the_simulated_node_are_the_kept_ones(name):
    kept = (GOLDEN / f"simulated-{name}.txt").read_text()
    scenario, detail = SCENARIOS[name]
    now = render_node(scenario, detail=detail)
    # the same families, help, types and series, in the same order
    got_shape, kept_shape = _shape(now), _shape(kept)
    assert got_shape == kept_shape, (
        f"tests/golden/simulated-{name}.txt: {len(set(got_shape) - set(kept_shape))} lines new, "
        f"{len(set(kept_shape) - set(got_shape))} gone, e.g. {sorted(set(got_shape) ^ set(kept_shape))[:3]}; "
        f"{REGENERATE}")
    want, got = _samples(kept), _samples(now)
    wrong = {series: (want[series], got[series]) for series in want
             if not (math.isclose(got[series], want[series], rel_tol=1e-9, abs_tol=1e-9)
                     or (math.isnan(got[series]) and math.isnan(want[series])))}
    assert not wrong, (f"tests/golden/simulated-{name}.txt: {len(wrong)} values differ, e.g. "
                       f"{sorted(wrong.items())[:5]}; {REGENERATE}")
    assert len(want) > 200


def test_a_failure_says_how_to_regenerate_the_kept_copies(monkeypatch):
    """A change that renders something else fails with the command that writes the new copies."""
    monkeypatch.setitem(SCENARIOS, "default", (None, False))
    kept = (GOLDEN / "simulated-default.txt").read_text()
    monkeypatch.setattr(sys.modules[__name__], "render_node",
                        lambda scenario, detail=False: kept.replace("gpu_up{", "gpu_upp{", 1))
    with pytest.raises(AssertionError, match=r"python tests/test_golden_metrics.py"):
        test_metrics_of_the_simulated_node_are_the_kept_ones("default")
    monkeypatch.setattr(sys.modules[__name__], "render_node",
                        lambda scenario, detail=False: kept.replace("} 1.0\n", "} 2.0\n", 1))
    with pytest.raises(AssertionError, match=r"values differ.*python tests/test_golden_metrics.py"):
        test_metrics_of_the_simulated_node_are_the_kept_ones("default")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    GOLDEN.mkdir(exist_ok=True)
    for scenario_name, scenario in SCENARIOS.items():
        (GOLDEN / f"simulated-{scenario_name}.txt").write_text(render_node(scenario[0], detail=scenario[1]))
        print(f"wrote {GOLDEN / f'simulated-{scenario_name}.txt'}")
