"""The connection guard: admits, tracks and closes the listener's connections.

Each TCP connection is a `ConnectionGuard`'s protocol: admitted under the cap (or making
room by closing the oldest idle or unfinished one), TLS started once admitted, its
request head bounded in bytes and time, then handed to aiohttp's request handler
(`exporter.web.limits` says what each limit is for).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
import time
from collections import OrderedDict
from typing import Any, Callable, cast

from exporter.output.counts import Rejections
from exporter.web.limits import ConnectionLimits
from exporter.web.logs import ThrottledLog

# The logger's name is the one these lines have always been logged under.
log = logging.getLogger("exporter.connections")

#: Seconds a refused connection (408, 431) is still read from, and what it sends dropped,
#: so that the client reads the answer before the agent closes.
LINGER_SECONDS = 1.0

_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large"}


class _GuardedConnection(asyncio.Protocol):
    """One TCP connection: TLS (when configured), then aiohttp's request handler.

    Tracks what the limits need: whether a request is being handled (`busy`), and how
    many bytes and how long the request head now arriving has taken.
    """

    def __init__(self, guard: ConnectionGuard):
        self.guard = guard
        self.raw: asyncio.Transport | None = None  # the TCP transport
        self.transport: asyncio.Transport | None = None  # what HTTP reads and writes (TLS or TCP)
        self.inner: Any = None  # aiohttp's RequestHandler, once HTTP starts
        self.since = guard.clock()
        # When the request head now arriving began (None: idle between requests), and its bytes.
        self.head_started: float | None = self.since
        self.head_bytes = 0
        self.closing = False
        self.lost = False
        self._tls: asyncio.Task[None] | None = None
        self._early: list[bytes] = []  # what TLS decrypted before HTTP started on it
        self._linger: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]
        if not self.guard.admit(self):
            self.closing = True
            cast(asyncio.Transport, transport).abort()
            return
        if self.guard.ssl_context is not None:
            # Nothing may be read before start_tls takes the connection over: the
            # ClientHello belongs to the TLS layer (start_tls resumes reading).
            cast(asyncio.Transport, transport).pause_reading()
            self._tls = asyncio.get_running_loop().create_task(self._start_tls())
        else:
            self._attach(self.raw)  # type: ignore[arg-type]

    async def _start_tls(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.guard.limits.header_timeout
        # Python 3.11+ bounds the TLS shutdown too (a peer that never answers close_notify).
        shutdown: dict[str, Any] = {"ssl_shutdown_timeout": timeout} if sys.version_info >= (3, 11) else {}
        try:
            tls = await loop.start_tls(self.raw, self, self.guard.ssl_context,  # type: ignore[arg-type]
                                       server_side=True, ssl_handshake_timeout=timeout, **shutdown)
        except Exception:  # noqa: BLE001 - a failed or timed-out handshake: start_tls closed the connection
            # Python 3.11+ then calls connection_lost; 3.10 does not for a handshake that failed
            self.connection_lost(None)
            return
        if tls is None or self.closing or self.lost:
            if tls is not None:
                tls.abort()
            return
        self._attach(tls)

    def _attach(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.inner = self.guard.handler_factory()
        self.inner.connection_made(transport)
        early, self._early = self._early, []
        self.head_bytes = 0  # counted again as it is handed on
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        inner = self.inner
        if inner is None:
            # TLS: the request can come with the handshake's last flight, before start_tls
            # has returned the transport to us; keep it (bounded) for the request handler.
            self._early.append(data)
            self.head_bytes += len(data)
            if self.head_bytes > self.guard.limits.max_header_bytes:
                self.guard.reject("header_too_large")
                self.abort()
            return
        if not self.busy():
            if self.head_started is None:
                self.head_started = self.guard.clock()
            self.head_bytes += len(data)
            if self.head_bytes > self.guard.limits.max_header_bytes:
                self.guard.reject("header_too_large")
                self.refuse(431)
                return
        before = getattr(inner, "_request_count", None)
        inner.data_received(data)
        if before is None or getattr(inner, "_request_count", None) != before:
            # a request head is complete: the next one's bytes and time start afresh
            self.head_bytes = 0
            self.head_started = None
            self.guard.touch(self)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        self.guard.release(self)
        if self._linger is not None:
            self._linger.cancel()
        if self._tls is not None and not self._tls.done():
            self._tls.cancel()
        if self.inner is not None:
            self.inner.connection_lost(exc)

    # -- limits ----------------------------------------------------------------------

    def busy(self) -> bool:
        """True while a request is queued or being handled (never evicted then)."""
        inner = self.inner
        return inner is not None and (bool(getattr(inner, "_request_in_progress", False))
                                      or bool(getattr(inner, "_messages", ())))

    def overdue(self, now: float) -> bool:
        """True when the request head (or TLS handshake) now arriving is past its deadline."""
        started = self.since if self.inner is None else self.head_started
        return (not self.closing and started is not None and not self.busy()
                and now - started > self.guard.limits.header_timeout)

    def refuse(self, status: int) -> None:
        """Answer ``status`` (408 or 431) and close.

        A client still sending would get a reset for the unread bytes if the connection
        closed at once, and with it lose the answer: so the agent stops writing, reads and
        drops what still comes for `LINGER_SECONDS` (or until the client closes), then
        closes. A lingering connection holds no request bytes and is the first to be
        closed should the cap be reached.
        """
        self.closing = True
        transport = self.transport
        if transport is None or transport.is_closing():
            self.abort()
            return
        reason = _REASONS[status]
        body = f"{reason}\n".encode()
        transport.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        if transport.can_write_eof():
            transport.write_eof()
        self._linger = asyncio.get_running_loop().call_later(LINGER_SECONDS, self.abort)

    def abort(self) -> None:
        """Close at once, without a word (eviction, a handshake past its deadline)."""
        self.closing = True
        if self.raw is not None:
            self.raw.abort()


class ConnectionGuard:
    """Admits, tracks and closes the listener's connections under `ConnectionLimits`.

    Args:
        handler_factory: makes aiohttp's request handler for a connection (the runner's
            ``server``).
        limits: the limits, ``max_connections`` already fitted to the open-file limit.
        ssl_context: TLS, started per connection once admitted; None for plain HTTP.
        clock: monotonic seconds.
        rejections: where connections closed at a limit are counted (None: a private one).
    """

    def __init__(self, handler_factory: Callable[[], Any], limits: ConnectionLimits,
                 ssl_context: ssl.SSLContext | None = None, clock: Callable[[], float] = time.monotonic,
                 rejections: Rejections | None = None):
        self.rejections = rejections if rejections is not None else Rejections()
        self.handler_factory = handler_factory
        self.limits = limits
        self.ssl_context = ssl_context
        self.clock = clock
        # Open connections, least recently active first (moved to the end at each request).
        self._open: OrderedDict[_GuardedConnection, None] = OrderedDict()
        self._sweeper: asyncio.Task[None] | None = None
        cap = limits.max_connections
        # What each reason logs, at most once per LOG_INTERVAL with a count.
        self._throttles = {
            "connection_limit_evicted": ThrottledLog(
                log, logging.WARNING, f"connection limit ({cap}) reached: closed the oldest idle or unfinished "
                "connection to admit a new one (--max-connections)"),
            "connection_limit_refused": ThrottledLog(
                log, logging.WARNING, f"connection limit ({cap}) reached with every connection busy: closed a new "
                "connection (--max-connections)"),
            "header_timeout": ThrottledLog(
                log, logging.INFO, "closed a connection whose request headers did not arrive within "
                f"{limits.header_timeout:g}s (--header-timeout)"),
            "header_too_large": ThrottledLog(
                log, logging.INFO, "refused a request whose line and headers exceed "
                f"{limits.max_header_bytes} bytes (--max-header-bytes)"),
        }

    def reject(self, reason: str) -> None:
        """A connection closed at a limit: counted, and logged (at most once per interval)."""
        self.rejections.add(reason)
        self._throttles[reason].event()

    def protocol(self) -> asyncio.Protocol:
        """The protocol factory for ``loop.create_server``."""
        return _GuardedConnection(self)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def describe(self) -> str:
        return f"{len(self._open)} connections open of at most {self.limits.max_connections}"

    def admit(self, conn: _GuardedConnection) -> bool:
        """Admit a new connection, closing the oldest idle or unfinished one at the cap;
        False when every open connection is busy with a request."""
        if len(self._open) >= self.limits.max_connections:
            # one being closed already (answered 408 or 431), else the least recently active idle one
            victim = (next((c for c in self._open if c.closing), None)
                      or next((c for c in self._open if not c.busy()), None))
            if victim is None:
                self.reject("connection_limit_refused")
                return False
            self._open.pop(victim, None)
            victim.abort()
            self.reject("connection_limit_evicted")
        self._open[conn] = None
        return True

    def touch(self, conn: _GuardedConnection) -> None:
        """A request arrived on ``conn``: it becomes the most recently active."""
        if conn in self._open:
            self._open.move_to_end(conn)

    def release(self, conn: _GuardedConnection) -> None:
        self._open.pop(conn, None)

    def sweep(self) -> None:
        """Close connections whose request head (or TLS handshake) is past its deadline."""
        now = self.clock()
        for conn in list(self._open):
            if conn.overdue(now):
                self.reject("header_timeout")
                conn.refuse(408)
        for throttle in self._throttles.values():
            throttle.flush()

    async def _sweep_forever(self) -> None:
        period = max(0.05, min(1.0, self.limits.header_timeout / 4))
        while True:
            await asyncio.sleep(period)
            self.sweep()

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    def stop(self) -> None:
        """Stop sweeping; close connections HTTP has not started on (aiohttp's shutdown
        closes the others)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self._open):
            if conn.inner is None:
                conn.abort()
