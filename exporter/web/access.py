"""What the web config does to each request: client SANs, rate limit, basic auth, headers.

/healthz and /readyz answer without basic auth (kubelet probes cannot send credentials);
/metrics, the page at /, /api/v1/snapshot and everything else need it when users are configured.
Every refusal is counted by reason (`exporter.output.counts.Rejections`).
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable

from aiohttp import web

from exporter.output.counts import Rejections
from exporter.web.auth import AuthBusy, BasicAuthenticator
from exporter.web.ratelimit import ClientRateLimiter
from exporter.web.webconfig import WebConfig

#: Paths that answer without credentials: kubelet and systemd probes cannot send any.
EXEMPT_PATHS = frozenset({"/healthz", "/readyz"})


def _peer_sans(request: web.Request) -> set[str]:
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    return {str(value) for _, value in (cert or {}).get("subjectAltName", ())}




class AccessControl:
    """Applies the web config in force to every request (`middleware`).

    Args:
        config: the web config in force now, read on every request (a reload applies at once).
        clock: monotonic seconds, for the rate limit.
        rejections: where refused requests are counted (403, 429, 503, 401).
    """

    def __init__(self, config: Callable[[], WebConfig], clock: Callable[[], float] = time.monotonic,
                 rejections: Rejections | None = None):
        self.rejections = rejections if rejections is not None else Rejections()
        self._config = config
        self._clock = clock
        self._auth = BasicAuthenticator()
        self._limiter: ClientRateLimiter | None = None

    def reset(self) -> None:
        """A new configuration was loaded: every client starts again with a full burst."""
        self._limiter = None

    def close(self) -> None:
        self._auth.close()

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """aiohttp middleware: client SANs, rate limit and basic auth, then response headers."""
        config = self._config()
        try:
            denied = await self._guard(config, request)
            response = denied if denied is not None else await handler(request)
        except web.HTTPException as exc:
            exc.headers.update(config.headers)
            raise
        response.headers.update(config.headers)
        return response

    async def _guard(self, config: WebConfig, request: web.Request) -> web.StreamResponse | None:
        tls = config.tls
        if tls is not None and tls.client_allowed_sans and not (_peer_sans(request) & set(tls.client_allowed_sans)):
            self.rejections.add("client_cert_not_allowed")
            return web.Response(status=403, text="client certificate not allowed\n")
        if request.path in EXEMPT_PATHS:
            return None
        header = request.headers.get("Authorization")
        if config.users and self._auth.cached(config.users, header):
            return None  # a credential that passed lately: no bcrypt, no rate limit
        client = request.remote or ""
        if config.rate_limit is not None:
            if self._limiter is None or self._limiter.limit != config.rate_limit:
                self._limiter = ClientRateLimiter(config.rate_limit, self._clock)
            wait = self._limiter.allow(client)
            if wait is not None:
                self.rejections.add("rate_limited")
                return web.Response(status=429, text="too many requests from this address\n",
                                    headers={"Retry-After": str(wait)})
        if config.users:
            try:
                ok = await self._auth.check(config.users, header, client)
            except AuthBusy:
                self.rejections.add("auth_busy")
                return web.Response(status=503, text="too many password checks queued; retry shortly\n",
                                    headers={"Retry-After": "1"})
            if not ok:
                self.rejections.add("auth_failed")
                return web.Response(status=401, text="unauthorized\n",
                                    headers={"WWW-Authenticate": 'Basic realm="l9gpu", charset="UTF-8"'})
        return None
