"""What the default output costs the backend: its series per GPU stay within the bound of
docs/METRICS.md (*Series per GPU*) against the DCGM schema on the same node, unless the doc
says why; and --detail, --detail-metric and the catalogue's shapes do what the doc says.

The nodes are the real agent on the simulated node and on an 8-GPU node of the NVML fake,
counted as benchmarks/bench_series.py counts them (series with a ``gpu`` label over the GPUs).
Not timed: the figures of that benchmark are in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from agent import run_cli

from exporter.core.model import DeviceSample, Snapshot
from exporter.health import HealthSignals
from exporter.health.signals import NvLink
from exporter.output import catalogue as cat
from exporter.output.metrics_doc import SERIES_BUDGET, SeriesBudget
from exporter.output.render import families
from exporter.output.spec import COUNTER, DEVICE, GAUGE, MetricSpec

REPO = Path(__file__).resolve().parent.parent


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_series", REPO / "benchmarks" / "bench_series.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_series"] = module
    spec.loader.exec_module(module)
    return module


bench = _bench()


def over_budget(ours: float, dcgm: float, budget: SeriesBudget) -> str | None:
    """Why ``ours`` series per GPU break ``budget`` against DCGM's ``dcgm``; None when they do not
    (within the bound, or past it with the reason the doc gives)."""
    if ours <= budget.bound * dcgm or budget.exceeded:
        return None
    return (f"the default serves {ours:.1f} series per GPU, {ours / dcgm:.2f}x the DCGM schema's {dcgm:.1f}, past "
            f"the bound of {budget.bound:g}x: shape the new series (docs/METRICS.md, *Series per GPU*) or say why "
            "in metrics_doc.SERIES_BUDGET.exceeded")


def test_the_budget_check_fails_past_the_bound_unless_the_doc_says_why():
    assert over_budget(57.0, 38.0, SeriesBudget(1.5)) is None
    assert "1.53x" in (over_budget(58.0, 38.0, SeriesBudget(1.5)) or "")
    assert over_budget(58.0, 38.0, SeriesBudget(1.5, exceeded="per-link NVLink detail is the product")) is None


def test_the_reason_for_passing_the_bound_is_in_the_doc():
    doc = (REPO / "docs" / "METRICS.md").read_text(encoding="utf-8")
    assert f"within {SERIES_BUDGET.bound:g}x the DCGM schema's series per GPU" in doc
    if SERIES_BUDGET.exceeded:
        assert SERIES_BUDGET.exceeded in doc


@pytest.mark.parametrize("node", sorted(bench.NODES))
def test_the_default_serves_at_most_the_bound_times_dcgms_series_per_gpu(node, tmp_path):
    got = bench.node_counts(node, ("--metric-schema", "l9gpu,dcgm"), tmp_path)
    ours, dcgm = got["l9gpu"], got["dcgm"]
    assert ours.gpus == dcgm.gpus == 8
    assert dcgm.per_gpu > 20  # the DCGM schema's default counters, per GPU and per workload
    problem = over_budget(ours.per_gpu, dcgm.per_gpu, SERIES_BUDGET)
    assert problem is None, f"{node}: {problem}"


def test_detail_serves_what_the_default_leaves_out(tmp_path):
    """The same node with --detail serves every series of the default and more: nothing the
    default serves is shaped away by --detail."""
    node = "simulated"
    default = bench.node_counts(node, (), tmp_path)["l9gpu"]
    detail = bench.node_counts(node, ("--detail",), tmp_path)["l9gpu"]
    assert detail.per_gpu > 1.8 * default.per_gpu  # per link and type, every state, the breakdowns


# ---- the shapes, on a snapshot --------------------------------------------------------------


def _node() -> Snapshot:
    """Two GPUs: GPU 0 with 18 NVLinks, one of them with errors, a clock throttle and a pending
    remap; GPU 1 with nothing to say."""
    from exporter.health import HEALTHY_VERDICT
    from exporter.health.signals import RowRemap

    links = tuple(NvLink(link=n, up=True, replay=3 if n == 5 else 0, recovery=0, crc_flit=1 if n == 5 else 0,
                         crc_data=0) for n in range(18))
    gpus = (DeviceSample(index=0, uuid="GPU-0", model="H100", throttle_reasons={"gpu_idle": False, "sw_power_cap": True}),
            DeviceSample(index=1, uuid="GPU-1", model="H100", throttle_reasons={"gpu_idle": False, "sw_power_cap": False}))
    signals = {"GPU-0": HealthSignals(nvlinks=links, row_remap=RowRemap(correctable=2, uncorrectable=1, pending=True,
                                                                        failure=False)),
               "GPU-1": HealthSignals(row_remap=RowRemap(correctable=0, uncorrectable=0, pending=False, failure=False))}
    return Snapshot(seq=1, node="n", timestamp=0.0, devices=gpus, health_signals=signals,
                    verdicts={"GPU-0": HEALTHY_VERDICT, "GPU-1": HEALTHY_VERDICT})


def _series(snapshot: Snapshot, name: str, detailed: frozenset[str] = frozenset()) -> list[tuple[dict, float]]:
    family = next(f for f in families(snapshot, cat.enabled_names(), detailed=detailed)
                  if f.name == name.removesuffix("_total"))
    return [(dict(s.labels), s.value) for s in family.samples if s.name == name]


def test_nvlink_errors_are_one_sum_per_gpu_and_per_link_and_type_on_request():
    snap = _node()
    assert _series(snap, "gpu_nvlink_errors_total") == [
        ({"node": "n", "gpu": "0", "uuid": "GPU-0", "model": "H100", "gpu_instance": ""}, 4.0)]
    whole = _series(snap, "gpu_nvlink_errors_total", frozenset({"gpu_nvlink_errors_total"}))
    assert len(whole) == 18 * 4 and sum(v for _, v in whole) == 4.0
    assert {(lab["link"], lab["type"]) for lab, v in whole if v} == {("5", "replay"), ("5", "crc_flit")}


def test_a_state_set_and_a_flag_serve_what_is_set_and_detail_serves_the_zeros():
    snap = _node()
    assert [(lab["gpu"], lab["reason"]) for lab, _ in _series(snap, "gpu_clock_throttle_active")] == [
        ("0", "sw_power_cap")]
    assert len(_series(snap, "gpu_clock_throttle_active", frozenset({"gpu_clock_throttle_active"}))) == 4
    assert [(lab["gpu"], v) for lab, v in _series(snap, "gpu_row_remap_pending")] == [("0", 1.0)]
    assert [(lab["state"], v) for lab, v in _series(snap, "gpu_health")] == [("healthy", 1.0)] * 2
    states = _series(snap, "gpu_health", frozenset({"gpu_health"}))
    assert sorted(v for _, v in states) == [0.0] * 4 + [1.0] * 2
    # error counters keep their zeros: increase() sees the first error
    assert sorted(v for _, v in _series(snap, "gpu_remapped_rows_total")) == [0.0, 3.0]


def test_a_shape_says_what_it_costs_and_sums_only_labels_it_has():
    with pytest.raises(ValueError, match="say what the default's shape costs"):
        MetricSpec("gpu_new_total", COUNTER, "", "A count.", cat.DEVICE_LABELS + ("link",), DEVICE,
                   lambda frame, spec: (), summed=("link",))
    with pytest.raises(ValueError, match="sums over labels it lacks"):
        MetricSpec("gpu_new_total", COUNTER, "", "A count.", cat.DEVICE_LABELS, DEVICE, lambda frame, spec: (),
                   summed=("link",), cost="one per GPU")
    off = MetricSpec("gpu_new_ratio", GAUGE, "ratio", "A ratio.", cat.DEVICE_LABELS, DEVICE, lambda frame, spec: (),
                     detail=True, cost="a breakdown")
    assert not off.default_enabled and off.shaped
    for spec in cat.METRICS:
        assert not spec.shaped or spec.cost, spec.name


def test_detail_turns_on_the_breakdowns_and_detail_metric_one_family_whole():
    off = {spec.name for spec in cat.METRICS if spec.detail}
    assert off and not off & cat.enabled_names() and off <= cat.enabled_names(detail=True)
    assert "gpu_process_memory_used_bytes" not in cat.enabled_names(detail=True)  # --process-metrics' own
    assert cat.detailed_names(False, ["gpu_nvlink_errors_total"]) == {"gpu_nvlink_errors_total"}
    assert cat.detailed_names(True) == {spec.name for spec in cat.METRICS if spec.summed or spec.sparse}


def test_an_unknown_detail_metric_is_a_one_line_error():
    result = run_cli(["serve", "--backend", "simulated", "--detail-metric", "gpu_no_such_family"])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == ["l9gpu: unknown metric 'gpu_no_such_family' (see docs/METRICS.md)"]
