"""Basic auth against the web config's bcrypt hashes (``basic_auth_users``).

`BasicAuthenticator` checks an ``Authorization: Basic`` header on a worker thread with a
bounded queue (`AuthBusy` when it is full), caches successes, and makes every failure
take as long as a check of the dearest configured hash.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from typing import Mapping

#: How long, in seconds, the bcrypt checks ahead of a new one may be expected to take
#: before the new one is refused (503) rather than queued: an admitted check answers well
#: within Prometheus' default 10 s scrape timeout.
AUTH_QUEUE_SECONDS = 2.0
#: bcrypt checks waiting or running at most, whatever their cost.
AUTH_QUEUE_MAX = 64
#: bcrypt checks one client address may have waiting or running at once.
AUTH_QUEUE_PER_CLIENT = 4


class AuthBusy(Exception):
    """Too many bcrypt checks are queued: answer 503 with ``Retry-After`` at once."""


def bcrypt_cost(hashed: str) -> int:
    """The cost (log2 of the rounds) of a ``$2y$NN$...`` hash."""
    return int(hashed.split("$")[2])


@dataclass(frozen=True)
class _Credentials:
    user_bytes: bytes
    user: str | None
    password: bytes


def _parse_basic(header: str | None) -> _Credentials | None:
    """The user and password of an ``Authorization: Basic`` header (None: not one)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except ValueError:
        return None
    user_bytes, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        user: str | None = user_bytes.decode("utf-8")
    except UnicodeDecodeError:
        user = None
    return _Credentials(user_bytes, user, password)


class BasicAuthenticator:
    """Checks ``Authorization: Basic`` against bcrypt hashes, remembering recent successes.

    bcrypt is slow on purpose (about 70 ms at cost 10). A success is cached under an HMAC
    (with a per-process random key) of the user, the hash and the password, so a scraper
    sending the same credentials every 15 s pays once; changing the hash in the file
    invalidates the entry. Failures are not cached.

    Failed logins tell nothing about which users exist: an unknown user is checked against
    a dummy hash of the highest cost among the configured users' hashes, and a configured
    user whose hash is cheaper has a failure padded (asleep, not computing) to what a
    check at that highest cost takes, so every failure costs about the same time.

    Checks run one at a time on a worker thread, so the event loop keeps serving and a
    flood of wrong passwords uses one core at most. The queue is bounded: a check is
    refused at once (`AuthBusy`: 503) when those ahead of it are expected to take more
    than ``queue_seconds``, when ``queue_max`` are queued, or when its client address
    already has ``per_client`` queued. Cached successes never queue.

    Args:
        cache_size: successes remembered.
        queue_seconds, queue_max, per_client: the queue's bounds (see above).
    """

    def __init__(self, cache_size: int = 64, queue_seconds: float = AUTH_QUEUE_SECONDS,
                 queue_max: int = AUTH_QUEUE_MAX, per_client: int = AUTH_QUEUE_PER_CLIENT):
        self._key = os.urandom(32)
        self._cache: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._cache_size = cache_size
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="l9gpu-bcrypt")
        self.queue_seconds = queue_seconds
        self.queue_max = queue_max
        self.per_client = per_client
        # Queue state, touched on the event loop only.
        self._queued = 0
        self._queued_seconds = 0.0  # expected worker time of the checks queued
        self._queued_by: dict[str, int] = {}
        # Written by the worker thread only: dummy hashes and the seconds a check takes, by cost.
        self._dummies: dict[int, str] = {}
        self._seconds: dict[int, float] = {}

    def _cache_key(self, creds: _Credentials, hashed: str) -> bytes:
        return hmac.new(self._key, b"\0".join((creds.user_bytes, hashed.encode(), creds.password)),
                        hashlib.sha256).digest()

    def cached(self, users: Mapping[str, str], header: str | None) -> bool:
        """True when ``header`` carries credentials that passed a check lately (no bcrypt)."""
        creds = _parse_basic(header)
        hashed = users.get(creds.user) if creds is not None and creds.user is not None else None
        if creds is None or hashed is None:
            return False
        key = self._cache_key(creds, hashed)
        if key in self._cache:
            self._cache.move_to_end(key)
            return True
        return False

    def _expected(self, cost: int) -> float:
        """Seconds a check at ``cost`` is expected to take (learned; guessed from cost 10's
        70 ms until one ran)."""
        seconds = dict(self._seconds)  # a copy: the worker thread adds to it
        if cost in seconds:
            return seconds[cost]
        nearest = min(seconds, key=lambda c: abs(c - cost), default=10)
        return seconds.get(nearest, 0.07) * 2.0 ** (cost - nearest)  # each cost step doubles the work

    async def check(self, users: Mapping[str, str], header: str | None, client: str = "") -> bool:
        """True when ``header`` carries a configured user and the right password.

        Raises:
            AuthBusy: the check would wait too long behind others; nothing was checked.
        """
        creds = _parse_basic(header)
        if creds is None or not users:
            return False
        hashed = users.get(creds.user) if creds.user is not None else None
        if hashed is not None and self.cached(users, header):
            return True
        top = max(bcrypt_cost(h) for h in users.values())
        cost = bcrypt_cost(hashed) if hashed is not None else top
        expected = self._expected(cost)
        if self._queued and (self._queued >= self.queue_max or self._queued_seconds + expected > self.queue_seconds):
            raise AuthBusy(f"{self._queued} password checks queued")
        if self._queued_by.get(client, 0) >= self.per_client:
            raise AuthBusy(f"{self._queued_by[client]} password checks queued for this client")
        self._queued += 1
        self._queued_seconds += expected
        self._queued_by[client] = self._queued_by.get(client, 0) + 1
        try:
            loop = asyncio.get_running_loop()
            ok, took, floor = await loop.run_in_executor(self._executor, self._verify, creds.password, hashed, top)
        finally:
            self._queued -= 1
            self._queued_seconds = max(0.0, self._queued_seconds - expected) if self._queued else 0.0
            left = self._queued_by[client] - 1
            if left:
                self._queued_by[client] = left
            else:
                del self._queued_by[client]
        if ok and hashed is not None:
            self._cache[self._cache_key(creds, hashed)] = None
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return True
        if floor > took:
            # a cheaper hash than the dearest configured one: fail no sooner than it would
            await asyncio.sleep(floor - took)
        return False

    def _dummy(self, cost: int) -> str:
        """(Worker thread) a hash of a random password at ``cost``, made once per cost."""
        import bcrypt

        dummy = self._dummies.get(cost)
        if dummy is None:
            started = time.perf_counter()
            dummy = bcrypt.hashpw(base64.b64encode(os.urandom(18)), bcrypt.gensalt(cost)).decode()
            self._learn(cost, time.perf_counter() - started)
            self._dummies[cost] = dummy
        return dummy

    def _learn(self, cost: int, seconds: float) -> None:
        known = self._seconds.get(cost)
        self._seconds[cost] = seconds if known is None else 0.8 * known + 0.2 * seconds

    def _verify(self, password: bytes, hashed: str | None, top: int) -> tuple[bool, float, float]:
        """(Worker thread) check ``password`` against ``hashed`` (None: an unknown user,
        checked against the dummy at cost ``top``).

        Returns:
            (match, seconds the check took, seconds a check at cost ``top`` takes).
        """
        target = hashed if hashed is not None else self._dummy(top)
        started = time.perf_counter()
        ok = _bcrypt_matches(password, target)
        took = time.perf_counter() - started
        cost = bcrypt_cost(target)
        self._learn(cost, took)
        if ok or cost >= top:
            return ok, took, 0.0
        self._dummy(top)  # so that what a check at the top cost takes is known
        return ok, took, self._seconds[top]

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _bcrypt_matches(password: bytes, hashed: str) -> bool:
    import bcrypt

    try:
        return bool(bcrypt.checkpw(password, hashed.encode()))  # constant-time comparison inside
    except ValueError:  # over 72 bytes, or a hash bcrypt cannot read: not a match
        return False
