"""A unary "list" call on a node-local gRPC unix socket, polled in a background thread.

The kubelet's pod-resources socket and the container runtime's CRI socket are both
asked the same way: one List call with a short deadline, on a slow cadence in a daemon
thread (and on demand), never raising into the collector, and reporting its health.
`SocketLister` does that; each source subclasses it and says what a listing means.

Because every call has a deadline, a socket that is gone (refused, removed) or a server
that accepts the call and never answers is noticed by the next background call at the
latest: within `SocketLister.outage_bound` seconds.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

# The kubelet allows responses up to 16 MiB on both sockets; a node with many containers
# needs more than gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

# Deadline of the first call, made once at startup before any collection pass: no pass
# waits on it, and a node that is busy booting its pods should not start the agent with
# an empty listing for want of a few hundred milliseconds.
STARTUP_TIMEOUT = 5.0


def socket_path(value: str) -> str:
    """``unix:///run/x.sock``, ``unix:/run/x.sock`` or ``/run/x.sock`` -> ``/run/x.sock``."""
    for prefix in ("unix://", "unix:"):
        if value.startswith(prefix):
            return value[len(prefix):]
    return value


class SocketLister:
    """Calls one unary ``method`` on a unix socket; subclasses act on the answers.

    Args:
        socket: the socket's path (or ``unix://`` URL).
        method: the full gRPC method name, e.g. ``/v1.PodResourcesLister/List``.
        request: the request message.
        response_type: the response message class.
        interval: seconds between background listings.
        timeout: deadline of one call, seconds.

    Raises:
        ImportError: ``grpcio`` is not installed.
    """

    name = "socket"
    thread_name = "l9gpu-socket"

    def __init__(self, socket: str, method: str, request: Any, response_type: Any, interval: float,
                 timeout: float):
        import grpc  # imported here: optional dependency

        self.socket = socket_path(socket)
        self.interval = interval
        self.timeout = timeout
        self._grpc = grpc
        self._channel = grpc.insecure_channel("unix://" + self.socket, options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            # Reconnect soon after the kubelet or runtime restarts, not after gRPC's 2 minutes.
            ("grpc.initial_reconnect_backoff_ms", 500),
            ("grpc.max_reconnect_backoff_ms", 5000),
        ])
        self._call = self._channel.unary_unary(method, request_serializer=type(request).SerializeToString,
                                               response_deserializer=response_type.FromString)
        self._request = request
        self._lock = threading.Lock()  # one listing at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._healthy = False
        self._failures = 0
        self.last_code = ""
        self.last_error = ""
        self.listings = 0

    def healthy(self) -> bool:
        """True while the last call worked."""
        return self._healthy

    @property
    def outage_bound(self) -> float:
        """Seconds within which `healthy` turns False once the socket is gone or hangs.

        A call that was under way when the server went (at most ``timeout``), the wait
        until the next background call (``interval``), and that call's deadline.
        """
        return self.interval + 2 * self.timeout

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._channel.close()

    def refresh(self, timeout: float | None = None) -> bool:
        """Call once and hand the answer to `listed`; never raises, waits about ``timeout`` at most.

        Args:
            timeout: this call's deadline, seconds (default: the source's ``timeout``).

        Returns what `listed` returns, or False when the call failed or another listing
        was already running (it fills in the same data).
        """
        deadline = self.timeout if timeout is None else timeout
        if not self._lock.acquire(timeout=deadline):
            return False
        try:
            self.before_call()
            try:
                response = self._call(self._request, timeout=deadline)
                result = self.listed(response)
            except self._grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                self._fail(getattr(code, "name", "ERROR"), exc.details() if hasattr(exc, "details") else str(exc))
                return False
            except Exception as exc:  # noqa: BLE001 - a broken channel or answer must not reach the collector
                self._fail(type(exc).__name__, str(exc))
                return False
            recovered = self._failures > 0
            self.listings += 1
            self._healthy, self._failures, self.last_code, self.last_error = True, 0, "OK", ""
            if recovered:
                self.recovered()
            return result
        finally:
            self._lock.release()

    def _fail(self, code: str, detail: str) -> None:
        self._healthy = False
        self._failures += 1
        self.last_code, self.last_error = code, detail
        self.failed(first=self._failures == 1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    # ---- what subclasses say -------------------------------------------------------

    def before_call(self) -> None:
        """Called under the lock just before each call."""

    def listed(self, response: Any) -> bool:
        """Take a successful answer in; return the `refresh` result."""
        raise NotImplementedError

    def failed(self, first: bool) -> None:
        """Report a failed call (``last_code``, ``last_error``); ``first`` of a run of failures."""

    def recovered(self) -> None:
        """Report that the socket answers again after failures."""
