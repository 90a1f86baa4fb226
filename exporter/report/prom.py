"""A small client for the Prometheus HTTP API (``/api/v1/query`` and ``query_range``).

Authentication and TLS as in a Prometheus scrape config or promtool: a bearer token (or
a file holding one), basic auth (password or password file), a CA file, a client
certificate and key, or no verification at all for a lab; extra request headers
(``--header``) for the multi-tenant Prometheus-compatible servers that want one, such as
Grafana Mimir's and Cortex's ``X-Scope-OrgID``. Queries go out as POST forms (long
selectors fit), a few at a time over one connection pool.

Every failure becomes a `PrometheusError` with one line that says what to fix: a server
that cannot be reached, refuses a query, or answers something that is not the API's
shape (the answer is checked before it is used, so a broken or hostile server never
causes a traceback). A range query the server refuses as more than it loads at once (a
default Prometheus keeps 50 M samples per query) is asked again as two halves of its
range, and so on down to one step, and the answers joined: a large fleet's month needs no
server setting raised. An answer is read up to ``max_response_bytes`` and no further. The
values of the token, the password and the extra headers never appear in a message, even
when the server echoes them back, and text from the server is escaped for the terminal.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import unquote, urlsplit, urlunsplit

from exporter.core.escape import for_terminal
from exporter.report.progress import Progress

#: Default cap on one answer's size (decompressed), in bytes: ``--max-response-bytes``.
DEFAULT_MAX_RESPONSE_BYTES = 256 * 2**20
#: Answers are read side by side up to this size each; one that grows past it is read (and
#: parsed) alone while the others wait at it, so the answers held at once stay under
#: ``--max-response-bytes`` plus ``concurrency - 1`` times this, whatever the server sends.
SIDE_BY_SIDE_BYTES = 16 * 2**20
# Secrets shorter than this are not searched for in messages (they would garble them).
_SHORTEST_REDACTED = 4
_READ_CHUNK = 64 * 1024
# RFC 9110 token characters: what a header name may be made of.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# Visible ASCII, space and tab: what a header value may hold here.
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]*$")
# Headers the HTTP client writes itself (framing, connection management).
_RESERVED_HEADERS = frozenset({"content-length", "content-type", "transfer-encoding", "connection", "upgrade",
                               "te", "trailer", "expect", "keep-alive", "proxy-connection"})
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKMGT]i?B|B)?\s*$")
# How a server says a query is more than it evaluates at once: Prometheus, Thanos and
# Mimir ("query processing would load too many samples into memory", --query.max-samples;
# "query timed out in expression evaluation", --query.timeout), VictoriaMetrics ("cannot
# select more than -search.maxSamplesPerQuery=N samples", "too many points ...
# -search.maxPointsPerTimeseries"), Mimir's chunk and sample limits.
_TOO_LARGE = re.compile(r"too many (samples|points)|maxSamplesPerQuery|maxPointsPerTimeseries|"
                        r"maximum number of (samples|chunks)|query timed out", re.IGNORECASE)
_SIZE_UNITS = {None: 1, "B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KiB": 2**10, "kiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


class PrometheusError(Exception):
    """Prometheus could not be reached, refused a query or answered nonsense (one line)."""


class QueryTooLarge(PrometheusError):
    """The server refused a query as more than it evaluates at once (too many samples,
    points or chunks, or its own time limit): a shorter range may be answered."""


@dataclass(frozen=True)
class PrometheusConfig:
    """Where Prometheus is and how to authenticate to it.

    ``headers`` are extra (name, value) request headers; ``max_response_bytes`` caps
    one answer. Secrets are left out of the repr.
    """

    url: str
    bearer_token: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    timeout: float = 120.0
    concurrency: int = 4
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES

    @property
    def header_names(self) -> list[str]:
        """The names of the extra headers (their values may be secrets)."""
        return [name for name, _ in self.headers]


def parse_size(text: str) -> int:
    """A size in bytes from ``268435456``, ``256MiB``, ``64MB``, ``1.5GiB`` (kB, MB, GB
    are powers of 1000; KiB, MiB, GiB of 1024).

    Raises:
        ValueError: not a size, or not above zero.
    """
    match = _SIZE.match(str(text))
    if not match or match.group(2) not in _SIZE_UNITS:
        raise ValueError(f"invalid size {text!r}: use bytes or a unit, e.g. 256MiB, 64MB, 1GiB")
    size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
    if size <= 0:
        raise ValueError(f"invalid size {text!r}: must be above zero")
    return size


def parse_header(text: str, position: int) -> tuple[str, str]:
    """One ``--header 'Name: value'`` flag as (name, value), the value's surrounding
    spaces removed.

    A mistake is a ValueError naming the flag by its position (``--header #2``) and the
    header by its name, never showing the value, which may be a credential.
    """
    name, colon, value = str(text).partition(":")
    name, value = name.strip(), value.strip(" \t")
    if not colon or not name:
        raise ValueError(f"--header #{position}: expected 'Name: value', e.g. 'X-Scope-OrgID: tenant-1'")
    if not _HEADER_NAME.match(name):
        raise ValueError(f"--header #{position}: the text before ':' is not a header name (letters, digits and "
                         "!#$%&'*+-.^_`|~; expected 'Name: value')")
    if not value:
        raise ValueError(f"--header {name}: the value is empty")
    if not _HEADER_VALUE.match(value):
        raise ValueError(f"--header {name}: the value holds a control or non-ASCII character")
    if name.lower() in _RESERVED_HEADERS:
        raise ValueError(f"--header {name}: the HTTP client sets this header itself")
    return name, value


def _read_secret(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None


def config_from_args(url: str, *, bearer_token: str | None = None, bearer_token_file: str | None = None,
                     username: str | None = None, password: str | None = None, password_file: str | None = None,
                     ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                     insecure_skip_verify: bool = False, timeout: float = 120.0, headers: Sequence[str] = (),
                     max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> PrometheusConfig:
    """Validate the connection flags (one ValueError line for the first mistake).

    ``headers`` are the ``--header 'Name: value'`` flags (see `parse_header`); a name
    given twice, or an ``Authorization`` header beside ``--bearer-token`` or
    ``--username``, is a mistake.
    """
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
    parsed: list[tuple[str, str]] = []
    for position, text in enumerate(headers, 1):
        name, value = parse_header(text, position)
        if any(name.lower() == seen.lower() for seen, _ in parsed):
            raise ValueError(f"--header {name}: given twice (put several values in one header)")
        if name.lower() == "authorization" and (bearer_token or username):
            raise ValueError("--header Authorization and --bearer-token or --username: give one")
        parsed.append((name, value))
    if max_response_bytes <= 0:
        raise ValueError("--max-response-bytes must be above zero")
    return PrometheusConfig(url.rstrip("/"), bearer_token or None, username or None,
                            (password or "") if username else None, ca_file, cert_file, key_file,
                            insecure_skip_verify, timeout, headers=tuple(parsed),
                            max_response_bytes=max_response_bytes)


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

    def __init__(self, config: PrometheusConfig, progress: Progress | None = None):
        self.config = config
        self._progress = progress or Progress()  # counts the queries asked and answered
        self._session: Any = None
        self._limit = asyncio.Semaphore(config.concurrency)
        self._large = asyncio.Semaphore(1)  # held by the one answer read past SIDE_BY_SIDE_BYTES
        self.queries = 0
        self.splits = 0  # range queries refused as too large and asked again as two halves
        self._failure: PrometheusError | None = None
        self._headers = self._request_headers()
        # Every credential as it could come back in an answer, longest first (a token
        # inside its "Bearer ..." header is replaced whole).
        secrets = {value for _, value in config.headers}
        secrets.update(v for v in (config.bearer_token, config.password, self._headers.get("Authorization")) if v)
        self._secrets = sorted((s for s in secrets if len(s) >= _SHORTEST_REDACTED), key=len, reverse=True)

    def _request_headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "l9gpu-report"}
        if self.config.bearer_token:
            headers["Authorization"] = f"Bearer {self.config.bearer_token}"
        elif self.config.username:
            pair = f"{self.config.username}:{self.config.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        for name, value in self.config.headers:  # the user's wins, whatever its case
            for known in [k for k in headers if k.lower() == name.lower()]:
                del headers[known]
            headers[name] = value
        return headers

    def error(self, message: str, kind: type[PrometheusError] = PrometheusError) -> PrometheusError:
        """A `PrometheusError` (or ``kind``) whose message shows no credential and no control
        character."""
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return kind(for_terminal(message))

    async def __aenter__(self) -> Prometheus:
        import aiohttp

        connector = aiohttp.TCPConnector(ssl=_ssl_context(self.config), limit=self.config.concurrency)
        self._session = aiohttp.ClientSession(headers=self._headers, connector=connector,
                                              timeout=aiohttp.ClientTimeout(total=self.config.timeout))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._session.close()

    async def _read(self, resp: Any) -> tuple[bytearray, bool]:
        """The answer's body, decompressed, or an error once it passes the size cap; and
        whether it holds ``_large`` (grown past `SIDE_BY_SIDE_BYTES`: the caller releases it
        once the body is parsed)."""
        cap = self.config.max_response_bytes
        if resp.content_length is not None and resp.content_length > cap:
            raise self.error(f"Prometheus at {self.config.url} answered {resp.content_length} bytes, more than "
                             f"--max-response-bytes {cap}; narrow the period or the --selector, or raise the cap")
        body = bytearray()
        large = False
        try:
            async for chunk in resp.content.iter_chunked(_READ_CHUNK):
                if len(body) + len(chunk) > cap:
                    raise self.error(f"Prometheus at {self.config.url} sent an answer over --max-response-bytes "
                                     f"{cap} and was cut off; narrow the period or the --selector, or raise the cap")
                if not large and len(body) + len(chunk) > SIDE_BY_SIDE_BYTES:
                    await self._large.acquire()  # the server waits meanwhile (TCP's flow control)
                    large = True
                    if self._failure is not None:  # an answer read before this one failed the report
                        raise PrometheusError(str(self._failure))
                body += chunk
        except BaseException:
            if large:
                self._large.release()
            raise
        return body, large

    async def _call(self, path: str, form: dict[str, str], splittable: bool = False) -> Any:
        """POST one query; the answer's ``data``. The first failure fails every later call
        at once: the report needs every answer, so the rest would be read for nothing.
        A `QueryTooLarge` of a ``splittable`` query is raised alone, for the caller to ask
        again in parts."""
        self._progress.asked()
        try:
            async with self._limit:
                if self._failure is not None:
                    raise PrometheusError(str(self._failure))
                try:
                    return await self._post(path, form)
                except QueryTooLarge as exc:
                    if splittable:
                        raise
                    self._failure = self.error(
                        f"{exc}; the report cannot ask it in smaller parts: raise the server's limit (Prometheus, "
                        "Thanos: --query.max-samples, --query.timeout; VictoriaMetrics: -search.maxSamplesPerQuery), "
                        "or report a shorter period or a narrower --selector")
                    raise self._failure from None
                except PrometheusError as exc:
                    self._failure = exc
                    raise
        finally:
            self._progress.answered()

    async def _post(self, path: str, form: dict[str, str]) -> Any:
        import aiohttp

        url = self.config.url + path
        self.queries += 1
        try:
            async with self._session.post(url, data=form) as resp:
                status = resp.status
                body, large = await self._read(resp)
        except aiohttp.ClientSSLError as exc:
            raise self.error(f"TLS with {self.config.url} failed: {_reason(exc)} "
                             "(--ca-file, --cert-file/--key-file, --insecure-skip-verify)") from None
        except aiohttp.ClientError as exc:
            raise self.error(f"cannot reach Prometheus at {self.config.url}: {_reason(exc)}") from None
        except asyncio.TimeoutError:
            raise self.error(f"Prometheus at {self.config.url} did not answer within "
                             f"{self.config.timeout:g}s (--timeout)") from None
        try:
            if status in (401, 403):
                raise self.error(f"Prometheus at {self.config.url} refused the credentials (HTTP {status}); "
                                 "check --bearer-token, --username/--password or --header")
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
                doc = None
        finally:
            if large:
                self._large.release()
        if not isinstance(doc, dict):
            raise self.error(f"{url}: HTTP {status}, not a Prometheus API answer "
                             f"({body[:80].decode(errors='replace')!r}); is --prometheus the server's "
                             "base URL?")
        if doc.get("status") != "success":
            error, kind = _text(doc.get("error", "")), _text(doc.get("errorType", ""))
            raise self.error(f"Prometheus refused a query (HTTP {status}, {kind}): {error}",
                             QueryTooLarge if _TOO_LARGE.search(error) else PrometheusError)
        return doc.get("data")

    def _malformed(self, where: str, problem: str) -> PrometheusError:
        self._failure = self.error(f"Prometheus at {self.config.url} gave an answer that is not the Prometheus API's "
                          f"({where}: {problem}); is --prometheus a Prometheus-compatible API?")
        return self._failure

    async def query(self, expr: str, at: float, expect: str | None = None) -> list[dict[str, Any]]:
        """An instant query at ``at``; the result list.

        Args:
            expr: PromQL.
            at: evaluation time, Unix seconds.
            expect: "vector" or "matrix" (a range selector); None takes either.

        Returns:
            The series, checked (see `checked_result`), without NaN or infinite samples.
        """
        data = await self._call("/api/v1/query", {"query": expr, "time": _ts(at)})
        return self.checked_result(data, (expect,) if expect else ("vector", "matrix"))

    async def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query; every series with its ``values`` (checked as by `checked_result`).

        Refused as too large (`QueryTooLarge`), it is asked again as two queries, each for
        half of its steps, which run side by side, and their answers joined: the same
        points, as each step is evaluated alone."""
        points = int((end - start) / step + 1e-6) + 1 if end >= start else 1  # float seconds: 2.9999999 is 3
        try:
            data = await self._call("/api/v1/query_range",
                                    {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)},
                                    splittable=points > 1)
        except QueryTooLarge:
            self.splits += 1
            middle = start + (points // 2) * step
            first, second = await all_of(self.query_range(expr, start, middle - step, step),
                                         self.query_range(expr, middle, end, step))
            return _joined(first, second)
        return self.checked_result(data, ("matrix",))

    def checked_result(self, data: Any, expect: Sequence[str]) -> list[dict[str, Any]]:
        """The ``result`` of an answer's ``data``, each series checked and rebuilt.

        A matrix series comes back as ``{"metric": {...}, "values": [(ts, value), ...]}``
        and a vector one as ``{"metric": {...}, "value": (ts, value)}``: labels are
        strings, timestamps finite numbers, values floats. NaN and infinite samples are
        left out (a vector series whose value is one, entirely): a counter has no such
        value, and a sum with one would be no figure at all.

        Raises:
            PrometheusError: the answer is not of that shape (one line saying where).
        """
        if not isinstance(data, dict):
            raise self._malformed("data", f"{_kind(data)}, not an object")
        kind = data.get("resultType")
        if kind not in expect:
            raise self._malformed("data.resultType", f"{_show(kind)}, expected {' or '.join(expect)}")
        result = data.get("result")
        if result is None:
            return []
        if not isinstance(result, list):
            raise self._malformed("data.result", f"{_kind(result)}, not a list")
        out = []
        for i, series in enumerate(result):
            where = f"data.result[{i}]"
            if not isinstance(series, dict):
                raise self._malformed(where, f"{_kind(series)}, not an object")
            metric = series.get("metric")
            if not isinstance(metric, dict):
                raise self._malformed(f"{where}.metric", "missing" if metric is None else f"{_kind(metric)}, "
                                      "not an object")
            for name, value in metric.items():
                if not isinstance(value, str):
                    raise self._malformed(f"{where}.metric.{_show(name)}", f"{_kind(value)}, not a string")
            if kind == "vector":
                point = self._point(series.get("value"), f"{where}.value")
                if point is not None:
                    out.append({"metric": metric, "value": point})
                continue
            values = series.get("values")
            if values is None and "histograms" in series:
                values = []  # native histograms only: no float samples
            if not isinstance(values, list):
                raise self._malformed(f"{where}.values", "missing" if values is None else f"{_kind(values)}, "
                                      "not a list")
            points = (self._point(p, f"{where}.values[{j}]") for j, p in enumerate(values))
            out.append({"metric": metric, "values": [p for p in points if p is not None]})
        return out

    def _point(self, point: Any, where: str) -> tuple[float, float] | None:
        """One [timestamp, "value"] pair as numbers; None for a NaN or infinite value."""
        if not isinstance(point, (list, tuple)) or len(point) != 2:
            raise self._malformed(where, f"{_show(point)}, not a [timestamp, value] pair")
        ts, raw = point
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
            raise self._malformed(f"{where}[0]", f"{_show(ts)}, not a timestamp")
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise self._malformed(f"{where}[1]", f"{_show(raw)}, not a number")
        try:
            value = float(raw)
        except ValueError:
            raise self._malformed(f"{where}[1]", f"{_show(raw)}, not a number") from None
        return (ts, value) if math.isfinite(value) else None


async def all_of(*awaitables: Any) -> list[Any]:
    """The results of ``awaitables`` run together; the first failure is raised once all
    have finished, so no failed query is left for asyncio to report at shutdown (a TLS or
    auth error fails every query at once, and the user gets one line, not tracebacks)."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _joined(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two range answers for consecutive ranges as one: each series' points in order."""
    by_labels = {tuple(sorted(s["metric"].items())): s for s in first}
    for series in second:
        earlier = by_labels.get(tuple(sorted(series["metric"].items())))
        if earlier is None:
            first.append(series)
        else:
            earlier["values"].extend(series["values"])
    return first


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:200]


def _kind(value: Any) -> str:
    """What a JSON value is, for a message: "a list", "a string 'x'", "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"a number {value!r}"
    if isinstance(value, str):
        return f"a string {_show(value)}"
    return "a list" if isinstance(value, list) else "an object"


def _show(value: Any) -> str:
    """A value from an answer, short and quoted, for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(value: Any) -> str:
    """A server's error text, one line of at most 300 characters."""
    text = " ".join(str(value).split())
    return text if len(text) <= 300 else text[:297] + "..."
