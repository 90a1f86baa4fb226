"""The report's exact counter rule, computed by the server and summed there by group.

`compute` states the rule: per series, each step's increase is the difference of its last
samples in the step and the step before, a fall counts the new value from 0, a series'
first sample counts from 0, and a step with a fall (or a series back after a whole step
without samples) is summed sample by sample. Reading every series' value at every step
costs the client O(series x steps): at a thousand nodes, tens of millions of points. Here
the server does the arithmetic, and the client reads O(series + groups x steps) numbers
plus the few cases the server cannot settle:

- Per series, the period's total: without falls, the increases of its steps add up to its
  last value in the period less its value before START (0 for a new series; a rise across
  a gap counts as growth, as in the rule), so two instant queries give every series' total.
- Per group and step, for the figures shown per step: ``sum by (group, price keys)`` of
  ``cur - prev`` at every step end (``cur``, ``prev``: ``last_over_time`` in the step and
  the step before), plus ``cur`` of each series new in the step, which the appearances
  below carry (a series new in the step counts from 0: together they are
  ``E = (cur - prev) or cur``, without the server evaluating ``cur`` twice).
- Per series and step, where those may be wrong, both sparse: the falls
  (``resets(c[2 steps]) > 0``, as before) and the appearances (``cur unless prev``). An
  appearance is a new series unless the series was seen earlier in the period: then it is
  back after a gap, and its step is read like a fall, from its last value before the gap.
- For those (series, step) pairs only: the raw samples of the step, the series' value at
  the step's end and before it (queries per step and batch of nodes, as before); the
  difference between the exact figure and what the total and ``E`` counted is added to the
  series' total and its group's step.

The answers equal the per-series computation (`compute._counter`) on the same history up to
float rounding; tests hold the two side by side on histories with restarts, churn and gaps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

from exporter.report.compute import (
    NODE_BATCH,
    FetchStats,
    Grid,
    SeriesKey,
    _node_regex,
    _promql_string,
    series_key,
    with_matchers,
)
from exporter.report.prom import Prometheus, all_of

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

    def fell(self, window_ms: int) -> str:
        return f"resets({self.sel}[{window_ms}ms]) > 0"

    def rise(self, window_ms: int) -> str:
        """``cur - prev`` over a window of ``window_ms`` ending at the evaluation time, the
        step before a regular step (``step_ms``): E of the series present in both (the new
        ones are added from the appearances); falls are corrected afterwards."""
        return f"{self.cur(window_ms)} - {self.cur(self.step_ms, window_ms)}"

    def appeared(self, window_ms: int) -> str:
        return f"{self.cur(window_ms)} unless {self.cur(self.step_ms, window_ms)}"


async def increases(prom: Prometheus, family: str, grid: Grid, selector: str, group_by: Sequence[str] | None,
                    stats: FetchStats, keys: dict[SeriesKey, SeriesKey] | None = None) -> Increases:
    """The increases of ``family`` over ``grid`` (see the module docstring); per step by
    ``group_by`` only when it is given. ``keys`` holds one copy of each series' key for
    every family read (the same series in each: held once, not once per family)."""
    keys = {} if keys is None else keys
    bounds = grid.bounds
    n = grid.regular
    g = grid.step_ms
    steps = len(bounds) - 1
    tail_ms = bounds[-1] - bounds[n] if steps > n else 0
    x = _Exprs(family, selector, g)
    t = [b / 1000 for b in bounds]
    by = ", ".join(sorted(set(group_by or ())))
    asked: dict[str, Any] = {}
    if n >= 1:
        asked["fell"] = prom.query_range(x.fell(2 * g), t[1], t[n], g / 1000)
        asked["appeared"] = prom.query_range(x.appeared(g), t[1], t[n], g / 1000)
        if group_by is not None:
            asked["steps"] = prom.query_range(f"sum by ({by}) ({x.rise(g)})", t[1], t[n], g / 1000)
    # then a series' total: without falls and gaps, its last value less its value before START
    if tail_ms:
        asked["tail_appeared"] = prom.query(x.appeared(tail_ms), t[-1], expect="vector")
        asked["tail_fell"] = prom.query(x.fell(tail_ms + (g if n else tail_ms)), t[-1], expect="vector")
        if group_by is not None:
            asked["tail_steps"] = prom.query(f"sum by ({by}) ({x.rise(tail_ms)})", t[-1], expect="vector")
    # The range queries first (their answers are checked), reduced to series keys and
    # numbers before the last and first values are asked for: at a thousand nodes an
    # answer's label maps are tens of MiB, and six counters are read side by side.
    answers = dict(zip(asked, await all_of(*asked.values())))
    index = {b / 1000: k for k, b in enumerate(bounds)}
    out = Increases()

    def key_of(metric: Mapping[str, str]) -> SeriesKey:
        key = series_key(metric)
        return keys.setdefault(key, key)  # one copy of each key, whichever family read it first

    def row(group: GroupKey) -> list[float]:
        return out.steps.setdefault(group, [0.0] * steps)

    def points(series: Mapping[str, Any]) -> Iterator[tuple[int, float]]:
        """A range answer's (step, value) at the grid's step ends."""
        for ts, v in series["values"]:
            k = index.get(ts)
            if k:
                yield k, float(v)

    if group_by is not None:
        for series in answers.pop("steps", ()):
            its_row = row(series_key(series["metric"]))
            for k, v in points(series):
                its_row[k - 1] += v
        for series in answers.pop("tail_steps", ()):
            row(series_key(series["metric"]))[-1] += float(series["value"][1])
    appeared: dict[SeriesKey, set[int]] = {}
    for series in answers.pop("appeared", ()):
        mine = appeared.setdefault(key_of(series["metric"]), set())
        its_group = None if group_by is None else row(group_key(series["metric"], group_by))
        for k, v in points(series):
            mine.add(k)
            if its_group is not None:  # new in the step: counts from 0
                its_group[k - 1] += v
    for series in answers.pop("tail_appeared", ()):
        appeared.setdefault(key_of(series["metric"]), set()).add(steps)
        if group_by is not None:
            row(group_key(series["metric"], group_by))[-1] += float(series["value"][1])
    fell: dict[int, set[SeriesKey]] = {}
    for series in answers.pop("fell", ()):
        key = key_of(series["metric"])
        for k, _ in points(series):
            fell.setdefault(k, set()).add(key)
    for series in answers.pop("tail_fell", ()):
        fell.setdefault(steps, set()).add(key_of(series["metric"]))
    del answers
    # then a series' total: without falls and gaps, its last value less its value before START
    first_answer, last_answer = await all_of(prom.query(x.cur(g), t[0], expect="vector"),
                                           prom.query(x.cur(bounds[-1] - bounds[0] + g), t[-1], expect="vector"))
    first = {series_key(s["metric"]): float(s["value"][1]) for s in first_answer}
    del first_answer
    for series in last_answer:
        key = key_of(series["metric"])
        out.totals[key] = float(series["value"][1]) - first.get(key, 0.0)
    del last_answer
    # an appearance after a step with samples (at START, or an earlier appearance): back after a gap
    returning: dict[int, set[SeriesKey]] = {}
    for key, ks in appeared.items():
        for k in ks:
            if k >= 2 and (key in first or any(j < k for j in ks)):
                returning.setdefault(k, set()).add(key)
    flagged = {k: fell.get(k, set()) | returning.get(k, set()) for k in set(fell) | set(returning)}
    stats.raw_steps += len(flagged)
    if flagged:
        await _settle(prom, x, family, selector, bounds, flagged, returning, out, group_by)
    stats.series = max(stats.series, len(out.totals))
    return out


async def _settle(prom: Prometheus, x: _Exprs, family: str, selector: str, bounds: list[int],
                  flagged: dict[int, set[SeriesKey]], returning: dict[int, set[SeriesKey]], out: Increases,
                  group_by: Sequence[str] | None) -> None:
    """Read the flagged (series, step) pairs sample by sample and correct what the totals
    (last less first: each present step's value less the series' value before it) and the
    steps (``E``: less its value in the step before, else 0) counted for them. One step and
    batch of nodes at a time is reduced to its corrections as soon as it is read, so the
    raw samples of a fleet-wide restart are never all held at once."""
    g = x.step_ms
    steps = len(bounds) - 1

    async def batch(k: int, keys: set[SeriesKey], nodes: list[str]) -> list[tuple[SeriesKey, int, float, float]]:
        back = returning.get(k, set())
        window = bounds[k] - bounds[k - 1]
        matcher = f"node=~{_promql_string(_node_regex(nodes))}"
        sel = with_matchers(family, f"{selector}, {matcher}" if selector else matcher)
        asked = {"raw": prom.query(f"{sel}[{window}ms]", bounds[k] / 1000, expect="matrix"),
                 "cur": prom.query(f"last_over_time({sel}[{window}ms])", bounds[k] / 1000, expect="vector"),
                 "short": prom.query(f"last_over_time({sel}[{g}ms])", bounds[k - 1] / 1000, expect="vector")}
        if back & keys:  # its value before the gap: the last since START
            asked["long"] = prom.query(f"last_over_time({sel}[{bounds[k - 1] - bounds[0] + g}ms])",
                                       bounds[k - 1] / 1000, expect="vector")
        answers = dict(zip(asked, await all_of(*asked.values())))
        value: dict[str, dict[SeriesKey, float]] = {}
        for kind in ("cur", "short", "long"):
            value[kind] = {key: float(series["value"][1]) for series in answers.get(kind, ())
                           if (key := series_key(series["metric"])) in keys}
        out_rows = []
        for series in answers["raw"]:
            key = series_key(series["metric"])
            if key not in keys:
                continue
            before = value["long" if key in back else "short"].get(key)
            last = before
            exact = 0.0
            for ts, v in series["values"]:
                if bounds[k - 1] < round(float(ts) * 1000) <= bounds[k]:
                    sample = float(v)
                    exact += sample if last is None or sample < last else sample - last
                    last = sample
            cur = value["cur"].get(key)
            in_total = 0.0 if cur is None else cur - (before or 0.0)
            in_steps = 0.0 if cur is None else cur - value["short"].get(key, 0.0)
            out_rows.append((key, k, exact - in_total, exact - in_steps))
        return out_rows

    work = []
    for k, keys in sorted(flagged.items()):
        nodes = sorted({dict(key).get("node", "") for key in keys})
        for i in range(0, len(nodes), NODE_BATCH):
            work.append(batch(k, keys, nodes[i:i + NODE_BATCH]))
    for rows in await all_of(*work):
        for key, k, total_delta, steps_delta in rows:
            if total_delta:
                out.totals[key] = out.totals.get(key, 0.0) + total_delta
            if group_by is not None and steps_delta:
                out.steps.setdefault(group_key(dict(key), group_by), [0.0] * steps)[k - 1] += steps_delta
