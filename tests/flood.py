"""A connection flood against a listener, on real sockets, from one background thread.

`Flood` opens ``idle`` connections that send nothing and ``heavy`` ones that send an
unfinished request (a request line, then header fields up to ``header_bytes``, never the
blank line that ends them), as a slowloris or a header-bloat attack does. It records what
the server does to them: how many it closed, and the status line of any answer (408,
431...). With ``reconnect`` every connection the server closes is opened again, so the
pressure lasts. Used by tests/test_connections.py and benchmarks/bench_flood.py.
"""

from __future__ import annotations

import errno
import selectors
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

_PAD = b"X-Pad-%05d: " + b"a" * 7900 + b"\r\n"


@dataclass
class _Conn:
    sock: socket.socket
    heavy: bool
    out: bytes = b""
    sent: int = 0
    answer: bytes = b""
    opened: float = 0.0


@dataclass
class FloodStats:
    opened: int = 0
    closed_by_server: int = 0
    connect_failures: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    lifetimes: list[float] = field(default_factory=list)  # seconds from connect to the server's close

    @property
    def summary(self) -> str:
        return (f"opened {self.opened}, closed by the server {self.closed_by_server}, "
                f"connect failures {self.connect_failures}, answers {dict(self.statuses)}")


class Flood:
    """Hold ``idle`` silent and ``heavy`` half-sent connections open against ``(host, port)``.

    Args:
        host, port: the listener.
        idle: connections that connect and send nothing.
        heavy: connections that send an unfinished request of about ``header_bytes``.
        header_bytes: bytes of header fields each heavy connection sends (no final CRLF).
        head: what heavy connections send instead (e.g. a request line and one header).
        reconnect: open a new connection for each one the server closes.
        rate: new connections per second at most (0: as fast as the kernel accepts).
    """

    def __init__(self, host: str, port: int, idle: int = 0, heavy: int = 0, header_bytes: int = 960_000,
                 reconnect: bool = False, rate: float = 0.0, head: bytes | None = None):
        self.address = (host, port)
        self.idle, self.heavy = idle, heavy
        self.header_bytes = header_bytes
        self.reconnect = reconnect
        self.rate = rate
        self.head = head
        self.stats = FloodStats()
        self._sel = selectors.DefaultSelector()
        self._conns: dict[int, _Conn] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)
        self._lock = threading.Lock()
        self._wanted: list[bool] = [False] * idle + [True] * heavy  # to open: heavy or not

    # -- control ---------------------------------------------------------------------

    def start(self) -> Flood:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for conn in list(self._conns.values()):
            conn.sock.close()
        self._conns.clear()
        self._sel.close()

    def __enter__(self) -> Flood:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def open_now(self) -> int:
        with self._lock:
            return len(self._conns)

    def pending(self) -> int:
        """Connections still to open (not yet tried)."""
        with self._lock:
            return len(self._wanted)

    # -- the loop --------------------------------------------------------------------

    def _request(self) -> bytes:
        if self.head is not None:  # a given unfinished request (e.g. a slowloris' first line)
            return self.head
        head = b"GET /metrics HTTP/1.1\r\nHost: l9gpu\r\n"
        count = max(1, self.header_bytes // len(_PAD % 0))
        return head + b"".join(_PAD % i for i in range(count))  # no blank line: never finished

    def _open(self, heavy: bool) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(self.address)
        except BlockingIOError:
            pass
        except OSError:
            sock.close()
            self.stats.connect_failures += 1
            return
        conn = _Conn(sock, heavy, self._payload if heavy else b"", opened=time.monotonic())
        with self._lock:
            self._conns[sock.fileno()] = conn
        self._sel.register(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if heavy else 0), conn)
        self.stats.opened += 1

    def _closed(self, conn: _Conn) -> None:
        self._sel.unregister(conn.sock)
        with self._lock:
            self._conns.pop(conn.sock.fileno(), None)
        conn.sock.close()
        self.stats.closed_by_server += 1
        self.stats.lifetimes.append(time.monotonic() - conn.opened)
        if conn.answer:
            self.stats.statuses[conn.answer.split(b"\r\n", 1)[0].decode(errors="replace")] += 1
        if self.reconnect and not self._stop.is_set():
            with self._lock:
                self._wanted.append(conn.heavy)

    def _run(self) -> None:
        self._payload = self._request()
        next_open = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            while now >= next_open:
                with self._lock:
                    if not self._wanted:
                        break
                    heavy = self._wanted.pop(0)
                self._open(heavy)
                if self.rate:
                    next_open += 1.0 / self.rate
                    if next_open < now - 1.0:
                        next_open = now
            for key, events in self._sel.select(timeout=0.05):
                conn: _Conn = key.data
                if events & selectors.EVENT_READ:
                    try:
                        data = conn.sock.recv(65536)
                    except BlockingIOError:
                        data = None
                    except OSError:
                        data = b""
                    if data == b"":
                        self._closed(conn)
                        continue
                    if data:
                        conn.answer += data[:256]
                if events & selectors.EVENT_WRITE and conn.sent < len(conn.out):
                    try:
                        conn.sent += conn.sock.send(conn.out[conn.sent:conn.sent + 65536])
                    except BlockingIOError:
                        pass
                    except OSError as exc:
                        if exc.errno not in (errno.EAGAIN, errno.EINPROGRESS):
                            self._closed(conn)
                            continue
                    if conn.sent >= len(conn.out):
                        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
