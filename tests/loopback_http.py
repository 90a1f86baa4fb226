"""A real aiohttp server on 127.0.0.1, in a thread of its own, for clients under test.

The client code under test (``l9gpu report``'s Prometheus client) runs its own event
loop, so the server gets another loop in a daemon thread::

    with LoopbackServer(app) as server:
        main(["report", "--prometheus", server.base, ...])
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web


class LoopbackServer:
    """Serves ``app`` on a free loopback port until the ``with`` block ends.

    ``base`` is ``http://127.0.0.1:<port>``; ``requests`` records (method, path, headers)
    of every request, for tests that check what a client sent.
    """

    def __init__(self, app: web.Application):
        self.app = app
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.base = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="loopback-http", daemon=True)
        self._runner: web.AppRunner | None = None

        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            self.requests.append((request.method, request.path, dict(request.headers)))
            return await handler(request)

        app.middlewares.append(record)

    def _run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=0.5)
        self._run(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._run(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001 - the OS's port
        self.base = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._runner is not None:
                self._run(self._runner.cleanup())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()
