"""TLS, basic auth and response headers for the HTTP endpoints, from a web config file.

The file has the format of Prometheus exporter-toolkit's web configuration (the
``--web.config.file`` of node_exporter and friends), so a file written for another
exporter works here unchanged::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to the file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    http_server_config:
      headers: {X-Frame-Options: deny}
    basic_auth_users:
      alice: $2y$10$...              # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')

`parse_web_config` turns the parsed YAML into a frozen `WebConfig` (pure: it reads no
files), `load_web_config` reads the file, checks every file it names and builds the TLS
context once to prove it works. Every error is a `ValueError` with one line naming the
file and the key. `WebConfigWatcher` re-reads the file (and the certificate files it
names) when their modification times change, checked at most once a second; a file that
no longer loads is logged and the last good configuration stays in force.

/healthz and /readyz answer without basic auth (kubelet probes cannot send credentials);
/metrics, the page at /, /api/v1/snapshot and everything else need it when users are configured.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import dataclasses
import hashlib
import hmac
import logging
import math
import os
import re
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Awaitable, Callable, Mapping

from aiohttp import web

from exporter.connections import Rejections
from exporter.parsing import parse_duration_or_seconds

log = logging.getLogger(__name__)

#: Paths that answer without credentials: kubelet and systemd probes cannot send any.
EXEMPT_PATHS = frozenset({"/healthz", "/readyz"})

#: exporter-toolkit's client_auth_type values (Go's tls.ClientAuthType names) mapped to
#: Python's verify modes. Python cannot ask for a client certificate without verifying it:
#: RequestClientCert (asked for, never verified, so it refuses nobody) serves as
#: CERT_NONE, and RequireAnyClientCert is verified against the client CA (stricter than
#: Go's, which checks only that a certificate was sent).
CLIENT_AUTH_TYPES: Mapping[str, ssl.VerifyMode] = MappingProxyType({
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
})

TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = MappingProxyType({
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
})

_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
_TLS_KEYS = ("cert_file", "key_file", "cert", "key", "client_auth_type", "client_ca_file", "client_ca",
             "client_allowed_sans", "min_version", "max_version", "cipher_suites", "curve_preferences",
             "prefer_server_cipher_suites")
_HTTP_KEYS = ("http2", "headers")
_RATE_KEYS = ("interval", "burst")
# Headers the server sets itself; exporter-toolkit refuses these too.
_RESERVED_HEADERS = frozenset(h.lower() for h in (
    "Authorization", "Content-Encoding", "Content-Length", "Content-Type", "Connection", "Server",
    "Transfer-Encoding", "Vary", "WWW-Authenticate", "Date"))
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HEADER_VALUES = {"x-frame-options": ("deny", "sameorigin"), "x-content-type-options": ("nosniff",)}
_BCRYPT = re.compile(r"^\$2[abxy]?\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")


@dataclass(frozen=True)
class TLSServerConfig:
    """``tls_server_config``: file paths are absolute (resolved against the file's directory)."""

    cert_file: str = ""
    key_file: str = ""
    # PEM text: inline in the file, or what load_web_config read from the *_file paths
    cert: str = ""
    key: str = field(default="", repr=False)
    client_auth_type: str = "NoClientCert"
    client_ca_file: str = ""
    client_ca: str = ""
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    prefer_server_cipher_suites: bool = True
    cipher_suites: tuple[str, ...] = ()
    curve_preferences: tuple[str, ...] = ()

    @property
    def verify_mode(self) -> ssl.VerifyMode:
        return CLIENT_AUTH_TYPES[self.client_auth_type]

    def files(self) -> tuple[tuple[str, str], ...]:
        """(key, path) of every file this section names."""
        return tuple((k, p) for k, p in (("cert_file", self.cert_file), ("key_file", self.key_file),
                                          ("client_ca_file", self.client_ca_file)) if p)


@dataclass(frozen=True)
class RateLimit:
    """``rate_limit``: a token bucket, one token every ``interval`` seconds, ``burst`` at most."""

    interval: float
    burst: int


@dataclass(frozen=True)
class WebConfig:
    """A loaded web config file. The empty file means plain HTTP, no auth."""

    path: str
    tls: TLSServerConfig | None = None
    headers: tuple[tuple[str, str], ...] = ()
    http2: bool = True
    users: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    rate_limit: RateLimit | None = None

    def files(self) -> tuple[str, ...]:
        """The file itself and every file it names: a change to any of them reloads."""
        return (self.path, *(p for _, p in (self.tls.files() if self.tls else ())))


def _fail(path: str, key: str, message: str) -> ValueError:
    return ValueError(f"{path}: {key}: {message}" if key else f"{path}: {message}")


def _mapping(path: str, key: str, value: Any, allowed: tuple[str, ...] | None) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, key, f"must be a mapping, not {type(value).__name__}")
    if allowed is not None:
        for name in value:
            if name not in allowed:
                where = f"{key}.{name}" if key else str(name)
                raise _fail(path, where, f"unknown key (known: {', '.join(allowed)})")
    return value


def _string(path: str, key: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _fail(path, key, f"must be a string, not {type(value).__name__}")
    return value


def _strings(path: str, key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(path, key, "must be a list of strings")
    return tuple(value)


def _choice(path: str, key: str, value: Any, default: str, choices: Mapping[str, Any]) -> str:
    text = _string(path, key, value) or default
    if text not in choices:
        raise _fail(path, key, f"{text!r} is not one of {', '.join(choices)}")
    return text


def _resolve(base: str, file: str) -> str:
    return file if not file or os.path.isabs(file) else os.path.join(base, file)


def _parse_tls(path: str, raw: Any) -> TLSServerConfig | None:
    section = "tls_server_config"
    data = _mapping(path, section, raw, _TLS_KEYS)
    k = {name: f"{section}.{name}" for name in _TLS_KEYS}
    base = os.path.dirname(os.path.abspath(path))
    files = {n: _resolve(base, _string(path, k[n], data.get(n))) for n in ("cert_file", "key_file", "client_ca_file")}
    inline = {n: _string(path, k[n], data.get(n)) for n in ("cert", "key", "client_ca")}
    auth_given = data.get("client_auth_type") is not None
    # As exporter-toolkit: a section without certificate, key or client settings is plain HTTP.
    if not any(files.values()) and not any(inline.values()) and not auth_given:
        for n in _TLS_KEYS:  # still validate what is there
            if n in ("min_version", "max_version") and data.get(n) is not None:
                _choice(path, k[n], data.get(n), "TLS12", TLS_VERSIONS)
        return None
    for inline_key, file_key in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if inline[inline_key] and files[file_key]:
            raise _fail(path, k[file_key], f"give either {inline_key} or {file_key}, not both")
    if not files["cert_file"] and not inline["cert"]:
        raise _fail(path, k["cert_file"], "missing: TLS needs a certificate (cert_file or cert)")
    if not files["key_file"] and not inline["key"]:
        raise _fail(path, k["key_file"], "missing: TLS needs a private key (key_file or key)")
    auth = _choice(path, k["client_auth_type"], data.get("client_auth_type"), "NoClientCert", CLIENT_AUTH_TYPES)
    has_ca = bool(files["client_ca_file"] or inline["client_ca"])
    if has_ca and auth == "NoClientCert":
        raise _fail(path, k["client_ca_file"], "a client CA is set but client_auth_type is NoClientCert; "
                                               "use RequireAndVerifyClientCert to require client certificates")
    if CLIENT_AUTH_TYPES[auth] != ssl.CERT_NONE and not has_ca:
        raise _fail(path, k["client_ca_file"], f"missing: client_auth_type {auth} verifies client certificates "
                                               "against a client CA (client_ca_file or client_ca)")
    sans = _strings(path, k["client_allowed_sans"], data.get("client_allowed_sans"))
    if sans and auth not in ("RequireAnyClientCert", "RequireAndVerifyClientCert"):
        raise _fail(path, k["client_allowed_sans"], "needs client_auth_type RequireAndVerifyClientCert "
                                                    "(or RequireAnyClientCert)")
    min_version = _choice(path, k["min_version"], data.get("min_version"), "TLS12", TLS_VERSIONS)
    max_version = _choice(path, k["max_version"], data.get("max_version"), "TLS13", TLS_VERSIONS)
    if TLS_VERSIONS[min_version] > TLS_VERSIONS[max_version]:
        raise _fail(path, k["min_version"], f"{min_version} is above max_version {max_version}")
    prefer = data.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise _fail(path, k["prefer_server_cipher_suites"], "must be true or false")
    return TLSServerConfig(
        cert_file=files["cert_file"], key_file=files["key_file"], cert=inline["cert"], key=inline["key"],
        client_auth_type=auth, client_ca_file=files["client_ca_file"], client_ca=inline["client_ca"],
        client_allowed_sans=sans, min_version=min_version, max_version=max_version,
        prefer_server_cipher_suites=prefer,
        cipher_suites=_strings(path, k["cipher_suites"], data.get("cipher_suites")),
        curve_preferences=_strings(path, k["curve_preferences"], data.get("curve_preferences")))


def _parse_headers(path: str, raw: Any) -> tuple[tuple[str, str], ...]:
    key = "http_server_config.headers"
    out = []
    for name, value in _mapping(path, key, raw, None).items():
        where = f"{key}.{name}"
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise _fail(path, where, "not a valid HTTP header name")
        if name.lower() in _RESERVED_HEADERS:
            raise _fail(path, where, "this header is set by the server and cannot be configured")
        text = _string(path, where, value)
        if "\r" in text or "\n" in text:
            raise _fail(path, where, "a header value cannot contain a line break")
        if not text:  # blank means unset, as in exporter-toolkit
            continue
        allowed = _HEADER_VALUES.get(name.lower())
        if allowed and text.lower() not in allowed:
            raise _fail(path, where, f"{text!r} is not one of {', '.join(allowed)}")
        out.append((name, text))
    return tuple(out)


def _parse_users(path: str, raw: Any) -> Mapping[str, str]:
    users: dict[str, str] = {}
    for name, hashed in _mapping(path, "basic_auth_users", raw, None).items():
        if isinstance(name, bool) or not isinstance(name, (str, int)):
            raise _fail(path, f"basic_auth_users.{name}", "a user name must be a string")
        where = f"basic_auth_users.{name}"
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            # never echo the value: it is a secret
            raise _fail(path, where, "not a bcrypt hash (expected $2y$10$ followed by 53 characters, "
                                     "e.g. from htpasswd -nBC 10 \"\" | tr -d ':\\n')")
        users[str(name)] = hashed
    return MappingProxyType(users)


def _parse_rate_limit(path: str, raw: Any) -> RateLimit | None:
    data = _mapping(path, "rate_limit", raw, _RATE_KEYS)
    if not data:
        return None
    interval_raw = data.get("interval", 0)
    try:
        interval = parse_duration_or_seconds(str(interval_raw)) if not isinstance(interval_raw, bool) else -1.0
    except ValueError:
        interval = -1.0
    if interval < 0:
        raise _fail(path, "rate_limit.interval", f"{interval_raw!r} is not a duration such as 100ms or 1s")
    burst = data.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
        raise _fail(path, "rate_limit.burst", "must be a non-negative integer")
    if interval == 0:
        return None  # 0 turns the limiter off, as in exporter-toolkit
    if burst == 0:
        raise _fail(path, "rate_limit.burst", "must be at least 1 when interval is set (0 refuses every request)")
    return RateLimit(interval, burst)


def parse_web_config(data: Any, path: str) -> WebConfig:
    """Validate a parsed web config file (pure: no file is read).

    Args:
        data: what ``yaml.safe_load`` returned for the file (None for an empty file).
        path: the file's path, named in errors; relative certificate paths resolve
            against its directory.

    Raises:
        ValueError: one line, ``<path>: <key>: <what is wrong>``.
    """
    top = _mapping(path, "", data, _TOP_KEYS)
    http = _mapping(path, "http_server_config", top.get("http_server_config"), _HTTP_KEYS)
    http2 = http.get("http2", True)
    if not isinstance(http2, bool):
        raise _fail(path, "http_server_config.http2", "must be true or false")
    return WebConfig(
        path=path,
        tls=_parse_tls(path, top.get("tls_server_config")),
        headers=_parse_headers(path, http.get("headers")),
        http2=http2,
        users=_parse_users(path, top.get("basic_auth_users")),
        rate_limit=_parse_rate_limit(path, top.get("rate_limit")))


def _load_chain(ctx: ssl.SSLContext, tls: TLSServerConfig) -> None:
    if not tls.cert and not tls.key:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
        return
    # ssl loads certificates only from files: PEM text goes through a private temp dir
    with tempfile.TemporaryDirectory(prefix="l9gpu-tls-") as tmp:
        cert, key = tls.cert_file, tls.key_file
        if tls.cert:
            cert = os.path.join(tmp, "cert.pem")
            with open(cert, "w") as out:
                out.write(tls.cert)
        if tls.key:
            key = os.path.join(tmp, "key.pem")
            with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as out:
                out.write(tls.key)
        ctx.load_cert_chain(cert, key)


def apply_tls(ctx: ssl.SSLContext, tls: TLSServerConfig, path: str = "") -> None:
    """Load ``tls`` into a server context: certificate, client CA, verify mode, versions.

    Used for a new context and, on reload, for the live one: new connections see the new
    certificate and settings. (A client CA removed from the file stays trusted until the
    agent restarts: ssl can add to a context's trust store but not remove from it.)

    Raises:
        ValueError: naming the file and key when a certificate, key or CA does not load.
    """
    try:
        _load_chain(ctx, tls)
    except (ssl.SSLError, OSError) as exc:
        where = "cert_file/key_file" if tls.cert_file or tls.key_file else "cert/key"
        raise _fail(path, f"tls_server_config.{where}",
                    f"cannot load the certificate and key: {getattr(exc, 'reason', None) or exc}") from None
    if tls.client_ca_file or tls.client_ca:
        try:
            if tls.client_ca:
                ctx.load_verify_locations(cadata=tls.client_ca)
            else:
                ctx.load_verify_locations(cafile=tls.client_ca_file)
        except (ssl.SSLError, OSError, ValueError) as exc:
            key = "client_ca_file" if tls.client_ca_file else "client_ca"
            raise _fail(path, f"tls_server_config.{key}",
                        f"cannot load the client CA: {getattr(exc, 'reason', None) or exc}") from None
    ctx.verify_mode = tls.verify_mode
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE


def build_ssl_context(tls: TLSServerConfig, path: str = "") -> ssl.SSLContext:
    """A server-side context for ``tls`` (see `apply_tls`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    apply_tls(ctx, tls, path)
    return ctx


def _read_yaml(path: str) -> Any:
    import yaml

    try:
        with open(path, encoding="utf-8") as src:
            text = src.read()
    except OSError as exc:
        raise _fail(path, "", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _fail(path, "", "not UTF-8 text") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise _fail(path, "", f"not valid YAML{where}: {problem}") from None


def load_web_config(path: str) -> tuple[WebConfig, ssl.SSLContext | None]:
    """Read, validate and prove a web config file: the config and its TLS context (or None).

    Raises:
        ValueError: one line naming the file and the key.
    """
    config = parse_web_config(_read_yaml(path), path)
    context = None
    if config.tls is not None:
        # Read every file once: the context is built, and on reload applied to the live
        # one, from these same bytes, so a file replaced in between cannot half-apply.
        contents: dict[str, str] = {}
        for key, file in config.tls.files():
            try:
                with open(file, encoding="ascii") as src:
                    contents[key.removesuffix("_file")] = src.read()
            except OSError as exc:
                raise _fail(path, f"tls_server_config.{key}", f"cannot read {file}: {exc.strerror or exc}") from None
            except UnicodeDecodeError:
                raise _fail(path, f"tls_server_config.{key}", f"{file} is not a PEM file") from None
        tls = dataclasses.replace(config.tls, cert=contents.get("cert", config.tls.cert),
                                  key=contents.get("key", config.tls.key),
                                  client_ca=contents.get("client_ca", config.tls.client_ca))
        config = dataclasses.replace(config, tls=tls)
        context = build_ssl_context(tls, path)
    if config.users:
        try:
            import bcrypt  # noqa: F401 - checked here so a missing package fails at start-up
        except ImportError:
            raise _fail(path, "basic_auth_users", "checking bcrypt hashes needs the Python package bcrypt "
                                                  "(pip install bcrypt)") from None
    return config, context


def _fingerprint(files: tuple[str, ...]) -> tuple[Any, ...]:
    out: list[tuple[Any, ...]] = []
    for file in files:
        try:
            st = os.stat(file)
            out.append((file, st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((file, None))
    return tuple(out)


#: How long, in seconds, the bcrypt checks ahead of a new one may be expected to take
#: before the new one is refused (503) rather than queued: an admitted check answers well
#: within Prometheus' default 10 s scrape timeout.
AUTH_QUEUE_SECONDS = 2.0
#: bcrypt checks waiting or running at most, whatever their cost.
AUTH_QUEUE_MAX = 64
#: bcrypt checks one client address may have waiting or running at once.
AUTH_QUEUE_PER_CLIENT = 4
#: Client addresses whose rate-limit buckets are remembered (least recently seen dropped).
RATE_LIMIT_CLIENTS = 4096


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


def _peer_sans(request: web.Request) -> set[str]:
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    return {str(value) for _, value in (cert or {}).get("subjectAltName", ())}


class WebConfigWatcher:
    """The current web config: reloaded when the file or its certificates change.

    Args:
        path: the web config file.
        clock: monotonic seconds (injected for tests).
        check_interval: the files' modification times are looked at no more often.
        rejections: where refused requests are counted (403, 429, 503, 401).

    Raises:
        ValueError: when the file does not load at start-up.
    """

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic, check_interval: float = 1.0,
                 rejections: Rejections | None = None):
        self.rejections = rejections if rejections is not None else Rejections()
        self.path = path
        self._clock = clock
        self.check_interval = check_interval
        self.config, self.ssl_context = load_web_config(path)
        self._fingerprint = _fingerprint(self.config.files())
        self._checked_at = clock()
        self._auth = BasicAuthenticator()
        self._limiter: ClientRateLimiter | None = None
        self._log_unapplied(self.config)

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"

    def _log_unapplied(self, config: WebConfig) -> None:
        tls = config.tls
        if tls is not None and (tls.cipher_suites or tls.curve_preferences):
            log.warning("%s: tls_server_config cipher_suites and curve_preferences are not applied (Go names with no "
                        "faithful OpenSSL mapping); OpenSSL's defaults for the TLS versions allowed are used",
                        config.path)
        if tls is not None and tls.client_auth_type == "RequireAnyClientCert":
            log.warning("%s: client_auth_type RequireAnyClientCert: client certificates are verified against the "
                        "client CA as well (RequireAndVerifyClientCert)", config.path)
        if config.users and self.ssl_context is None:
            log.warning("%s: basic auth without TLS sends passwords in clear text; add tls_server_config",
                        config.path)

    def check(self) -> bool:
        """Reload if the files changed since the last look (at most once per interval)."""
        now = self._clock()
        if now - self._checked_at < self.check_interval:
            return False
        self._checked_at = now
        fingerprint = _fingerprint(self.config.files())
        if fingerprint == self._fingerprint:
            return False
        self._fingerprint = fingerprint
        try:
            config, context = load_web_config(self.path)
        except ValueError as exc:
            log.error("web config not reloaded, the last good one stays in force: %s", exc)
            return False
        if (context is None) != (self.ssl_context is None):
            log.error("web config not reloaded: turning TLS %s needs a restart",
                      "on" if context is not None else "off")
            return False
        if config.tls is not None and self.ssl_context is not None:
            try:
                apply_tls(self.ssl_context, config.tls, self.path)
            except ValueError as exc:  # the file changed again between load and apply
                log.error("web config not reloaded: %s", exc)
                return False
        self._fingerprint = _fingerprint(config.files())
        self.config = config
        self._limiter = None
        self._log_unapplied(config)
        log.info("web config %s reloaded", self.path)
        return True

    async def watch(self) -> None:
        """Check for changes forever (run as a task next to the server)."""
        while True:
            await asyncio.sleep(self.check_interval)
            self.check()

    def close(self) -> None:
        self._auth.close()

    @web.middleware
    async def middleware(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """aiohttp middleware: client SANs, rate limit and basic auth, then response headers."""
        config = self.config
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
