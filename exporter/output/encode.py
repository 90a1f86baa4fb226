"""Exposition bytes for /metrics: prometheus_client's formats, encoded faster.

A scrape of a busy node is ~800 series with ~14 labels each. prometheus_client's encoders
re-check every label name and escape every label value and sample name of every series
on every scrape (~11 ms for such a node); the label sets themselves hardly change from one
scrape to the next. `Encoder` writes the same bytes, but renders each distinct label set
once and reuses the text while that set is still exported.

Bytes are identical to prometheus_client's (tests/test_encode.py compares them for every
format and escaping a client can negotiate): families the fast path does not cover (other
metric types, exemplars, timestamps, names outside ``[a-zA-Z_][a-zA-Z0-9_]*``, OpenMetrics
2.0, dots/values escaping, and in the text format a counter or gauge carrying
``<name>_created``, ``<name>_gsum`` or ``<name>_gcount`` samples, which prometheus_client
moves into gauge families of their own) are encoded by prometheus_client itself, family
by family.

OpenMetrics 1.0 names a counter's series ``<name>_total``; dcgm-exporter's counters have
no such suffix (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``), and dashboards query them by
those names. Such a family is named with `BareCounterName`, and `for_openmetrics` types it
``unknown`` in OpenMetrics, the type OpenMetrics gives a metric from a third-party system
whose type it cannot state, so that strict parsers accept it under its own name; the text
format keeps ``counter``, as dcgm-exporter writes it (and /metrics answers the text format
to every scraper that accepts it while the DCGM schema is served: `exporter.web.exposition`).
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from prometheus_client import exposition as text_format
from prometheus_client.openmetrics import exposition as om_format
from prometheus_client.utils import floatToGoString

# Names that every escaping scheme the fast path serves (underscores, allow-utf-8)
# leaves exactly as they are.
_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_FAST_TYPES = ("counter", "gauge", "unknown")
_EOF = "# EOF\n"
# Samples named <family><suffix> that prometheus_client's text format takes out of their
# family and writes after it, as a gauge family of their own (OpenMetrics keeps them).
_TEXT_MOVED_SUFFIXES = ("_created", "_gsum", "_gcount")
_MINUS_INF = float("-inf")
# Positive values from here on may take Go's exponent form in `floatToGoString` (a repr
# with more than six digits before its point).
_EXPONENT_FROM = 1e6


class BareCounterName(str):
    """The name of a counter family whose series carry no ``_total`` suffix.

    prometheus_client's text format names a counter's HELP and TYPE lines (and the series
    it expects) ``<family>_total``; with this name they name the series they describe, as
    dcgm-exporter's output does. OpenMetrics cannot type such a family ``counter``: see
    `for_openmetrics`.
    """

    def __add__(self, other: str) -> str:
        if other == "_total":
            return str(self)
        return str.__add__(self, other)


def for_openmetrics(families: Iterable[Any], escaping: str = om_format.UNDERSCORES) -> Iterator[Any]:
    """``families`` as OpenMetrics may carry them, for names escaped with ``escaping``.

    * A counter family named with `BareCounterName` is typed ``unknown``: OpenMetrics 1.0
      requires a counter's samples to be named ``<name>_total`` (a strict parser rejects
      the whole exposition otherwise, with "Clashing name"), and renaming them would break
      every query written for the names.
    * With ``escaping=dots``, which doubles every underscore of a name, a family's unit is
      escaped as its name is, so that it stays the suffix of the name that OpenMetrics
      requires (prometheus_client escapes the name only; a strict parser then rejects the
      exposition with "Unit does not match metric name").

    Every other family is passed on as it is; a changed one is a shallow copy.
    """
    escape_units = escaping == om_format.DOTS
    for family in families:
        bare = family.type == "counter" and isinstance(family.name, BareCounterName)
        unit = om_format.escape_metric_name(family.unit, escaping) if escape_units and family.unit else family.unit
        if bare or unit != family.unit:
            family = copy.copy(family)
            if bare:
                family.name, family.type = str(family.name), "unknown"
            family.unit = unit
        yield family


def _plain_label_name(name: str) -> bool:
    return _PLAIN_NAME.match(name) is not None and not name.startswith("__")


def _library_encode(families: Sequence[Any], library: Callable[[Any], bytes]) -> str:
    """prometheus_client's text for ``families`` (without OpenMetrics' ``# EOF``)."""
    body = library(_Families(families)).decode("utf-8")
    return body[: -len(_EOF)] if body.endswith(_EOF) else body


class _Families:
    """A registry stand-in serving a fixed list of families to an encoder."""

    def __init__(self, families: Iterable[Any]):
        self._families = list(families)

    def collect(self) -> list[Any]:
        return self._families


class Encoder:
    """Encodes families as one negotiated format, the way prometheus_client does.

    Args:
        library: prometheus_client's encoder for the format, as `choose_encoder` returns
            it; it encodes what the fast path does not cover.

    Label-set texts are kept from one `encode` to the next for the label sets still in
    use; the rest are dropped, so the cache follows what is exported.
    """

    def __init__(self, library: Callable[[Any], bytes]):
        self.library = library
        func = getattr(library, "func", library)
        keywords = getattr(library, "keywords", {}) or {}
        escaping = keywords.get("escaping", om_format.UNDERSCORES)
        if func is om_format.generate_latest:
            self.openmetrics = True
            version = keywords.get("version", "1.0.0")
            fast = om_format.parse_version(version) < (2, 0, 0)
        else:
            self.openmetrics = False
            fast = func is text_format.generate_latest
        self.escaping: str = escaping  # how the format escapes names (om_format.UNDERSCORES, ...)
        self.fast = fast and escaping in (om_format.UNDERSCORES, om_format.ALLOWUTF8)
        self._labels: dict[tuple[tuple[str, str], ...], str] = {}
        self._names: set[str] = set()

    def encode(self, families: Iterable[Any], step: int = 0) -> bytes:
        """The body for ``families``.

        ``step``: after every ``step`` families, sleep for zero seconds, which hands the
        interpreter to any thread waiting for it (the event loop answering scrapes).
        """
        families = list(families)
        if not self.fast:
            return self.library(_Families(families))
        used: dict[tuple[tuple[str, str], ...], str] = {}
        parts: list[str] = []
        for number, family in enumerate(families, 1):
            text = self._family(family, used)
            parts.append(text if text is not None else _library_encode([family], self.library))
            if step and number % step == 0:
                time.sleep(0)
        self._labels = used
        if self.openmetrics:
            parts.append(_EOF)
        return "".join(parts).encode("utf-8")

    # ---- one family ------------------------------------------------------------------

    def _plain(self, name: str) -> bool:
        if name in self._names:
            return True
        if _PLAIN_NAME.match(name) is None:
            return False
        self._names.add(name)
        return True

    def _family(self, family: Any, used: dict[tuple[tuple[str, str], ...], str]) -> str | None:
        """The family's text, or None when the fast path does not cover it."""
        if family.type not in _FAST_TYPES or not self._plain(family.name):
            return None
        name, help_text = family.name, family.documentation
        out: list[str] = []
        if self.openmetrics:
            help_text = help_text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {family.type}\n")
            if family.unit:
                out.append(f"# UNIT {name} {family.unit}\n")
        else:
            kind = family.type
            if kind == "counter":
                name += "_total"
            elif kind == "unknown":
                kind = "untyped"  # the text format's word for it
            help_text = help_text.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        cache = self._labels
        names = self._names
        # the text format's series carry the header's name (``name``); only a sample named
        # otherwise needs the closer look
        text_format = not self.openmetrics
        for sample in family.samples:
            sample_name, value = sample.name, sample.value
            if value is None or sample.timestamp is not None or sample.exemplar is not None or getattr(
                    sample, "native_histogram", None) is not None or (sample_name not in names
                                                                      and not self._plain(sample_name)):
                return None
            if text_format and sample_name != name and _moved_in_text(family.name, sample_name):
                return None  # the text format moves these to a gauge family of their own
            labels = sample.labels
            if labels:
                key = tuple(labels.items())
                text = used.get(key)
                if text is None:
                    text = cache.get(key)
                    if text is None:
                        text = _label_text(labels)
                        if text is None:
                            return None
                    used[key] = text
            else:
                text = ""
            out.append(f"{sample_name}{text} {_go_float(value)}\n")
        return "".join(out)


def _go_float(value: Any) -> str:
    """``floatToGoString(value)``, the common case first: a float above -Inf and under a
    million is its ``repr`` there (Go's exponent form begins at a million, and infinities
    and NaN are spelled otherwise)."""
    if value.__class__ is float and _MINUS_INF < value < _EXPONENT_FROM:
        return repr(value)
    return floatToGoString(value)


def _moved_in_text(family: str, sample: str) -> bool:
    """True for a sample prometheus_client's text format writes after its family, in a
    gauge family of its own (``<family>_created``, ``_gsum``, ``_gcount``)."""
    return sample.startswith(family) and sample[len(family):] in _TEXT_MOVED_SUFFIXES


def _label_text(labels: dict[str, str]) -> str | None:
    """``{name="value",...}`` sorted by name, values escaped; None for a label name the
    fast path does not cover."""
    pairs = []
    for name, value in sorted(labels.items()):
        if not _plain_label_name(name):
            return None
        value = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        pairs.append(f'{name}="{value}"')
    return "{" + ",".join(pairs) + "}"


__all__ = ["BareCounterName", "Encoder", "for_openmetrics"]
