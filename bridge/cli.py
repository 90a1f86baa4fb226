"""The ``otlp`` flags of ``l9gpu serve`` and starting the push from them.

Every flag also has an ``L9GPU_OTLP_*`` variable (read by `exporter.app.cli`); when neither
is given, the standard ``OTEL_*`` variables apply (see `bridge.config` and docs/OTLP.md).
"""

from __future__ import annotations

import argparse
import logging
import socket
import time
from typing import Any

from bridge.config import (
    GRPC,
    PROTOCOLS,
    OtlpSettings,
    header_items,
    logs_endpoint,
    parse_header,
    redact_url,
    resolve,
)
from exporter.core.parsing import argtype, parse_positive_duration

log = logging.getLogger("l9gpu.otlp")

# Loggers of the SDK exporters: they log every failed attempt; l9gpu logs one line when
# exports start failing and one when they work again, and shows the SDK's lines at debug.
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.grpc._log_exporter",
    "opentelemetry.exporter.otlp.proto.http._log_exporter",
    "opentelemetry.exporter.otlp.common.http",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``otlp`` argument group to the ``serve`` parser."""
    group = parser.add_argument_group(
        "otlp", "push the same series over OTLP (off unless an endpoint is set here or in "
                "OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)")
    group.add_argument("--otlp-endpoint", default=None, metavar="URL",
                       help="OTLP receiver, e.g. otel-collector:4317 (gRPC) or http://otel-collector:4318 "
                            "(http/protobuf; /v1/metrics is appended)")
    group.add_argument("--otlp-protocol", default=None, choices=PROTOCOLS,
                       help="grpc or http/protobuf (default: $OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)")
    group.add_argument("--otlp-insecure", action="store_true", default=None,
                       help="plaintext for an endpoint without http:// or https:// (default: TLS)")
    group.add_argument("--otlp-certificate", default=None, metavar="FILE",
                       help="CA bundle (PEM) to verify the receiver (default: $OTEL_EXPORTER_OTLP_CERTIFICATE, "
                            "else the system roots)")
    group.add_argument("--otlp-header", action="append", default=[], type=argtype(parse_header),
                       metavar="KEY=VALUE",
                       help="request header, e.g. authorization=Bearer... (repeatable; values are never logged)")
    group.add_argument("--otlp-interval", default=None, type=argtype(parse_positive_duration), metavar="DURATION",
                       help="time between pushes (default: $OTEL_METRIC_EXPORT_INTERVAL in ms, else 60s)")
    group.add_argument("--otlp-timeout", default=None, type=argtype(parse_positive_duration), metavar="DURATION",
                       help="time one push may take, retries included (default: $OTEL_EXPORTER_OTLP_TIMEOUT "
                            "in ms, else 10s)")
    group.add_argument("--otlp-incidents", default="on", choices=("on", "off"), type=str.lower,
                       help="also send each GPU incident as OTLP log records, one per workload it involves, with "
                            "the metrics' k8s.*, gpu.* and slurm.job.id attributes (http/protobuf: to /v1/logs or "
                            "$OTEL_EXPORTER_OTLP_LOGS_ENDPOINT; default: on while OTLP is on)")


def _quiet_sdk_loggers() -> None:
    def only_at_debug(record: logging.LogRecord) -> bool:
        return logging.getLogger().isEnabledFor(logging.DEBUG)

    for name in _SDK_LOGGERS:
        logger = logging.getLogger(name)
        if only_at_debug not in logger.filters:
            logger.addFilter(only_at_debug)


def _read(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as handle:
        return handle.read()


METRICS = "metrics"
LOGS = "logs"


def build_exporter(settings: OtlpSettings, signal: str = METRICS, endpoint: str = "") -> Any:
    """Build the SDK's OTLP exporter of ``signal`` (metrics or logs) for ``settings``
    (explicit values, no env fallbacks), sending to ``endpoint`` (default: the settings').

    Raises:
        ValueError: the exporter package for the protocol is not installed, or the SDK
            rejected a setting.
    """
    try:
        if settings.protocol == GRPC:
            import grpc  # type: ignore[import-untyped]
            if signal == LOGS:
                from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcExporter
            else:
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # type: ignore[assignment]
                    OTLPMetricExporter as GrpcExporter,
                )
        elif signal == LOGS:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
                OTLPMetricExporter as HttpExporter,
            )
    except ImportError as exc:
        package = "grpc" if settings.protocol == GRPC else "http"
        raise ValueError(f"OTLP push over {settings.protocol} needs opentelemetry-exporter-otlp-proto-{package} "
                         f"(pip install '.[otlp]' in l9gpu's checkout): {exc}") from None
    target = endpoint or settings.endpoint
    try:
        if settings.protocol == GRPC:
            credentials = None
            if settings.tls:
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=_read(settings.certificate),
                    private_key=_read(settings.client_key),
                    certificate_chain=_read(settings.client_certificate))
            return GrpcExporter(endpoint=target, insecure=not settings.tls, credentials=credentials,
                                headers=header_items(settings), timeout=settings.timeout)
        return HttpExporter(endpoint=target, certificate_file=settings.certificate or None,
                            client_key_file=settings.client_key or None,
                            client_certificate_file=settings.client_certificate or None,
                            headers=dict(settings.headers), timeout=settings.timeout)
    except (OSError, ValueError, RuntimeError, Exception) as exc:  # noqa: BLE001 - the SDK raises its own types
        raise ValueError(f"cannot set up the OTLP {signal} exporter: {exc}") from None


def build_resource(node: str) -> Any:
    """service.name=l9gpu, service.version, host.name, k8s.node.name, then OTEL_RESOURCE_ATTRIBUTES
    (and OTEL_SERVICE_NAME) on top."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    from exporter import __version__

    ours = {"service.name": "l9gpu", "service.version": __version__, "host.name": socket.gethostname()}
    if node:
        ours["k8s.node.name"] = node
    return Resource(ours).merge(OTELResourceDetector().detect())


def start_from_args(args: argparse.Namespace, registry: Any, node: str) -> Any:
    """Start pushing ``registry`` over OTLP if an endpoint is configured.

    Args:
        args: the parsed ``serve`` flags.
        registry: the registry /metrics serves.
        node: the node name (resource attribute ``k8s.node.name``).

    Returns:
        None when no endpoint is configured, else the running pusher (call ``.stop()``).

    Raises:
        ValueError: bad settings or a missing exporter package, in one line.
    """
    settings = resolve(args)
    if settings is None:
        return None
    try:
        from bridge.push import ExportCounter, OtlpPusher
    except ImportError as exc:
        raise _sdk_missing(exc) from None
    exporter = build_exporter(settings)
    _quiet_sdk_loggers()
    counter = ExportCounter()
    if "l9gpu_otlp_exports_total" not in (getattr(args, "disable_metric", None) or []):
        registry.register(counter)
    pusher = OtlpPusher(registry, exporter, build_resource(node), settings.interval, settings.timeout,
                        counter=counter, agent_start=time.time(), description=settings.describe().split(" ")[0])
    log.info("pushing metrics over OTLP to %s", settings.describe())
    return pusher.start()


def incident_logs_from_args(args: argparse.Namespace, node: str) -> Any:
    """The OTLP log records of GPU incidents (`bridge.incident_logs`), when OTLP is on and
    ``--otlp-incidents on``; None otherwise.

    Raises:
        ValueError: bad settings or a missing exporter package, in one line.
    """
    if getattr(args, "otlp_incidents", "on") == "off":
        return None
    settings = resolve(args)
    if settings is None:
        return None
    try:
        from bridge.incident_logs import IncidentLogs
    except ImportError as exc:
        raise _sdk_missing(exc) from None
    endpoint = logs_endpoint(settings)
    exporter = build_exporter(settings, LOGS, endpoint)
    _quiet_sdk_loggers()
    log.info("sending GPU incidents as OTLP log records to %s", redact_url(endpoint))
    return IncidentLogs(exporter, build_resource(node), redact_url(endpoint), settings.timeout)


def _sdk_missing(exc: ImportError) -> ValueError:
    return ValueError(f"OTLP push needs opentelemetry-sdk (pip install '.[otlp]' in l9gpu's checkout): {exc}")
