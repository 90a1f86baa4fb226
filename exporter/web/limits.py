"""What an HTTP client can make the agent hold: connections, header bytes, and time.

The agent usually runs with host networking, so anything on the cluster network can
connect to its port. Each open connection costs a file descriptor, and the descriptors
are shared with attribution (a pidfd or kept-open /proc file per GPU process, sockets to
the kubelet and the API server): a flood of idle connections that took them all would
leave GPU processes unattributed. So, as Go's ``http.Server`` timeouts and header limits
do for exporters written in Go:

* **A cap on open connections** (`ConnectionLimits.max_connections`), lowered at start
  so that the open-file limit keeps descriptors in reserve for attribution
  (`exporter.web.descriptors.connection_budget`). At the cap a new connection makes room
  by closing the oldest one that has no request in progress (idle keep-alive, or still
  sending its headers): scrapers reconnect, and a flood cannot lock them out. Only when
  every connection is busy with a request is the new one closed.
* **A deadline for a request's line and headers** (``header_timeout``): from the
  connection's start (the TLS handshake included) for its first request, from the first
  byte of each later one. A half-sent request (slowloris) is answered 408 and closed.
* **Idle keep-alive connections close** after ``keepalive_timeout`` (aiohttp's own timer).
* **A bound on a request's line and headers together** (``max_header_bytes``, besides
  aiohttp's per-line, per-field and header-count limits): past it, 431 and closed, so
  unfinished requests cannot pile up memory.
* **The soft open-file limit raised to the hard one** at start
  (`exporter.web.descriptors.raise_open_file_limit`: Python, unlike Go, does not), and
  **accept errors** (``EMFILE``: "socket.accept() out of system resource") logged at most
  once per `exporter.web.logs.LOG_INTERVAL` with a count instead of a traceback per
  attempt (`exporter.web.logs.install_accept_error_log`).

Whatever is turned away is counted by reason (`exporter.output.counts.Rejections`:
``l9gpu_http_rejections_total``), with the web config's refusals (403, 429, 503, 401).

`exporter.web.site.GuardedSite` is the aiohttp site that applies all of this through an
`exporter.web.guard.ConnectionGuard`. docs/SECURITY.md lists every limit and its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# aiohttp's request-line and per-field limits (its defaults), and header count.
DEFAULT_MAX_LINE = 8190
DEFAULT_MAX_HEADERS = 100


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
