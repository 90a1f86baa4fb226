"""The report's exact counter rule, computed by the server and summed there by group.

`compute` states the rule: per series, each step's increase is the difference of its last
samples in the step and the step before, a fall counts the new value from 0, a series'
first sample counts from 0, and a step with a fall (or a series back after a whole step
without samples) is summed sample by sample. Reading every series' value at every step
costs the client O(series x steps); at a thousand nodes that is tens of millions of
points. Here the server does that arithmetic, and the client reads O(series + groups x
steps) numbers plus the few cases the server cannot settle:

- ``E`` at a step end, per series: ``(cur - prev) or cur`` (a series without a sample in
  the step before counts from 0), ``unless`` the series fell in the step or from the step
  before (``resets(c[2G]) > 0``): those are left out, and read sample by sample below.
- Per series, the period's total of ``E`` (one instant query with a subquery over the
  steps) and, for the figures that need them per step, ``sum by (group, price keys) (E)``
  at every step end (one range query).
- Per series and step, where ``E`` may be wrong: the falls (as before), and the series that
  appeared in a step (``cur unless prev``: sparse). An appearance is a new series (``E``
  right) unless the series was seen earlier in the period: then it is back after a gap, and
  its step is read sample by sample like a fall, from its last value before the gap.
- For those (series, step) pairs only: the raw samples of the step and the series' value
  before it (queries per step and batch of nodes, as before), and the difference between
  the exact figure and what ``E`` counted is added to the series' total and its group's step.

The answers equal the per-series computation (`compute._counter`) on the same history up to
float rounding; tests hold the two side by side on histories with restarts, churn and moves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from exporter.report.compute import (
    NODE_BATCH,
    FetchStats,
    Grid,
    SeriesKey,
    _all,
    _node_regex,
    _promql_string,
    series_key,
    with_matchers,
)
from exporter.report.prom import Prometheus

GroupKey = SeriesKey


@dataclass
class Increases:
    """One counter over the period: per series its total, per group its increase per step
    (groups keyed by the ``group_by`` labels the series carry; empty labels left out, as
    Prometheus' ``sum by`` leaves them)."""

    totals: dict[SeriesKey, float] = field(default_factory=dict)
    steps: dict[GroupKey, list[float]] = field(default_factory=dict)


def group_key(labels: Mapping[str, str], group_by: Sequence[str]) -> GroupKey:
    """The group a series falls in under ``sum by (group_by)``."""
    return tuple(sorted((name, labels[name]) for name in set(group_by) if labels.get(name)))


def _off(ms: int) -> str:
    return f" offset {ms}ms" if ms else ""


class _Exprs:
    """The PromQL of one counter family: values, falls and ``E`` at window ends."""

    def __init__(self, family: str, selector: str, step_ms: int):
        self.sel = with_matchers(family, selector)
        self.step_ms = step_ms

    def cur(self, window_ms: int, offset_ms: int = 0) -> str:
        return f"last_over_time({self.sel}[{window_ms}ms]{_off(offset_ms)})"

    def fell(self, window_ms: int, offset_ms: int = 0) -> str:
        return f"resets({self.sel}[{window_ms}ms]{_off(offset_ms)}) > 0"

    def inc(self, window_ms: int, offset_ms: int, fell_ms: int) -> str:
        """E over a window of ``window_ms`` ending ``offset_ms`` before the evaluation time;
        the step before is a regular step (``step_ms``)."""
        cur, prev = self.cur(window_ms, offset_ms), self.cur(self.step_ms, offset_ms + window_ms)
        # last_over_time keeps the metric name: "+ 0" drops it, so that a series is one series
        # whether it rose or is new
        return f"(({cur} - {prev}) or ({cur} + 0)) unless ({self.fell(fell_ms, offset_ms)})"

    def appeared(self, window_ms: int) -> str:
        return f"{self.cur(window_ms)} unless {self.cur(self.step_ms, window_ms)}"


async def increases(prom: Prometheus, family: str, grid: Grid, selector: str, group_by: Sequence[str] | None,
                    stats: FetchStats) -> Increases:
    """The increases of ``family`` over ``grid`` (see the module docstring); per step by
    ``group_by`` only when it is given."""
    bounds = grid.bounds
    n = grid.regular
    g = grid.step_ms
    steps = len(bounds) - 1
    tail_ms = bounds[-1] - bounds[n] if steps > n else 0
    x = _Exprs(family, selector, g)
    t = [b / 1000 for b in bounds]
    asked: dict[str, Any] = {}
    if n >= 1:
        shift = (-bounds[0]) % g  # the subquery's steps are multiples of g since the epoch
        inner = x.inc(g, shift, 2 * g)
        asked["total"] = prom.query(f"sum_over_time(({inner})[{n * g - 1}ms:{g}ms])", (bounds[n] + shift) / 1000,
                                    expect="vector")
        asked["appeared"] = prom.query_range(x.appeared(g), t[1], t[n], g / 1000)
        asked["fell"] = prom.query_range(x.fell(2 * g), t[1], t[n], g / 1000)
        if group_by is not None:
            by = ", ".join(sorted(set(group_by)))
            asked["steps"] = prom.query_range(f"sum by ({by}) ({x.inc(g, 0, 2 * g)})", t[1], t[n], g / 1000)
    if tail_ms:
        fell_ms = tail_ms + (g if n else tail_ms)  # the step and the one before it
        asked["tail"] = prom.query(x.inc(tail_ms, 0, fell_ms), t[-1], expect="vector")
        asked["tail_appeared"] = prom.query(x.appeared(tail_ms), t[-1], expect="vector")
        asked["tail_fell"] = prom.query(x.fell(fell_ms), t[-1], expect="vector")
    answers = dict(zip(asked, await _all(*asked.values())))
    index = {b / 1000: k for k, b in enumerate(bounds)}
    out = Increases()
    labels_of: dict[SeriesKey, Mapping[str, str]] = {}

    def key_of(metric: Mapping[str, str]) -> SeriesKey:
        key = series_key(metric)
        labels_of.setdefault(key, metric)
        return key

    for series in answers.get("total", ()):
        out.totals[key_of(series["metric"])] = float(series["value"][1])
    if group_by is not None:
        for series in answers.get("steps", ()):
            row = out.steps.setdefault(series_key(series["metric"]), [0.0] * steps)
            for ts, v in series["values"]:
                k = index.get(ts)
                if k:
                    row[k - 1] += float(v)
    tail: dict[SeriesKey, float] = {}
    for series in answers.get("tail", ()):
        tail[key_of(series["metric"])] = float(series["value"][1])
    appeared: dict[SeriesKey, dict[int, float]] = {}  # series -> step -> its value there (what E counted)
    for series in answers.get("appeared", ()):
        mine = appeared.setdefault(key_of(series["metric"]), {})
        for ts, v in series["values"]:
            k = index.get(ts)
            if k:
                mine[k] = float(v)
    for series in answers.get("tail_appeared", ()):
        appeared.setdefault(key_of(series["metric"]), {})[steps] = float(series["value"][1])
    fell: dict[int, set[SeriesKey]] = {}
    for series in answers.get("fell", ()):
        key = key_of(series["metric"])
        for ts, _ in series["values"]:
            k = index.get(ts)
            if k:
                fell.setdefault(k, set()).add(key)
    for series in answers.get("tail_fell", ()):
        fell.setdefault(steps, set()).add(key_of(series["metric"]))
    for key, value in tail.items():
        out.totals[key] = out.totals.get(key, 0.0) + value
        if group_by is not None:
            out.steps.setdefault(group_key(labels_of[key], group_by), [0.0] * steps)[steps - 1] += value
    # appearances after the first step: new series, or series back after a gap
    later = {key: ks for key, ks in appeared.items() if any(k >= 2 for k in ks)}
    returning: dict[int, set[SeriesKey]] = {}
    if later:
        seen_at_start = set()
        if any(min(ks) >= 2 for ks in later.values()):
            start_answer = await prom.query(x.cur(g), t[0], expect="vector")
            seen_at_start = {series_key(s["metric"]) for s in start_answer}
        for key, ks in later.items():
            for k in sorted(ks):
                if k >= 2 and (key in seen_at_start or any(j < k for j in ks)):
                    returning.setdefault(k, set()).add(key)
    flagged = {k: fell.get(k, set()) | returning.get(k, set()) for k in set(fell) | set(returning)}
    stats.raw_steps += len(flagged)
    if flagged:
        await _settle(prom, x, family, selector, bounds, flagged, fell, returning, appeared, out, group_by,
                      labels_of)
    stats.series = max(stats.series, len(out.totals))
    return out


async def _settle(prom: Prometheus, x: _Exprs, family: str, selector: str, bounds: list[int],
                  flagged: dict[int, set[SeriesKey]], fell: dict[int, set[SeriesKey]],
                  returning: dict[int, set[SeriesKey]], appeared: dict[SeriesKey, dict[int, float]],
                  out: Increases, group_by: Sequence[str] | None, labels_of: dict[SeriesKey, Mapping[str, str]]
                  ) -> None:
    """Read the flagged (series, step) pairs sample by sample and correct what E counted."""
    g = x.step_ms
    steps = len(bounds) - 1
    asked: list[tuple[str, int, Any]] = []
    for k, keys in sorted(flagged.items()):
        nodes = sorted({dict(key).get("node", "") for key in keys})
        back = returning.get(k, set())
        # the value before the step: in the step before, or (back after a gap) anywhere since START
        kinds = [("short", g, keys - back), ("long", bounds[k - 1] - bounds[0] + g, back)]
        for i in range(0, len(nodes), NODE_BATCH):
            batch = nodes[i:i + NODE_BATCH]
            matcher = f"node=~{_promql_string(_node_regex(batch))}"
            inner = f"{selector}, {matcher}" if selector else matcher
            sel = with_matchers(family, inner)
            asked.append(("raw", k, prom.query(f"{sel}[{bounds[k] - bounds[k - 1]}ms]", bounds[k] / 1000,
                                               expect="matrix")))
            for kind, window, members in kinds:
                if members:
                    asked.append((kind, k, prom.query(f"last_over_time({sel}[{window}ms])", bounds[k - 1] / 1000,
                                                      expect="vector")))
    answers = await _all(*(q for _, _, q in asked))
    raw: dict[tuple[SeriesKey, int], list[float]] = {}
    prev: dict[tuple[SeriesKey, int], float] = {}
    for (kind, k, _), answer in zip(asked, answers):
        for series in answer:
            key = series_key(series["metric"])
            if key not in flagged[k]:
                continue
            if kind == "raw":
                raw[(key, k)] = [float(v) for ts, v in series["values"]
                                 if bounds[k - 1] < round(float(ts) * 1000) <= bounds[k]]
                labels_of.setdefault(key, series["metric"])
            elif (kind == "long") == (key in returning.get(k, ())):
                prev[(key, k)] = float(series["value"][1])
    for k, keys in flagged.items():
        for key in keys:
            last = prev.get((key, k))
            exact = 0.0
            for sample in raw.get((key, k), ()):
                exact += sample if last is None or sample < last else sample - last
                last = sample
            counted = 0.0 if key in fell.get(k, ()) else appeared.get(key, {}).get(k, 0.0)
            delta = exact - counted
            if not delta:
                continue
            out.totals[key] = out.totals.get(key, 0.0) + delta
            if group_by is not None and key in labels_of:
                out.steps.setdefault(group_key(labels_of[key], group_by), [0.0] * steps)[k - 1] += delta
