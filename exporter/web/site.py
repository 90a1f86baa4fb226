"""The aiohttp site the agent listens with: its connections go through the guard.

TLS is started per connection after the connection is admitted, so handshakes in
progress count against the cap and the header deadline too (from Python 3.11; on 3.10
asyncio runs the handshakes, bounded by the header deadline).
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import sys
from typing import Any

from aiohttp import web

from exporter.output.counts import Rejections
from exporter.web.guard import ConnectionGuard
from exporter.web.limits import ConnectionLimits


def listen_backlog() -> int:
    """The longest listen queue the kernel allows (``net.core.somaxconn``), as Go listens.

    A burst of connections (a flood opening hundreds at once) overflows a short queue, and
    the kernel drops the SYNs it has no room for: a scraper whose connection was among them
    waits a second for its SYN to be sent again. A long queue holds them until accepted
    (costing the kernel memory, not the agent descriptors). asyncio still accepts only
    ``backlog`` of them per turn of the loop, so the requests of those accepted are read
    before more arrive to push them out at the connection cap.
    """
    try:
        with open("/proc/sys/net/core/somaxconn") as src:
            return max(128, int(src.read()))
    except (OSError, ValueError):
        return 4096


class GuardedSite(web.BaseSite):
    """An aiohttp TCP site whose connections go through a `ConnectionGuard`.

    Args:
        runner: a set-up ``web.AppRunner`` (made with `ConnectionLimits.handler_kwargs`).
        host, port: where to listen (port 0: any free one, see `port`).
        limits: the listener's limits, ``max_connections`` fitted to the open-file limit.
        ssl_context: TLS for every connection, or None.
        backlog: connections accepted at most per turn of the event loop (asyncio's use of
            it); the kernel's listen queue is made as long as it allows (`listen_backlog`).
        rejections: where connections closed at a limit are counted.
    """

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: ConnectionLimits,
                 ssl_context: ssl.SSLContext | None = None, backlog: int = 128, rejections: Rejections | None = None):
        super().__init__(runner, backlog=backlog)
        server = runner.server
        assert server is not None
        self._host = host
        self._port = port
        self._tls = ssl_context
        # Python 3.10's transports may read before start_tls takes a connection over (a
        # paused one is resumed by its own set-up): there, asyncio runs TLS itself, and
        # handshakes in progress are bounded by the header timeout but not counted.
        self._native_tls = ssl_context is not None and sys.version_info < (3, 11)
        self.guard = ConnectionGuard(server, limits, None if self._native_tls else ssl_context,
                                     rejections=rejections)

    @property
    def name(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        sockets = getattr(self._server, "sockets", None)  # an asyncio.Server's, once listening
        if sockets:
            return int(sockets[0].getsockname()[1])
        return self._port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = ({"ssl": self._tls, "ssl_handshake_timeout": self.guard.limits.header_timeout}
                               if self._native_tls else {})
        self._server = await loop.create_server(self.guard.protocol, self._host, self._port, backlog=self._backlog,
                                                **tls)
        for listening in self._server.sockets:  # a deeper kernel queue (asyncio listens with backlog)
            deeper = socket.socket(fileno=os.dup(listening.fileno()))
            try:
                deeper.listen(listen_backlog())
            finally:
                deeper.close()  # the duplicate descriptor only
        self.guard.start()

    async def stop(self) -> None:
        await super().stop()
        self.guard.stop()
