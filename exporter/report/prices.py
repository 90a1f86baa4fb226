"""The prices file: what a GPU-hour and a kWh cost, with overrides per team.

    currency: EUR
    gpu_hour:                          # price of one GPU-hour, by the series' `model` label
      NVIDIA H100 80GB HBM3: 2.90
      NVIDIA A100-SXM4-80GB: 1.60
      default: 1.00                    # optional: any model not listed
    kwh: 0.21                          # optional: price of one kWh of GPU energy
    carbon:                            # optional: grid carbon intensity, for gCO2e per group
      gco2e_per_kwh: 350               # one number, or by the value of `label`:
      # gco2e_per_kwh: {eu-west-1: 210, us-east-1: 390, default: 400}
      # label: region                  # the series label that names the region or node pool
      # pue: 1.3                       # optional: facility overhead (else GPU board energy only)
    overrides:                         # optional; the first that matches a series wins
      - match: {namespace: ml-research}          # reserved capacity, paid up front
        gpu_hour: {NVIDIA H100 80GB HBM3: 1.20}  # a mapping by model, or one number for all
      - match: {label_team: search, slurm_account: nlp-lab}
        gpu_hour: 2.0
        kwh: 0.0

``match`` compares series labels exactly (``namespace``, ``label_<key>``,
``slurm_account``, ``slurm_user``, ``node``, ... — every listed label must be equal).
Every mistake is a `PricesError` with one line naming the file and the field.

`recording_rules` turns the file into Prometheus recording rules (constant series
``l9gpu_gpu_hour_price{model}``, ``l9gpu_kwh_price`` and their per-namespace overrides)
that the chargeback rules and the Grafana dashboard multiply with.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TOP_KEYS = ("currency", "gpu_hour", "kwh", "carbon", "overrides")
CARBON_KEYS = ("gco2e_per_kwh", "label", "pue")
OVERRIDE_KEYS = ("match", "gpu_hour", "kwh")


class PricesError(ValueError):
    """A mistake in the prices file, or a series no price applies to (one line)."""


@dataclass(frozen=True)
class Override:
    """Prices for series whose labels equal every pair in ``match``.

    ``gpu_hour`` maps a model to its price; ``gpu_hour_all`` applies to every model not in
    it; either may be absent (None/empty), and then the next rule decides.
    """

    match: tuple[tuple[str, str], ...]
    gpu_hour: Mapping[str, float]
    gpu_hour_all: float | None
    kwh: float | None

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key, "") == value for key, value in self.match)


@dataclass(frozen=True)
class Carbon:
    """Grid carbon intensity (gCO2e per kWh): one figure, or one per value of ``label``
    (``default`` for the values not listed); ``pue`` multiplies the GPUs' energy (1: GPU
    board energy only)."""

    by_value: Mapping[str, float]
    default: float | None
    label: str | None = None
    pue: float = 1.0

    def gco2e_per_kwh(self, labels: Mapping[str, str]) -> float | None:
        """The intensity for a series (or group) with these labels; None when none applies."""
        if self.label is not None:
            value = self.by_value.get(labels.get(self.label, ""))
            if value is not None:
                return value
        return self.default


@dataclass(frozen=True)
class Prices:
    """A validated prices file."""

    currency: str
    gpu_hour: Mapping[str, float]
    default_gpu_hour: float | None
    kwh: float | None
    overrides: tuple[Override, ...]
    source: str = "prices"
    carbon: Carbon | None = None

    def gpu_hour_price(self, labels: Mapping[str, str]) -> float:
        """The price of one GPU-hour for a series with these labels (its `model` among them)."""
        model = labels.get("model", "")
        for rule in self.overrides:
            if rule.matches(labels):
                if model in rule.gpu_hour:
                    return rule.gpu_hour[model]
                if rule.gpu_hour_all is not None:
                    return rule.gpu_hour_all
        if model in self.gpu_hour:
            return self.gpu_hour[model]
        if self.default_gpu_hour is not None:
            return self.default_gpu_hour
        raise PricesError(f"{self.source}: no price for GPU model {model!r} "
                          "(add it under gpu_hour, or set gpu_hour.default)")

    def kwh_price(self, labels: Mapping[str, str]) -> float | None:
        """The price of one kWh for a series with these labels, None when the file sets none."""
        for rule in self.overrides:
            if rule.kwh is not None and rule.matches(labels):
                return rule.kwh
        return self.kwh


def _price(source: str, where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise PricesError(f"{source}: {where}: a price must be a number >= 0, got {value!r}")
    return float(value)


def _gpu_hour(source: str, where: str, value: Any, allow_default: bool) -> tuple[dict[str, float], float | None]:
    """A gpu_hour value: a mapping model -> price (``default`` for the rest), or one number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {}, _price(source, where, value)
    if not isinstance(value, dict) or not value:
        raise PricesError(f"{source}: {where}: expected a mapping of GPU model to price per hour, or one number")
    by_model: dict[str, float] = {}
    default = None
    for model, price in value.items():
        if not isinstance(model, str) or not model:
            raise PricesError(f"{source}: {where}: a GPU model must be a non-empty string, got {model!r}")
        if model == "default" and allow_default:
            default = _price(source, f"{where}.default", price)
        else:
            by_model[model] = _price(source, f"{where}[{model!r}]", price)
    return by_model, default


def _unknown(source: str, where: str, doc: dict[str, Any], allowed: tuple[str, ...]) -> None:
    extra = [str(k) for k in doc if k not in allowed]
    if extra:
        raise PricesError(f"{source}: {where}unknown key {extra[0]!r} (expected one of: {', '.join(allowed)})")


def parse_prices(doc: Any, source: str = "prices") -> Prices:
    """Validate a parsed prices document."""
    if not isinstance(doc, dict):
        raise PricesError(f"{source}: expected a mapping with gpu_hour (and optionally currency, kwh, overrides)")
    _unknown(source, "", doc, TOP_KEYS)
    if "gpu_hour" not in doc:
        raise PricesError(f"{source}: gpu_hour is required (price of one GPU-hour by GPU model)")
    currency = doc.get("currency", "")
    if not isinstance(currency, str) or len(currency) > 8:
        raise PricesError(f"{source}: currency: expected a short string such as EUR or USD, got {currency!r}")
    by_model, default = _gpu_hour(source, "gpu_hour", doc["gpu_hour"], allow_default=True)
    kwh = None if doc.get("kwh") is None else _price(source, "kwh", doc["kwh"])
    overrides_doc = doc.get("overrides") or []
    if not isinstance(overrides_doc, list):
        raise PricesError(f"{source}: overrides: expected a list of {{match: ..., gpu_hour: ..., kwh: ...}}")
    overrides = []
    for i, entry in enumerate(overrides_doc):
        where = f"overrides[{i}]"
        if not isinstance(entry, dict):
            raise PricesError(f"{source}: {where}: expected a mapping with match and gpu_hour and/or kwh")
        _unknown(source, f"{where}: ", entry, OVERRIDE_KEYS)
        match = entry.get("match")
        if not isinstance(match, dict) or not match:
            raise PricesError(f"{source}: {where}.match: expected a mapping of label to value, "
                              "e.g. {namespace: ml-research}")
        pairs = []
        for key, value in match.items():
            if not isinstance(key, str) or not LABEL_NAME.match(key):
                raise PricesError(f"{source}: {where}.match: {key!r} is not a Prometheus label name")
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise PricesError(f"{source}: {where}.match.{key}: expected a string, got {value!r}")
            pairs.append((key, str(value)))
        if "gpu_hour" not in entry and "kwh" not in entry:
            raise PricesError(f"{source}: {where}: set gpu_hour and/or kwh")
        o_models: dict[str, float] = {}
        o_all = None
        if "gpu_hour" in entry:
            o_models, o_all = _gpu_hour(source, f"{where}.gpu_hour", entry["gpu_hour"], allow_default=False)
        o_kwh = None if entry.get("kwh") is None else _price(source, f"{where}.kwh", entry["kwh"])
        overrides.append(Override(tuple(sorted(pairs)), o_models, o_all, o_kwh))
    carbon = _carbon(source, doc["carbon"]) if doc.get("carbon") is not None else None
    return Prices(currency, by_model, default, kwh, tuple(overrides), source, carbon)


def _carbon(source: str, doc: Any) -> Carbon:
    """The ``carbon`` section."""
    if not isinstance(doc, dict):
        raise PricesError(f"{source}: carbon: expected a mapping with gco2e_per_kwh (and optionally label, pue)")
    _unknown(source, "carbon: ", doc, CARBON_KEYS)
    label = doc.get("label")
    if label is not None and (not isinstance(label, str) or not LABEL_NAME.match(label)):
        raise PricesError(f"{source}: carbon.label: {label!r} is not a Prometheus label name")
    pue = 1.0
    if doc.get("pue") is not None:
        pue = _price(source, "carbon.pue", doc["pue"])
        if pue < 1:
            raise PricesError(f"{source}: carbon.pue: a PUE is 1 or more (facility energy over IT energy), "
                              f"got {doc['pue']!r}")
    value = doc.get("gco2e_per_kwh")
    if isinstance(value, dict):
        if label is None:
            raise PricesError(f"{source}: carbon.gco2e_per_kwh by region needs carbon.label: the series label "
                              "that names the region or node pool, e.g. region")
        by_value = {str(k): _price(source, f"carbon.gco2e_per_kwh[{k!r}]", v) for k, v in value.items()
                    if k != "default"}
        default = None if value.get("default") is None else _price(source, "carbon.gco2e_per_kwh.default",
                                                                    value["default"])
        return Carbon(by_value, default, label, pue)
    if value is None:
        if label is None:
            raise PricesError(f"{source}: carbon: set gco2e_per_kwh (grams of CO2e per kWh of the grid)")
        return Carbon({}, None, label, pue)  # intensities from --carbon-intensity-query
    return Carbon({}, _price(source, "carbon.gco2e_per_kwh", value), label, pue)


def load_prices(path: str | Path) -> Prices:
    """Read and validate a prices file; every problem is one `PricesError` line."""
    name = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PricesError(f"{name}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise PricesError(f"{name}: not valid YAML{where}: {problem}") from None
    return parse_prices(doc, name)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def recording_rules(prices: Prices) -> str:
    """A Prometheus rule file with the prices as constant series.

    ``l9gpu_gpu_hour_price{model}``, ``l9gpu_default_gpu_hour_price``, ``l9gpu_kwh_price``,
    ``l9gpu_carbon_gco2e_per_kwh`` (the default intensity times the PUE);
    overrides that match on ``namespace`` alone become ``l9gpu_namespace_gpu_hour_price
    {namespace, model}``, ``l9gpu_namespace_default_gpu_hour_price{namespace}`` and
    ``l9gpu_namespace_kwh_price{namespace}``. Other overrides (pod labels, Slurm accounts)
    apply in ``l9gpu report`` only; the file lists them in a comment.
    """
    lines = [
        "# Prices for the l9gpu chargeback rules and dashboard, generated by `l9gpu prices`",
        f"# from {prices.source}. Load it beside l9gpu.rules.yaml (rule_files).",
    ]
    rules: list[tuple[str, float, dict[str, str]]] = []
    for model, price in sorted(prices.gpu_hour.items()):
        rules.append(("l9gpu_gpu_hour_price", price, {"model": model}))
    if prices.default_gpu_hour is not None:
        rules.append(("l9gpu_default_gpu_hour_price", prices.default_gpu_hour, {}))
    if prices.kwh is not None:
        rules.append(("l9gpu_kwh_price", prices.kwh, {}))
    carbon = prices.carbon
    if carbon is not None and carbon.default is not None:  # the PUE included: gCO2e per kWh the GPUs draw
        rules.append(("l9gpu_carbon_gco2e_per_kwh", carbon.default * carbon.pue, {}))
    seen: set[tuple[str, str]] = set()  # the first override wins, as in the report
    skipped = []
    for rule in prices.overrides:
        keys = [key for key, _ in rule.match]
        if keys != ["namespace"]:
            skipped.append(", ".join(f"{k}={v}" for k, v in rule.match))
            continue
        namespace = rule.match[0][1]
        for model, price in sorted(rule.gpu_hour.items()):
            if ("gpu", namespace + "\0" + model) not in seen:
                seen.add(("gpu", namespace + "\0" + model))
                rules.append(("l9gpu_namespace_gpu_hour_price", price, {"namespace": namespace, "model": model}))
        if rule.gpu_hour_all is not None and ("all", namespace) not in seen:
            seen.add(("all", namespace))
            rules.append(("l9gpu_namespace_default_gpu_hour_price", rule.gpu_hour_all, {"namespace": namespace}))
        if rule.kwh is not None and ("kwh", namespace) not in seen:
            seen.add(("kwh", namespace))
            rules.append(("l9gpu_namespace_kwh_price", rule.kwh, {"namespace": namespace}))
    if carbon is not None and carbon.by_value:
        lines.append(f"# Carbon intensities per {carbon.label} apply in `l9gpu report` only "
                     "(Prometheus gets the default):")
        lines += [f"#   {value}: {rate:g} gCO2e/kWh" for value, rate in sorted(carbon.by_value.items())]
    if skipped:
        lines.append("# Overrides that apply in `l9gpu report` only (Prometheus gets namespace overrides):")
        lines += [f"#   {text}" for text in skipped]
    if prices.currency:
        lines.append(f"# Currency: {prices.currency}")
    lines += ["groups:", "  - name: l9gpu-prices", "    rules:"]
    for name, value, labels in rules:
        lines.append(f"      - record: {name}")
        lines.append(f"        expr: vector({value!r})")
        if labels:
            inner = ", ".join(f"{k}: {_quote(v)}" for k, v in labels.items())
            lines.append(f"        labels: {{{inner}}}")
    return "\n".join(lines) + "\n"
