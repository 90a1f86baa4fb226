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


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_metrics_of_the_simulated_node_are_the_kept_ones(name):
    kept = (GOLDEN / f"simulated-{name}.txt").read_text()
    scenario, detail = SCENARIOS[name]
    now = render_node(scenario, detail=detail)
    # the same families, help, types and series, in the same order
    assert [line.rpartition(" ")[0] if not line.startswith("#") else line for line in now.splitlines()] == [
        line.rpartition(" ")[0] if not line.startswith("#") else line for line in kept.splitlines()]
    want, got = _samples(kept), _samples(now)
    wrong = {series: (want[series], got[series]) for series in want
             if not (math.isclose(got[series], want[series], rel_tol=1e-9, abs_tol=1e-9)
                     or (math.isnan(got[series]) and math.isnan(want[series])))}
    assert not wrong, f"{len(wrong)} values differ, e.g. {sorted(wrong.items())[:5]}"
    assert len(want) > 200


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    GOLDEN.mkdir(exist_ok=True)
    for scenario_name, scenario in SCENARIOS.items():
        (GOLDEN / f"simulated-{scenario_name}.txt").write_text(render_node(scenario[0], detail=scenario[1]))
        print(f"wrote {GOLDEN / f'simulated-{scenario_name}.txt'}")
