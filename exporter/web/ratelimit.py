"""The web config's ``rate_limit``: a token bucket per client address.

Only requests that still need a password check are charged (`exporter.web.access`):
credentials that passed lately never are.
"""

from __future__ import annotations

import collections
import math
from typing import Callable

from exporter.web.webconfig import RateLimit

#: Client addresses whose rate-limit buckets are remembered (least recently seen dropped).
RATE_LIMIT_CLIENTS = 4096


class _TokenBucket:
    def __init__(self, limit: RateLimit, clock: Callable[[], float]):
        self.limit = limit
        self._clock = clock
        self._tokens = float(limit.burst)
        self._at = clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(float(self.limit.burst), self._tokens + (now - self._at) / self.limit.interval)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def retry_after(self) -> int:
        """Whole seconds until the next token (at least 1), for ``Retry-After``."""
        return max(1, math.ceil((1.0 - self._tokens) * self.limit.interval))


class ClientRateLimiter:
    """``rate_limit`` per client address: a token bucket each, the least recently seen
    forgotten beyond ``max_clients`` (a forgotten client starts again with a full burst).

    Args:
        limit: the bucket's refill interval and burst.
        clock: monotonic seconds.
        max_clients: buckets remembered at most.
    """

    def __init__(self, limit: RateLimit, clock: Callable[[], float], max_clients: int = RATE_LIMIT_CLIENTS):
        self.limit = limit
        self._clock = clock
        self._max = max_clients
        self._buckets: collections.OrderedDict[str, _TokenBucket] = collections.OrderedDict()

    def allow(self, client: str) -> int | None:
        """None when ``client`` may go on (a token is taken); else the seconds to wait."""
        bucket = self._buckets.pop(client, None) or _TokenBucket(self.limit, self._clock)
        self._buckets[client] = bucket
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return None if bucket.allow() else bucket.retry_after()
