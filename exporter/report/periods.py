"""START and END of a report: dates, timestamps and times relative to now.

Accepted forms (times without a zone are UTC):

- ``2026-11-01`` (midnight UTC), ``2026-11-01T08:30``, ``2026-11-01 08:30:00``,
  ``2026-11-01T08:30:00Z``, ``2026-11-01T08:30:00+01:00``;
- a Unix timestamp in seconds, ``1793491200``;
- ``now``; ``30d``, ``12h``, ``2w``, ``1d12h``, ``90m`` (that long before now; also
  written ``now-30d``), with Prometheus' units ms, s, m, h, d, w, y (365 days).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "y": 365 * 86400.0}
_RELATIVE = re.compile(r"^(?:now\s*-\s*)?((?:\d+(?:ms|s|m|h|d|w|y))+)$")
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$")


def parse_prometheus_duration(text: str) -> float:
    """A duration in Prometheus' grammar (``1d12h``, ``30m``: whole numbers with the units
    ms, s, m, h, d, w, y; no bare numbers) in seconds, for ``l9gpu report``. (The agent's
    flags take `exporter.core.parsing.parse_duration_or_seconds`'s grammar.)"""
    value = text.strip()
    match = _RELATIVE.match(value)
    if not match or value.startswith("now"):
        raise ValueError(f"invalid duration {text!r}; use e.g. 1h, 6h, 1d")
    return sum(int(n) * _UNITS[u] for n, u in _PART.findall(match.group(1)))


def parse_time(text: str, now: float) -> float:
    """Seconds since the epoch for one of the accepted forms (see the module docstring)."""
    value = text.strip()
    if value == "now":
        return now
    match = _RELATIVE.match(value)
    if match:
        return now - sum(int(n) * _UNITS[u] for n, u in _PART.findall(match.group(1)))
    if re.fullmatch(r"\d{9,11}(\.\d+)?", value):
        return float(value)
    if _ISO.match(value):
        iso = value.replace(" ", "T")
        if iso.endswith("Z"):
            iso = iso[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(iso)
        except ValueError:
            pass
        else:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=timezone.utc)
            return moment.timestamp()
    raise ValueError(f"invalid time {text!r}; use a date (2026-11-01), a date and time "
                     "(2026-11-01T08:00Z), a Unix timestamp, now, or a time before now (30d, 12h)")


def parse_period(start: str, end: str, now: float) -> tuple[float, float]:
    """START and END as epoch seconds; END must come after START and not after now."""
    try:
        t0 = parse_time(start, now)
    except ValueError as exc:
        raise ValueError(f"--from: {exc}") from None
    try:
        t1 = parse_time(end, now)
    except ValueError as exc:
        raise ValueError(f"--to: {exc}") from None
    if t1 <= t0:
        raise ValueError(f"--to ({iso(t1)}) must be after --from ({iso(t0)})")
    if t1 > now + 60:
        raise ValueError(f"--to ({iso(t1)}) is in the future; the report covers what has happened")
    return t0, t1


def iso(t: float) -> str:
    """UTC ISO 8601 with a Z, seconds precision (milliseconds when there are any)."""
    moment = datetime.fromtimestamp(t, timezone.utc)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += f".{moment.microsecond // 1000:03d}"
    return text + "Z"
