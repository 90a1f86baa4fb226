"""Snapshot -> Prometheus metric families, driven by the catalogue.

`SnapshotCollector` is a prometheus_client custom collector: every ``collect()`` yields
fresh families built from the current snapshot, so a pod that vanished vanishes from the
output (no ``Gauge.labels().set()`` bookkeeping). `families()` is the pure part: each
enabled row of the catalogue is rendered by the extractor the row declares; nothing here
knows one family from another.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator, Union

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PrometheusCollector

from exporter.core.model import Snapshot
from exporter.output import catalogue as cat
from exporter.output.extract import Frame, Labels, Row

Family = Union[GaugeMetricFamily, CounterMetricFamily]

# Scopes whose series carry the configured workload labels (owner, ``label_*``) after the row's.
_WORKLOAD_SCOPES = frozenset({cat.WORKLOAD, cat.WORKLOAD_GPM})


def _family(spec: cat.MetricSpec, labels: tuple[str, ...]) -> Family:
    unit = spec.unit if spec.unit and spec.unit != "ratio" else ""
    if spec.type == cat.COUNTER:
        return CounterMetricFamily(spec.name, spec.help, labels=labels, unit=unit)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels, unit=unit)


def _summed(rows: Iterable[Row], keep: tuple[int, ...]) -> Iterator[Row]:
    """One row per distinct value of the ``keep`` labels, the sum of the rows that share it."""
    totals: dict[Labels, float] = {}
    for labels, value in rows:
        key = tuple(labels[i] for i in keep)
        totals[key] = totals.get(key, 0.0) + value
    return iter(totals.items())


def shaped_rows(spec: cat.MetricSpec, rows: Iterable[Row]) -> Iterable[Row]:
    """A family's rows as the default output serves them: summed over ``spec.summed``, the
    zeros of a ``spec.sparse`` family left out (`MetricSpec`; ``--detail`` serves ``rows``)."""
    if spec.summed:
        rows = _summed(rows, tuple(i for i, label in enumerate(spec.labels) if label not in spec.summed))
    if spec.sparse:
        rows = (row for row in rows if row[1] != 0)
    return rows


def families(
    snapshot: Snapshot,
    enabled: frozenset[str],
    extra_labels: tuple[str, ...] = (),
    now: float | None = None,
    detailed: frozenset[str] = frozenset(),
) -> Iterator[Metric]:
    """Yield every enabled family for ``snapshot``.

    Args:
        snapshot: what the collector published.
        enabled: family names to export (`catalogue.enabled_names`).
        extra_labels: names of the workload labels after the catalogue's
            (owner, ``label_*``), matching the snapshot's workload label values.
        now: wall-clock time for ages (``l9gpu_snapshot_age_seconds``; default: time.time()).
        detailed: families served whole (per link, every state, zeros too) instead of in
            the default's shape (`shaped_rows`; `catalogue.detailed_names`).
    """
    frame: Frame | None = None
    for spec in cat.METRICS:
        if spec.name not in enabled or spec.extract is None:
            continue  # off, or registered by a part of its own (`MetricSpec.registered_by`)
        if frame is None:
            frame = Frame.of(snapshot, time.time() if now is None else now)
        whole = spec.name in detailed
        labels = spec.labels if whole else spec.default_labels
        family = _family(spec, labels + extra_labels if spec.scope in _WORKLOAD_SCOPES else labels)
        add = family.add_metric
        rows = spec.extract(frame, spec)
        for values, value in (rows if whole else shaped_rows(spec, rows)):
            add(values, value)
        yield family


class SnapshotCollector(PrometheusCollector):
    """A prometheus_client collector that serves whatever snapshot is current.

    Args:
        get_snapshot: returns the current snapshot (None before the first pass, which
            yields nothing).
        enabled: family names to export.
        extra_labels: extra workload label names (see `families`).
        detailed: families served whole (see `families`).
    """

    def __init__(
        self,
        get_snapshot: Callable[[], Snapshot | None],
        enabled: frozenset[str] | None = None,
        extra_labels: tuple[str, ...] = (),
        detailed: frozenset[str] = frozenset(),
    ):
        self._get_snapshot = get_snapshot
        self._enabled = enabled if enabled is not None else cat.enabled_names()
        self._extra_labels = extra_labels
        self._detailed = detailed

    def collect(self) -> Iterator[Metric]:
        snapshot = self._get_snapshot()
        if snapshot is None:
            return iter(())
        return families(snapshot, self._enabled, self._extra_labels, detailed=self._detailed)

    def describe(self) -> Iterator[Metric]:
        # Declaring no families keeps registration free of a first collect() pass.
        return iter(())
