"""Self-metrics a part of the agent counts itself, by the value of one label.

The OTLP bridge counts its exports by result, the HTTP listener what it turned away by
reason: each is a `LabelCounts` registered on the registry ``/metrics`` and the pushes
read (`exporter.output.catalogue.REGISTERED_ELSEWHERE`), every value served from 0, so that
``increase()`` sees the first event. `Rejections` is the listener's (the connection
guard's and the web config's refusals, `exporter.web`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from exporter.output import catalogue as cat


class LabelCounts(Collector):
    """Counts of events by one label's value, served as the catalogue's counter ``name``.

    Counted from any thread (the event loop, the pusher), read when the registry is
    rendered.

    Args:
        name: the family in `exporter.output.catalogue`, with one label.
        values: the label's values, in the order they are served.
    """

    def __init__(self, name: str, values: Iterable[str]) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(values, 0)

    def add(self, value: str) -> None:
        with self._lock:
            self._counts[value] += 1

    def value(self, value: str) -> int:
        with self._lock:
            return self._counts[value]

    def collect(self) -> Iterator[CounterMetricFamily]:
        spec = cat.get(self.name)
        family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
        with self._lock:
            counts = list(self._counts.items())
        for value, count in counts:
            family.add_metric((value,), float(count))
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        return iter(())


#: Why the listener turned a connection or a request away (``l9gpu_http_rejections_total``).
REJECTION_REASONS = (
    "connection_limit_evicted",  # an idle or unfinished connection closed to admit a new one
    "connection_limit_refused",  # a new connection closed: every open one was busy
    "header_timeout",            # 408: the request's line and headers did not arrive in time
    "header_too_large",          # 431 (or closed during TLS): past --max-header-bytes
    "accept_failed",             # the kernel had a connection the agent could not accept (EMFILE)
    "client_cert_not_allowed",   # 403: a client certificate outside client_allowed_sans
    "rate_limited",              # 429: the client address's rate limit
    "auth_busy",                 # 503: too many password checks queued
    "auth_failed",               # 401: no or wrong credentials
)
REJECTIONS_METRIC = "l9gpu_http_rejections_total"


class Rejections(LabelCounts):
    """Counts what the listener turned away, by reason: ``l9gpu_http_rejections_total{reason}``."""

    def __init__(self) -> None:
        super().__init__(REJECTIONS_METRIC, REJECTION_REASONS)
