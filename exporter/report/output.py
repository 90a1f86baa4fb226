"""The report as CSV, JSON or one self-contained HTML page (inline SVG chart, no network)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from exporter.report.summary import FIGURES

CSV_COLUMNS = ("group",) + FIGURES + ("waste_ratio", "workloads", "top_waste")
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


def to_csv(report: dict[str, Any]) -> str:
    """One row per group; costs empty without a prices file; the top wasters in one cell."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for g in report["groups"]:
        top = "; ".join(f"{w['workload']}={w['waste_gpu_hours']:g}h" for w in g["top_waste"])
        writer.writerow([g["group"]] + ["" if g[k] is None else repr(g[k]) for k in FIGURES]
                        + ["" if g["waste_ratio"] is None else repr(g["waste_ratio"]), g["workloads"], top])
    return buf.getvalue()


def _fmt(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _nice(top: float) -> float:
    """A round axis maximum at or above ``top``."""
    if top <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(top))) / 10
    for factor in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if factor * magnitude >= top:
            return factor * magnitude
    return 10 * magnitude


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def svg_chart(report: dict[str, Any]) -> str:
    """Stacked bars: cost (or allocated GPU-hours) per group per day, with axes and a legend."""
    timeline = report["timeline"]
    bins, groups = timeline["bins"], timeline["groups"]
    unit = (report["currency"] or "cost") if timeline["unit"] == "cost" else "GPU-hours allocated"
    width, height, left, right, top, bottom = 960, 340, 70, 20, 20, 60
    plot_w, plot_h = width - left - right, height - top - bottom
    stacks = [sum(values[i] for values in groups.values()) for i in range(len(bins))]
    ymax = _nice(max(stacks, default=0.0))
    bar_w = plot_w / max(1, len(bins))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height + 24 * ((len(groups) + 3) // 4)}" '
             f'role="img" aria-label="{_escape(unit)} per group over the period" class="chart">']
    for i in range(5):
        value = ymax * i / 4
        y = top + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(value, 0 if ymax >= 10 else 2)}'
                     '</text>')
    parts.append(f'<text x="14" y="{top + plot_h / 2:.0f}" transform="rotate(-90 14 {top + plot_h / 2:.0f})" '
                 f'text-anchor="middle">{_escape(unit)}</text>')
    label_every = max(1, len(bins) // 10)
    for i, start in enumerate(bins):
        x = left + i * bar_w
        base = 0.0
        for j, (name, values) in enumerate(groups.items()):
            v = values[i]
            if v <= 0:
                continue
            h = plot_h * v / ymax
            y = top + plot_h - plot_h * (base + v) / ymax
            parts.append(f'<rect x="{x + bar_w * 0.1:.1f}" y="{y:.1f}" width="{bar_w * 0.8:.1f}" height="{h:.1f}" '
                         f'fill="{PALETTE[j % len(PALETTE)]}"><title>{_escape(name)} {start[:10]}: '
                         f'{_fmt(v)}</title></rect>')
            base += v
        if i % label_every == 0:
            label = start[5:10] if timeline["bin_seconds"] >= 86400 else start[5:16].replace("T", " ")
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{label}</text>')
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{top + plot_h}" y2="{top + plot_h}" class="axis"/>')
    for j, name in enumerate(groups):
        x = left + (j % 4) * 220
        y = height - 10 + 24 * (j // 4)
        parts.append(f'<rect x="{x}" y="{y - 11}" width="12" height="12" fill="{PALETTE[j % len(PALETTE)]}"/>'
                     f'<text x="{x + 18}" y="{y}">{_escape(name[:30])}</text>')
    parts.append("</svg>")
    return "".join(parts)


TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>GPU chargeback {{ period.from[:10] }} to {{ period.to[:10] }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto; max-width: 1200px;
       color: #1d2330; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
.sub { color: #5a6272; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8rem; }
.card { border: 1px solid #d8dce3; border-radius: 8px; padding: 0.7rem 1rem; min-width: 150px; background: #f7f8fa; }
.card .label { font-size: 0.8rem; color: #5a6272; } .card .value { font-size: 1.45rem; font-weight: 600; }
.card.main { background: #eaf1fb; border-color: #9db8e0; }
.card .note { font-size: 0.75rem; color: #5a6272; }
.explain { background: #fffbea; border: 1px solid #eedc82; border-radius: 8px; padding: 0.6rem 1rem; font-size: 0.9rem; }
table { border-collapse: collapse; width: 100%; font-size: 0.85rem; }
th, td { border-bottom: 1px solid #e3e6ec; padding: 0.35rem 0.5rem; text-align: right; vertical-align: top; }
th { background: #f0f2f5; position: sticky; top: 0; } td.name, th.name, td.top { text-align: left; }
td.top { font-size: 0.78rem; color: #3c4452; }
tr.total td { font-weight: 600; border-top: 2px solid #9aa3b2; }
svg.chart { width: 100%; height: auto; font-size: 11px; fill: #3c4452; }
svg.chart .grid { stroke: #e3e6ec; } svg.chart .axis { stroke: #7a8394; }
footer { margin-top: 2rem; font-size: 0.75rem; color: #7a8394; }
</style>
</head>
<body>
<h1>GPU chargeback</h1>
<p class="sub">{{ period.from }} to {{ period.to }} ({{ fmt(period.hours, 1) }} hours), grouped by
<b>{{ by }}</b>{% if currency %}, prices in {{ currency }}{% endif %}.</p>

<h2>Totals</h2>
<div class="cards" id="totals">
{% if has_costs %}
  <div class="card main" data-figure="total_cost" data-value="{{ totals.total_cost }}"><div class="label">Total charge</div>
    <div class="value">{{ money(totals.total_cost) }}</div><div class="note">allocated GPU time{% if totals.energy_cost is not none %} + energy{% endif %}</div></div>
  <div class="card" data-figure="allocated_cost" data-value="{{ totals.allocated_cost }}"><div class="label">Allocated cost</div>
    <div class="value">{{ money(totals.allocated_cost) }}</div><div class="note">GPU-hours held x price</div></div>
  <div class="card" data-figure="effective_cost" data-value="{{ totals.effective_cost }}"><div class="label">Effective cost</div>
    <div class="value">{{ money(totals.effective_cost) }}</div><div class="note">GPU-hours computing x price</div></div>
  <div class="card" data-figure="waste_cost" data-value="{{ totals.waste_cost }}"><div class="label">Waste</div>
    <div class="value">{{ money(totals.waste_cost) }}</div><div class="note">{{ pct(totals.waste_ratio) }} of allocated time</div></div>
{% if totals.energy_cost is not none %}
  <div class="card" data-figure="energy_cost" data-value="{{ totals.energy_cost }}"><div class="label">Energy cost</div>
    <div class="value">{{ money(totals.energy_cost) }}</div></div>
{% endif %}
{% endif %}
  <div class="card" data-figure="gpu_hours_allocated" data-value="{{ totals.gpu_hours_allocated }}"><div class="label">GPU-hours allocated</div>
    <div class="value">{{ fmt(totals.gpu_hours_allocated) }}</div></div>
  <div class="card" data-figure="gpu_hours_used" data-value="{{ totals.gpu_hours_used }}"><div class="label">GPU-hours used</div>
    <div class="value">{{ fmt(totals.gpu_hours_used) }}</div></div>
  <div class="card" data-figure="waste_gpu_hours" data-value="{{ totals.waste_gpu_hours }}"><div class="label">GPU-hours wasted</div>
    <div class="value">{{ fmt(totals.waste_gpu_hours) }}</div></div>
  <div class="card" data-figure="zombie_hours" data-value="{{ totals.zombie_hours }}"><div class="label">Idle holding (zombie) hours</div>
    <div class="value">{{ fmt(totals.zombie_hours) }}</div></div>
  <div class="card" data-figure="energy_kwh" data-value="{{ totals.energy_kwh }}"><div class="label">Energy</div>
    <div class="value">{{ fmt(totals.energy_kwh) }} kWh</div></div>
</div>

<h2>What the figures mean</h2>
<div class="explain">
<p><b>A GPU-hour</b> is one GPU for one hour. <b>Allocated</b> hours count the time a team's workloads held a GPU
(it was assigned to them, or they kept data in its memory), whether they used it or not: nobody else could.
<b>Used</b> hours count only the time the GPU actually computed for them (two jobs sharing a GPU half and half
each use half of it).</p>
<p><b>Waste</b> is allocated minus used: GPU time paid for but not computed with.
<b>Zombie hours</b> are the plainest waste: time a workload held a GPU while running nothing on it at all,
such as a notebook left open over the weekend. <b>Allocated cost</b> is what the held GPUs cost,
<b>effective cost</b> what the computing cost, and the difference is the cost of waste.
{% if has_costs %}The charge is the allocated cost{% if totals.energy_cost is not none %} plus the energy{% endif %}.{% endif %}</p>
</div>

<h2>{% if has_costs %}Cost{% else %}Allocated GPU-hours{% endif %} per {{ by }} over the period</h2>
{{ chart | safe }}

<h2>Per {{ by }}</h2>
<table id="groups">
<thead><tr><th class="name">{{ by }}</th>{% if has_costs %}<th>Charge</th><th>Allocated cost</th><th>Effective cost</th>
<th>Waste cost</th>{% if totals.energy_cost is not none %}<th>Energy cost</th>{% endif %}{% endif %}
<th>GPU-h allocated</th><th>GPU-h used</th><th>GPU-h wasted</th><th>Waste %</th><th>Zombie h</th><th>kWh</th>
<th class="name">Top wasting workloads (GPU-h)</th></tr></thead>
<tbody>
{% for g in groups %}
<tr data-group="{{ g.group }}">
<td class="name">{{ g.group }}</td>{% if has_costs %}<td>{{ fmt(g.total_cost) }}</td><td>{{ fmt(g.allocated_cost) }}</td>
<td>{{ fmt(g.effective_cost) }}</td><td>{{ fmt(g.waste_cost) }}</td>{% if totals.energy_cost is not none %}<td>{{ fmt(g.energy_cost) }}</td>{% endif %}{% endif %}
<td>{{ fmt(g.gpu_hours_allocated) }}</td><td>{{ fmt(g.gpu_hours_used) }}</td><td>{{ fmt(g.waste_gpu_hours) }}</td>
<td>{{ pct(g.waste_ratio) }}</td><td>{{ fmt(g.zombie_hours) }}</td><td>{{ fmt(g.energy_kwh) }}</td>
<td class="top">{% for w in g.top_waste %}{{ w.workload }}: {{ fmt(w.waste_gpu_hours) }}{% if not loop.last %}<br>{% endif %}{% endfor %}</td>
</tr>
{% endfor %}
<tr class="total"><td class="name">Total</td>{% if has_costs %}<td>{{ fmt(totals.total_cost) }}</td><td>{{ fmt(totals.allocated_cost) }}</td>
<td>{{ fmt(totals.effective_cost) }}</td><td>{{ fmt(totals.waste_cost) }}</td>{% if totals.energy_cost is not none %}<td>{{ fmt(totals.energy_cost) }}</td>{% endif %}{% endif %}
<td>{{ fmt(totals.gpu_hours_allocated) }}</td><td>{{ fmt(totals.gpu_hours_used) }}</td><td>{{ fmt(totals.waste_gpu_hours) }}</td>
<td>{{ pct(totals.waste_ratio) }}</td><td>{{ fmt(totals.zombie_hours) }}</td><td>{{ fmt(totals.energy_kwh) }}</td><td></td></tr>
</tbody>
</table>

<footer>Generated by l9gpu report from {{ source.prometheus or "Prometheus" }}{% if prices %} with prices from {{ prices }}{% endif %}:
{{ totals.workloads }} workloads, counters read in steps of {{ source.step_seconds }} s ({{ source.queries }} queries).
Counter resets (agent restarts) and workloads that moved between nodes are counted exactly; see docs/CHARGEBACK.md.</footer>
</body>
</html>
"""


def to_html(report: dict[str, Any]) -> str:
    """One HTML file: totals, an explanation of waste, an inline SVG chart and the table."""
    try:
        import jinja2
    except ImportError:
        raise RuntimeError("the HTML report needs jinja2: pip install 'l9gpu[report]'") from None
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    currency = report["currency"] or ""

    def money(value: float | None) -> str:
        return _fmt(value) + (f" {currency}" if currency and value is not None else "")

    def pct(value: float | None) -> str:
        return "—" if value is None else f"{value * 100:.1f}%"

    has_costs = report["totals"]["allocated_cost"] is not None
    return env.from_string(TEMPLATE).render(**report, fmt=_fmt, money=money, pct=pct, has_costs=has_costs,
                                            chart=svg_chart(report))


FORMATS = {"csv": to_csv, "json": to_json, "html": to_html}
