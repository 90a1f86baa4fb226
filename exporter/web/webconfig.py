"""The web config file's format: what it may say, validated into a frozen `WebConfig`.

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

`parse_web_config` turns the parsed YAML into a `WebConfig` (pure: it reads no files).
Every error is a `ValueError` with one line naming the file and the key
(`config_error`). Reading the file, proving its TLS settings and re-reading it on change
are `exporter.web.watcher`'s; what it does to each request, `exporter.web.access`'s.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from exporter.core.parsing import parse_duration_or_seconds

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


def config_error(path: str, key: str, message: str) -> ValueError:
    """The one-line error for ``key`` of the file at ``path``: ``<path>: <key>: <message>``."""
    return ValueError(f"{path}: {key}: {message}" if key else f"{path}: {message}")


def _mapping(path: str, key: str, value: Any, allowed: tuple[str, ...] | None) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise config_error(path, key, f"must be a mapping, not {type(value).__name__}")
    if allowed is not None:
        for name in value:
            if name not in allowed:
                where = f"{key}.{name}" if key else str(name)
                raise config_error(path, where, f"unknown key (known: {', '.join(allowed)})")
    return value


def _string(path: str, key: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise config_error(path, key, f"must be a string, not {type(value).__name__}")
    return value


def _strings(path: str, key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise config_error(path, key, "must be a list of strings")
    return tuple(value)


def _choice(path: str, key: str, value: Any, default: str, choices: Mapping[str, Any]) -> str:
    text = _string(path, key, value) or default
    if text not in choices:
        raise config_error(path, key, f"{text!r} is not one of {', '.join(choices)}")
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
            raise config_error(path, k[file_key], f"give either {inline_key} or {file_key}, not both")
    if not files["cert_file"] and not inline["cert"]:
        raise config_error(path, k["cert_file"], "missing: TLS needs a certificate (cert_file or cert)")
    if not files["key_file"] and not inline["key"]:
        raise config_error(path, k["key_file"], "missing: TLS needs a private key (key_file or key)")
    auth = _choice(path, k["client_auth_type"], data.get("client_auth_type"), "NoClientCert", CLIENT_AUTH_TYPES)
    has_ca = bool(files["client_ca_file"] or inline["client_ca"])
    if has_ca and auth == "NoClientCert":
        raise config_error(path, k["client_ca_file"], "a client CA is set but client_auth_type is NoClientCert; "
                                               "use RequireAndVerifyClientCert to require client certificates")
    if CLIENT_AUTH_TYPES[auth] != ssl.CERT_NONE and not has_ca:
        raise config_error(path, k["client_ca_file"], f"missing: client_auth_type {auth} verifies client certificates "
                                               "against a client CA (client_ca_file or client_ca)")
    sans = _strings(path, k["client_allowed_sans"], data.get("client_allowed_sans"))
    if sans and auth not in ("RequireAnyClientCert", "RequireAndVerifyClientCert"):
        raise config_error(path, k["client_allowed_sans"], "needs client_auth_type RequireAndVerifyClientCert "
                                                    "(or RequireAnyClientCert)")
    min_version = _choice(path, k["min_version"], data.get("min_version"), "TLS12", TLS_VERSIONS)
    max_version = _choice(path, k["max_version"], data.get("max_version"), "TLS13", TLS_VERSIONS)
    if TLS_VERSIONS[min_version] > TLS_VERSIONS[max_version]:
        raise config_error(path, k["min_version"], f"{min_version} is above max_version {max_version}")
    prefer = data.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise config_error(path, k["prefer_server_cipher_suites"], "must be true or false")
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
            raise config_error(path, where, "not a valid HTTP header name")
        if name.lower() in _RESERVED_HEADERS:
            raise config_error(path, where, "this header is set by the server and cannot be configured")
        text = _string(path, where, value)
        if "\r" in text or "\n" in text:
            raise config_error(path, where, "a header value cannot contain a line break")
        if not text:  # blank means unset, as in exporter-toolkit
            continue
        allowed = _HEADER_VALUES.get(name.lower())
        if allowed and text.lower() not in allowed:
            raise config_error(path, where, f"{text!r} is not one of {', '.join(allowed)}")
        out.append((name, text))
    return tuple(out)


def _parse_users(path: str, raw: Any) -> Mapping[str, str]:
    users: dict[str, str] = {}
    for name, hashed in _mapping(path, "basic_auth_users", raw, None).items():
        if isinstance(name, bool) or not isinstance(name, (str, int)):
            raise config_error(path, f"basic_auth_users.{name}", "a user name must be a string")
        where = f"basic_auth_users.{name}"
        if not isinstance(hashed, str) or not _BCRYPT.match(hashed):
            # never echo the value: it is a secret
            raise config_error(path, where, "not a bcrypt hash (expected $2y$10$ followed by 53 characters, "
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
        raise config_error(path, "rate_limit.interval", f"{interval_raw!r} is not a duration such as 100ms or 1s")
    burst = data.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
        raise config_error(path, "rate_limit.burst", "must be a non-negative integer")
    if interval == 0:
        return None  # 0 turns the limiter off, as in exporter-toolkit
    if burst == 0:
        raise config_error(path, "rate_limit.burst",
                           "must be at least 1 when interval is set (0 refuses every request)")
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
        raise config_error(path, "http_server_config.http2", "must be true or false")
    return WebConfig(
        path=path,
        tls=_parse_tls(path, top.get("tls_server_config")),
        headers=_parse_headers(path, http.get("headers")),
        http2=http2,
        users=_parse_users(path, top.get("basic_auth_users")),
        rate_limit=_parse_rate_limit(path, top.get("rate_limit")))
