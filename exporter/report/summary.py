"""Per-series totals -> the report: figures per group, totals, top wasters, a timeline.

Figures (per series, then summed; hours are GPU-hours: one GPU for one hour):

- ``gpu_hours_used``: SM time, the integral of the workload's SM share;
- ``gpu_hours_allocated``: time the GPU was allocated to it or it held memory there;
- ``waste_gpu_hours``: allocated minus used (never below 0 for a series);
- ``zombie_hours``: time it held the GPU (memory, or a device-plugin allocation) at 0% SM;
- ``stalled_gpu_hours``: time its GPUs were busy with no work (the agent's stall, a wedged
  collective: docs/TRAINING.md), a minute at a time; not split between served models
  (``--by model`` leaves it out);
- ``energy_kwh``: its share of the GPU's energy;
- ``allocated_cost`` = allocated x price per GPU-hour, ``effective_cost`` = used x price,
  ``waste_cost`` = waste x price, ``energy_cost`` = kWh x price per kWh, and
  ``total_cost`` = allocated_cost + energy_cost: what the group is charged.

Reconciliation (totals, from the GPU series): ``gpu_hours_capacity`` is the GPU time that
existed (GPUs that joined or left count for the time they were there), of which
``gpu_hours_unallocated`` nobody held, so that the groups' allocated hours plus the
unallocated hours are the capacity. With prices, a GPU's hour costs the price of its model
(overrides that match GPU labels alone, such as ``node``, apply): ``capacity_cost`` is what
the GPUs cost, ``unallocated_cost`` the part nobody held, and ``price_overrides_cost`` what
overrides on workload labels (a namespace's reserved rate) took off the groups' charges
(negative where they charge more), so that allocated + unallocated + price overrides =
capacity cost.

Per served model (``--by model``, docs/INFERENCE.md): each inference workload's series are
split between the models its engine served by their share of its tokens, step by step
(`_ModelSplit`); workloads serving no model are in `NONE_GROUP`, so the reconciliation
holds as for any grouping. The groups add tokens, costs, kWh and GPU-hours per million
tokens, replicas and idle replica hours (`MODEL_FIGURES`).
"""

from __future__ import annotations

from array import array
from typing import Any, Iterator, Mapping, Sequence

from exporter.report import carbon
from exporter.report.carbon import Intensity
from exporter.report.compute import SCALE, STEP_COUNTERS, WORKLOAD_LABELS, Grid, ModelTokens, SeriesTotals
from exporter.report.periods import iso
from exporter.report.prices import Prices

FIGURES = ("gpu_hours_used", "gpu_hours_allocated", "waste_gpu_hours", "zombie_hours", "stalled_gpu_hours",
           "energy_kwh", "allocated_cost", "effective_cost", "waste_cost", "energy_cost", "total_cost")
COST_FIGURES = ("allocated_cost", "effective_cost", "waste_cost", "energy_cost", "total_cost")
# With --by model, per served model (docs/INFERENCE.md).
MODEL_FIGURES = ("prompt_tokens", "generated_tokens", "cost_per_million_tokens", "effective_cost_per_million_tokens",
                 "kwh_per_million_tokens", "gpu_hours_per_million_tokens", "replicas", "idle_replica_hours",
                 "idle_gpu_hours")
MODEL_BY = "model"
JOB_BY = "training_job"  # --by job: the training job a workload is a rank of (docs/TRAINING.md)
CARBON = "carbon_gco2e"  # per group and in the totals: grams of CO2e (carbon.py)
CAPACITY_FIGURES = ("gpu_hours_capacity", "gpu_hours_unallocated", "capacity_cost", "unallocated_cost",
                    "price_overrides_cost", "gpu_hours_unhealthy")
NONE_GROUP = "(none)"
UNALLOCATED_GROUP = "(unallocated)"
# Allocated plus unallocated may differ from the capacity by float rounding only.
RECONCILE_TOLERANCE = 1e-3
CHART_GROUPS = 8
DIGITS = 6


def workload_name(labels: dict[str, str]) -> str:
    """How a person names the workload: namespace/pod/container, or the Slurm job."""
    if labels.get("pod"):
        return "/".join(x for x in (labels.get("namespace", ""), labels["pod"], labels.get("container", "")) if x)
    if labels.get("slurm_job_id"):
        user = labels.get("slurm_user")
        return f"slurm job {labels['slurm_job_id']}" + (f" ({user})" if user else "")
    return "(unattributed)"


def _figures(s: SeriesTotals, prices: Prices | None) -> dict[str, float | None]:
    used = s.total("used")
    allocated = s.total("allocated")
    waste = max(allocated - used, 0.0)
    kwh = s.total("energy")
    f: dict[str, float | None] = {"gpu_hours_used": used, "gpu_hours_allocated": allocated, "waste_gpu_hours": waste,
                                  "zombie_hours": s.total("idle"), "stalled_gpu_hours": s.total("stalled"),
                                  "energy_kwh": kwh}
    if prices is None:
        f.update({k: None for k in COST_FIGURES})
        return f
    price = prices.gpu_hour_price(s.labels)
    kwh_price = prices.kwh_price(s.labels)
    energy_cost = None if kwh_price is None else kwh * kwh_price
    f.update({"allocated_cost": allocated * price, "effective_cost": used * price, "waste_cost": waste * price,
              "energy_cost": energy_cost, "total_cost": allocated * price + (energy_cost or 0.0)})
    return f


def _add(into: dict[str, Any], f: dict[str, float | None]) -> None:
    for key in FIGURES:
        value = f[key]
        if value is None:
            into.setdefault(key, None)
        else:
            into[key] = (into.get(key) or 0.0) + value


def _finish(d: dict[str, Any]) -> dict[str, Any]:
    for key in FIGURES:
        d.setdefault(key, None if key in COST_FIGURES else 0.0)
        if d[key] is not None:
            d[key] = round(d[key], DIGITS) + 0.0  # no -0.0
    allocated = d["gpu_hours_allocated"]
    d["waste_ratio"] = round(d["waste_gpu_hours"] / allocated, DIGITS) if allocated else None
    return d


def gpu_labels(labels: dict[str, str]) -> dict[str, str]:
    """A workload series' labels less the workload's own: the labels of its GPU's series."""
    return {k: v for k, v in labels.items() if k not in WORKLOAD_LABELS and not k.startswith("label_")}


def unhealthy_by_model(devices: Sequence[SeriesTotals]) -> dict[str, float]:
    """GPU-hours during which GPUs' verdicts were unhealthy, per GPU model (``model`` label):
    the capacity a team claims back from its cloud provider (docs/CHARGEBACK.md)."""
    out: dict[str, float] = {}
    for d in devices:
        hours = d.total("unhealthy")
        if hours:
            model = d.labels.get("model", "")
            out[model] = out.get(model, 0.0) + hours
    return {model: round(hours, DIGITS) + 0.0 for model, hours in sorted(out.items())}


def _capacity(series: Sequence[SeriesTotals], devices: Sequence[SeriesTotals], prices: Prices | None,
              device_steps: Sequence[SeriesTotals] | None = None) -> tuple[dict[str, float | None], list[float] | None]:
    """The reconciliation totals, and the unallocated figure per step (cost with prices)."""
    out: dict[str, float | None] = dict.fromkeys(CAPACITY_FIGURES)
    if not devices:
        return out, None
    out["gpu_hours_capacity"] = sum(d.total("capacity") for d in devices)
    out["gpu_hours_unallocated"] = sum(d.total("unallocated") for d in devices)
    out["gpu_hours_unhealthy"] = sum(d.total("unhealthy") for d in devices)
    steps: list[float] | None = None
    for d in devices if device_steps is None else device_steps:
        unallocated = d.steps.get("unallocated")
        if unallocated is None:
            continue
        price = prices.gpu_hour_price(d.labels) if prices is not None else 1.0
        row = [x * SCALE["unallocated"] * price for x in unallocated]
        steps = row if steps is None else [a + b for a, b in zip(steps, row)]
    if prices is not None:
        out["capacity_cost"] = sum(d.total("capacity") * prices.gpu_hour_price(d.labels) for d in devices)
        out["unallocated_cost"] = sum(d.total("unallocated") * prices.gpu_hour_price(d.labels) for d in devices)
        adjustment = 0.0
        for s in series:
            allocated = s.total("allocated")
            if allocated:
                gpu_price = prices.gpu_hour_price(gpu_labels(s.labels))
                adjustment += allocated * (gpu_price - prices.gpu_hour_price(s.labels))
        out["price_overrides_cost"] = adjustment
    return out, steps


def _notes(totals: dict[str, Any], series: Sequence[SeriesTotals], devices: Sequence[SeriesTotals]) -> list[str]:
    """What a reader must know before trusting the reconciliation."""
    if not series and not devices:
        return []
    if not devices:
        return ["no gpu_capacity_seconds_total series in this period: the agents predate l9gpu 0.2 (GPU capacity "
                "and unallocated hours are unknown), or --selector matches workload labels only"]
    capacity, unallocated = totals["gpu_hours_capacity"], totals["gpu_hours_unallocated"]
    gap = capacity - unallocated - totals["gpu_hours_allocated"]
    if abs(gap) > RECONCILE_TOLERANCE * max(1.0, capacity):
        return [f"the groups' allocated GPU-hours plus the unallocated ones differ from the capacity by {gap:+.4f} "
                "GPU-hours: part of the period predates agents that split a shared GPU's time (before l9gpu 0.2 "
                "every tenant was billed the whole GPU), or --selector keeps only some workloads of a GPU"]
    return []


class _ModelSplit:
    """How the workloads' GPU time is split between the models they serve (--by model).

    Per step, a workload's series are split by each model's share of the workload's tokens
    in that step; in a step where it served no token (or for a workload whose token series
    say nothing of a step), equally between the models it served in the period. Workloads
    without engine series serve no model: their time is in `NONE_GROUP`.
    """

    def __init__(self, tokens: Sequence[ModelTokens], idle: Mapping[tuple[str, str], list[float]], grid: Grid):
        self.by_pod: dict[tuple[str, str], list[ModelTokens]] = {}
        for row in tokens:
            self.by_pod.setdefault((row.namespace, row.pod), []).append(row)
        self.idle = idle
        bounds = grid.bounds
        self.lengths = [(bounds[k] - bounds[k - 1]) / 1000 for k in range(1, len(bounds))]

    def shares(self, pod: tuple[str, str]) -> list[tuple[str, list[float]]]:
        """(model, share per step) for a workload; empty where it serves none."""
        rows = self.by_pod.get(pod, [])
        out = []
        for row in rows:
            share = []
            for k in range(len(self.lengths)):
                total = sum(r.total(k) for r in rows)
                share.append(row.total(k) / total if total > 0 else 1 / len(rows))
            out.append((row.model, share))
        return out

    def idle_fraction(self, pod: tuple[str, str]) -> list[float]:
        idle = self.idle.get(pod) or [0.0] * len(self.lengths)
        return [min(1.0, seconds / length) if length else 0.0 for seconds, length in zip(idle, self.lengths)]

    def pieces(self, s: SeriesTotals) -> list[tuple[str, SeriesTotals]]:
        """The parts of one workload series that each model it serves pays, with the
        ``idle_gpu`` counter: its allocated time in intervals where nothing was served."""
        pod = (s.labels.get("namespace", ""), s.labels.get("pod", ""))
        shares = self.shares(pod) if pod[1] else []
        if not shares:
            return [(NONE_GROUP, s)]
        idle = self.idle_fraction(pod)
        out = []
        for model, share in shares:
            # arrays of doubles: a piece per workload series, 8 bytes a step
            steps: dict[str, Sequence[float]] = {
                key: array("d", [x * w for x, w in zip(values, share)]) for key, values in s.steps.items()}
            steps["idle_gpu"] = array("d", [x * f for x, f in zip(steps.get("allocated", ()), idle)])
            out.append((model, SeriesTotals({**s.labels, "model_name": model}, steps)))
        return out

    def figures(self) -> dict[str, dict[str, float]]:
        """Per model: tokens, replicas and idle replica hours."""
        out: dict[str, dict[str, float]] = {}
        for pod, rows in self.by_pod.items():
            idle = self.idle.get(pod) or [0.0] * len(self.lengths)
            for model, share in self.shares(pod):
                f = out.setdefault(model, {"prompt_tokens": 0.0, "generated_tokens": 0.0, "replicas": 0,
                                           "idle_replica_hours": 0.0})
                row = next(r for r in rows if r.model == model)
                f["prompt_tokens"] += sum(row.prompt)
                f["generated_tokens"] += sum(row.generated)
                f["replicas"] += 1
                f["idle_replica_hours"] += sum(i * w for i, w in zip(idle, share)) / 3600
        return out


class _RecordedModels:
    """--by model from the recording rules (`exporter.report.rules`): the rows are each
    model's part already, split hour by hour on the server, and the model figures are
    the rules' (``replicas``: the most that served the model in one hour)."""

    def __init__(self, figures: Mapping[str, Mapping[str, float]]):
        self._figures = figures

    def pieces(self, s: SeriesTotals) -> list[tuple[str, SeriesTotals]]:
        return [(s.labels.get("model_name") or NONE_GROUP, s)]

    def figures(self) -> dict[str, dict[str, float]]:
        return {name: {"prompt_tokens": f.get("prompt_tokens", 0.0), "generated_tokens": f.get("generated_tokens", 0.0),
                       "replicas": int(f.get("replicas", 0)),
                       "idle_replica_hours": f.get("idle_replica_seconds", 0.0) / 3600}
                for name, f in self._figures.items()}


def _per_million(value: float | None, tokens: float) -> float | None:
    return None if value is None or not tokens else round(value / tokens * 1e6, DIGITS) + 0.0


def _model_figures(g: dict[str, Any], tokens: Mapping[str, float] | None) -> dict[str, Any]:
    tokens = tokens or {}
    prompt, generated = tokens.get("prompt_tokens", 0.0), tokens.get("generated_tokens", 0.0)
    total = prompt + generated
    return {"prompt_tokens": round(prompt, 3) + 0.0, "generated_tokens": round(generated, 3) + 0.0,
            "cost_per_million_tokens": _per_million(g["allocated_cost"], total),
            "effective_cost_per_million_tokens": _per_million(g["effective_cost"], total),
            "kwh_per_million_tokens": _per_million(g["energy_kwh"], total),
            "gpu_hours_per_million_tokens": _per_million(g["gpu_hours_allocated"], total),
            "replicas": int(tokens.get("replicas", 0)),
            "idle_replica_hours": round(tokens.get("idle_replica_hours", 0.0), DIGITS) + 0.0,
            "idle_gpu_hours": round(g.get("idle_gpu_hours") or 0.0, DIGITS) + 0.0}


def _split_of(by: str, grid: Grid, tokens: Sequence[ModelTokens], idle: Mapping[tuple[str, str], list[float]] | None,
              recorded_models: Mapping[str, Mapping[str, float]] | None) -> _ModelSplit | _RecordedModels | None:
    """How the workload series become groups per served model (None: not ``--by model``):
    split by their tokens here, or split already by the recording rules."""
    if by != MODEL_BY:
        return None
    if recorded_models is not None:
        return _RecordedModels(recorded_models)
    return _ModelSplit(tokens, idle or {}, grid)


def _add_model_totals(totals: dict[str, Any], groups: Sequence[dict[str, Any]]) -> None:
    """The served models' figures (`MODEL_FIGURES` that add up) over all groups."""
    for key in ("prompt_tokens", "generated_tokens", "idle_replica_hours", "idle_gpu_hours"):
        totals[key] = round(sum(g[key] for g in groups), DIGITS) + 0.0
    totals["replicas"] = sum(g["replicas"] for g in groups)


def summarize(series: Sequence[SeriesTotals], grid: Grid, by: str, prices: Prices | None, *, top: int = 5,
              source: dict[str, Any] | None = None, devices: Sequence[SeriesTotals] = (),
              tokens: Sequence[ModelTokens] = (), idle: Mapping[tuple[str, str], list[float]] | None = None,
              steps: Sequence[SeriesTotals] | None = None, device_steps: Sequence[SeriesTotals] | None = None,
              intensity: Intensity | None = None, recorded_models: Mapping[str, Mapping[str, float]] | None = None
              ) -> dict[str, Any]:
    """The report as plain data (the JSON output; CSV and HTML are views of it).

    Args:
        series: the workload series.
        devices: the GPU series (`compute.DEVICE_COUNTERS`), for the reconciliation totals.
        by: a label of the workload series, or `MODEL_BY`: per served model, from
            ``tokens`` and ``idle`` (`compute.Fetched`), each workload's GPU time split
            between the models it serves by their tokens (see `_ModelSplit`).
        steps, device_steps: the increases per step summed by group (`compute.Fetched`),
            when ``series`` and ``devices`` carry period totals only; else the series'
            own steps make the timeline.
        intensity: the grid's carbon intensity (`carbon.Intensity`): adds ``carbon_gco2e``
            per group, from each step's energy.
        recorded_models: with `MODEL_BY`, the recording rules' figures per served model
            (`rules.Recorded.models`): ``series`` are each model's part already.
    """
    groups: dict[str, dict[str, Any]] = {}
    workloads: dict[str, dict[str, dict[str, Any]]] = {}
    per_series = []
    split = _split_of(by, grid, tokens, idle, recorded_models)

    def pieces() -> Iterator[tuple[str, SeriesTotals]]:
        """Each series, or each model's piece of it: one at a time, as a piece's figures
        are summed as soon as it is made."""
        for s in series:
            if not any(any(steps) for steps in s.steps.values()):
                continue  # seen just before the period, nothing in it
            yield from split.pieces(s) if split is not None else [(s.labels.get(by) or NONE_GROUP, s)]

    for name, s in pieces():
        f = _figures(s, prices)
        if split is not None:
            f["idle_gpu_hours"] = sum(s.steps.get("idle_gpu", ())) * SCALE["allocated"]
            # a piece's own copy: the timeline and the carbon need no more of it
            s.steps = {key: s.steps[key] for key in STEP_COUNTERS if key in s.steps}
        per_series.append((name, s, f))
        g = groups.setdefault(name, {})
        _add(g, f)
        if "idle_gpu_hours" in f:
            g["idle_gpu_hours"] = g.get("idle_gpu_hours", 0.0) + f["idle_gpu_hours"]
        w = workloads.setdefault(name, {}).setdefault(workload_name(s.labels), {})
        _add(w, f)
    model_tokens = split.figures() if split is not None else {}
    for name in model_tokens:  # models whose pods held no GPU l9gpu saw
        groups.setdefault(name, {})
        workloads.setdefault(name, {})
    totals: dict[str, Any] = {}
    for g in groups.values():
        _add(totals, {k: g.get(k) for k in FIGURES})
    rank_key = "total_cost" if prices is not None else "gpu_hours_allocated"
    out_groups = []
    for name, g in groups.items():
        wl = workloads[name]
        ranked = sorted(wl.items(), key=lambda kv: (-round(kv[1].get("waste_gpu_hours") or 0.0, DIGITS), kv[0]))
        top_waste = []
        for wname, wf in ranked[:top]:
            wf = _finish(dict(wf))
            if not wf["waste_gpu_hours"]:
                break
            top_waste.append({"workload": wname, "waste_gpu_hours": wf["waste_gpu_hours"],
                              "waste_cost": wf["waste_cost"], "gpu_hours_allocated": wf["gpu_hours_allocated"],
                              "gpu_hours_used": wf["gpu_hours_used"], "zombie_hours": wf["zombie_hours"]})
        row = {"group": name, **_finish(g), "workloads": len(wl), "top_waste": top_waste}
        if split is not None:
            row.update(_model_figures(row, model_tokens.get(name)))
        out_groups.append(row)
    out_groups.sort(key=lambda g: (-(g[rank_key] or 0.0), g["group"]))
    totals = _finish(totals)
    if split is not None:
        _add_model_totals(totals, out_groups)
    step_rows = (per_series if steps is None else [(s.labels.get(by) or NONE_GROUP, s, {}) for s in steps])
    notes_carbon = _add_carbon(out_groups, totals, [(name, s) for name, s, _ in step_rows], intensity)
    totals["groups"] = len(out_groups)
    totals["workloads"] = sum(len(w) for w in workloads.values())
    capacity, unallocated_steps = _capacity(series, devices, prices, device_steps)
    for key, value in capacity.items():
        totals[key] = None if value is None else round(value, DIGITS) + 0.0
    totals["gpu_hours_unhealthy_by_model"] = unhealthy_by_model(devices)
    notes = _notes(totals, series, devices)
    return {
        "report": "l9gpu chargeback",
        "period": {"from": iso(grid.start_ms / 1000), "to": iso(grid.end_ms / 1000),
                   "hours": round((grid.end_ms - grid.start_ms) / 3.6e6, DIGITS)},
        "by": by,
        "currency": prices.currency if prices is not None else None,
        "prices": prices.source if prices is not None else None,
        "source": source or {},
        "totals": totals,
        "groups": out_groups,
        "timeline": _timeline(step_rows, grid, prices, [g["group"] for g in out_groups], unallocated_steps),
        "notes": notes + notes_carbon,
    }


def _add_carbon(groups: list[dict[str, Any]], totals: dict[str, Any], rows: list[tuple[str, SeriesTotals]],
                intensity: Intensity | None) -> list[str]:
    """``carbon_gco2e`` per group and in the totals (None without an intensity); notes."""
    if intensity is None:
        for g in groups:
            g[CARBON] = None
        totals[CARBON] = None
        return []
    per_group, uncovered = carbon.grams(rows, intensity)
    for g in groups:
        g[CARBON] = round(per_group.get(g["group"], 0.0), 3) + 0.0
    totals[CARBON] = round(sum(per_group.values()), 3) + 0.0
    if uncovered > 1e-6:
        return [f"{uncovered:.3f} kWh had no carbon intensity (no value of the --carbon-intensity-query for their "
                "steps or region, and no constant in the prices file): their carbon is not counted"]
    return []


def _timeline(per_series: list[tuple[str, SeriesTotals, dict[str, Any]]], grid: Grid, prices: Prices | None,
              ranked: list[str], unallocated: list[float] | None = None) -> dict[str, Any]:
    """Cost (or allocated GPU-hours without prices) per group per day (per step for short periods),
    and what nobody held (`UNALLOCATED_GROUP`) where it is known and not 0."""
    bounds = grid.bounds
    span = grid.end_ms - grid.start_ms
    bin_ms = 86_400_000 if span >= 2 * 86_400_000 and grid.step_ms <= 86_400_000 else grid.step_ms
    nbins = max(1, -(-span // bin_ms))
    shown = ranked[:CHART_GROUPS]
    other = "other" if len(ranked) > CHART_GROUPS else None
    values = {name: [0.0] * nbins for name in shown + ([other] if other else [])}
    step_bins = [min(nbins - 1, (bounds[k] - 1 - grid.start_ms) // bin_ms) for k in range(1, len(bounds))]
    for name, s, _ in per_series:
        target = name if name in values else other
        if target is None:
            continue
        # per step: allocated GPU-hours, or their cost plus the energy's
        steps = [x * SCALE["allocated"] for x in s.steps.get("allocated", [0.0] * (len(bounds) - 1))]
        if prices is not None:
            price = prices.gpu_hour_price(s.labels)
            kwh_price = prices.kwh_price(s.labels) or 0.0
            energy = s.steps.get("energy") or [0.0] * len(steps)
            scale = SCALE["energy"] * kwh_price
            steps = [a * price + e * scale for a, e in zip(steps, energy)]
        row = values[target]
        for b, value in zip(step_bins, steps):
            row[b] += value
    if unallocated is not None and any(round(v, DIGITS) for v in unallocated):
        row = values[UNALLOCATED_GROUP] = [0.0] * nbins
        for b, value in zip(step_bins, unallocated):
            row[b] += value
    return {"unit": "cost" if prices is not None else "gpu_hours_allocated",
            "bins": [iso((grid.start_ms + i * bin_ms) / 1000) for i in range(nbins)],
            "bin_seconds": bin_ms // 1000,
            "groups": {name: [round(v, DIGITS) + 0.0 for v in vals] for name, vals in values.items()}}
