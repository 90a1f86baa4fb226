"""Snapshot -> Prometheus metric families, driven by the catalogue.

`SnapshotCollector` is a prometheus_client custom collector: every ``collect()`` yields
fresh families built from the current snapshot, so a pod that vanished vanishes from the
output (no ``Gauge.labels().set()`` bookkeeping). `families()` is the pure part.
"""

from __future__ import annotations

import platform
import time
from typing import Callable, Iterator, Mapping, Sequence, Union

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector as PrometheusCollector

from exporter import __version__
from exporter.core.labels import device_label_values, workload_id_values
from exporter.core.model import DeviceSample, Snapshot, WorkloadUsage
from exporter.output import catalogue as cat
from exporter.output.render_health import health_rows

Family = Union[GaugeMetricFamily, CounterMetricFamily]


def _family(spec: cat.MetricSpec, labels: tuple[str, ...]) -> Family:
    unit = spec.unit if spec.unit and spec.unit != "ratio" else ""
    if spec.type == cat.COUNTER:
        return CounterMetricFamily(spec.name, spec.help, labels=labels, unit=unit)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels, unit=unit)


def _number(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return float(value)  # type: ignore[arg-type]


def families(
    snapshot: Snapshot,
    enabled: frozenset[str],
    extra_labels: tuple[str, ...] = (),
    now: float | None = None,
) -> Iterator[Metric]:
    """Yield every enabled family for ``snapshot``.

    Args:
        snapshot: what the collector published.
        enabled: family names to export (`catalogue.enabled_names`).
        extra_labels: names of the workload labels after the catalogue's
            (owner, ``label_*``), matching the snapshot's workload label values.
        now: wall-clock time for ``l9gpu_snapshot_age_seconds`` (default: time.time()).
    """
    devices = {d.key: d for d in snapshot.devices}
    dev_labels = {d.key: device_label_values(snapshot.node, d) for d in snapshot.devices}
    sole: list[WorkloadUsage] | None = None  # the workloads that use a GPU alone, once GPM needs them
    for spec in cat.METRICS:
        if spec.name not in enabled or spec.name in cat.REGISTERED_ELSEWHERE:
            continue
        if spec.name == "gpu_stuck_call_seconds":
            family = _stuck_family(spec, snapshot, dev_labels, now)
        elif spec.scope == cat.DEVICE:
            family = _device_family(spec, snapshot, dev_labels)
        elif spec.scope == cat.HEALTH:
            family = _family(spec, spec.labels)
            for labels, row_value in health_rows(spec.name, snapshot, dev_labels):
                family.add_metric(labels, row_value)
        elif spec.scope == cat.WORKLOAD:
            family = _family(spec, spec.labels + extra_labels)
            for usage in snapshot.workloads:
                if not usage.present and spec.type != cat.COUNTER:
                    continue
                value = _number(getattr(usage, spec.source))
                if value is not None:
                    family.add_metric(usage.labels, value)
        elif spec.scope == cat.WORKLOAD_GPM:
            if sole is None:
                sole = [usage for usage in snapshot.workloads if usage.sole_owner]
            family = _gpm_workload_family(spec, sole, devices, extra_labels)
        elif spec.scope == cat.UNATTRIBUTED:
            family = _family(spec, spec.labels)
            for rest in snapshot.unattributed:
                value = _number(getattr(rest, spec.source))
                if value is not None and rest.device_key in dev_labels:
                    family.add_metric(dev_labels[rest.device_key], value)
        elif spec.scope == cat.PROCESS:
            family = _family(spec, spec.labels)
            for row in snapshot.processes:
                value = _number(getattr(row, spec.source))
                if value is not None and row.device_key in dev_labels:
                    labels = dev_labels[row.device_key] + workload_id_values(row.workload) + (str(row.pid), row.comm)
                    family.add_metric(labels, value)
        else:
            family = _self_family(spec, snapshot, devices, now)
        yield family


def _gpm_workload_family(spec: cat.MetricSpec, sole: Sequence[WorkloadUsage], devices: Mapping[str, DeviceSample],
                         extra_labels: tuple[str, ...]) -> Family:
    """A GPM family per workload: on a GPU (or MIG instance) that one workload uses alone
    (`WorkloadUsage.sole_owner`), the device's value with the workload's labels. On a
    shared GPU device-wide values cannot be split by process, so no workload gets them."""
    family = _family(spec, spec.labels + extra_labels)
    key = spec.source[len("gpm."):]
    for usage in sole:
        device = devices.get(usage.device_key)
        if device is not None and device.up:
            value = device.gpm.get(key)
            if value is not None:
                family.add_metric(usage.labels, float(value))
    return family


def _stuck_family(spec: cat.MetricSpec, snapshot: Snapshot, dev_labels: Mapping[str, tuple[str, ...]],
                  now: float | None) -> Family:
    """`gpu_stuck_call_seconds`: per device left unread by a stuck call, how long it has waited."""
    family = _family(spec, spec.labels)
    if not snapshot.stuck:
        return family
    at = time.time() if now is None else now
    for stuck in snapshot.stuck:
        seconds = max(stuck.seconds, at - stuck.since)
        for key in stuck.devices:
            labels = dev_labels.get(key)
            if labels is not None:
                family.add_metric(labels + (stuck.call,), seconds)
    return family


def _device_family(spec: cat.MetricSpec, snapshot: Snapshot,
                   dev_labels: Mapping[str, tuple[str, ...]]) -> Family:
    family = _family(spec, spec.labels)
    for device in snapshot.devices:
        labels = dev_labels[device.key]
        if spec.name == "gpu_info":
            family.add_metric(labels + (device.vendor, device.driver_version, device.pci_bus_id, device.serial), 1.0)
        elif spec.name == "gpu_up":
            family.add_metric(labels, 1.0 if device.up else 0.0)
        elif spec.name == "gpu_energy_joules_total":
            energy = snapshot.device_energy_joules.get(device.key)
            if energy is not None:
                family.add_metric(labels, energy)
        elif spec.name == "gpu_capacity_seconds_total":
            seconds = snapshot.device_capacity_seconds.get(device.key)
            if seconds is not None:
                family.add_metric(labels, seconds)
        elif not device.up and spec.source != "xid_errors":
            continue  # a down GPU keeps only its XID counts (`DeviceSample.down`): Xid 79 takes it down
        elif spec.source.startswith("gpm."):
            gpm_value = device.gpm.get(spec.source[len("gpm."):])
            if gpm_value is not None:
                family.add_metric(labels, float(gpm_value))
        else:
            value = getattr(device, spec.source)
            if isinstance(value, Mapping):
                for key in sorted(value):
                    family.add_metric(labels + (str(key),), float(value[key]))
            else:
                number = _number(value)
                if number is not None:
                    family.add_metric(labels, number)
    return family


def _self_family(spec: cat.MetricSpec, snapshot: Snapshot, devices: Mapping[str, DeviceSample],
                 now: float | None) -> Family:
    family = _family(spec, spec.labels)
    if spec.name == "l9gpu_collector_success":
        for status in snapshot.collectors:
            family.add_metric((status.name,), 1.0 if status.success else 0.0)
    elif spec.name == "l9gpu_collector_duration_seconds":
        for status in snapshot.collectors:
            family.add_metric((status.name,), status.duration_seconds)
    elif spec.name == "l9gpu_snapshot_age_seconds":
        family.add_metric((), max(0.0, (time.time() if now is None else now) - snapshot.timestamp))
    elif spec.name == "l9gpu_unattributed_processes":
        family.add_metric((snapshot.node,), float(snapshot.info.get("unattributed_processes", 0)))
    elif spec.name == "l9gpu_host_pids_visible":
        if "host_pids_visible" in snapshot.info:
            family.add_metric((snapshot.node,), float(snapshot.info["host_pids_visible"]))
    elif spec.name == "l9gpu_backend_errors_total":
        for (backend, reason), count in sorted(snapshot.backend_errors.items()):
            family.add_metric((backend, reason), float(count))
    elif spec.name == "l9gpu_build_info":
        family.add_metric((__version__, platform.python_version()), 1.0)
    return family


class SnapshotCollector(PrometheusCollector):
    """A prometheus_client collector that serves whatever snapshot is current.

    Args:
        get_snapshot: returns the current snapshot (None before the first pass, which
            yields nothing).
        enabled: family names to export.
        extra_labels: extra workload label names (see `families`).
    """

    def __init__(
        self,
        get_snapshot: Callable[[], Snapshot | None],
        enabled: frozenset[str] | None = None,
        extra_labels: tuple[str, ...] = (),
    ):
        self._get_snapshot = get_snapshot
        self._enabled = enabled if enabled is not None else cat.enabled_names()
        self._extra_labels = extra_labels

    def collect(self) -> Iterator[Metric]:
        snapshot = self._get_snapshot()
        if snapshot is None:
            return iter(())
        return families(snapshot, self._enabled, self._extra_labels)

    def describe(self) -> Iterator[Metric]:
        # Declaring no families keeps registration free of a first collect() pass.
        return iter(())
