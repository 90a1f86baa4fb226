"""The report's read of Prometheus: every counter of the period, summed per series on the
server (`exporter.report.aggregate`) or read per step where inference engines split a
workload's time between models (`exporter.report.compute`)."""

from __future__ import annotations

import asyncio
from typing import Any, Iterable, Mapping, MutableSequence, Sequence

from exporter.report import aggregate
from exporter.report.compute import (
    COUNTERS,
    DEVICE_COUNTERS,
    DEVICE_STEP_COUNTERS,
    STALLED_FAMILY,
    STALLED_RESOLUTION_S,
    STEP_COUNTERS,
    VALUE_ANSWERS_AT_ONCE,
    WORKLOAD_LABELS,
    Fetched,
    FetchStats,
    Grid,
    SeriesKey,
    SeriesTotals,
    _counter,
    _idle,
    _rows,
    _series_rows,
    idle_expression,
    model_tokens,
    series_key,
    token_candidates,
    with_matchers,
)
from exporter.report.progress import Progress
from exporter.report.prom import Prometheus, all_of


def _period_totals(named: Iterable[tuple[str, Mapping[SeriesKey, float]]]) -> list[SeriesTotals]:
    """Each named counter's period total per series as one-step `SeriesTotals` (what
    `summary` sums per group)."""
    return _series_rows((name, {key: [total] for key, total in totals.items()}) for name, totals in named)


def _totals(counters: Sequence[str], results: Sequence[Any]) -> list[SeriesTotals]:
    """`_period_totals` of `aggregate.increases` results, one per counter."""
    return _period_totals((name, result.totals) for name, result in zip(counters, results))


def _group_rows(counters: Sequence[str], results: Sequence[Any]) -> list[SeriesTotals]:
    """Per-group per-step increases as `SeriesTotals` labelled with the group's labels."""
    return _series_rows((name, result.steps) for name, result in zip(counters, results))


async def stalled_seconds(prom: Prometheus, grid: Grid, selector: str) -> dict[SeriesKey, float]:
    """Per workload series, the GPU-seconds it was stalled in the period: its 0/1
    `STALLED_FAMILY` a minute at a time, from the period's first minute to the one before
    its end (as the hourly rules count an hour). Series stalled for none of it are left out."""
    span = grid.end_ms - grid.start_ms
    expr = (f"{STALLED_RESOLUTION_S} * sum_over_time({with_matchers(STALLED_FAMILY, selector)}"
            f"[{span}ms:{STALLED_RESOLUTION_S}s] offset 1ms) > 0")
    answer = await prom.query(expr, grid.end_ms / 1000, expect="vector")
    return {series_key(s["metric"]): float(s["value"][1]) for s in answer}


async def fetch(prom: Prometheus, start_ms: int, end_ms: int, step_ms: int, selector: str = "",
                engines: Sequence[Any] = (), progress: Progress | None = None,
                group_by: Sequence[str] = ("namespace", "model")) -> Fetched:
    """Every workload series with its increase of every counter in `COUNTERS`, and every
    GPU series with those of `DEVICE_COUNTERS`; with ``engines``
    (`exporter.inference.engines.Engine`), their token counters, read the same way, and
    the idle intervals of the workloads that hold GPUs. ``progress`` is told the phase.

    Without engines the server does the arithmetic (`exporter.report.aggregate`): the
    series carry their period totals (one step), and `Fetched.steps` /
    `Fetched.device_steps` the increases per step summed by ``group_by`` (the report's
    grouping and the labels its prices and carbon intensity depend on). With engines each
    workload series is read per step (the split between models is per step and per pod)."""
    progress = progress or Progress()
    progress.phase("reading counters and idle intervals" if engines else "reading counters")
    grid = Grid(start_ms, end_ms, step_ms)
    stats = FetchStats()
    if not engines:
        gpu_keys = [k for k in group_by if k not in WORKLOAD_LABELS and not k.startswith("label_")]
        keys: dict[SeriesKey, SeriesKey] = {}
        sums = [aggregate.increases(prom, family, grid, selector, group_by if key in STEP_COUNTERS else None, stats,
                                    keys) for key, (family, _) in COUNTERS.items()]
        sums += [aggregate.increases(prom, family, grid, selector,
                                     gpu_keys if key in DEVICE_STEP_COUNTERS else None, stats, keys)
                 for key, (family, _) in DEVICE_COUNTERS.items()]
        results = await all_of(*sums, stalled_seconds(prom, grid, selector))
        stalled = results.pop()
        series = _period_totals([*((name, result.totals) for name, result in zip(COUNTERS, results)),
                                 ("stalled", stalled)])
        devices = _totals(list(DEVICE_COUNTERS), results[len(COUNTERS):])
        fetched = Fetched(grid, series, devices, stats, steps=_group_rows(list(COUNTERS), results[:len(COUNTERS)]),
                          device_steps=_group_rows(list(DEVICE_COUNTERS), results[len(COUNTERS):]))
        stats.queries = prom.queries
        stats.series = len(series)
        return fetched
    families = [family for family, _ in COUNTERS.values()]
    candidates = token_candidates(engines)

    keys = {}
    at_once = asyncio.Semaphore(VALUE_ANSWERS_AT_ONCE)

    async def tokens_then_idle() -> tuple[list[Any], dict[tuple[str, str], MutableSequence[float]]]:
        # the tokens first: the idle intervals are asked for only where tokens were served
        token_results = await all_of(*[_counter(prom, text, grid, selector, stats, keys, at_once)
                                       for _, _, _, text in candidates])
        used = [text for (_, _, _, text), result in zip(candidates, token_results) if result]
        pods = sorted({dict(key).get("pod", "") for result in token_results for key in result} - {""})
        if not used or not pods:
            return token_results, {}
        return token_results, await _idle(prom, grid, idle_expression(used, pods, selector))

    work: list[Any] = [tokens_then_idle()]
    work += [_counter(prom, family, grid, selector, stats, keys, at_once) for family in families]
    work += [aggregate.increases(prom, family, grid, selector, None, stats, keys)
             for family, _ in DEVICE_COUNTERS.values()]
    answers = await all_of(*work)
    token_results, idle = answers[0]
    results = answers[1:1 + len(families)]
    series = _rows(COUNTERS, results)
    devices = _totals(list(DEVICE_COUNTERS), answers[1 + len(families):])
    fetched = Fetched(grid, series, devices, stats)
    fetched.tokens, fetched.unjoined = model_tokens(
        [(e, label, f, r) for (e, label, f, _), r in zip(candidates, token_results)], len(grid.bounds) - 1)
    fetched.idle = idle
    stats.queries = prom.queries
    stats.series = len(series)
    return fetched
