"""/metrics bytes from `exporter.output.encode.Encoder` are prometheus_client's, byte for byte.

The encoder renders each label set once and reuses it; whatever it writes must equal what
prometheus_client writes for the same families, in every format and escaping a scraper
can negotiate, including the families it leaves to prometheus_client.
"""

from __future__ import annotations

import math

import pytest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.samples import Exemplar, Sample

from exporter.app import cli, wiring
from exporter.devices import close_backends
from exporter.output.encode import Encoder, for_openmetrics

ACCEPT = [
    "",
    "text/plain;version=0.0.4",
    "text/plain;version=1.0.0;escaping=underscores",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text/plain;version=1.0.0;escaping=dots",
    "text/plain;version=1.0.0;escaping=values",
    "application/openmetrics-text;version=1.0.0",
    "application/openmetrics-text; version=1.0.0; charset=utf-8",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
    "application/openmetrics-text;version=1.0.0;escaping=dots",
    "application/openmetrics-text;version=1.0.0;escaping=values",
    "application/openmetrics-text;version=2.0.0;escaping=allow-utf-8",
    # What Prometheus 2 and 3 send by default.
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
]


class _Families:
    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def _demo_families() -> list[Metric]:
    """Every family the demo node exports: both schemas, per-process series, the agent's own."""
    args = cli.build_parser().parse_args(
        ["serve", "--backend", "simulated", "--metric-schema", "l9gpu,dcgm", "--process-metrics",
         "--pod-label", "team", "--pod-label", "app.kubernetes.io/name"])
    backends, attributor = wiring.open_sources(args)
    try:
        collector, extra = wiring.build_collector(args, backends, attributor)
        collector.collect_once()
        registry = wiring.build_registry(lambda: collector.snapshot, wiring.enabled_families(args), extra,
                                      wiring.select_dcgm_fields(args))
        return list(registry.collect())
    finally:
        attributor.close()
        close_backends(backends)


def _odd_families() -> list[Metric]:
    """Label values and numbers that need escaping or formatting, and families the fast
    path leaves to prometheus_client."""
    gauge = GaugeMetricFamily("odd_gauge", 'Help with "quotes", a \\ and a\nnewline.', labels=["pod", "note"],
                              unit="bytes")
    values = [0.0, -0.0, 0.1, 1.0, 123456.0, 1234567.0, 1e22, 2.5e-7, -3.0, math.inf, -math.inf, math.nan, 2**53]
    notes = ['a "quoted" value', "back\\slash", "two\nlines", "λ-unicode ✓", "", "}{,=", "tab\there"]
    for i, value in enumerate(values):
        gauge.add_metric([f"pod-{i}", notes[i % len(notes)]], value)
    counter = CounterMetricFamily("odd_events", "Events.", labels=["kind"])
    counter.add_metric(["a"], 3)
    counter.add_metric(["b"], 0.5)
    created = CounterMetricFamily("odd_created_events", "Events with a created time.", labels=["kind"],
                                  created=1700000000.0)
    created.add_metric(["c"], 7, created=1700000000.5)
    plain = GaugeMetricFamily("odd_no_labels", "")
    plain.add_metric([], 42)
    info = InfoMetricFamily("odd_build", "Build.", value={"version": "1.2.3"})
    histogram = HistogramMetricFamily("odd_seconds", "A histogram.", buckets=[("0.5", 2), ("+Inf", 3)], sum_value=1.5)
    colon = GaugeMetricFamily("job:odd:ratio", "A recording-rule style name.", labels=["x"])
    colon.add_metric(["1"], 0.5)
    untyped = Metric("odd_untyped", "A family of unknown type.", "unknown")
    untyped.add_sample("odd_untyped", {"src": "x"}, 5.0)
    reserved = GaugeMetricFamily("odd_reserved", "A reserved label name.")
    reserved.samples.append(Sample("odd_reserved", {"__meta": "x"}, 1.0))
    stamped = GaugeMetricFamily("odd_stamped", "A sample with a timestamp.")
    stamped.samples.append(Sample("odd_stamped", {}, 1.0, timestamp=1700000000.25))
    exemplar = CounterMetricFamily("odd_traced", "A counter with an exemplar.")
    exemplar.samples.append(Sample("odd_traced_total", {}, 2.0, exemplar=Exemplar({"trace_id": "abc"}, 1.0)))
    return [gauge, counter, created, plain, info, histogram, colon, untyped, reserved, stamped, exemplar,
            *_gsum_gcount_families()]


def _gsum_gcount_families() -> list[Metric]:
    """Counter and gauge families carrying ``<name>_gsum``/``_gcount`` (and ``_created``)
    samples among their own, which the text format writes after the family in gauge
    families of their own and OpenMetrics keeps in place."""
    counter = CounterMetricFamily("odd_grouped_events", "A counter with gauge-histogram style samples.",
                                  labels=["kind"])
    counter.add_metric(["a"], 3)
    counter.samples.append(Sample("odd_grouped_events_gsum", {"kind": "a"}, 1.5))
    counter.add_metric(["b"], 4)
    counter.samples.append(Sample("odd_grouped_events_gcount", {"kind": "a"}, 2.0))
    counter.samples.append(Sample("odd_grouped_events_gsum", {"kind": "b"}, 0.25))
    gauge = GaugeMetricFamily("odd_grouped_level", "A gauge with _gsum, _gcount and _created samples.",
                              labels=["pod"])
    gauge.samples.append(Sample("odd_grouped_level_gcount", {"pod": "x"}, 7.0))
    gauge.add_metric(["x"], 0.5)
    gauge.samples.append(Sample("odd_grouped_level_gsum", {"pod": "x"}, 3.5))
    gauge.samples.append(Sample("odd_grouped_level_created", {"pod": "x"}, 1700000000.0))
    gauge.add_metric(["y"], 1.0)
    # Only <name> + suffix is moved: a longer name that merely contains it stays in place.
    lookalike = GaugeMetricFamily("odd_lookalike", "Samples whose names only look like the suffixes.")
    lookalike.add_metric([], 1.0)
    lookalike.samples.append(Sample("odd_lookalike_gsum_extra", {}, 2.0))
    lookalike.samples.append(Sample("other_lookalike_gcount", {}, 3.0))
    return [counter, gauge, lookalike]


@pytest.fixture(scope="module")
def demo_families() -> list[Metric]:
    return _demo_families()


@pytest.mark.parametrize("accept", ACCEPT)
def test_bytes_equal_prometheus_client_for_every_negotiable_format(accept: str, demo_families) -> None:
    library, _ = choose_encoder(accept)
    for families in (demo_families, _odd_families(), demo_families + _odd_families()):
        expected = library(_Families(families))
        encoder = Encoder(library)
        assert encoder.encode(families) == expected
        assert encoder.encode(families) == expected  # again, from the cached label texts
        assert encoder.encode(families, step=3) == expected  # in steps, as the collector thread renders


@pytest.mark.parametrize("accept", [a for a in ACCEPT if a.startswith("application/openmetrics-text")])
def test_families_adapted_for_openmetrics_are_encoded_as_prometheus_client_encodes_them(accept: str,
                                                                                         demo_families) -> None:
    """/metrics in OpenMetrics: dcgm-exporter's counters typed unknown (and units escaped
    for dots escaping) before encoding; the bytes are still prometheus_client's."""
    library, _ = choose_encoder(accept)
    encoder = Encoder(library)
    families = list(for_openmetrics(demo_families, encoder.escaping))
    assert any(f.type == "unknown" and f.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" for f in families)
    assert encoder.encode(families) == library(_Families(families))
    # the registry's own families are left as they were
    assert next(f for f in demo_families if f.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION").type == "counter"


def test_the_formats_prometheus_negotiates_take_the_fast_path(demo_families) -> None:
    for accept in ("", "text/plain;version=0.0.4", ACCEPT[-2], ACCEPT[-1]):
        assert Encoder(choose_encoder(accept)[0]).fast, accept
    assert not Encoder(choose_encoder("application/openmetrics-text;version=1.0.0;escaping=dots")[0]).fast


@pytest.mark.parametrize("accept", ACCEPT)
def test_gsum_and_gcount_samples_are_written_where_prometheus_client_writes_them(accept: str) -> None:
    library, _ = choose_encoder(accept)
    families = _gsum_gcount_families()
    expected = library(_Families(families))
    encoder = Encoder(library)
    assert encoder.encode(families) == expected
    assert encoder.encode(families) == expected  # again, from the cached label texts
    text = expected.decode()
    if encoder.fast and not encoder.openmetrics:
        # the text format's own behaviour, which the encoder reproduces: after the family,
        # one gauge family per suffix (names as they are: the escapings the fast path serves)
        assert "# TYPE odd_grouped_events_gsum gauge\nodd_grouped_events_gsum{kind=\"a\"} 1.5\n" in text
        assert text.index("odd_grouped_events_total{kind=\"b\"} 4.0") < text.index("# TYPE odd_grouped_events_gcount")


def test_label_texts_are_kept_only_for_series_still_exported(demo_families) -> None:
    library, _ = choose_encoder("application/openmetrics-text;version=1.0.0")
    encoder = Encoder(library)
    encoder.encode(demo_families)
    everything = len(encoder._labels)
    devices_only = [f for f in demo_families if f.name.startswith("gpu_")]
    assert encoder.encode(devices_only) == library(_Families(devices_only))
    label_sets = {tuple(s.labels.items()) for f in devices_only for s in f.samples if s.labels}
    assert set(encoder._labels) == label_sets and len(label_sets) < everything
