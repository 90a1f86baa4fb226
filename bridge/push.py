"""The push loop: every export interval, collect the registry and export one OTLP batch.

It runs on its own daemon thread, so an unreachable or slow endpoint never delays
collection or ``/metrics``. Each batch is built fresh from ``registry.collect()`` at
export time and is either delivered or dropped: nothing is queued, so memory stays flat
however long the endpoint is down, and pushing resumes with current values when it
returns. One export, including the exporter's own retries with backoff, is bounded by
the export timeout; a failed batch is counted in ``l9gpu_otlp_exports_total{result}``.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.registry import CollectorRegistry

from bridge.convert import StartTimes, to_metrics_data
from exporter import __version__
from exporter.output.counts import LabelCounts

log = logging.getLogger("l9gpu.otlp")

EXPORTS_METRIC = "l9gpu_otlp_exports_total"


class ExportCounter(LabelCounts):
    """Counts export outcomes and serves them as ``l9gpu_otlp_exports_total{result}``."""

    def __init__(self) -> None:
        super().__init__(EXPORTS_METRIC, ("success", "failure"))

    def add_result(self, success: bool) -> None:
        self.add("success" if success else "failure")


class OtlpPusher:
    """Pushes a prometheus_client registry to an OTLP exporter on a background thread.

    Args:
        registry: the registry ``/metrics`` serves (collected once per export).
        exporter: an OTLP metric exporter (gRPC or HTTP) from the OpenTelemetry SDK.
        resource: the resource every batch reports.
        interval: seconds between exports; the first export happens one interval after
            `start`, once the collector has published its first snapshot.
        timeout: seconds one export may take, retries included (the exporter was built
            with the same bound); `stop` waits at most about this long for the last one.
        counter: where export outcomes are counted (None: a private one).
        clock: wall clock in seconds, for point timestamps.
        agent_start: wall-clock time the agent started (start time of cumulative
            series seen in the first batch); default: now.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        exporter: MetricExporter,
        resource: Resource,
        interval: float,
        timeout: float,
        counter: ExportCounter | None = None,
        clock: Callable[[], float] = time.time,
        agent_start: float | None = None,
        description: str = "OTLP endpoint",
    ):
        self.registry = registry
        self.exporter = exporter
        self.resource = resource
        self.interval = interval
        self.timeout = timeout
        self.counter = counter if counter is not None else ExportCounter()
        self._clock = clock
        self._scope = InstrumentationScope("l9gpu", __version__)
        self._starts = StartTimes(int((clock() if agent_start is None else agent_start) * 1e9))
        self._description = description
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._lock = threading.Lock()

    def export_once(self) -> bool:
        """Collect the registry now and export one batch; True when it was delivered."""
        with self._lock:
            try:
                now_ns = int(self._clock() * 1e9)
                data = to_metrics_data(self.registry.collect(), self.resource, self._scope, now_ns, self._starts)
                result = self.exporter.export(data, timeout_millis=self.timeout * 1000)
                ok = result is MetricExportResult.SUCCESS
                error = "" if ok else "the exporter reported a failure"
            except Exception as exc:  # noqa: BLE001 - a push must never end the agent
                ok, error = False, f"{type(exc).__name__}: {exc}"
            self.counter.add_result(ok)
            if not ok:
                free_failed_batch()
            if ok and self._failing:
                log.info("OTLP export to %s works again", self._description)
            elif not ok and not self._failing:
                log.warning("OTLP export to %s failed (%s); dropping the batch and trying again every %gs "
                            "(details at --log-level debug)", self._description, error, self.interval)
            elif not ok:
                log.debug("OTLP export to %s failed again (%s)", self._description, error)
            self._failing = not ok
            return ok

    def start(self) -> OtlpPusher:
        """Start the push thread."""
        self._thread = threading.Thread(target=self._run, name="l9gpu-otlp-push", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self.export_once()
            next_at += self.interval
            now = time.monotonic()
            if next_at <= now:  # an export overran whole intervals: skip them, never catch up
                next_at = now + self.interval - ((now - next_at) % self.interval)
        # Final flush so the last values before shutdown are delivered.
        self.export_once()

    def stop(self, timeout: float | None = None) -> None:
        """Stop pushing after one last export, waiting at most about ``timeout`` seconds.

        Default bound: the export timeout plus one second. If the last export is still
        retrying then, the exporter is shut down, which aborts its retries.
        """
        bound = self.timeout + 1.0 if timeout is None else timeout
        self._stop.set()
        if self._thread is not None:
            self._thread.join(bound)
            if self._thread.is_alive():
                log.warning("OTLP: the last export did not finish within %gs; giving up on it", bound)
        rest = min(1.0, bound)
        try:
            self.exporter.shutdown(timeout_millis=int(rest * 1000))
        except Exception as exc:  # noqa: BLE001
            log.debug("OTLP exporter shutdown: %s", exc)
        if self._thread is not None:
            self._thread.join(rest)


def free_failed_batch() -> int:
    """Free what a failed export left for the cyclic garbage collector; the objects freed.

    The SDK's OTLP exporters keep each failed batch in a reference cycle: the export's
    result holds the error, whose traceback holds the export's frames, which hold the
    result, the batch's protobuf request and, over gRPC, the channel the exporter closed
    to reconnect. Left to the collector's schedule (thresholds count Python objects, not
    the native memory behind them), several such batches pile up while an endpoint is down
    and the agent's memory rises and falls with them. Collected here, on the push thread,
    once per failed export (at most once per --otlp-interval).
    """
    return gc.collect()


def register_counter(registry: CollectorRegistry, counter: ExportCounter) -> Any:
    """Serve the export counter on ``registry`` (so /metrics and the pushes show it)."""
    registry.register(counter)
    return counter
