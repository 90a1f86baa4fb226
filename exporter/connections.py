"""What an HTTP client can make the agent hold: connections, header bytes, and time.

The agent usually runs with host networking, so anything on the cluster network can
connect to its port. Each open connection costs a file descriptor, and the descriptors
are shared with attribution (a pidfd or kept-open /proc file per GPU process, sockets to
the kubelet and the API server): a flood of idle connections that took them all would
leave GPU processes unattributed. So, as Go's ``http.Server`` timeouts and header limits
do for exporters written in Go:

* **A cap on open connections** (`ConnectionLimits.max_connections`), lowered at start
  so that the open-file limit keeps descriptors in reserve for attribution
  (`connection_budget`). At the cap a new connection makes room by closing the oldest
  one that has no request in progress (idle keep-alive, or still sending its headers):
  scrapers reconnect, and a flood cannot lock them out. Only when every connection is
  busy with a request is the new one closed.
* **A deadline for a request's line and headers** (``header_timeout``): from the
  connection's start (the TLS handshake included) for its first request, from the first
  byte of each later one. A half-sent request (slowloris) is answered 408 and closed.
* **Idle keep-alive connections close** after ``keepalive_timeout`` (aiohttp's own timer).
* **A bound on a request's line and headers together** (``max_header_bytes``, besides
  aiohttp's per-line, per-field and header-count limits): past it, 431 and closed, so
  unfinished requests cannot pile up memory.
* **The soft open-file limit raised to the hard one** at start (`raise_open_file_limit`:
  Python, unlike Go, does not), and **accept errors** (``EMFILE``: "socket.accept() out
  of system resource") logged at most once per `LOG_INTERVAL` with a count instead of a
  traceback per attempt (`install_accept_error_log`).

Whatever is turned away is counted by reason (`Rejections`:
``l9gpu_http_rejections_total``), with the web config's refusals (403, 429, 503, 401).

`GuardedSite` is the aiohttp site that applies all of this; TLS is started per
connection after the connection is admitted, so handshakes in progress count against
the cap and the header deadline too (from Python 3.11; on 3.10 asyncio runs the
handshakes, bounded by the header deadline). docs/SECURITY.md lists every limit and its default.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import ssl
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web

from exporter.counts import LabelCounts

log = logging.getLogger(__name__)

#: Recurring network trouble (accept errors, evictions, refusals) is logged at most this
#: often, in seconds, each line saying how many times it happened meanwhile.
LOG_INTERVAL = 10.0

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


#: Descriptors kept free beyond those counted at start and attribution's kept-open files:
#: sockets to the kubelet, the container runtime, the API server and an OTLP collector,
#: NVML's device nodes as GPUs come and go, a web config reload, log rotation.
SPARE_DESCRIPTORS = 64

#: The fewest connections the cap is lowered to, however low the open-file limit.
MIN_CONNECTIONS = 8

#: Seconds a refused connection (408, 431) is still read from, and what it sends dropped,
#: so that the client reads the answer before the agent closes.
LINGER_SECONDS = 1.0

# aiohttp's request-line and per-field limits (its defaults), and header count.
DEFAULT_MAX_LINE = 8190
DEFAULT_MAX_HEADERS = 100

_ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


@dataclass(frozen=True)
class ConnectionLimits:
    """The listener's limits (see the module docstring; flags of ``l9gpu serve``).

    Attributes:
        max_connections: open connections at most (``--max-connections``), TLS
            handshakes in progress included.
        keepalive_timeout: seconds an idle keep-alive connection stays open
            (``--keepalive-timeout``).
        header_timeout: seconds a request's line and headers may take to arrive
            (``--header-timeout``); also bounds a TLS handshake.
        max_header_bytes: bytes of a request's line and headers together
            (``--max-header-bytes``).
        max_line_size: bytes of the request line, and of one header field.
        max_headers: header fields of one request at most.
    """

    max_connections: int = 512
    keepalive_timeout: float = 75.0
    header_timeout: float = 10.0
    max_header_bytes: int = 16384
    max_line_size: int = DEFAULT_MAX_LINE
    max_headers: int = DEFAULT_MAX_HEADERS

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, not {self.max_connections}")
        for name in ("keepalive_timeout", "header_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, not {getattr(self, name)!r}")
        if self.max_header_bytes < 1024:
            raise ValueError(f"max_header_bytes must be at least 1024, not {self.max_header_bytes}")

    def handler_kwargs(self) -> dict[str, Any]:
        """aiohttp request handler arguments (for ``web.AppRunner(app, **kwargs)``)."""
        line = min(self.max_line_size, self.max_header_bytes)
        return {"keepalive_timeout": self.keepalive_timeout, "max_line_size": line, "max_field_size": line,
                "max_headers": self.max_headers}


def parse_connections(text: str) -> int:
    """``--max-connections``: a whole number, at least 1."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number of connections") from None
    if value < 1:
        raise ValueError(f"{value} connections: at least 1 is needed")
    return value


def parse_header_bytes(text: str) -> int:
    """``--max-header-bytes``: a whole number of bytes, at least 1024."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number of bytes (e.g. 16384)") from None
    if value < 1024:
        raise ValueError(f"{value} bytes is too small for a request's headers (at least 1024)")
    return value


# ---------------------------------------------------------------- descriptors


@dataclass(frozen=True)
class OpenFileLimit:
    """The soft open-file limit before and after `raise_open_file_limit`, and the hard one
    (``resource.RLIM_INFINITY`` where unlimited)."""

    before: int
    soft: int
    hard: int

    def describe(self) -> str:
        hard = "unlimited" if self.hard == resource.RLIM_INFINITY else str(self.hard)
        if self.soft > self.before:
            return f"open-file limit raised from {self.before} to {self.soft} (hard limit {hard})"
        return f"open-file limit {self.soft} (hard limit {hard})"


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as src:
            return int(src.read())
    except (OSError, ValueError):
        return 1 << 20


def raise_open_file_limit() -> OpenFileLimit:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (or to ``fs.nr_open`` where the
    hard limit is unlimited), as Go does at start since 1.19 and Python does not.

    systemd starts services with a soft limit of 1024; every connection, pidfd and kept-open
    /proc file counts against it. A failure leaves the limit as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _nr_open() if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
            return OpenFileLimit(soft, soft, hard)
        return OpenFileLimit(soft, target, hard)
    return OpenFileLimit(soft, soft, hard)


def descriptors_in_use() -> int:
    """File descriptors this process has open now."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir opened
    except OSError:
        return 0


def connection_budget(requested: int, soft_limit: int, in_use: int, reserved: int) -> int:
    """Connections at most, so that ``reserved`` descriptors (and `SPARE_DESCRIPTORS`)
    stay free for attribution under the soft open-file limit.

    Args:
        requested: ``--max-connections``.
        soft_limit: the soft ``RLIMIT_NOFILE`` (``resource.RLIM_INFINITY``: unlimited).
        in_use: descriptors open now (the listener, NVML, sockets, log files).
        reserved: descriptors attribution may still open (a pidfd or /proc file per GPU
            process; `exporter.attribution.procfs.max_kept_open`).
    """
    if soft_limit == resource.RLIM_INFINITY or soft_limit < 0:
        return requested
    available = soft_limit - in_use - reserved - SPARE_DESCRIPTORS
    return max(MIN_CONNECTIONS, min(requested, available))


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


# ---------------------------------------------------------------- throttled logs


class ThrottledLog:
    """Logs a recurring event at most once per ``interval``, with how often it happened.

    The first occurrence is logged at once; later ones within the interval are counted
    and said in one line when the interval has passed (at the next occurrence or `flush`).
    """

    def __init__(self, logger: logging.Logger, level: int, what: str, interval: float = LOG_INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self._log = logger
        self._level = level
        self._what = what
        self.interval = interval
        self._clock = clock
        self._last: float | None = None
        self._pending = 0
        self._detail = ""
        self.total = 0

    def event(self, detail: str = "") -> None:
        """One occurrence; ``detail`` (e.g. the error) is said with the next line."""
        self.total += 1
        self._pending += 1
        self._detail = detail
        self.flush()

    def flush(self) -> None:
        """Say what was counted, if the interval since the last line has passed."""
        now = self._clock()
        if not self._pending or (self._last is not None and now - self._last < self.interval):
            return
        since = "" if self._last is None else f" in the last {now - self._last:.0f}s"
        times = "" if self._pending == 1 and self._last is None else f" ({self._pending} times{since})"
        detail = f": {self._detail}" if self._detail else ""
        self._log.log(self._level, "%s%s%s", self._what, detail, times)
        self._last = now
        self._pending = 0


def install_accept_error_log(loop: asyncio.AbstractEventLoop, describe: Callable[[], str] = lambda: "",
                             interval: float = LOG_INTERVAL, rejections: Rejections | None = None) -> ThrottledLog:
    """Log the event loop's accept errors (out of descriptors, memory or buffers) at most
    once per ``interval`` with a count, instead of asyncio's traceback per attempt.

    asyncio retries a failed accept a second later, and on Linux logs every failed
    attempt: thousands of tracebacks a second when the open-file limit is reached. Other
    errors go to the handler that was set before (or asyncio's default).

    Args:
        loop: the running loop.
        describe: extra words for each line (e.g. open connections and the limit).
        rejections: where each failed accept is counted (``accept_failed``).
    """
    throttle = ThrottledLog(log, logging.ERROR, "cannot accept connections", interval)
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", ""))
        if "accept" in message and isinstance(exc, OSError) and exc.errno in _ACCEPT_ERRNOS:
            extra = describe()
            if rejections is not None:
                rejections.add("accept_failed")
            throttle.event(f"{exc.strerror or exc}" + (f"; {extra}" if extra else ""))
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return throttle


# ---------------------------------------------------------------- the guard


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
            transport.abort()  # type: ignore[attr-defined]
            return
        if self.guard.ssl_context is not None:
            # Nothing may be read before start_tls takes the connection over: the
            # ClientHello belongs to the TLS layer (start_tls resumes reading).
            transport.pause_reading()  # type: ignore[attr-defined]
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
