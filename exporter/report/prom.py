"""A small client for the Prometheus HTTP API (``/api/v1/query`` and ``query_range``).

Authentication and TLS as in a Prometheus scrape config or promtool: a bearer token (or
a file holding one), basic auth (password or password file), a CA file, a client
certificate and key, or no verification at all for a lab. Queries go out as POST forms
(long selectors fit), a few at a time over one connection pool. Every failure becomes a
`PrometheusError` with one line that says what to fix.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit


class PrometheusError(Exception):
    """Prometheus could not be reached or refused a query (one line)."""


@dataclass(frozen=True)
class PrometheusConfig:
    """Where Prometheus is and how to authenticate to it."""

    url: str
    bearer_token: str | None = None
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    timeout: float = 120.0
    concurrency: int = 4


def _read_secret(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None


def config_from_args(url: str, *, bearer_token: str | None = None, bearer_token_file: str | None = None,
                     username: str | None = None, password: str | None = None, password_file: str | None = None,
                     ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                     insecure_skip_verify: bool = False, timeout: float = 120.0) -> PrometheusConfig:
    """Validate the connection flags (one ValueError line for the first mistake)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = url if parts.password is None else url.replace(parts.password, "***")
        raise ValueError(f"--prometheus {shown!r}: expected an http:// or https:// URL, e.g. http://prometheus:9090")
    if parts.username is not None:  # user:password@host: basic auth, kept out of the report
        username = username or unquote(parts.username)
        if password is None and password_file is None and parts.password is not None:
            password = unquote(parts.password)
        netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        netloc += f":{parts.port}" if parts.port else ""
        url = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    if bearer_token and bearer_token_file:
        raise ValueError("--bearer-token and --bearer-token-file: give one")
    if bearer_token_file:
        bearer_token = _read_secret(bearer_token_file, "--bearer-token-file")
    if password and password_file:
        raise ValueError("--password and --password-file: give one")
    if password_file:
        password = _read_secret(password_file, "--password-file")
    if (password is not None) and not username:
        raise ValueError("--password needs --username")
    if bearer_token and username:
        raise ValueError("--bearer-token and --username: use one kind of authentication")
    if bool(cert_file) != bool(key_file):
        raise ValueError("--cert-file and --key-file go together")
    for flag, path in (("--ca-file", ca_file), ("--cert-file", cert_file), ("--key-file", key_file)):
        if path and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
    return PrometheusConfig(url.rstrip("/"), bearer_token or None, username or None,
                            (password or "") if username else None, ca_file, cert_file, key_file,
                            insecure_skip_verify, timeout)


def _ssl_context(config: PrometheusConfig) -> ssl.SSLContext | bool:
    if not config.url.startswith("https:"):
        return True
    try:
        context = ssl.create_default_context(cafile=config.ca_file)
        if config.cert_file:
            context.load_cert_chain(config.cert_file, config.key_file)
    except (ssl.SSLError, OSError) as exc:
        raise PrometheusError(f"TLS files: {exc}") from None
    if config.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class Prometheus:
    """An open connection pool to one Prometheus (use as ``async with``)."""

    def __init__(self, config: PrometheusConfig):
        self.config = config
        self._session: Any = None
        self._limit = asyncio.Semaphore(config.concurrency)
        self.queries = 0

    async def __aenter__(self) -> Prometheus:
        import aiohttp

        headers = {"Accept": "application/json", "User-Agent": "l9gpu-report"}
        if self.config.bearer_token:
            headers["Authorization"] = f"Bearer {self.config.bearer_token}"
        elif self.config.username:
            pair = f"{self.config.username}:{self.config.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        connector = aiohttp.TCPConnector(ssl=_ssl_context(self.config), limit=self.config.concurrency)
        self._session = aiohttp.ClientSession(headers=headers, connector=connector,
                                              timeout=aiohttp.ClientTimeout(total=self.config.timeout))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._session.close()

    async def _call(self, path: str, form: dict[str, str]) -> Any:
        import aiohttp

        url = self.config.url + path
        async with self._limit:
            self.queries += 1
            try:
                async with self._session.post(url, data=form) as resp:
                    body = await resp.read()
                    status = resp.status
            except aiohttp.ClientSSLError as exc:
                raise PrometheusError(f"TLS with {self.config.url} failed: {_reason(exc)} "
                                      "(--ca-file, --cert-file/--key-file, --insecure-skip-verify)") from None
            except aiohttp.ClientError as exc:
                raise PrometheusError(f"cannot reach Prometheus at {self.config.url}: {_reason(exc)}") from None
            except asyncio.TimeoutError:
                raise PrometheusError(f"Prometheus at {self.config.url} did not answer within "
                                      f"{self.config.timeout:g}s (--timeout)") from None
        if status in (401, 403):
            raise PrometheusError(f"Prometheus at {self.config.url} refused the credentials (HTTP {status}); "
                                  "check --bearer-token or --username/--password")
        try:
            doc = json.loads(body)
        except ValueError:
            raise PrometheusError(f"{url}: HTTP {status}, not a Prometheus API answer "
                                  f"({body[:80].decode(errors='replace')!r}); is --prometheus the server's "
                                  "base URL?") from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            error = doc.get("error", "") if isinstance(doc, dict) else ""
            kind = doc.get("errorType", "") if isinstance(doc, dict) else ""
            raise PrometheusError(f"Prometheus refused a query (HTTP {status}, {kind}): {error}")
        return doc["data"]

    async def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """An instant query at ``at``; the result list (vector or matrix)."""
        data = await self._call("/api/v1/query", {"query": expr, "time": _ts(at)})
        return list(data.get("result") or [])

    async def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query; every series with its ``values``."""
        data = await self._call("/api/v1/query_range",
                                {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)})
        return list(data.get("result") or [])


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]
