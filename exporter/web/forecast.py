"""When each scraper's next scrape is due, learned from its last scrapes.

Rendering costs far more than a pass on a busy node (a 200 KiB body), and Prometheus
scrapes every 15-60 s while passes run every second, so the agent renders only for the
scrapes it expects: `ScrapeForecast` learns each client's scrape period, and after a
pass `exporter.web.exposition.Exposition.warm` renders only when a scrape is due before
the next pass.
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Client:
    last: float
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=3))
    rendered_for: float | None = None  # the expected scrape a pass already rendered for


class ScrapeForecast:
    """When each client's next scrape is due, from its last scrapes.

    Prometheus scrapes a target at a fixed period with little jitter; each server of an
    HA pair has its own period and phase, so clients are told apart (by address and the
    variant they ask for). A client's period is the median of its last three gaps.

    Args:
        max_clients: clients remembered at most (the least recently seen are dropped).
        forget_after: seconds after which a client seen once (period unknown) is dropped;
            a client with a known period is dropped after three missed periods plus this.
    """

    def __init__(self, max_clients: int = 32, forget_after: float = 120.0):
        self._clients: dict[Any, _Client] = {}
        self._max = max_clients
        self._forget_after = forget_after
        self._lock = threading.Lock()

    def observe(self, key: Any, now: float) -> None:
        """A scrape by ``key`` (client and variant) at monotonic time ``now``."""
        with self._lock:
            client = self._clients.pop(key, None)
            if client is None:
                client = _Client(now)
            else:
                client.gaps.append(max(0.0, now - client.last))
                client.last = now
            self._clients[key] = client  # most recently seen last
            while len(self._clients) > self._max:
                del self._clients[next(iter(self._clients))]

    def due(self, variant: Any, now: float, horizon: float) -> bool:
        """True when a client of ``variant`` is expected to scrape before ``now + horizon``
        and no earlier call answered True for that scrape: the caller renders for it, once.

        A client seen once (period unknown) is not expected: its next scrape renders by
        itself, and from the third on they are foreseen. A scrape overdue by more than a
        quarter of ``horizon`` is no longer expected.
        """
        with self._lock:
            wanted = False
            for key, client in list(self._clients.items()):
                if not client.gaps:
                    if now - client.last > self._forget_after:
                        del self._clients[key]
                    continue
                period = statistics.median(client.gaps)
                if now - client.last > 3 * period + self._forget_after:
                    del self._clients[key]
                    continue
                if key[1:] != variant:
                    continue
                # Its next scrape, if due before the next pass (or late by a quarter of the
                # horizon): the first pass that sees it due renders for it, the next ones do
                # not (the bytes stay servable for two intervals). A client that missed its
                # time (stopped, or irregular) is not rendered for on every pass; its next
                # scrape renders by itself and tells its period anew.
                expected = client.last + period
                if now - horizon / 4 <= expected <= now + horizon and client.rendered_for != expected:
                    client.rendered_for = expected
                    wanted = True
            return wanted
