"""Recurring network trouble, logged at most once per interval with a count.

A flood makes the same event happen thousands of times a second (an eviction, a refusal,
a failed accept): `ThrottledLog` says it once per `LOG_INTERVAL` with how often it
happened, and `install_accept_error_log` replaces asyncio's traceback per failed accept.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from typing import Any, Callable

from exporter.output.counts import Rejections

# The logger's name is the one these lines have always been logged under.
log = logging.getLogger("exporter.connections")

#: Recurring network trouble (accept errors, evictions, refusals) is logged at most this
#: often, in seconds, each line saying how many times it happened meanwhile.
LOG_INTERVAL = 10.0

_ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


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
