"""The HTTP side: /metrics, /healthz, /readyz and a landing page, on aiohttp.

A scrape never touches hardware: it serves bytes rendered from the current snapshot.
Bytes are rendered once per (snapshot, encoding, gzip) and reused by every scrape of
that snapshot; they are re-rendered at most once per interval when the snapshot stops
changing, so ``l9gpu_snapshot_age_seconds`` keeps growing if the collector stalls.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from typing import Callable, Sequence

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter import __version__
from exporter.model import Snapshot

log = logging.getLogger(__name__)

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LANDING = """<!doctype html>
<html><head><title>l9gpu</title></head>
<body>
<h1>l9gpu {version}</h1>
<p>GPU telemetry with per-pod, per-container and per-Slurm-job attribution for node <b>{node}</b>.</p>
<ul>
<li><a href="/metrics">/metrics</a> &mdash; Prometheus exposition (text or OpenMetrics)</li>
<li><a href="/healthz">/healthz</a> &mdash; the process and its collector thread are alive</li>
<li><a href="/readyz">/readyz</a> &mdash; a first snapshot exists</li>
</ul>
</body></html>
"""


class Exposition:
    """Renders the registry to bytes, cached per snapshot, encoding and compression.

    The uncompressed body is rendered once per (snapshot, encoding) and the gzip body is
    compressed once from it. After each new snapshot the collector thread calls `warm`,
    which renders the variants scrapers asked for recently (Prometheus asks for
    OpenMetrics with gzip), so scrapes find their bytes ready.

    Args:
        registry: the registry to render (the snapshot collector plus process metrics).
        get_snapshot: the current snapshot.
        max_age: seconds after which the bytes of an unchanged snapshot are rendered again.
    """

    def __init__(self, registry: CollectorRegistry, get_snapshot: Callable[[], Snapshot | None],
                 max_age: float = 1.0):
        self.registry = registry
        self._get_snapshot = get_snapshot
        self._max_age = max_age
        self._lock = threading.Lock()
        # (seq, content type) -> (rendered at, body, gzipped body or None)
        self._cache: dict[tuple[int, str], tuple[float, bytes, bytes | None]] = {}
        # variants asked for since the last warm: (Accept header, gzip)
        self._wanted: dict[tuple[str, bool], None] = {("", False): None}

    def render(self, accept: str | None, want_gzip: bool) -> tuple[bytes, str]:
        """Return (body, content type) for a request's Accept and Accept-Encoding."""
        encoder, content_type = choose_encoder(accept or "")
        snapshot = self._get_snapshot()
        seq = snapshot.seq if snapshot is not None else 0
        key = (seq, content_type)
        now = time.monotonic()
        with self._lock:
            self._wanted[(accept or "", want_gzip)] = None
            hit = self._cache.get(key)
        if hit is None or now - hit[0] > self._max_age:
            hit = (now, encoder(self.registry), None)
        rendered_at, body, zipped = hit
        if want_gzip and zipped is None:
            zipped = gzip.compress(body, compresslevel=5)
            hit = (rendered_at, body, zipped)
        with self._lock:
            if any(k[0] != seq for k in self._cache):
                self._cache = {k: v for k, v in self._cache.items() if k[0] == seq}
            self._cache[key] = hit
        return (zipped if want_gzip else body), content_type  # type: ignore[return-value]

    def warm(self, snapshot: Snapshot) -> None:
        """Pre-render the variants scrapers asked for (collector thread hook)."""
        with self._lock:
            wanted = list(self._wanted)
            if len(self._wanted) > 8:  # forget odd one-off clients
                self._wanted = {("", False): None}
        for accept, want_gzip in wanted:
            self.render(accept or None, want_gzip)


def make_app(
    exposition: Exposition | None,
    get_snapshot: Callable[[], Snapshot | None],
    collector_alive: Callable[[], bool],
    node: str,
    middlewares: Sequence[Callable[..., object]] = (),
) -> web.Application:
    """Build the aiohttp application.

    Args:
        exposition: renders /metrics; None runs without a metrics endpoint (push-only).
        get_snapshot: the current snapshot, for /readyz.
        collector_alive: True while the collector thread runs, for /healthz.
        node: node name shown on the landing page.
        middlewares: aiohttp middlewares, e.g. the web config's basic auth and headers.
    """

    async def metrics(request: web.Request) -> web.Response:
        assert exposition is not None
        want_gzip = "gzip" in request.headers.get("Accept-Encoding", "")
        body, content_type = exposition.render(request.headers.get("Accept"), want_gzip)
        headers = {"Content-Type": content_type}
        if want_gzip:
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def healthz(request: web.Request) -> web.Response:
        if collector_alive():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="collector thread is not running\n")

    async def readyz(request: web.Request) -> web.Response:
        if get_snapshot() is None:
            return web.Response(status=503, text="not ready: the first collection pass has not finished\n")
        return web.Response(text="ok\n")

    async def landing(request: web.Request) -> web.Response:
        return web.Response(text=LANDING.format(version=__version__, node=node), content_type="text/html")

    app = web.Application(middlewares=list(middlewares))  # type: ignore[arg-type]
    if exposition is not None:
        app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/", landing)
    return app
