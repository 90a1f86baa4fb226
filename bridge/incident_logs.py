"""Each GPU incident as OTLP log records, beside the metrics the bridge pushes.

With OTLP on (and ``--otlp-incidents on``, the default), every incident the agent records
(`exporter.incidents.watch`) becomes one log record per workload it involves, with that
workload's role: the same ``k8s.*``, ``gpu.*`` and ``slurm.job.id`` attributes as its
metrics' points (`exporter.output.catalogue.otel_attribute`), plus ``l9gpu.incident.*`` for the
incident itself. An incident that involves no workload (a fault on an idle GPU) is one
record with the GPU's attributes. A log backend (Loki, Elasticsearch, an OpenTelemetry
Collector) can then find "every incident of pod X" by the attribute it already indexes.

The OpenTelemetry SDK's `BatchLogRecordProcessor` sends them from its own thread: `emit`
only queues (bounded; the SDK drops the oldest when full), so a slow or unreachable
receiver never delays a pass. A failed export is logged once, and once again when
exports work again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from exporter import __version__
from exporter.output import catalogue as cat

log = logging.getLogger("l9gpu.otlp")

# The event name of every record (OpenTelemetry's log "event name" field).
EVENT_NAME = "l9gpu.gpu.incident"
# Records waiting for the receiver: an incident storm beyond this drops the oldest.
MAX_QUEUE = 1024
# How long the SDK waits to fill a batch before it sends what it has (milliseconds).
SCHEDULE_DELAY_MS = 1000


class _Reporting:
    """The SDK exporter, with a log line when exports start failing and when they work again."""

    def __init__(self, exporter: Any, description: str):
        self._exporter = exporter
        self._description = description
        self._failing = False
        self._lock = threading.Lock()

    def export(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        error = ""
        try:
            result = self._exporter.export(batch, *args, **kwargs)
            ok = getattr(result, "name", "") == "SUCCESS"
            if not ok:
                error = "the exporter reported a failure"
        except Exception as exc:  # noqa: BLE001 - the SDK's worker thread must go on
            result, ok, error = None, False, f"{type(exc).__name__}: {exc}"
        if not ok:
            from bridge.push import free_failed_batch

            free_failed_batch()  # the SDK leaves a failed batch in a reference cycle
        with self._lock:
            if ok and self._failing:
                log.info("OTLP incident log records to %s are delivered again", self._description)
            elif not ok and not self._failing:
                log.warning("OTLP incident log records to %s failed (%s); %d dropped (details at --log-level debug)",
                            self._description, error, len(batch))
            self._failing = not ok
        return result

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        flush = getattr(self._exporter, "force_flush", None)
        return bool(flush(timeout_millis)) if flush is not None else True

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self._exporter.shutdown(*args, **kwargs)


def incident_attributes(doc: Mapping[str, Any], labels: Mapping[str, str], role: str) -> dict[str, Any]:
    """The attributes of one record: the workload's labels as its metrics' attributes
    (empty values dropped), then the incident's own (pure)."""
    out: dict[str, Any] = {cat.otel_attribute(key): value for key, value in labels.items() if value != ""}
    out.setdefault("k8s.node.name", doc.get("node") or "")
    out.setdefault("gpu.index", str(doc.get("gpu", "")))
    out.setdefault("gpu.id", doc.get("uuid") or "")
    if doc.get("gpu_instance"):
        out.setdefault("gpu.mig.instance", doc["gpu_instance"])
    out["l9gpu.incident.id"] = doc.get("id", "")
    out["l9gpu.incident.kind"] = doc.get("kind", "")
    out["l9gpu.incident.action"] = doc.get("action", "")
    out["l9gpu.incident.cause_known"] = bool(doc.get("cause_known"))
    if doc.get("cause_basis"):
        out["l9gpu.incident.cause_basis"] = str(doc["cause_basis"])
    if role:
        out["l9gpu.incident.role"] = role
    if doc.get("xid") is not None:
        out["l9gpu.incident.xid"] = int(doc["xid"])
    return {key: value for key, value in out.items() if value != ""}


class IncidentLogs:
    """Emits incidents as OTLP log records (see the module docstring).

    Args:
        exporter: the SDK's OTLP log exporter (gRPC or HTTP).
        resource: the resource the metrics report (service, host, node).
        description: the endpoint, for log lines.
        timeout: seconds one export may take.
    """

    def __init__(self, exporter: Any, resource: Any, description: str = "OTLP endpoint", timeout: float = 10.0):
        from opentelemetry._logs import SeverityNumber
        from opentelemetry.sdk._logs import LoggerProvider
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

        self._warn = SeverityNumber.WARN
        self.exporter = _Reporting(exporter, description)
        self._provider = LoggerProvider(resource=resource, shutdown_on_exit=False)
        # The SDK calls export, force_flush and shutdown: the wrapper's duck type (the base
        # class was renamed between SDK releases).
        self._provider.add_log_record_processor(BatchLogRecordProcessor(
            self.exporter,  # type: ignore[arg-type]
            schedule_delay_millis=SCHEDULE_DELAY_MS, export_timeout_millis=timeout * 1000,
            max_queue_size=MAX_QUEUE, max_export_batch_size=min(512, MAX_QUEUE)))
        self._logger = self._provider.get_logger("l9gpu.incidents", __version__)

    def emit(self, doc: Mapping[str, Any], summary: str, rows: Sequence[tuple[str, Mapping[str, str]]]) -> None:
        """Queue the records of one incident: ``doc`` is its ``/api/v1/incidents`` entry,
        ``summary`` the log line's text, ``rows`` (role, workload labels) per workload."""
        timestamp = int(float(doc.get("time") or 0) * 1e9) or None
        for role, labels in rows or (("", {}),):
            self._logger.emit(timestamp=timestamp, severity_number=self._warn, severity_text="WARN",
                              body=summary, attributes=incident_attributes(doc, labels, role),
                              event_name=EVENT_NAME)

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued (waiting at most ``timeout`` seconds), then stop."""
        try:
            self._provider.force_flush(int(timeout * 1000))
            self._provider.shutdown()
        except Exception as exc:  # noqa: BLE001 - shutting down must not fail the agent's exit
            log.debug("OTLP incident log records: shutdown: %s", exc)
