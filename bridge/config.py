"""OTLP settings from flags and the standard ``OTEL_*`` variables (pure; no SDK needed).

A flag wins over a variable; a signal-specific variable (``OTEL_EXPORTER_OTLP_METRICS_*``)
wins over the generic one. l9gpu resolves everything itself and passes explicit values to
the SDK's exporters, so the rules below hold whatever the Python SDK's own defaults are:

- protocol: ``grpc`` (default) or ``http/protobuf``. The Python SDK reads the
  ``..._PROTOCOL`` variables only in auto-instrumentation; l9gpu reads them here.
- endpoint: ``--otlp-endpoint`` and ``OTEL_EXPORTER_OTLP_ENDPOINT`` are base URLs; for
  ``http/protobuf`` l9gpu appends ``/v1/metrics`` (unless the path already ends with it).
  ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` is used as given. For gRPC only host and port
  count (default port 4317).
- TLS: an ``http://`` endpoint is plaintext, ``https://`` is TLS. Without a scheme,
  ``--otlp-insecure`` (or ``OTEL_EXPORTER_OTLP_INSECURE=true``) means plaintext, else TLS.
- timeouts in ``OTEL_EXPORTER_OTLP_TIMEOUT`` and ``OTEL_METRIC_EXPORT_INTERVAL`` are
  milliseconds, as the specification says (the Python SDK reads the timeout as seconds).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from exporter.core.parsing import parse_positive_duration

GRPC = "grpc"
HTTP = "http/protobuf"
PROTOCOLS = (GRPC, HTTP)

DEFAULT_INTERVAL = 60.0  # seconds; the specification's default for OTEL_METRIC_EXPORT_INTERVAL
DEFAULT_TIMEOUT = 10.0  # seconds; the specification's default for OTEL_EXPORTER_OTLP_TIMEOUT
DEFAULT_GRPC_PORT = 4317
METRICS_PATH = "/v1/metrics"
LOGS_PATH = "/v1/logs"


@dataclass(frozen=True)
class OtlpSettings:
    """Where and how to push.

    Attributes:
        protocol: GRPC or HTTP.
        endpoint: for gRPC ``host:port``; for HTTP the full URL including ``/v1/metrics``.
        tls: True for TLS (always for https:// HTTP endpoints).
        headers: request headers (gRPC metadata keys are lower-case).
        interval: seconds between exports.
        timeout: seconds one export may take, retries included.
        certificate: CA bundle (PEM) to trust for TLS, or "" for the system roots.
        client_key: client private key (PEM) for mutual TLS, or "".
        client_certificate: client certificate chain (PEM) for mutual TLS, or "".
    """

    protocol: str
    endpoint: str
    tls: bool
    headers: Mapping[str, str] = field(default_factory=dict)
    interval: float = DEFAULT_INTERVAL
    timeout: float = DEFAULT_TIMEOUT
    certificate: str = ""
    client_key: str = ""
    client_certificate: str = ""

    def describe(self) -> str:
        """One log line: endpoint without credentials, header keys only."""
        keys = ", ".join(sorted(self.headers)) or "none"
        return (f"{redact_url(self.endpoint)} over {self.protocol} every {self.interval:g}s "
                f"(timeout {self.timeout:g}s, {'TLS' if self.tls else 'plaintext'}, header keys: {keys})")


def redact_url(url: str) -> str:
    """Drop a ``user:password@`` part so an endpoint can be logged."""
    if "@" not in url:
        return url
    parts = urlsplit(url if "://" in url else "//" + url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    text = urlunsplit(parts._replace(netloc=netloc))
    return text if "://" in url else text.lstrip("/")


def _env(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first set, non-empty variable among ``names`` as (name, value)."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return None


def _env_bool(name: str, value: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r} is not a boolean (use true or false)")


def _env_millis(name: str, value: str) -> float:
    """A duration variable: plain numbers are milliseconds (spec); ``10s`` style is accepted too."""
    try:
        millis = float(value)
    except ValueError:
        try:
            return parse_positive_duration(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a duration (milliseconds, e.g. 10000)") from None
    if not millis > 0 or millis == float("inf"):
        raise ValueError(f"{name}={value!r} must be a positive number of milliseconds")
    return millis / 1000.0


def parse_header(text: str) -> tuple[str, str]:
    """Parse one ``--otlp-header KEY=VALUE``."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"invalid OTLP header {key or text.split('=')[0]!r}: use KEY=VALUE")
    if any(c.isspace() or c in ',;:"' for c in key):
        raise ValueError(f"invalid OTLP header name {key!r}")
    return key, value.strip()


def parse_env_headers(name: str, text: str) -> dict[str, str]:
    """Parse the ``OTEL_EXPORTER_OTLP_HEADERS`` format: ``k1=v1,k2=v2``, values URL-encoded."""
    headers: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{name}: invalid entry {key.strip()!r} (use key=value,key2=value2)")
        headers[unquote(key.strip())] = unquote(value.strip())
    return headers


def _split_endpoint(name: str, endpoint: str) -> tuple[str, str, int | None, str]:
    """(scheme or "", host, port or None, path) of an endpoint, validated."""
    text = endpoint.strip()
    has_scheme = "://" in text
    parts = urlsplit(text if has_scheme else "//" + text)
    scheme = parts.scheme.lower() if has_scheme else ""
    if scheme not in ("", "http", "https"):
        raise ValueError(f"{name} {redact_url(endpoint)!r}: scheme must be http or https")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{name} {redact_url(endpoint)!r}: invalid port") from None
    if not parts.hostname:
        raise ValueError(f"{name} {redact_url(endpoint)!r}: no host; use e.g. otel-collector:4317")
    return scheme, parts.hostname, port, parts.path


def resolve(args: Any, env: Mapping[str, str] | None = None) -> OtlpSettings | None:
    """Resolve the OTLP settings from parsed flags and the environment.

    Args:
        args: the parsed ``serve`` flags (``otlp_endpoint``, ``otlp_protocol``,
            ``otlp_insecure``, ``otlp_header``, ``otlp_interval``, ``otlp_timeout``,
            ``otlp_certificate``; missing attributes count as not given).
        env: the environment (default: os.environ).

    Returns:
        None when no endpoint is configured (pushing is off).

    Raises:
        ValueError: a bad flag or variable, with a one-line message.
    """
    env = os.environ if env is None else env

    def flag(name: str) -> Any:
        return getattr(args, name, None)

    protocol = flag("otlp_protocol")
    if not protocol:
        found = _env(env, "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        protocol = found[1] if found else GRPC
        if protocol not in PROTOCOLS:
            raise ValueError(f"{found[0] if found else 'protocol'}={protocol!r}: l9gpu supports "
                             f"{' and '.join(PROTOCOLS)}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"--otlp-protocol {protocol!r}: choose grpc or http/protobuf")

    signal_specific = False
    if flag("otlp_endpoint"):
        source, endpoint = "--otlp-endpoint", str(flag("otlp_endpoint"))
    elif (found := _env(env, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")) is not None:
        (source, endpoint), signal_specific = found, True
    elif (found := _env(env, "OTEL_EXPORTER_OTLP_ENDPOINT")) is not None:
        source, endpoint = found
    else:
        return None
    scheme, host, port, _path = _split_endpoint(source, endpoint)  # gRPC ignores a path

    insecure_flag = flag("otlp_insecure")
    if insecure_flag and scheme == "https":
        raise ValueError(f"--otlp-insecure contradicts the https:// endpoint {redact_url(endpoint)!r}; "
                         "drop one of them")
    if scheme:
        tls = scheme == "https"  # the scheme decides; the insecure variables apply without one
    elif insecure_flag is not None:
        tls = not insecure_flag
    elif (found := _env(env, "OTEL_EXPORTER_OTLP_METRICS_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE")) is not None:
        tls = not _env_bool(*found)
    else:
        tls = True

    if protocol == GRPC:
        target_host = f"[{host}]" if ":" in host else host
        resolved = f"{target_host}:{port or DEFAULT_GRPC_PORT}"
    else:
        parts = urlsplit(endpoint.strip() if scheme else ("https://" if tls else "http://") + endpoint.strip())
        if not signal_specific and not parts.path.rstrip("/").endswith(METRICS_PATH):
            parts = parts._replace(path=parts.path.rstrip("/") + METRICS_PATH)
        resolved = urlunsplit(parts)

    headers: dict[str, str] = {}
    if (found := _env(env, "OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")) is not None:
        headers.update(parse_env_headers(*found))
    for item in flag("otlp_header") or []:
        key, value = parse_header(item) if isinstance(item, str) else item
        headers[key] = value
    if protocol == GRPC:
        headers = {key.lower(): value for key, value in headers.items()}

    interval = flag("otlp_interval")
    if interval is None:
        found = _env(env, "OTEL_METRIC_EXPORT_INTERVAL")
        interval = _env_millis(*found) if found else DEFAULT_INTERVAL
    timeout = flag("otlp_timeout")
    if timeout is None:
        found = _env(env, "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
        timeout = _env_millis(*found) if found else DEFAULT_TIMEOUT

    certificate = flag("otlp_certificate") or ""
    if not certificate and (found := _env(env, "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
                                          "OTEL_EXPORTER_OTLP_CERTIFICATE")) is not None:
        certificate = found[1]
    client_key = (_env(env, "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY", "OTEL_EXPORTER_OTLP_CLIENT_KEY") or ("", ""))[1]
    client_cert = (_env(env, "OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE",
                        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE") or ("", ""))[1]
    for what, path_ in (("certificate", certificate), ("client key", client_key), ("client certificate", client_cert)):
        if tls and path_ and not os.access(path_, os.R_OK):
            raise ValueError(f"OTLP {what} file {path_!r} is not readable")
    if bool(client_key) != bool(client_cert):
        raise ValueError("OTLP mutual TLS needs both OTEL_EXPORTER_OTLP_CLIENT_KEY and "
                         "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE")

    return OtlpSettings(protocol=protocol, endpoint=resolved, tls=tls, headers=headers,
                        interval=float(interval), timeout=float(timeout),
                        certificate=certificate if tls else "",
                        client_key=client_key if tls else "", client_certificate=client_cert if tls else "")


def header_items(settings: OtlpSettings) -> Sequence[tuple[str, str]]:
    """Headers as (key, value) pairs, the form the gRPC exporter takes."""
    return tuple(settings.headers.items())


def logs_endpoint(settings: OtlpSettings, env: Mapping[str, str] | None = None) -> str:
    """Where the incidents' OTLP log records go, beside the metrics of ``settings``.

    gRPC: the same ``host:port`` (one receiver serves both services). http/protobuf:
    ``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`` as given, else the metrics URL with ``/v1/logs``
    in place of ``/v1/metrics``.

    Raises:
        ValueError: an HTTP metrics endpoint at a path of its own (a signal-specific
            variable) and no logs endpoint to go with it.
    """
    env = os.environ if env is None else env
    if settings.protocol == GRPC:
        return settings.endpoint
    found = _env(env, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
    if found is not None:
        scheme, _host, _port, _path = _split_endpoint(*found)
        if not scheme:
            raise ValueError(f"{found[0]} {redact_url(found[1])!r}: give the full URL (http:// or https://)")
        return found[1].strip()
    parts = urlsplit(settings.endpoint)
    path = parts.path.rstrip("/")
    if not path.endswith(METRICS_PATH):
        raise ValueError(f"the OTLP metrics endpoint {redact_url(settings.endpoint)!r} has a path of its own: "
                         "set OTEL_EXPORTER_OTLP_LOGS_ENDPOINT for the incidents' log records, or "
                         "--otlp-incidents off")
    return urlunsplit(parts._replace(path=path[: -len(METRICS_PATH)] + LOGS_PATH))
