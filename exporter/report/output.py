"""The report as CSV, JSON or one self-contained HTML page (inline SVG chart, no network).

Group and workload names come from labels the workloads' owners choose (namespaces, pod
labels, Slurm accounts): each format escapes them for where it is opened (see
`exporter.core.escape`): CSV text cells are quoted and never start a formula, JSON is strict
(NaN and infinities as null), HTML is autoescaped.
"""

from __future__ import annotations

import csv
import io
import math
from importlib import resources
from typing import Any

from exporter.core.escape import for_spreadsheet, json_for_terminal, strict_json
from exporter.report.summary import CARBON, FIGURES, MODEL_BY, MODEL_FIGURES, UNALLOCATED_GROUP

CSV_COLUMNS = ("group",) + FIGURES + ("waste_ratio", "workloads", "top_waste", CARBON)
# --by model: the served model's tokens, costs per million tokens and idle replicas follow
MODEL_CSV_COLUMNS = CSV_COLUMNS + MODEL_FIGURES
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def to_json(report: dict[str, Any]) -> str:
    """The report as strict JSON: a figure that is NaN or infinite is written as null.
    Names keep their letters (UTF-8), with every control character escaped, so the JSON
    printed to a terminal cannot drive it."""
    return json_for_terminal(strict_json(report, indent=2, ensure_ascii=False)) + "\n"


def _figure(value: float | None) -> float | str:
    """A figure's CSV cell: the number (written unquoted, as Python's repr), or empty
    where there is none (no prices) or it is not finite."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return value


def reconciliation_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The lines under the groups that make the bill add up: ``(unallocated)`` (GPU time
    nobody held), ``(price overrides)`` (where overrides changed what groups pay) and
    ``(capacity)``, what the GPUs offered and cost in the period. The groups' and the first
    two lines' allocated GPU-hours and allocated cost sum to the ``(capacity)`` line. Then,
    outside that sum, one ``(unhealthy: MODEL)`` line per GPU model whose GPUs had an
    unhealthy verdict: the part of the capacity a team claims back from its provider."""
    totals = report.get("totals") or {}
    if totals.get("gpu_hours_capacity") is None:
        return []
    rows = [{"group": UNALLOCATED_GROUP, "gpu_hours_allocated": totals["gpu_hours_unallocated"],
             "allocated_cost": totals["unallocated_cost"], "total_cost": totals["unallocated_cost"]}]
    if totals.get("price_overrides_cost"):
        rows.append({"group": "(price overrides)", "gpu_hours_allocated": 0.0,
                     "allocated_cost": totals["price_overrides_cost"], "total_cost": totals["price_overrides_cost"]})
    rows.append({"group": "(capacity)", "gpu_hours_allocated": totals["gpu_hours_capacity"],
                 "allocated_cost": totals["capacity_cost"], "total_cost": totals["capacity_cost"]})
    # Outside the sum: of the capacity, what was unhealthy (what to claim back), per GPU model.
    for model, hours in sorted((totals.get("gpu_hours_unhealthy_by_model") or {}).items()):
        if hours:
            rows.append({"group": f"(unhealthy: {model})", "gpu_hours_allocated": hours})
    return rows


def to_csv(report: dict[str, Any]) -> str:
    """One row per group, then the reconciliation lines; costs empty without a prices file;
    the top wasters in one cell.

    Safe to open in a spreadsheet: the text cells (``group``, ``top_waste``) are always
    quoted, so a comma, semicolon, CR or LF inside a name stays inside its cell, and one
    that starts with ``= + - @``, TAB or CR gets a leading ``'`` (`escape.for_spreadsheet`).
    Figures are numbers, written unquoted and unchanged (a negative one keeps its ``-``).
    """
    buf = io.StringIO()
    by_model = report.get("by") == MODEL_BY
    extra = MODEL_FIGURES if by_model else ()
    csv.writer(buf, lineterminator="\n").writerow(MODEL_CSV_COLUMNS if by_model else CSV_COLUMNS)
    # QUOTE_NONNUMERIC quotes every str (the names, and the empty cells) and writes the
    # figures, which are int or float here, bare.
    writer = csv.writer(buf, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    for g in report["groups"]:
        top = "; ".join(f"{w['workload']}={w['waste_gpu_hours']:g}h" for w in g["top_waste"])
        writer.writerow([for_spreadsheet(g["group"])] + [_figure(g.get(k)) for k in FIGURES]
                        + [_figure(g["waste_ratio"]), g["workloads"], for_spreadsheet(top), _figure(g.get(CARBON))]
                        + [_figure(g[k]) for k in extra])
    for row in reconciliation_rows(report):
        writer.writerow([row["group"]] + [_figure(row.get(k)) for k in FIGURES] + ["", "", "", ""] + [""] * len(extra))
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




def to_html(report: dict[str, Any]) -> str:
    """One HTML file: totals, an explanation of waste, an inline SVG chart and the table."""
    try:
        import jinja2
    except ImportError:
        raise RuntimeError("the HTML report needs jinja2: pip install '.[report]' in l9gpu's checkout") from None
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    currency = report["currency"] or ""

    def money(value: float | None) -> str:
        return _fmt(value) + (f" {currency}" if currency and value is not None else "")

    def pct(value: float | None) -> str:
        return "—" if value is None else f"{value * 100:.1f}%"

    def duration(seconds: int) -> str:
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if seconds % size == 0:
                return f"{seconds // size} {unit}"
        return f"{seconds} s"

    has_costs = report["totals"]["allocated_cost"] is not None
    template = resources.files("exporter.report").joinpath("report.html.j2").read_text(encoding="utf-8")
    return env.from_string(template).render(**report, fmt=_fmt, money=money, pct=pct, duration=duration,
                                            has_costs=has_costs, chart=svg_chart(report),
                                            by_model=report["by"] == MODEL_BY,
                                            reconciliation=reconciliation_rows(report))


FORMATS = {"csv": to_csv, "json": to_json, "html": to_html}
