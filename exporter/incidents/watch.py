"""The incident watch: follows every published snapshot, on the collector thread.

After each pass (`Collector.on_snapshot`, before the exposition is rendered) it reads what
the kernel log has new (`exporter.incidents.kmsg`, never blocking), keeps the peak memory
of the last ``--peak-window`` per GPU and per workload (`exporter.incidents.peaks`), asks
the incident tracker (`exporter.incidents.engine`) what the pass started, and for each new
incident counts it per workload and role, logs one structured line, and hands the pods
their Kubernetes Events (`exporter.incidents.events`, which posts from its own thread).
`IncidentFamilies` serves what it counted on the registry. Nothing here waits on the
network or the driver.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PrometheusCollector

from exporter.core.labels import Labeller, device_label_values, workload_label_map
from exporter.core.model import DeviceSample, Snapshot, Workload
from exporter.incidents.peaks import PeakSeries
from exporter.output import catalogue as cat

V = TypeVar("V")

log = logging.getLogger("l9gpu.incidents")

ROLES = ("caused", "affected")


class _ByPid(Mapping[int, V]):
    """A read-only mapping by PID that is made (``make()``) at its first look, if any."""

    __slots__ = ("_make", "_made")

    def __init__(self, make: Callable[[], dict[int, V]]):
        self._make = make
        self._made: dict[int, V] | None = None

    def _mapping(self) -> dict[int, V]:
        if self._made is None:
            self._made = self._make()
        return self._made

    def __getitem__(self, pid: int) -> V:
        return self._mapping()[pid]

    def get(self, pid: int, default: Any = None) -> Any:
        return self._mapping().get(pid, default)

    def __iter__(self) -> Iterator[int]:
        return iter(self._mapping())

    def __len__(self) -> int:
        return len(self._mapping())


class IncidentWatch:
    """What the incidents part keeps between passes.

    Args:
        node: the node's name (``node`` label, Event source host).
        labeller: workload label values after the device labels (`labels.label_schema`).
        extra_names: the names of those extra values (for the incidents' JSON).
        tracker: the incident tracker (`engine.IncidentTracker`); None keeps peaks only.
        kernel_log: an open `kmsg.KernelLog`, or None (``--kernel-log off``).
        events: an `events.EventSink`, or None (no Kubernetes API, or Events off).
        log_records: a `bridge.incident_logs.IncidentLogs` (OTLP log records), or None.
        peak_window: seconds over which the peaks are the maximum (``--peak-window``).
        clock: monotonic clock (seconds).
    """

    def __init__(self, node: str, labeller: Labeller, extra_names: Sequence[str] = (), *, tracker: Any = None,
                 kernel_log: Any = None, events: Any = None, log_records: Any = None, peak_window: float = 30.0,
                 clock: Callable[[], float] | None = None):
        import time

        self.node = node
        self._labeller = labeller
        self.extra_names = tuple(extra_names)
        self.tracker = tracker
        self.kernel_log = kernel_log
        self.events = events
        self.log_records = log_records
        self._clock = clock or time.monotonic
        self._device_peaks: PeakSeries[str] = PeakSeries(peak_window)
        self._workload_peaks: PeakSeries[tuple[str, ...]] = PeakSeries(peak_window)
        self._devices: dict[str, DeviceSample] = {}
        self._lock = threading.Lock()
        self._counts: dict[tuple[tuple[str, ...], str, str], int] = {}
        self._poll_failed = False
        self._observed = -1  # the seq of the last snapshot the tracker took in whole

    def observe(self, snap: Snapshot) -> None:
        """Fold one published snapshot in (the collector thread's hook)."""
        now = self._clock()
        self._devices = {d.key: d for d in snap.devices}
        self._device_peaks.observe(now, ((d.key, d.memory_used_bytes) for d in snap.devices
                                         if d.up and d.memory_used_bytes is not None))
        self._workload_peaks.observe(now, ((u.labels, u.memory_used_bytes) for u in snap.workloads
                                           if u.present and u.memory_used_bytes is not None))
        if self.tracker is None:
            return
        records = self._poll()
        rows = snap.processes
        # each PID's owner, start and name, made at the tracker's first look: it looks only
        # at the processes of GPUs it does not take on from the last pass
        owners: Mapping[int, Workload] = _ByPid(lambda: {row.pid: row.workload for row in rows})
        starts: Mapping[int, float] = _ByPid(
            lambda: {row.pid: row.start_time for row in rows if row.start_time is not None})
        comms: Mapping[int, str] = _ByPid(lambda: {row.pid: row.comm for row in rows})
        reasons = {key: set(verdict.reason_names) for key, verdict in snap.verdicts.items()}
        # the collector's word that a GPU's processes are the snapshot before's holds for the
        # tracker only where that snapshot is the last one it took in
        unchanged = snap.unchanged_processes if snap.seq == self._observed + 1 else frozenset()
        self._observed = -1
        new = self.tracker.observe(now, snap.timestamp, snap.devices, owners, records, reasons, starts=starts,
                                   comms=comms, new_xids=snap.new_xids, unchanged=unchanged)
        self._observed = snap.seq
        for incident in new:
            self._record(incident)

    def _poll(self) -> Sequence[Any]:
        """The kernel log's new Xid records; nothing (logged once) where the reader fails."""
        if self.kernel_log is None:
            return ()
        try:
            return self.kernel_log.poll()
        except Exception as exc:  # noqa: BLE001 - a reader's failure never reaches the pass
            if not self._poll_failed:
                self._poll_failed = True
                log.warning("reading the kernel log failed: %r; its records are skipped", exc)
            return ()

    def _record(self, incident: Any) -> None:
        from exporter.incidents.messages import event_messages, incident_json

        device = next((d for d in self._devices.values()
                       if d.uuid == incident.uuid and d.gpu_instance == incident.gpu_instance), None)
        rows: list[tuple[str, tuple[str, ...]]] = []
        for role, workloads in (("caused", incident.caused_by), ("affected", incident.affected)):
            for workload in workloads:
                if device is not None and workload.attributed:
                    rows.append((role, device_label_values(self.node, device) + self._labeller(workload)))
        with self._lock:
            for role, labels in rows:
                key = (labels, incident.kind, role)
                self._counts[key] = self._counts.get(key, 0) + 1
        doc = incident_json(incident, self.extra_names)
        summary = _summary(doc)
        log.warning("GPU incident: %s", summary, extra={"incident": doc})
        if self.log_records is not None:
            self.log_records.emit(doc, summary, [(role, workload_label_map(labels, self.extra_names))
                                                 for role, labels in rows])
        if self.events is not None:
            from exporter.incidents.events import PodEvent

            for workload, reason, message in event_messages(incident):
                if workload.pod and workload.namespace:
                    self.events.submit(PodEvent(workload.namespace, workload.pod, workload.pod_uid, reason, message))

    def recent_json(self) -> list[dict[str, Any]]:
        """The incidents the agent remembers, newest first (``/api/v1/incidents``)."""
        if self.tracker is None:
            return []
        from exporter.incidents.messages import incident_json

        return [incident_json(incident, self.extra_names) for incident in self.tracker.recent()]

    def incident_counts(self) -> Mapping[tuple[tuple[str, ...], str, str], int]:
        with self._lock:
            return dict(self._counts)

    def device_peaks(self) -> Mapping[str, int]:
        return self._device_peaks.peaks()

    def workload_peaks(self) -> Mapping[tuple[str, ...], int]:
        return self._workload_peaks.peaks()

    def devices(self) -> Mapping[str, DeviceSample]:
        return dict(self._devices)

    def close(self) -> None:
        if self.kernel_log is not None:
            self.kernel_log.close()
        if self.events is not None:
            self.events.close()
        if self.log_records is not None:
            self.log_records.close()


def _summary(doc: Mapping[str, Any]) -> str:
    def names(key: str) -> str:
        return ", ".join(w.get("owner", "") for w in doc.get(key) or ()) or "-"

    what = f"Xid {doc['xid']}" if doc.get("xid") is not None else doc.get("kind")  # "Xid 79", not "xid Xid 79"
    basis = f" (by {str(doc['cause_basis']).replace('_', ' ')})" if doc.get("cause_basis") else ""
    return (f"{what} on GPU {doc.get('gpu')} ({doc.get('uuid')}): caused by {names('caused_by')}"
            f"{basis}; "
            f"affected {names('affected')}; action {doc.get('action')}; {doc.get('detail', '')}")


_unrepresentable_logged: set[str] = set()


def _counts(name: str, source: Any) -> list[tuple[str, float]]:
    """A source's counts as the exposition's floats: a count that is none (or beyond what a
    float holds exactly) is clamped, logged once per family; a source that fails is skipped
    (logged once): the scrape never fails for them."""
    try:
        counts = list(source.counts().items())
    except Exception as exc:  # noqa: BLE001 - a broken source costs its own family only
        if name not in _unrepresentable_logged:
            _unrepresentable_logged.add(name)
            log.warning("%s: its counts cannot be read (%r); left out", name, exc)
        return []
    out = []
    for outcome, count in counts:
        try:
            value = float(min(max(int(count), 0), 2**53))
        except (TypeError, ValueError, OverflowError):
            value = None
        if value is None or value != count:
            if name not in _unrepresentable_logged:
                _unrepresentable_logged.add(name)
                log.warning("%s{outcome=%r}: count %.40s cannot be exported as it is; clamped to %s", name,
                            str(outcome), str(count), value if value is not None else "nothing")
            if value is None:
                continue
        out.append((str(outcome), value))
    return out


class IncidentFamilies(PrometheusCollector):
    """The incident watch's families on the registry (`catalogue.REGISTERED_ELSEWHERE`)."""

    def __init__(self, watch: IncidentWatch, enabled: frozenset[str], extra_labels: tuple[str, ...] = ()):
        self.watch = watch
        self.enabled = enabled
        self.extra_labels = extra_labels

    def collect(self) -> Iterator[Metric]:
        watch = self.watch
        if "container_gpu_incidents_total" in self.enabled:
            spec = cat.get("container_gpu_incidents_total")
            # kind and role first: the workload's values end with its training labels, only where set
            labels = ("kind", "role") + cat.WORKLOAD_LABELS + self.extra_labels
            counter = CounterMetricFamily(spec.name, spec.help, labels=labels)
            for (values, kind, role), count in sorted(watch.incident_counts().items()):
                counter.add_metric((kind, role) + values, float(count))
            yield counter
        devices = watch.devices()
        if "gpu_memory_peak_bytes" in self.enabled:
            spec = cat.get("gpu_memory_peak_bytes")
            gauge = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels, unit="bytes")
            for key, peak in watch.device_peaks().items():
                if key in devices:
                    gauge.add_metric(device_label_values(watch.node, devices[key]), float(peak))
            yield gauge
        if "container_gpu_memory_peak_bytes" in self.enabled:
            spec = cat.get("container_gpu_memory_peak_bytes")
            gauge = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels + self.extra_labels, unit="bytes")
            for values, peak in watch.workload_peaks().items():
                gauge.add_metric(values, float(peak))
            yield gauge
        for name, source in (("l9gpu_kernel_log_records_total", watch.kernel_log),
                             ("l9gpu_kubernetes_events_total", watch.events)):
            if name in self.enabled and source is not None:
                spec = cat.get(name)
                counter = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
                for outcome, value in _counts(name, source):
                    counter.add_metric((outcome,), value)
                yield counter

    def describe(self) -> Iterator[Metric]:
        return iter(())
