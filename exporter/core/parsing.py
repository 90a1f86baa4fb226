"""Parsers of the values users give in flags, variables and files: durations, listen addresses.

Every parser raises `ValueError` with a message that names what was wrong and what is
accepted; the CLI turns that into one line and exit status 2.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration_or_seconds(text: str) -> float:
    """Parse a duration like ``500ms``, ``2s``, ``1m30s`` or a plain number of seconds (``1.5``).

    The grammar of every agent flag that takes a duration: decimal numbers with the units
    ms, s, m and h, one after another, or a bare number of seconds. (``l9gpu report`` takes
    Prometheus' durations instead: `exporter.report.periods.parse_prometheus_duration`.)

    Returns:
        The duration in seconds.

    Raises:
        ValueError: for an empty, negative or malformed duration.
    """
    value = str(text).strip()
    if not value:
        raise ValueError("empty duration; use e.g. 500ms, 2s, 1m")
    if value.startswith("-"):
        raise ValueError(f"invalid duration {text!r}: a negative duration is not allowed; use e.g. 500ms, 2s, 1m")
    try:
        seconds = float(value)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(value) or pos == 0:
            raise ValueError(f"invalid duration {text!r}; use e.g. 500ms, 2s, 1m") from None
    if seconds != seconds or seconds < 0 or seconds == float("inf"):
        raise ValueError(f"invalid duration {text!r}; must be a finite, non-negative time")
    return seconds


def parse_positive_duration(text: str) -> float:
    """Like `parse_duration_or_seconds`, but zero is rejected too."""
    seconds = parse_duration_or_seconds(text)
    if seconds <= 0:
        raise ValueError(f"invalid duration {text!r}; must be greater than zero")
    return seconds


def parse_listen(text: str) -> tuple[str, int]:
    """Parse ``HOST:PORT``, ``:PORT`` or ``[::1]:PORT`` into (host, port).

    An empty host means all interfaces ("0.0.0.0").
    """
    value = str(text).strip()
    host, sep, port_text = value.rpartition(":")
    if not sep:
        raise ValueError(f"invalid listen address {text!r}; use HOST:PORT, e.g. 0.0.0.0:9835")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"invalid port in listen address {text!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range 0-65535 in listen address {text!r}")
    return host or "0.0.0.0", port


def argtype(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser for argparse's ``type=``: its ValueError message becomes the error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert
