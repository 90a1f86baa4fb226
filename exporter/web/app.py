"""The HTTP application: /metrics, /healthz, /readyz, the page at / and its JSON, and
/api/v1/incidents.

The routes only: /metrics bytes are `exporter.web.exposition`'s, the page's
`exporter.web.page`'s; the web config's checks come in as a middleware
(`exporter.web.access`), the listener's limits with the site (`exporter.web.site`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from aiohttp import web

from exporter.core.model import Snapshot
from exporter.web.exposition import Exposition
from exporter.web.page import SnapshotPages

INCIDENTS_PATH = "/api/v1/incidents"


def make_app(
    exposition: Exposition | None,
    get_snapshot: Callable[[], Snapshot | None],
    collector_alive: Callable[[], bool],
    node: str,
    middlewares: Sequence[Callable[..., object]] = (),
    pages: SnapshotPages | None = None,
    health: Callable[[], tuple[bool, str]] | None = None,
    incidents: Callable[[], list[dict[str, Any]]] | None = None,
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
        incidents: the incidents the agent remembers, newest first, for
            ``/api/v1/incidents`` (docs/INCIDENTS.md); None serves none.
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

    async def incident_list(request: web.Request) -> web.Response:
        items = incidents() if incidents is not None else []
        return web.json_response({"schema_version": 1, "node": node, "incidents": items,
                                  "kept": "in memory, the most recent only (--incident-history)"})

    app = web.Application(middlewares=list(middlewares))  # type: ignore[arg-type]
    if exposition is not None:
        app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get(INCIDENTS_PATH, incident_list)
    (pages or SnapshotPages(get_snapshot, node)).add_routes(app)
    return app
