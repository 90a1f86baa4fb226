"""The stall watch: follows every published snapshot, on the collector thread, as the
incident watch does (`exporter.incidents.watch`).

After each pass it asks the tracker (`exporter.stall.tracker`) which GPUs are busy with no
work and for how long; a stall that has lasted ``--stall-after`` becomes an incident of kind
``stalled``: one structured log line, OTLP log records, and a Warning Event on each pod on
the GPU (through the incidents' event sink, which posts from its own thread); its end is
logged and posted too (a Normal Event). `StallFamilies` serves ``gpu_stalled``,
``gpu_stalled_seconds_total`` and ``container_gpu_stalled``; the page and
``/api/v1/snapshot`` read `StallWatch.gpu_entries`, ``/api/v1/incidents`` `recent_json`.
Nothing here waits on the network or the driver.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PrometheusCollector

from exporter.core.labels import device_label_values, workload_label_map
from exporter.core.model import DeviceSample, Snapshot, Workload, WorkloadUsage
from exporter.output import catalogue as cat
from exporter.stall.messages import event_messages, headline, holders_json, stall_id, stall_json
from exporter.stall.policy import STALL_AFTER, THRESHOLDS, THROTTLE
from exporter.stall.signature import Reading
from exporter.stall.tracker import GpuState, Stall, StallTracker

log = logging.getLogger("l9gpu.stall")

FAMILIES = ("gpu_stalled", "gpu_stalled_seconds_total", "container_gpu_stalled")


class StallWatch:
    """What the stall part keeps between passes.

    Args:
        node: the node's name.
        stall_after: seconds the signature must hold (``--stall-after``).
        extra_names: the names of the workload label values after `labels.WORKLOAD_LABELS`.
        events: the incidents' `events.EventSink`, or None (no Kubernetes API, or Events off).
        log_records: the OTLP log records (`bridge.incident_logs.IncidentLogs`), or None.
        history: how many stalls it keeps for ``/api/v1/incidents`` (``--incident-history``).
    """

    def __init__(self, node: str, stall_after: float = STALL_AFTER, extra_names: Sequence[str] = (), *,
                 events: Any = None, log_records: Any = None, history: int = 256):
        self.node = node
        self.stall_after = stall_after
        self.extra_names = tuple(extra_names)
        self.events = events
        self.log_records = log_records
        self.tracker = StallTracker(node, stall_after)
        self._history = history
        self._lock = threading.Lock()
        self._stalls: OrderedDict[str, Stall] = OrderedDict()  # by id, oldest first
        self._states: dict[str, GpuState] = {}
        self._devices: tuple[DeviceSample, ...] = ()
        self._usages: tuple[WorkloadUsage, ...] = ()
        self._now = 0.0

    def observe(self, snap: Snapshot) -> None:
        """Fold one published snapshot in (the collector thread's hook)."""
        holders: dict[str, list[Workload]] = {}
        usages = tuple(u for u in snap.workloads if u.present)
        for usage in usages:
            if usage.processes:
                holders.setdefault(usage.device_key, []).append(usage.workload)
        began, ended = self.tracker.observe(snap.timestamp, snap.devices, holders)
        with self._lock:
            self._states = self.tracker.states()
            self._devices, self._usages, self._now = snap.devices, usages, snap.timestamp
            for stall in (*began, *ended):
                self._stalls[stall_id(stall)] = stall
            while len(self._stalls) > self._history:
                self._stalls.popitem(last=False)
        for stall in began:
            self._report(stall, snap.timestamp, logging.WARNING)
        for stall in ended:
            self._report(stall, snap.timestamp, logging.INFO)

    def _report(self, stall: Stall, now: float, level: int) -> None:
        doc = stall_json(stall, now, self.stall_after)
        summary = headline(stall, now) + (f"; ended: {stall.end_reason}" if stall.ended is not None else
                                          f"; {doc['detail']}")
        log.log(level, "GPU stall: %s", summary, extra={"incident": doc})
        if self.log_records is not None:
            labels = {u.workload: u.labels for u in self._usages if u.device_key == stall.device_key}
            self.log_records.emit(doc, summary, [("affected", workload_label_map(labels[w], self.extra_names))
                                                 for w in stall.workloads if w.attributed and w in labels])
        if self.events is not None:
            from exporter.incidents.events import PodEvent

            for workload, kind, reason, message in event_messages(stall, now):
                if workload.pod and workload.namespace:
                    self.events.submit(PodEvent(workload.namespace, workload.pod, workload.pod_uid, reason, message,
                                                type=kind))

    def recent_json(self) -> list[dict[str, Any]]:
        """The stalls it remembers, newest first (merged into ``/api/v1/incidents``)."""
        with self._lock:
            stalls, now = list(self._stalls.values()), self._now
        return [stall_json(s, now, self.stall_after) for s in reversed(stalls)]

    def gpu_entries(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Each GPU's ``stall`` object of ``/api/v1/snapshot`` by (UUID, MIG instance): its state
        (``stalled``, ``matching`` while the signature holds but not yet long enough, ``clear``,
        or ``not_judged``), since when, the signals and why it is not a stall."""
        with self._lock:
            states, devices, now = dict(self._states), self._devices, self._now
        out = {}
        for device in devices:
            state = states.get(device.key)
            if state is not None:
                out[(device.uuid, device.gpu_instance)] = gpu_entry(state, now, self.stall_after)
        return out

    def series(self) -> tuple[tuple[DeviceSample, ...], tuple[WorkloadUsage, ...], dict[str, GpuState]]:
        """The last pass's devices, present workloads and each device's state (for the families)."""
        with self._lock:
            return self._devices, self._usages, dict(self._states)


def gpu_entry(state: GpuState, now: float, stall_after: float) -> dict[str, Any]:
    """One GPU's ``stall`` object (docs/SNAPSHOT.md)."""
    reading = state.reading
    if state.stalled:
        name = "stalled"
    elif state.since is not None:
        name = "matching"
    else:
        name = "clear" if reading.judged else "not_judged"
    stall = state.stall
    return {
        **reading_entry(reading, name),
        "since": state.since, "seconds": (now - state.since) if state.since is not None else 0.0,
        "stall_after_seconds": stall_after, "stalled_seconds_total": state.stalled_seconds_total,
        "headline": headline(stall, now) if stall is not None else None,
        "holders": holders_json(stall.workloads) if stall is not None else [],
    }


def reading_entry(reading: Reading, state: str | None = None) -> dict[str, Any]:
    """The keys of a GPU's ``stall`` object one pass gives: its state (``signature`` where one
    pass matches, for ``l9gpu snapshot``, which cannot tell how long it has lasted), the signals,
    those absent, why it is not a stall."""
    if state is None:
        state = "signature" if reading.matched else "clear" if reading.judged else "not_judged"
    signals = {t.name: reading.signals.get(t.name) for t in THRESHOLDS if t is not THROTTLE}  # None: not read
    signals["throttled"] = list(reading.signals.get("throttled") or [])  # type: ignore[call-overload]
    return {"state": state, "signals": signals, "signals_absent": list(reading.absent),
            "why_not": reading.why_not or None}


# The keys of a ``stall`` object that only the agent, which follows a GPU across passes, can
# fill: one pass (``l9gpu snapshot``) gives them as unknown, so both documents have one shape.
ACROSS_PASSES_UNKNOWN: dict[str, Any] = {"since": None, "seconds": None, "stall_after_seconds": None,
                                         "stalled_seconds_total": None, "headline": None, "holders": []}


class StallFamilies(PrometheusCollector):
    """The stall watch's families on the registry (`catalogue.REGISTERED_ELSEWHERE`): one
    ``gpu_stalled`` and ``gpu_stalled_seconds_total`` per GPU it reads, one
    ``container_gpu_stalled`` per workload on them."""

    def __init__(self, watch: StallWatch, enabled: frozenset[str], extra_labels: tuple[str, ...] = ()):
        self.watch = watch
        self.enabled = enabled
        self.extra_labels = extra_labels

    def collect(self) -> Iterator[Metric]:
        devices, usages, states = self.watch.series()
        node = self.watch.node
        judged = [(d, states[d.key]) for d in devices if d.key in states]
        if "gpu_stalled" in self.enabled:
            spec = cat.get("gpu_stalled")
            gauge = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
            for device, state in judged:
                gauge.add_metric(device_label_values(node, device), 1.0 if state.stalled else 0.0)
            yield gauge
        if "gpu_stalled_seconds_total" in self.enabled:
            spec = cat.get("gpu_stalled_seconds_total")
            counter = CounterMetricFamily(spec.name, spec.help, labels=spec.labels, unit="seconds")
            for device, state in judged:
                counter.add_metric(device_label_values(node, device), state.stalled_seconds_total)
            yield counter
        if "container_gpu_stalled" in self.enabled:
            spec = cat.get("container_gpu_stalled")
            gauge = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels + self.extra_labels)
            for usage in usages:
                held = states.get(usage.device_key)
                if held is not None and usage.workload.attributed:
                    gauge.add_metric(usage.labels, 1.0 if held.stalled else 0.0)
            yield gauge

    def describe(self) -> Iterator[Metric]:
        return iter(())


def merged_incidents(*sources: Any) -> list[Mapping[str, Any]]:
    """Several watches' incidents as one list, newest first (``/api/v1/incidents``, the page)."""
    items = [item for source in sources if source is not None for item in source()]
    return sorted(items, key=lambda item: -float(item.get("time") or 0.0))
