"""prometheus_client metric families -> OpenTelemetry SDK metric data (pure).

Every series of a ``/metrics`` scrape becomes exactly one OTLP data point with the same
value and the same name:

- gauges (and untyped, ``info`` and ``stateset`` families) -> Gauge points, named as the
  sample (``gpu_info`` stays ``gpu_info`` with its labels as attributes, value 1);
- counters -> monotonic, cumulative Sums named as the sample (``..._total``), with a
  start time that stays the same for the life of the series;
- histograms -> cumulative Histograms; summaries -> ``_sum``/``_count`` Sums and a
  quantile Gauge.

Units come from the catalogue (UCUM) for l9gpu's own families; for the others
(process, platform and GC metrics of prometheus_client) they are derived from the name
suffix (``_bytes`` -> ``By``, ``_seconds`` -> ``s``) or left empty. Label keys become
attribute keys through `exporter.output.catalogue.otel_attribute`; empty label values are
dropped, so ``slurm.job.id`` is absent on a Kubernetes workload's point.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.metrics_core import Metric as PromFamily
from prometheus_client.samples import Sample

from exporter.output import catalogue as cat

CUMULATIVE = AggregationTemporality.CUMULATIVE

# Unit words in metric names, longest first so ``_bytes_per_second`` wins over ``_second``.
_NAME_UNITS: tuple[tuple[str, str], ...] = tuple(
    sorted(((word, ucum) for word, ucum in cat.UCUM.items() if word), key=lambda item: -len(item[0]))
)

SeriesKey = tuple[str, frozenset[tuple[str, str]]]


def unit_for(name: str, family_unit: str = "") -> str:
    """The UCUM unit of an OTLP metric named ``name`` (a sample name).

    Catalogue families take the catalogue's unit (``1`` for counts and ratios); other
    families take it from their OpenMetrics unit or the unit word ending their name
    (``process_resident_memory_bytes`` -> ``By``), else "".
    """
    spec = cat.BY_NAME.get(name)
    if spec is not None:
        return spec.ucum
    if family_unit and family_unit in cat.UCUM:
        return cat.UCUM[family_unit]
    base = name.removesuffix("_total")
    for word, ucum in _NAME_UNITS:
        if base.endswith("_" + word):
            return ucum
    return ""


def attributes(labels: Mapping[str, str]) -> dict[str, str]:
    """Map Prometheus labels to OTLP attributes, dropping empty values."""
    return {cat.otel_attribute(key): value for key, value in labels.items() if value != ""}


class StartTimes:
    """Start times of cumulative series, stable for as long as a series is exported.

    A series seen in the first conversion starts at the agent's start time; one that
    appears later starts at the previous conversion (it began counting after that).
    Series that are gone are forgotten at the next conversion, so the table never
    grows beyond the series currently exported.
    """

    def __init__(self, agent_start_ns: int):
        self._agent_start_ns = agent_start_ns
        self._previous_ns: int | None = None
        self._starts: dict[SeriesKey, int] = {}
        self._seen: dict[SeriesKey, int] = {}

    def get(self, key: SeriesKey, created_ns: int | None = None) -> int:
        start = self._starts.get(key)
        if start is None:
            if created_ns is not None:
                start = created_ns
            else:
                start = self._agent_start_ns if self._previous_ns is None else self._previous_ns
        self._seen[key] = start
        return start

    def finish(self, now_ns: int) -> None:
        """Close one conversion: keep only the series it saw."""
        self._starts, self._seen = self._seen, {}
        self._previous_ns = now_ns

    def __len__(self) -> int:
        return len(self._starts)


def _key(name: str, labels: Mapping[str, str]) -> SeriesKey:
    return name, frozenset(labels.items())


def _created_ns(samples: Iterable[Sample], suffix: str = "_created") -> dict[frozenset[tuple[str, str]], int]:
    return {frozenset(s.labels.items()): int(s.value * 1e9) for s in samples if s.name.endswith(suffix)}


def _gauge(name: str, family: PromFamily, points: list[NumberDataPoint]) -> Metric:
    return Metric(name=name, description=family.documentation, unit=unit_for(name, family.unit),
                  data=Gauge(data_points=points))


def _sum(name: str, family: PromFamily, points: list[NumberDataPoint], unit: str | None = None) -> Metric:
    return Metric(name=name, description=family.documentation,
                  unit=unit_for(name, family.unit) if unit is None else unit,
                  data=Sum(data_points=points, aggregation_temporality=CUMULATIVE, is_monotonic=True))


def convert_family(family: PromFamily, now_ns: int, starts: StartTimes) -> list[Metric]:
    """Convert one prometheus_client family into OTLP metrics (empty families give none)."""
    kind = family.type
    if kind == "counter":
        created = _created_ns(family.samples)
        by_name: dict[str, list[NumberDataPoint]] = {}
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            label_key = frozenset(s.labels.items())
            start = starts.get(_key(s.name, s.labels), created.get(label_key))
            by_name.setdefault(s.name, []).append(
                NumberDataPoint(attributes=attributes(s.labels), start_time_unix_nano=start,
                                time_unix_nano=now_ns, value=s.value))
        return [_sum(name, family, points) for name, points in by_name.items()]
    if kind == "histogram":
        return _histogram(family, now_ns, starts)
    if kind == "summary":
        return _summary(family, now_ns, starts)
    # gauge, info, stateset, unknown, gaugehistogram: one Gauge per sample name.
    by_name = {}
    for s in family.samples:
        by_name.setdefault(s.name, []).append(
            NumberDataPoint(attributes=attributes(s.labels), start_time_unix_nano=0,
                            time_unix_nano=now_ns, value=s.value))
    return [_gauge(name, family, points) for name, points in by_name.items()]


def _without(labels: Mapping[str, str], key: str) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != key}


@dataclass
class _HistogramSeries:
    labels: dict[str, str]
    buckets: list[tuple[float, float]] = field(default_factory=list)  # (le, cumulative count)
    sum: float = 0.0
    count: int = 0


def _histogram(family: PromFamily, now_ns: int, starts: StartTimes) -> list[Metric]:
    created = _created_ns(family.samples)
    series: dict[frozenset[tuple[str, str]], _HistogramSeries] = {}
    for s in family.samples:
        if s.name.endswith("_created"):
            continue
        base = _without(s.labels, "le") if s.name.endswith("_bucket") else dict(s.labels)
        entry = series.setdefault(frozenset(base.items()), _HistogramSeries(base))
        if s.name.endswith("_bucket"):
            entry.buckets.append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_sum"):
            entry.sum = s.value
        elif s.name.endswith("_count"):
            entry.count = int(s.value)
    points = []
    for label_key, entry in series.items():
        cumulative = sorted(entry.buckets)
        bounds = [le for le, _ in cumulative if not math.isinf(le)]
        counts, previous = [], 0.0
        for _, value in cumulative:  # Prometheus buckets are cumulative; OTLP's are not
            counts.append(int(value - previous))
            previous = value
        points.append(HistogramDataPoint(
            attributes=attributes(entry.labels),
            start_time_unix_nano=starts.get(_key(family.name, entry.labels), created.get(label_key)),
            time_unix_nano=now_ns, count=entry.count, sum=entry.sum,
            bucket_counts=counts, explicit_bounds=bounds, min=math.nan, max=math.nan))
    if not points:
        return []
    return [Metric(name=family.name, description=family.documentation, unit=unit_for(family.name, family.unit),
                   data=Histogram(data_points=points, aggregation_temporality=CUMULATIVE))]


def _summary(family: PromFamily, now_ns: int, starts: StartTimes) -> list[Metric]:
    created = _created_ns(family.samples)
    sums: dict[str, list[NumberDataPoint]] = {}
    quantiles: list[NumberDataPoint] = []
    for s in family.samples:
        if s.name.endswith("_created"):
            continue
        if s.name in (family.name + "_sum", family.name + "_count"):
            start = starts.get(_key(s.name, s.labels), created.get(frozenset(s.labels.items())))
            sums.setdefault(s.name, []).append(NumberDataPoint(
                attributes=attributes(s.labels), start_time_unix_nano=start, time_unix_nano=now_ns, value=s.value))
        else:
            quantiles.append(NumberDataPoint(attributes=attributes(s.labels), start_time_unix_nano=0,
                                             time_unix_nano=now_ns, value=s.value))
    # ``_sum`` is in the family's unit; ``_count`` counts observations.
    metrics = [_sum(name, family, points, unit_for(family.name, family.unit) if name.endswith("_sum") else "")
               for name, points in sums.items()]
    if quantiles:
        metrics.append(_gauge(family.name, family, quantiles))
    return metrics


def to_metrics_data(
    families: Iterable[PromFamily],
    resource: Resource,
    scope: InstrumentationScope,
    now_ns: int,
    starts: StartTimes,
) -> MetricsData:
    """Convert one ``registry.collect()`` pass into one OTLP batch.

    Args:
        families: the families of one collection, in registry order.
        resource: the agent's resource (service, host, node).
        scope: the instrumentation scope the metrics are reported under.
        now_ns: the time of the collection, nanoseconds since the epoch; every point
            of the batch carries it.
        starts: the start times of cumulative series, kept between batches.
    """
    metrics: list[Metric] = []
    for family in families:
        metrics.extend(convert_family(family, now_ns, starts))
    starts.finish(now_ns)
    return MetricsData(resource_metrics=[ResourceMetrics(
        resource=resource,
        scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics, schema_url="")],
        schema_url="",
    )])
