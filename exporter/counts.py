"""Self-metrics a part of the agent counts itself, by the value of one label.

The OTLP bridge counts its exports by result, the HTTP listener what it turned away by
reason: each is a `LabelCounts` registered on the registry ``/metrics`` and the pushes
read (`exporter.catalogue.REGISTERED_ELSEWHERE`), every value served from 0, so that
``increase()`` sees the first event.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from exporter import catalogue as cat


class LabelCounts(Collector):
    """Counts of events by one label's value, served as the catalogue's counter ``name``.

    Counted from any thread (the event loop, the pusher), read when the registry is
    rendered.

    Args:
        name: the family in `exporter.catalogue`, with one label.
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
