"""Carbon per group: each step's energy times the grid's carbon intensity in that step.

gCO2e of a group = sum over steps of (the group's kWh in the step) x PUE x (gCO2e per kWh
in the step). The intensity is a constant from the prices file (one figure, or one per
value of a label such as ``region`` or ``node_pool``) or, with ``--carbon-intensity-query``,
a Prometheus series averaged over each step (what an Electricity Maps or WattTime exporter
publishes), so a team that computes at night on a windy grid is credited for it, which a
monthly average would not do. Energy is what the agent measures: the GPU boards' (the
workloads' shares of each GPU's energy counter), not the host, cooling or the facility,
unless the prices file gives a PUE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from exporter.report.compute import SCALE, Grid, SeriesTotals
from exporter.report.prices import Carbon
from exporter.report.prom import all_of


@dataclass
class Intensity:
    """gCO2e per kWh per step: from the query (per value of ``carbon.label``, or one series
    under ``""``), else the prices file's constant."""

    carbon: Carbon | None
    series: dict[str, list[float | None]] = field(default_factory=dict)

    @property
    def pue(self) -> float:
        return self.carbon.pue if self.carbon is not None else 1.0

    def at(self, labels: Mapping[str, str], k: int) -> float | None:
        """The intensity for a row with these labels in step ``k`` (0-based)."""
        label = self.carbon.label if self.carbon is not None else None
        row = self.series.get(labels.get(label, "") if label else "") if self.series else None
        if row is None and self.series and "" in self.series:
            row = self.series[""]
        if row is not None and row[k] is not None:
            return row[k]
        return self.carbon.gco2e_per_kwh(labels) if self.carbon is not None else None


class IntensityError(ValueError):
    """The intensity query's answer cannot be matched to the series (one line)."""


async def fetch_intensity(prom: Any, grid: Grid, query: str, carbon: Carbon | None) -> Intensity:
    """``query`` averaged over each step of ``grid`` (a subquery at Prometheus' default resolution)."""
    bounds = grid.bounds
    n = grid.regular
    g = grid.step_ms
    steps = len(bounds) - 1
    tail = bounds[-1] - bounds[n] if steps > n else 0
    asked = []
    if n >= 1:
        asked.append(prom.query_range(f"avg_over_time(({query})[{g}ms:])", bounds[1] / 1000, bounds[n] / 1000,
                                      g / 1000))
    if tail:
        asked.append(prom.query(f"avg_over_time(({query})[{tail}ms:])", bounds[-1] / 1000, expect="vector"))
    answers = await all_of(*asked)
    label = carbon.label if carbon is not None else None
    index = {b / 1000: k for k, b in enumerate(bounds)}
    out: dict[str, list[float | None]] = {}
    for answer in answers:
        seen: set[str] = set()
        for series in answer:
            key = series["metric"].get(label, "") if label else ""
            if key in seen:
                raise IntensityError(
                    f"--carbon-intensity-query returned several series{f' with the same {label}' if label else ''}; "
                    "aggregate it to one per region, e.g. avg by (region) (...), and name that label in the prices "
                    "file (carbon: {label: region})")
            seen.add(key)
            row = out.setdefault(key, [None] * steps)
            if "values" in series:
                for ts, v in series["values"]:
                    k = index.get(ts)
                    if k:
                        row[k - 1] = float(v)
            else:
                row[-1] = float(series["value"][1])
    return Intensity(carbon, out)


def grams(rows: Sequence[tuple[str, SeriesTotals]], intensity: Intensity) -> tuple[dict[str, float], float]:
    """gCO2e per group from rows with per-step energy (joules), and the kWh no intensity covered."""
    out: dict[str, float] = {}
    uncovered = 0.0
    for name, row in rows:
        energy = row.steps.get("energy")
        if not energy:
            continue
        total = out.setdefault(name, 0.0)
        for k, joules in enumerate(energy):
            if not joules:
                continue
            kwh = joules * SCALE["energy"] * intensity.pue
            rate = intensity.at(row.labels, k)
            if rate is None:
                uncovered += kwh
            else:
                total += kwh * rate
        out[name] = total
    return out, uncovered
