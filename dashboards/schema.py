"""Checks a dashboard's JSON against the schema grafana-foundation-sdk ships (its models are
generated from Grafana's own schemas), so that what Grafana would not understand fails here,
not at import:

* a field Grafana does not know (in the dashboard, a panel, its options, field config, a
  field override or a query): read into the SDK's models and written back, it is gone;
* a panel type Grafana has no plugin for (one it dropped, such as the old `graph`);
* a unit id Grafana does not have (custom units, `suffix:tok/s` and the like, allowed).
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import units

plugins.register_default_plugins()

# Every unit id Grafana's unit picker has (the constants of the SDK's units module).
UNITS = frozenset(value for name, value in vars(units).items() if not name.startswith("_") and isinstance(value, str))
# Custom units Grafana formats by their prefix (grafana-data's valueFormats getValueFormat).
CUSTOM_UNIT_PREFIXES = ("suffix:", "prefix:", "time:", "si:", "count:", "currency:")


def problems(doc: dict[str, Any]) -> list[str]:
    """Everything in `doc` (a dashboard as JSON) that Grafana's schema does not have, one line each."""
    found = [f"unknown field {path}" for path in _lost(doc, _round_trip(doc), "")]
    for where, panel in _panels(doc):
        kind = panel.get("type", "")
        if kind != "row" and runtime.panelcfg_config(kind) is None:
            found.append(f"{where}: panel type {kind!r} is not one Grafana has")
        found.extend(f"{where}: {line}" for line in _field_config_problems(panel))
    return found


def _round_trip(doc: dict[str, Any]) -> Any:
    built = model.Dashboard.from_json(doc)
    return json.loads(json.dumps(built, cls=JSONEncoder))


def _lost(before: Any, after: Any, path: str) -> Iterator[str]:
    """Paths in `before` that are missing from `after` (what the schema dropped). What the
    models add (their defaults) is no problem; what they drop is a field they do not know."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key, value in before.items():
            if key not in after:
                yield f"{path}.{key}".lstrip(".")
            else:
                yield from _lost(value, after[key], f"{path}.{key}")
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for index, (item, again) in enumerate(zip(before, after)):
            yield from _lost(item, again, f"{path}[{index}]")


def _panels(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for index, panel in enumerate(doc.get("panels", [])):
        yield f"panels[{index}] {panel.get('title', '')!r}", panel
        for inner, nested in enumerate(panel.get("panels", [])):
            yield f"panels[{index}].panels[{inner}] {nested.get('title', '')!r}", nested


def _unit_problem(unit: Any) -> str | None:
    if isinstance(unit, str) and (unit in UNITS or unit.startswith(CUSTOM_UNIT_PREFIXES)):
        return None
    return f"unit {unit!r} is not a Grafana unit id"


def _field_config_problems(panel: dict[str, Any]) -> Iterator[str]:
    """Units of the defaults and overrides, and override properties the panel's field config
    does not have (an override's `custom.lineStyle` is checked as `defaults.custom.lineStyle`)."""
    field_config = panel.get("fieldConfig", {})
    if "unit" in field_config.get("defaults", {}):
        problem = _unit_problem(field_config["defaults"]["unit"])
        if problem:
            yield f"fieldConfig.defaults: {problem}"
    for index, override in enumerate(field_config.get("overrides", [])):
        where = f"fieldConfig.overrides[{index}]"
        for prop in override.get("properties", []):
            if prop.get("id") == "unit":
                problem = _unit_problem(prop.get("value"))
                if problem:
                    yield f"{where}: {problem}"
            defaults: dict[str, Any] = {}
            *parents, leaf = str(prop.get("id", "")).split(".")
            node = defaults
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = prop.get("value")
            probe = {"type": panel.get("type", ""), "fieldConfig": {"defaults": defaults, "overrides": []}}
            after = json.loads(json.dumps(model.Panel.from_json(probe), cls=JSONEncoder))
            for path in _lost(probe["fieldConfig"]["defaults"], after.get("fieldConfig", {}).get("defaults", {}), ""):
                yield f"{where}: unknown property {prop.get('id')!r} ({path})"
