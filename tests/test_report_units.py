"""The report's pure parts: the counter rule, periods, prices, rendering without prices."""

from __future__ import annotations

import pytest

from exporter.report.compute import Grid, SeriesTotals, bucket_increments, choose_step
from exporter.report.output import to_csv, to_html
from exporter.report.periods import parse_period, parse_time
from exporter.report.prices import PricesError, parse_prices
from exporter.report.summary import summarize

NOW = 1_790_000_000.0  # 2026-09-21T14:13:20Z


def test_rises_count_as_differences_falls_as_restarts_and_first_values_from_zero():
    # before START 10; steps end at 15, 15 (no rise), absent, 25: 5 + 0 + 0 + 10
    assert bucket_increments([10, 15, 15, None, 25]) == [5, 0, 0, 10]
    # born in step 2 at 4; reset in step 4 (7 -> 2): the new value counts from 0
    assert bucket_increments([None, None, 4, 7, 2]) == [0, 4, 3, 2]
    # step 2 had a reset inside it: its raw samples decide (10 -> 12, reset to 1, -> 3) = 2 + 1 + 2
    assert bucket_increments([8, 10, 3, 5], {2: [(1, 12.0), (2, 1.0), (3, 3.0)]}) == [2, 5, 2]
    # a reset inside a step that ends above the old value: only the raw samples can tell
    assert bucket_increments([100, 150], {1: [(1, 120.0), (2, 5.0), (3, 160.0)]}) == [20 + 5 + 155]
    # a series absent for a while continues from its last value (no double count after a gap)
    assert bucket_increments([1, 2, None, None, 9]) == [1, 0, 0, 7]


def test_step_and_grid():
    assert choose_step(86400) == 900 and choose_step(30 * 86400) == 21600 and choose_step(3600) == 300
    assert choose_step(10 * 365 * 86400) == 86400
    grid = Grid(0, 10_000_000, 3_000_000)
    assert grid.bounds == [0, 3_000_000, 6_000_000, 9_000_000, 10_000_000]


@pytest.mark.parametrize("text,expected", [
    ("now", NOW), ("30d", NOW - 30 * 86400), ("now-1d12h", NOW - 36 * 3600), ("2w", NOW - 14 * 86400),
    ("2026-09-01", 1_788_220_800.0), ("2026-09-01T08:30Z", 1_788_251_400.0),
    ("2026-09-01 08:30:00+02:00", 1_788_244_200.0), ("1788220800", 1_788_220_800.0),
])
def test_times(text, expected):
    assert parse_time(text, NOW) == expected


def test_periods_must_be_in_order_and_in_the_past():
    with pytest.raises(ValueError, match="must be after --from"):
        parse_period("1d", "2d", NOW)
    with pytest.raises(ValueError, match="in the future"):
        parse_period("1d", "2030-01-01", NOW)
    with pytest.raises(ValueError, match="--to: invalid time '30x'"):
        parse_period("1d", "30x", NOW)


def test_overrides_first_match_wins_then_the_model_price_then_the_default():
    prices = parse_prices({
        "gpu_hour": {"H100": 3.0, "default": 1.0}, "kwh": 0.3,
        "overrides": [{"match": {"namespace": "a", "label_team": "x"}, "gpu_hour": {"H100": 2.0}},
                      {"match": {"namespace": "a"}, "gpu_hour": 2.5, "kwh": 0.1}]})
    assert prices.gpu_hour_price({"model": "H100", "namespace": "a", "label_team": "x"}) == 2.0
    assert prices.gpu_hour_price({"model": "A100", "namespace": "a", "label_team": "x"}) == 2.5
    assert prices.gpu_hour_price({"model": "H100", "namespace": "b"}) == 3.0
    assert prices.gpu_hour_price({"model": "T4", "namespace": "b"}) == 1.0
    assert prices.kwh_price({"namespace": "a"}) == 0.1 and prices.kwh_price({"namespace": "b"}) == 0.3
    assert parse_prices({"gpu_hour": 2}).gpu_hour_price({"model": "anything"}) == 2.0
    with pytest.raises(PricesError, match="no price for GPU model 'T4'"):
        parse_prices({"gpu_hour": {"H100": 1}}).gpu_hour_price({"model": "T4"})


def test_without_prices_the_report_counts_hours_and_leaves_costs_empty():
    grid = Grid(0, 7200_000, 3600_000)
    s = SeriesTotals({"namespace": "a", "pod": "p", "container": "c", "model": "H100"},
                     {"used": [1800.0, 1800.0], "allocated": [3600.0, 3600.0], "idle": [0.0, 0.0],
                      "energy": [3.6e6, 3.6e6]})
    gone = SeriesTotals({"namespace": "b", "pod": "q", "model": "H100"},
                        {"used": [0.0, 0.0], "allocated": [0.0, 0.0], "idle": [0.0, 0.0], "energy": [0.0, 0.0]})
    report = summarize([s, gone], grid, "namespace", None)
    assert [g["group"] for g in report["groups"]] == ["a"]  # nothing in the period: not listed
    assert report["totals"]["gpu_hours_allocated"] == 2.0 and report["totals"]["waste_ratio"] == 0.5
    assert report["timeline"]["unit"] == "gpu_hours_allocated"
    # text cells quoted, figures bare, no figure without prices
    assert to_csv(report).splitlines()[1] == '"a",1.0,2.0,1.0,0.0,0.0,2.0,"","","","","",0.5,1,"a/p/c=1h",""'
    html = to_html(report)
    assert "GPU-hours allocated" in html and "Total charge" not in html


def test_names_from_labels_are_escaped_in_the_page_and_its_chart():
    grid = Grid(0, 3600_000, 3600_000)
    s = SeriesTotals({"slurm_account": "<b>lab</b>", "slurm_job_id": "7", "slurm_user": "a&b", "model": "H100"},
                     {"used": [0.0], "allocated": [3600.0], "idle": [3600.0], "energy": [0.0]})
    html = to_html(summarize([s], grid, "slurm_account", parse_prices({"gpu_hour": 1})))
    assert "<b>lab</b>" not in html and "&lt;b&gt;lab&lt;/b&gt;" in html
    assert "slurm job 7 (a&amp;b)" in html


def test_progress_only_on_a_terminal_not_quiet_and_with_tqdm(monkeypatch):
    """The report's progress line needs a terminal, no --quiet, and tqdm (the report extra);
    missing any of them it is the silent default, not an error."""
    import io
    import os
    import pty
    import sys

    from exporter.report.progress import Progress, TerminalProgress, progress_for

    controller, terminal_fd = pty.openpty()
    try:
        with os.fdopen(terminal_fd, "w", closefd=True) as terminal:
            shown = progress_for(terminal, quiet=False)
            assert isinstance(shown, TerminalProgress)
            shown.close()
            assert type(progress_for(terminal, quiet=True)) is Progress
            assert type(progress_for(io.StringIO(), quiet=False)) is Progress
            monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` raises ImportError
            assert type(progress_for(terminal, quiet=False)) is Progress
    finally:
        os.close(controller)
    silent = Progress()
    out = io.StringIO()
    silent.phase("reading counters")
    silent.asked()
    silent.answered()
    silent.note("l9gpu report: note: a note", out)
    silent.close()
    assert out.getvalue() == "l9gpu report: note: a note\n"


def test_unhealthy_gpu_hours_per_model_follow_the_bill_outside_its_sum():
    grid = Grid(0, 7200_000, 3600_000)
    s = SeriesTotals({"namespace": "a", "pod": "p", "container": "c", "model": "H100"},
                     {"used": [1800.0, 1800.0], "allocated": [3600.0, 3600.0], "idle": [0.0, 0.0],
                      "energy": [0.0, 0.0]})
    sick = SeriesTotals({"gpu": "3", "uuid": "GPU-3", "model": "H100"},
                        {"capacity": [3600.0, 3600.0], "unallocated": [0.0, 0.0], "unhealthy": [0.0, 1800.0]})
    well = SeriesTotals({"gpu": "0", "uuid": "GPU-0", "model": "A100"},
                        {"capacity": [3600.0, 3600.0], "unallocated": [3600.0, 3600.0], "unhealthy": [0.0, 0.0]})
    report = summarize([s], grid, "namespace", parse_prices({"gpu_hour": 2}), devices=[sick, well])
    assert report["totals"]["gpu_hours_unhealthy"] == 0.5
    assert report["totals"]["gpu_hours_unhealthy_by_model"] == {"H100": 0.5}
    lines = to_csv(report).splitlines()
    assert [line.split(",")[0] for line in lines[-2:]] == ['"(capacity)"', '"(unhealthy: H100)"']
    assert lines[-1].split(",")[2] == "0.5"  # gpu_hours_allocated, as the (capacity) line
    html = to_html(report)
    assert 'data-group="(unhealthy: H100)"' in html
    assert 'class="total reconcile" data-group="(capacity)"' in html
