"""The HTTP side: /metrics, /healthz, /readyz, the page at / and its JSON, on aiohttp.

A scrape never touches hardware: it serves bytes rendered from the current snapshot.
Bytes are rendered once per (snapshot, encoding, gzip) and reused by every scrape of
that snapshot; they are re-rendered at most once per interval when the snapshot stops
changing, so ``l9gpu_snapshot_age_seconds`` keeps growing if the collector stalls.

Rendering costs far more than a pass on a busy node (a 200 KiB body), and Prometheus
scrapes every 15-60 s while passes run every second, so the agent renders only for the
scrapes it expects: it learns each client's scrape period (`ScrapeForecast`) and, after
a pass, renders only when a scrape is due before the next pass.

With the DCGM schema every scraper that accepts the text format gets it, as from
dcgm-exporter (whose counters OpenMetrics cannot type counter); only a scraper that
accepts nothing but OpenMetrics gets OpenMetrics (docs/MIGRATING-FROM-DCGM.md).
"""

from __future__ import annotations

import gzip
import logging
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.encode import Encoder, for_openmetrics
from exporter.model import Snapshot
from exporter.page import SnapshotPages

log = logging.getLogger(__name__)

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

@dataclass
class _Client:
    last: float
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=3))


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
        """True when a client of ``variant`` is expected to scrape before ``now + horizon``.

        A client seen once (period unknown) is not expected: its next scrape renders by
        itself, and from the third on they are foreseen. A scrape overdue by more than a
        quarter of ``horizon`` is no longer expected.
        """
        with self._lock:
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
                # horizon): one pass renders for it (two when it falls right at a pass
                # boundary). A client that missed its time (stopped, or irregular) is not
                # rendered for on every pass; its next scrape renders by itself and tells
                # its period anew.
                expected = client.last + period
                if now - horizon / 4 <= expected <= now + horizon:
                    return True
            return False


def text_first(accept: str) -> str:
    """The ``Accept`` header without its OpenMetrics entries, when it accepts anything else.

    Prometheus asks for OpenMetrics first and the text format after it (``text/plain``
    with a lower ``q``, or ``*/*``); `choose_encoder` then answers the text format. A
    header naming only OpenMetrics, or one whose other entries are all refused
    (``q=0``), is returned as it is.
    """
    others = []
    for entry in accept.split(","):
        media, *params = (part.strip() for part in entry.split(";"))
        if not media or media.lower() == "application/openmetrics-text":
            continue
        if media.lower() in ("text/plain", "text/*", "*/*") and not any(_refuses(p) for p in params):
            others.append(entry.strip())
    return ",".join(others) if others else accept


def _refuses(parameter: str) -> bool:
    """True for an Accept entry's ``q=0`` (that type is not acceptable)."""
    name, _, value = parameter.partition("=")
    if name.strip().lower() != "q":
        return False
    try:
        return float(value) == 0.0
    except ValueError:
        return False


@dataclass(frozen=True)
class _Rendered:
    seq: int
    rendered_at: float
    body: bytes
    zipped: bytes | None = None


class Exposition:
    """Renders the registry to bytes, cached per encoding, once per snapshot.

    After each pass the collector thread calls `warm`, which renders (and gzips) the
    variants a scrape is expected for before the next pass (`ScrapeForecast`) — a few
    families at a time so the event loop keeps answering in between. Scrapes get the
    newest bytes rendered, at most ``max_age`` old; a scrape renders by itself only when
    nothing recent enough is cached (a client's first scrapes, before its period is
    known, or a collector that stopped publishing, so that ``l9gpu_snapshot_age_seconds``
    keeps growing).

    Args:
        registry: the registry to render (the snapshot collector plus process metrics).
        get_snapshot: the current snapshot.
        max_age: seconds for which cached bytes may still be served.
        interval: seconds between collection passes.
        clock: monotonic clock, seconds.
        prefer_text: answer the text format to every client that accepts it, whatever it
            prefers (see `text_first`); OpenMetrics only to a client that accepts nothing
            else. For the DCGM schema: dcgm-exporter only ever answers text, in which its
            counters are typed counter, and OpenMetrics cannot type them so.
    """

    def __init__(self, registry: CollectorRegistry, get_snapshot: Callable[[], Snapshot | None],
                 max_age: float = 1.0, interval: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 prefer_text: bool = False):
        self.registry = registry
        self._prefer_text = prefer_text
        self._get_snapshot = get_snapshot
        self._max_age = max_age
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[str, _Rendered] = {}  # by content type
        self._encoders: dict[str, Encoder] = {}  # by content type: each keeps its label texts
        # variants scrapers asked for: (Accept header, gzip)
        self._wanted: dict[tuple[str, bool], None] = {}
        self.forecast = ScrapeForecast()

    def render(self, accept: str | None, want_gzip: bool, background: bool = False,
               client: str | None = None) -> tuple[bytes, str]:
        """Return (body, content type) for a request's Accept and Accept-Encoding.

        Args:
            accept: the request's Accept header.
            want_gzip: the request accepts gzip.
            background: called from the collector thread: render the current snapshot
                (unless already done), a few families at a time.
            client: who scrapes (the peer's address), to learn its scrape period.
        """
        library, content_type = choose_encoder(text_first(accept or "") if self._prefer_text else accept or "")
        snapshot = self._get_snapshot()
        seq = snapshot.seq if snapshot is not None else 0
        now = self._clock()
        variant = (accept or "", want_gzip)
        with self._lock:
            if not background:
                self._wanted[variant] = None
                if len(self._wanted) > 8:  # forget odd one-off clients
                    self._wanted = {variant: None}
            hit = self._cache.get(content_type)
            encoder = self._encoders.get(content_type)
            if encoder is None:
                encoder = self._encoders[content_type] = Encoder(library)
        if not background:
            self.forecast.observe((client or "",) + variant, now)
        if hit is None or now - hit.rendered_at > self._max_age or (background and hit.seq != seq):
            families: Iterable[Any] = self.registry.collect()
            if encoder.openmetrics:
                # dcgm-exporter's counters typed unknown; with dots escaping, units escaped
                families = for_openmetrics(families, encoder.escaping)
            # in the collector thread, a few families at a time so the event loop keeps answering
            body = encoder.encode(families, step=4 if background else 0)
            hit = _Rendered(seq, now, body)
        if want_gzip and hit.zipped is None:
            hit = replace(hit, zipped=gzip.compress(hit.body, compresslevel=5))
        with self._lock:
            current = self._cache.get(content_type)
            if current is None or (current.seq, current.rendered_at) <= (hit.seq, hit.rendered_at):
                self._cache[content_type] = hit
        return (hit.zipped if want_gzip and hit.zipped is not None else hit.body), content_type

    def warm(self, snapshot: Snapshot) -> None:
        """Render, for a new snapshot, the variants a scrape is due for before the next
        pass (collector thread); the others wait for their next expected scrape."""
        now = self._clock()
        with self._lock:
            wanted = list(self._wanted)
        # Until the next pass, and a tenth more: a scrape due right at a pass boundary may
        # arrive while that pass runs, so the pass before renders for it too.
        horizon = 1.1 * self._interval
        for accept, want_gzip in wanted:
            if self.forecast.due((accept, want_gzip), now, horizon):
                self.render(accept or None, want_gzip, background=True)


def make_app(
    exposition: Exposition | None,
    get_snapshot: Callable[[], Snapshot | None],
    collector_alive: Callable[[], bool],
    node: str,
    middlewares: Sequence[Callable[..., object]] = (),
    pages: SnapshotPages | None = None,
    health: Callable[[], tuple[bool, str]] | None = None,
) -> web.Application:
    """Build the aiohttp application.

    What the probes mean (docs/HEALTH.md): ``/healthz`` (liveness) fails only when the
    collector itself no longer runs or finishes passes, which a restart can mend; a GPU
    stuck in a driver call is no reason to restart (a new agent would meet the same stuck
    driver), so it is said in the body of a 200. ``/readyz`` fails only before the first
    snapshot: a target that is not ready is no longer scraped, and its down GPUs would
    vanish from Prometheus instead of alerting.

    Args:
        exposition: renders /metrics; None runs without a metrics endpoint (push-only).
        get_snapshot: the current snapshot, for /readyz.
        collector_alive: True while the collector thread runs, for /healthz (when no
            ``health`` is given).
        node: node name shown on the page.
        middlewares: aiohttp middlewares, e.g. the web config's basic auth and headers.
        pages: serves / and /api/v1/snapshot (default: from ``get_snapshot`` and ``node``).
        health: (live, note) for /healthz and /readyz: whether the collector runs and
            finishes passes, and what is degraded meanwhile, in one line
            (`Collector.liveness`).
    """

    async def metrics(request: web.Request) -> web.Response:
        assert exposition is not None
        want_gzip = "gzip" in request.headers.get("Accept-Encoding", "")
        body, content_type = exposition.render(request.headers.get("Accept"), want_gzip, client=request.remote)
        headers = {"Content-Type": content_type}
        if want_gzip:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    def liveness() -> tuple[bool, str]:
        if health is not None:
            return health()
        if collector_alive():
            return True, ""
        return False, "collector thread is not running"

    async def healthz(request: web.Request) -> web.Response:
        live, note = liveness()
        if live:
            return web.Response(text=f"ok: {note}\n" if note else "ok\n")
        return web.Response(status=503, text=f"{note}\n")

    async def readyz(request: web.Request) -> web.Response:
        if get_snapshot() is None:
            return web.Response(status=503, text="not ready: the first collection pass has not finished\n")
        # Ready whatever is degraded: Prometheus must keep scraping to see it.
        _, note = liveness()
        return web.Response(text=f"ok: {note}\n" if note else "ok\n")

    app = web.Application(middlewares=list(middlewares))  # type: ignore[arg-type]
    if exposition is not None:
        app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    (pages or SnapshotPages(get_snapshot, node)).add_routes(app)
    return app
