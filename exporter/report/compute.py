"""From the agent's counters in Prometheus to exact per-series totals over a period.

What a counter "did" over a period is, for each series, the sum over consecutive samples
inside (START, END] of the rise from the previous sample; a fall is a reset (the agent
restarted, or a workload came back after its counters were dropped) and counts the new
value from 0; a series' first sample counts from 0 when it has no earlier sample in the
step before (a new pod, a pod that moved to another node: another series). Each rise belongs
to the period of its later sample. ``increase()`` estimates this by extrapolating to its
window's edges; the report counts samples, so a month's report plus the next month's
equals the two months' report.

How it is computed without downloading every sample:

1. The period is cut into steps of G (`choose_step`: 5 minutes to a day, at most
   ~130 steps). Range queries per counter, ``last_over_time(c[G])`` at every step end,
   give each series' last value in each step (and at START, its value before); they are
   asked in slices of steps sized to the series count, each answer folded into arrays of
   doubles as it comes (a fleet's month whole would be a GiB of parsed JSON).
2. Where a counter only rises inside a step, the step's increase is the difference of
   those values: no sample in between matters. One range query per counter names the
   (few) steps where a series fell: ``resets(c[2G]) > 0`` at each step's end (a fall
   between two samples of the step, or from the previous step's last sample). A series
   that comes back after a whole step without samples is read the same way.
3. For those steps only, the raw samples are fetched (one query per step and counter,
   for the nodes concerned) and summed sample by sample.

`bucket_increments` is that rule, as a pure function the tests hold against hand-made
sample lists; `exporter.report.fetch.fetch` runs the queries.
"""

from __future__ import annotations

import asyncio
import math
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, MutableSequence, Sequence

from exporter.core.labels import OWNER_LABELS, TRAINING_LABELS, WORKLOAD_ID_LABELS
from exporter.report.prom import Prometheus, all_of

# What the report reads: key -> (family, scale to the report's unit).
COUNTERS: dict[str, tuple[str, float]] = {
    "used": ("container_gpu_usage_seconds_total", 1 / 3600),         # GPU-hours of SM time
    "allocated": ("container_gpu_allocation_seconds_total", 1 / 3600),  # GPU-hours held (its share)
    "idle": ("container_gpu_idle_seconds", 1 / 3600),                # hours held at 0% SM
    "energy": ("container_gpu_energy_joules_total", 1 / 3.6e6),       # kWh
}
# Per GPU (device series, no workload labels): what existed, and what nobody held.
DEVICE_COUNTERS: dict[str, tuple[str, float]] = {
    "capacity": ("gpu_capacity_seconds_total", 1 / 3600),            # GPU-hours that existed
    "unallocated": ("gpu_unallocated_seconds_total", 1 / 3600),      # GPU-hours nobody held
    "unhealthy": ("gpu_unhealthy_seconds_total", 1 / 3600),          # GPU-hours of unhealthy verdicts
}
# Per workload and GPU, 1 while the agent calls the GPU stalled (a gauge, read a minute at a time).
STALLED_FAMILY = "container_gpu_stalled"
STALLED_RESOLUTION_S = 60
SCALE: dict[str, float] = {key: scale for key, (_, scale) in {**COUNTERS, **DEVICE_COUNTERS}.items()}
SCALE["stalled"] = 1 / 3600  # GPU-hours stalled
STEPS_S = (300, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_STEPS = 130
NODE_BATCH = 100  # nodes per raw-sample query
# A counter's values per step are read in slices of steps: the first this long, the rest
# sized so that an answer holds about this many points, so many answers at once over all
# counters (see `_last_values`).
FIRST_SLICE_STEPS = 2
VALUES_PER_ANSWER = 100_000
VALUE_ANSWERS_AT_ONCE = 2

SeriesKey = tuple[tuple[str, str], ...]
# Labels that belong to a workload, not to its GPU: a workload series' labels without them
# are its GPU's (node, gpu, uuid, model, gpu_instance and the scrape's own labels).
WORKLOAD_LABELS = frozenset(WORKLOAD_ID_LABELS + OWNER_LABELS + TRAINING_LABELS)


def choose_step(seconds: float) -> int:
    """The smallest step in `STEPS_S` that cuts the period into at most `MAX_STEPS` steps."""
    for step in STEPS_S:
        if seconds / step <= MAX_STEPS:
            return step
    return STEPS_S[-1]


@dataclass(frozen=True)
class Grid:
    """Step ends t_0 = START < t_1 < ... < t_K = END, in milliseconds; the last step may be short."""

    start_ms: int
    end_ms: int
    step_ms: int

    @property
    def regular(self) -> int:
        """How many whole steps fit (t_0 .. t_n on the regular grid)."""
        return (self.end_ms - self.start_ms) // self.step_ms

    @property
    def bounds(self) -> list[int]:
        out = [self.start_ms + k * self.step_ms for k in range(self.regular + 1)]
        if out[-1] < self.end_ms:
            out.append(self.end_ms)
        return out


def series_key(metric: Mapping[str, str]) -> SeriesKey:
    """A series' identity: its labels without the metric name."""
    return tuple(sorted((k, v) for k, v in metric.items() if k != "__name__"))


def bucket_increments(values: Sequence[float | None],
                      raw: Mapping[int, Sequence[tuple[int, float]]] | None = None) -> list[float]:
    """Each step's increase of one counter series.

    Args:
        values: ``values[0]`` the series' last sample at or before START (None or NaN if
            it has none in the step before START); ``values[k]`` its last sample in step k
            (None or NaN if it has none there).
        raw: for steps where Prometheus saw a fall, every sample of the step, oldest first.

    Returns:
        K increases (step 1..K): a rise counts as the difference, a fall as the new value
        (a reset restarts from 0), and a series' first value counts from 0.
    """
    raw = raw or {}
    prev = values[0]
    if prev != prev:  # NaN: none
        prev = None
    out = []
    for k in range(1, len(values)):
        if k in raw:
            inc = 0.0
            for _, sample in raw[k]:
                inc += sample if prev is None or sample < prev else sample - prev
                prev = sample
            out.append(inc)
            continue
        v = values[k]
        if v is None or v != v:
            out.append(0.0)
            continue
        out.append(v if prev is None or v < prev else v - prev)
        prev = v
    return out


@dataclass
class SeriesTotals:
    """One workload series (one GPU): its labels and its increase per step, per counter."""

    labels: dict[str, str]
    steps: dict[str, Sequence[float]] = field(default_factory=dict)  # lists or arrays of doubles

    def total(self, key: str) -> float:
        """The period's total of one counter, in the report's unit (see `COUNTERS`)."""
        return sum(self.steps.get(key, ())) * SCALE[key]


def _ms(t: Any) -> int:
    return int(round(float(t) * 1000))


def _dur(ms: int) -> str:
    return f"{ms}ms"


def _promql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def with_matchers(family: str, matchers: str) -> str:
    """``family`` (a metric name, or a selector ``name{...}``) with more label matchers."""
    if not matchers:
        return family
    if family.endswith("}"):
        body = family[family.index("{") + 1:-1].strip()
        return f"{family[:family.index('{')]}{{{body + ', ' if body else ''}{matchers}}}"
    return f"{family}{{{matchers}}}"


def _node_regex(nodes: Sequence[str]) -> str:
    escaped = []
    for node in nodes:
        escaped.append("".join("\\" + c if not (c.isalnum() or c in "_") else c for c in node))
    return "|".join(escaped)


@dataclass
class FetchStats:
    """What the queries cost: for the report's footer and the benchmark."""

    queries: int = 0
    series: int = 0
    raw_steps: int = 0


async def _last_values(prom: Prometheus, sel: str, grid: Grid, interned: dict[SeriesKey, SeriesKey],
                       at_once: asyncio.Semaphore) -> dict[SeriesKey, array[float]]:
    """Per series of the selector ``sel``, its last value in each step of ``grid`` and
    before START (NaN: none), 8 bytes a step.

    The values are read in slices of steps sized to the series count that the first slice
    shows, so that an answer holds about `VALUES_PER_ANSWER` points (a month of 25,000
    series read whole is 3 M points, over a GiB as parsed JSON), at most ``at_once``
    answers at a time, each folded into the rows as it comes. ``interned`` holds one copy
    of each series' key for every family read (a key is ~2.5 KiB of label strings).
    """
    bounds = grid.bounds
    n = grid.regular
    step_ms = grid.step_ms
    t = [b / 1000 for b in bounds]
    tail_ms = bounds[-1] - bounds[n] if len(bounds) > n + 1 else 0
    # step ends as the API writes them (seconds, float or int; equal values hash alike)
    index = {b / 1000: k for k, b in enumerate(bounds)}
    values: dict[SeriesKey, array[float]] = {}
    blank = array("d", [math.nan]) * len(bounds)

    def row(metric: Mapping[str, str]) -> array[float]:
        key = series_key(metric)
        r = values.get(key)
        if r is None:
            r = values[interned.setdefault(key, key)] = array("d", blank)
        return r

    async def steps(first: int, last: int) -> None:
        async with at_once:
            for series in await prom.query_range(f"last_over_time({sel}[{_dur(step_ms)}])", t[first], t[last],
                                                 step_ms / 1000):
                r = row(series["metric"])
                for ts, v in series["values"]:
                    k = index.get(ts)
                    if k is not None:
                        r[k] = v

    async def tail() -> None:
        for series in await prom.query(f"last_over_time({sel}[{_dur(tail_ms)}])", t[-1], expect="vector"):
            row(series["metric"])[-1] = series["value"][1]

    await steps(0, min(n, FIRST_SLICE_STEPS - 1))
    width = max(1, VALUES_PER_ANSWER // max(1, len(values)))
    await all_of(*[steps(k, min(n, k + width - 1)) for k in range(FIRST_SLICE_STEPS, n + 1, width)],
                 *([tail()] if tail_ms else []))
    return values


async def _counter(prom: Prometheus, family: str, grid: Grid, selector: str, stats: FetchStats,
                   interned: dict[SeriesKey, SeriesKey] | None = None,
                   answers: asyncio.Semaphore | None = None) -> dict[SeriesKey, Sequence[float]]:
    """Per series, the increase of ``family`` in each step of ``grid``. ``interned`` and
    ``answers`` are `_last_values`' (series keys held once over every family; the slices of
    values read at once, over every family: an answer carries every series' labels)."""
    bounds = grid.bounds
    n = grid.regular
    step_ms = grid.step_ms
    sel = with_matchers(family, selector)
    t = [b / 1000 for b in bounds]

    def fell(window_ms: int, previous_ms: int) -> str:
        # the step and the one before it: a fall from the previous step's last sample too
        return f"resets({sel}[{_dur(window_ms + previous_ms)}]) > 0"

    reset_q = []
    if n >= 1:
        reset_q.append(prom.query_range(fell(step_ms, step_ms), t[1], t[n], step_ms / 1000))
    tail_ms = bounds[-1] - bounds[n] if len(bounds) > n + 1 else 0
    if tail_ms:
        reset_q.append(prom.query(fell(tail_ms, step_ms if n else tail_ms), t[-1]))
    index = {b / 1000: k for k, b in enumerate(bounds)}
    values, *resets_ans = await all_of(
        _last_values(prom, sel, grid, {} if interned is None else interned,
                     answers or asyncio.Semaphore(VALUE_ANSWERS_AT_ONCE)), *reset_q)
    flagged: dict[int, set[SeriesKey]] = {}
    for i, answer in enumerate(resets_ans):
        for series in answer:
            key = series_key(series["metric"])
            points = series["values"] if "values" in series else [series["value"]]
            for ts, _ in points:
                k = index.get(ts) if i == 0 and "values" in series else len(bounds) - 1
                if k:
                    flagged.setdefault(k, set()).add(key)
    for key, vals in values.items():  # back after a step or more without samples
        known = vals[0] == vals[0]  # not NaN
        for k in range(1, len(vals)):
            seen = vals[k] == vals[k]
            if seen and vals[k - 1] != vals[k - 1] and known:
                flagged.setdefault(k, set()).add(key)
            known = known or seen
    raw: dict[SeriesKey, dict[int, list[tuple[int, float]]]] = {}
    fetches = []
    for k, keys in sorted(flagged.items()):
        nodes = sorted({dict(key).get("node", "") for key in keys})
        for i in range(0, len(nodes), NODE_BATCH):
            batch = nodes[i:i + NODE_BATCH]
            matcher = f"node=~{_promql_string(_node_regex(batch))}"
            inner = f"{selector}, {matcher}" if selector else matcher
            window = bounds[k] - bounds[k - 1]
            fetches.append((k, keys, prom.query(f"{with_matchers(family, inner)}[{_dur(window)}]", bounds[k] / 1000,
                                                expect="matrix")))
    stats.raw_steps += len(flagged)
    results = await all_of(*(f for _, _, f in fetches))
    for (k, keys, _), answer in zip(fetches, results):
        for series in answer:
            key = series_key(series["metric"])
            if key not in keys:
                continue
            samples = [(_ms(ts), float(v)) for ts, v in series["values"]]
            raw.setdefault(key, {})[k] = [(ts, v) for ts, v in samples if bounds[k - 1] < ts <= bounds[k]]
    out: dict[SeriesKey, Sequence[float]] = {}
    for key, vals in values.items():
        out[key] = array("d", bucket_increments(vals, raw.get(key)))
    stats.series = max(stats.series, len(out))
    return out


@dataclass
class ModelTokens:
    """The tokens one workload (namespace, pod) served of one model, per step."""

    namespace: str
    pod: str
    model: str
    engine: str
    prompt: MutableSequence[float]
    generated: MutableSequence[float]

    def total(self, k: int) -> float:
        return self.prompt[k] + self.generated[k]


@dataclass
class Fetched:
    """What `exporter.report.fetch.fetch` read: the grid, the workload series and the GPU (device) series; with
    engines, the tokens each workload served per model and the seconds per step in which a
    workload held GPUs and served no token (`IDLE_RESOLUTION_S` intervals)."""

    grid: Grid
    series: list[SeriesTotals]
    devices: list[SeriesTotals]
    stats: FetchStats
    tokens: list[ModelTokens] = field(default_factory=list)
    idle: dict[tuple[str, str], MutableSequence[float]] = field(default_factory=dict)
    unjoined: int = 0  # engine series without a pod label: no workload to join them with
    steps: list[SeriesTotals] | None = None         # per group, per step (see `fetch.fetch`)
    device_steps: list[SeriesTotals] | None = None  # per GPU group, per step


UNNAMED_MODEL = "(unnamed)"
TOKEN_FIELDS = ("prompt_tokens", "generated_tokens")
# A workload is idle in a clock-aligned interval of this length when it held GPUs (its
# allocation counter has a sample there) and none of its token counters changed.
IDLE_RESOLUTION_S = 300
# The idle intervals' query is split into this many ranges of steps, asked for at once.
IDLE_PARTS = 4


def model_of(labels: Mapping[str, str], model_label: str) -> str:
    """The served model a token series counts: the engine's model label, else a
    ``model_name`` the scrape set (relabelling), else `UNNAMED_MODEL`."""
    return (labels.get(model_label) if model_label else None) or labels.get("model_name") or UNNAMED_MODEL


def model_tokens(candidates: Sequence[tuple[str, str, str, dict[SeriesKey, list[float]]]], steps: int
                 ) -> tuple[list[ModelTokens], int]:
    """The tokens per workload and model from every engine's counters.

    Args:
        candidates: (engine, model label, field, per-series increases) in the mapping's
            order, alternatives of a field after its first choice.
        steps: the number of steps.

    Returns:
        The rows, and how many series had no ``pod`` label. As in the rules, the first
        candidate that has series for a (namespace, pod, model) and a field is the one
        read there (a pod exposing two engines' names for one model counts once).
    """
    chosen: dict[tuple[str, str, str, str], int] = {}
    rows: dict[tuple[str, str, str], ModelTokens] = {}
    unjoined = 0
    for index, (engine, model_label, fieldname, per_series) in enumerate(candidates):
        for key, increments in per_series.items():
            labels = dict(key)
            if not labels.get("pod"):
                unjoined += 1
                continue
            where = (labels.get("namespace", ""), labels["pod"], model_of(labels, model_label))
            if chosen.setdefault((*where, fieldname), index) != index:
                continue
            row = rows.get(where)
            if row is None:
                row = rows[where] = ModelTokens(*where, engine, array("d", [0.0]) * steps, array("d", [0.0]) * steps)
            target = row.prompt if fieldname == "prompt_tokens" else row.generated
            for k, value in enumerate(increments):
                target[k] += value
    return list(rows.values()), unjoined


def token_candidates(engines: Sequence[Any]) -> list[tuple[str, str, str, str]]:
    """Every engine's token selectors, with a pod label, in the mapping's order (a field's
    alternatives after its first choice): (engine, model label, field, selector)."""
    return [(engine.name, engine.model_label, fieldname, sel.text('pod!=""'))
            for engine in engines for fieldname in TOKEN_FIELDS for sel in engine.selectors(fieldname)]


def idle_expression(token_selectors: Sequence[str], pods: Sequence[str] | None, selector: str = "") -> str:
    """1 per (namespace, pod) at each `IDLE_RESOLUTION_S` interval where it held GPUs (an
    allocation sample in the interval) and none of its token counters rose (the last
    sample in the interval above the last one before it; a series new in the interval
    rose if it is above 0).

    The report asks only about the pods that served tokens in the period (``pods``: their
    idle time splits between their models) and the engines' selectors that have series
    there (``token_selectors``): the expression is evaluated every 5 minutes of the
    period, so every pod and selector left out is 8,640 evaluations fewer a month. The
    recording rules (``pods`` None) ask about every pod with a token series sampled in
    the hour before the interval's end, an hour at a time."""
    res = f"{IDLE_RESOLUTION_S}s"
    pod_matcher = f"pod=~{_promql_string(_value_regex(pods))}" if pods is not None else ""
    allocation = with_matchers("container_gpu_allocation_seconds_total", _join(pod_matcher, selector))
    held = f"group by (namespace, pod) (last_over_time({allocation}[{res}]))"
    if pods is None:
        engines = " or ".join(f"last_over_time({with_matchers(text, selector)}[1h])" for text in token_selectors)
        held = f"{held} and on (namespace, pod) ({engines})"
    served = []
    for text in token_selectors:
        s = with_matchers(text, _join(pod_matcher, selector))
        now, before = f"last_over_time({s}[{res}])", f"last_over_time({s}[{res}] offset {res})"
        # a rise: a counter that fell restarted, which serves nothing by itself. Not
        # grouped by pod here: ``unless on (namespace, pod)`` matches the series as they
        # are, and an aggregation per 5-minute step is a sixth of the query's time.
        served.append(f"({now} > {before} or ({now} > 0 unless {before}))")
    return f"{held} unless on (namespace, pod) ({' or '.join(served)})"


def _value_regex(values: Sequence[str]) -> str:
    """A regex that matches exactly these label values."""
    return "|".join("".join("\\" + c if not (c.isalnum() or c in "_-") else c for c in v) for v in sorted(values))


def _join(*matchers: str) -> str:
    return ", ".join(m for m in matchers if m)


async def _idle(prom: Prometheus, grid: Grid, expr: str) -> dict[tuple[str, str], MutableSequence[float]]:
    """The seconds of each step in idle intervals per (namespace, pod).

    Each interval counts in the step its end falls in, steps taken as [t_{k-1}, t_k): the
    queries run a millisecond before each step's end, so that an interval ending on a
    step boundary is counted once (Prometheus 2 includes both ends of a range).

    The subquery evaluates the expression every `IDLE_RESOLUTION_S` over the whole period
    (8,640 times in 30 days), which one query does on one core: the steps are asked for in
    `IDLE_PARTS` ranges, which the server evaluates side by side, and each answer is
    folded into the rows as it comes.
    """
    bounds = grid.bounds
    n = grid.regular
    step_ms = grid.step_ms
    parts = min(IDLE_PARTS, n)
    cuts = [1 + (n * i) // parts for i in range(parts)] + [n + 1] if n >= 1 else []
    out: dict[tuple[str, str], MutableSequence[float]] = {}

    def add(metric: Mapping[str, str], k: int, count: float) -> None:
        key = (metric.get("namespace", ""), metric.get("pod", ""))
        row = out.get(key)
        if row is None:
            row = out[key] = array("d", [0.0]) * (len(bounds) - 1)
        row[k - 1] = min(count * IDLE_RESOLUTION_S, (bounds[k] - bounds[k - 1]) / 1000)

    async def part(first: int, after: int) -> None:
        for series in await prom.query_range(f"count_over_time(({expr})[{_dur(step_ms)}:{IDLE_RESOLUTION_S}s])",
                                             bounds[first] / 1000 - 0.001, bounds[after - 1] / 1000 - 0.001,
                                             step_ms / 1000):
            for ts, value in series["values"]:
                k = int(round((float(ts) + 0.001) * 1000 - bounds[0]) // step_ms)
                if 1 <= k <= n:
                    add(series["metric"], k, float(value))

    async def tail(tail_ms: int) -> None:
        for series in await prom.query(f"count_over_time(({expr})[{_dur(tail_ms)}:{IDLE_RESOLUTION_S}s])",
                                       bounds[-1] / 1000 - 0.001, expect="vector"):
            add(series["metric"], len(bounds) - 1, float(series["value"][1]))

    tail_ms = bounds[-1] - bounds[n] if len(bounds) > n + 1 else 0
    await all_of(*[part(first, after) for first, after in zip(cuts, cuts[1:])], *([tail(tail_ms)] if tail_ms else []))
    return out


def _series_rows(named: Iterable[tuple[str, Mapping[SeriesKey, Sequence[float]]]]) -> list[SeriesTotals]:
    """One `SeriesTotals` per series (or group) key, with each named counter's steps."""
    rows: dict[SeriesKey, SeriesTotals] = {}
    for name, per_series in named:
        for key, steps in per_series.items():
            totals = rows.get(key)
            if totals is None:
                totals = rows[key] = SeriesTotals(dict(key))
            totals.steps[name] = steps
    return list(rows.values())


def _rows(counters: dict[str, tuple[str, float]], results: list[dict[SeriesKey, Sequence[float]]]
          ) -> list[SeriesTotals]:
    return _series_rows(zip(counters, results))


# What `exporter.report.fetch.fetch` needs per step when the server sums by group: the timeline's cost and the
# carbon figures (allocated time and energy), and what nobody held.
STEP_COUNTERS = ("allocated", "energy")
DEVICE_STEP_COUNTERS = ("unallocated",)
