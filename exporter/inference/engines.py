"""The engine mapping: which series of each inference engine's /metrics hold its tokens,
KV cache, preemptions and queues (``engines.yaml`` in this package, plus a user's file).

Every field is a series selector (``name`` or ``name{label="value", ...}``), or a list of
them: alternatives, the first one a pod exposes wins. Selectors, not free PromQL, because
the report reads the counters sample by sample (reset-aware, as it reads the GPU
counters) and the rules take ``rate()`` of them; both need a series, not an expression.

Every mistake is an `EnginesError` with one line naming the file and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import yaml

DEFAULTS = "engines.yaml"
COUNTERS = ("prompt_tokens", "generated_tokens", "preemptions")
GAUGES = ("kv_cache_usage", "requests_running", "requests_waiting")
REQUIRED = ("prompt_tokens", "generated_tokens")
FIELDS = ("model_label",) + COUNTERS + GAUGES
ENGINE_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$')


class EnginesError(ValueError):
    """A mistake in an engines file (one line)."""


@dataclass(frozen=True)
class Selector:
    """A series selector: a metric name and label matchers (each as PromQL writes it)."""

    name: str
    matchers: tuple[str, ...] = ()

    def text(self, *extra: str) -> str:
        """The selector in PromQL, with ``extra`` matchers (``'pod!=""'``) added."""
        matchers = [m for m in (*self.matchers, *extra) if m]
        return f"{self.name}{{{', '.join(matchers)}}}" if matchers else self.name

    def __str__(self) -> str:
        return self.text()


def parse_selector(text: str) -> Selector:
    """``name`` or ``name{label="value", label=~"regex", ...}``; ValueError says what is wrong."""
    text = text.strip()
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        # it is written into rule files and queries: one line, no terminal or YAML control
        raise ValueError(f"{text!r}: a selector is one line without control characters")
    brace = text.find("{")
    name = text if brace < 0 else text[:brace].strip()
    if not METRIC_NAME.match(name):
        raise ValueError(f"{text!r} is not a series selector (a metric name, then optional "
                         '{label="value", ...})')
    if brace < 0:
        return Selector(name)
    if not text.endswith("}"):
        raise ValueError(f"{text!r}: the label matchers must end with }}")
    body = text[brace + 1:-1]
    matchers = []
    for part in _split_matchers(body):
        match = MATCHER.match(part)
        if not match:
            raise ValueError(f'{text!r}: {part.strip()!r} is not a label matcher (label="value", !=, =~ or !~)')
        label, op, value = match.groups()
        matchers.append(f'{label}{op}"{value}"')
    return Selector(name, tuple(matchers))


def _split_matchers(body: str) -> list[str]:
    """Split ``a="x,y", b!="z"`` at the commas outside the quotes."""
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for c in body:
        if escaped:
            escaped = False
        elif c == "\\" and quoted:
            escaped = True
        elif c == '"':
            quoted = not quoted
        elif c == "," and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(c)
    if quoted:
        raise ValueError(f"{{{body}}}: a quoted value is not closed")
    parts.append("".join(current))
    return [p for p in parts if p.strip()]  # PromQL allows a trailing comma


@dataclass(frozen=True)
class Engine:
    """One engine: per field the selectors that may hold it (alternatives, in order)."""

    name: str
    model_label: str
    series: Mapping[str, tuple[Selector, ...]]

    def selectors(self, field: str) -> tuple[Selector, ...]:
        return self.series.get(field, ())


def _where(source: str, path: str) -> str:
    return f"{source}: {path}" if path else source


def _engine(source: str, name: str, raw: Mapping[str, Any]) -> Engine:
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise EnginesError(f"{_where(source, f'engines.{name}')}: unknown key {unknown[0]!r} "
                           f"(expected one of: {', '.join(FIELDS)})")
    model_label = raw.get("model_label")
    if model_label is None:
        raise EnginesError(f"{_where(source, f'engines.{name}.model_label')}: required: the label naming the "
                           'served model, or "" where the engine writes none')
    if not isinstance(model_label, str) or (model_label and not LABEL_NAME.match(model_label)):
        raise EnginesError(f"{_where(source, f'engines.{name}.model_label')}: {model_label!r} is not a label name")
    series: dict[str, tuple[Selector, ...]] = {}
    for field in COUNTERS + GAUGES:
        value = raw.get(field)
        if value is None:
            if field in REQUIRED:
                raise EnginesError(f"{_where(source, f'engines.{name}.{field}')}: required (a series selector)")
            continue
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(item, str) for item in items):
            raise EnginesError(f"{_where(source, f'engines.{name}.{field}')}: expected a series selector or a "
                               f"list of them, got {value!r}")
        parsed = []
        for i, item in enumerate(items):
            at = f"engines.{name}.{field}" + (f"[{i}]" if isinstance(value, list) else "")
            try:
                parsed.append(parse_selector(item))
            except ValueError as exc:
                raise EnginesError(f"{_where(source, at)}: {exc}") from None
        series[field] = tuple(parsed)
    return Engine(name, model_label, series)


def _read(path: str | Path | None) -> tuple[str, Any]:
    if path is None:
        text = resources.files("exporter.inference").joinpath(DEFAULTS).read_text(encoding="utf-8")
        source = "engines.yaml (built in)"
    else:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise EnginesError(f"{source}: cannot read: {exc.strerror or exc}") from None
    try:
        return source, yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        raise EnginesError(f"{source}: not valid YAML{line}") from None


def _entries(source: str, doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict) or set(doc) - {"engines"}:
        extra = sorted(set(doc) - {"engines"}) if isinstance(doc, dict) else []
        what = f"unknown key {extra[0]!r} (expected: engines)" if extra else "expected a mapping with engines"
        raise EnginesError(f"{source}: {what}")
    engines = doc.get("engines")
    if not isinstance(engines, dict):
        raise EnginesError(f"{source}: engines: expected a mapping of engine name to its series")
    for name, raw in engines.items():
        if not isinstance(name, str) or not ENGINE_NAME.match(name):
            raise EnginesError(f"{source}: engines: {name!r} is not an engine name (lower case letters, digits, "
                               "- and _)")
        if raw is not None and not isinstance(raw, dict):
            raise EnginesError(f"{source}: engines.{name}: expected a mapping of field to series selector, "
                               "or null to remove the engine")
    return engines


def load_engines(path: str | Path | None = None) -> tuple[Engine, ...]:
    """The built-in engines, with those of the file at ``path`` added or overriding them.

    The user's file is merged field by field: an engine named there takes each field it
    sets (null removes the field), keeps the others; ``name: null`` removes the engine.
    Engines keep the built-in order, new ones follow in the file's order.
    """
    source, doc = _read(None)
    merged: dict[str, dict[str, Any]] = {name: dict(raw) for name, raw in _entries(source, doc).items()}
    if path is not None:
        source, doc = _read(path)
        for name, raw in _entries(source, doc).items():
            if raw is None:
                merged.pop(name, None)
                continue
            entry = merged.setdefault(name, {})
            for key, value in raw.items():
                if value is None:
                    entry.pop(key, None)
                else:
                    entry[key] = value
    if not merged:
        raise EnginesError(f"{source}: no engine left")
    return tuple(_engine(source, name, raw) for name, raw in merged.items())
