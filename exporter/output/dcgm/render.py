"""The DCGM schema's families from a snapshot (``--metric-schema dcgm``).

`exporter.output.dcgm.fields` holds the field table and the counters files; this module turns a
snapshot into the families the selected fields name: one device series per GPU and,
for the fields that have them, one workload series per pod container or Slurm job,
holding that workload's own share (docs/MIGRATING-FROM-DCGM.md).
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector as PrometheusCollector
from prometheus_client.samples import Sample

from exporter.core.model import DeviceSample, Snapshot, WorkloadUsage
from exporter.output.dcgm.fields import FieldDevice, Selection, default_selection
from exporter.output.encode import BareCounterName


def workload_labels(usage: WorkloadUsage) -> dict[str, str]:
    """dcgm-exporter's labels for a workload: ``namespace``/``pod``/``container`` for a pod,
    ``hpc_job`` for a Slurm job; empty when neither is known (a pod known by UID only). A
    rank of a training job adds ``training_job`` and ``training_rank`` (l9gpu's, as in the
    native schema; dcgm-exporter has none), each only where set."""
    workload = usage.workload
    out: dict[str, str] = {}
    if workload.pod:
        out["container"] = workload.container
        out["namespace"] = workload.namespace
        out["pod"] = workload.pod
    elif workload.slurm_job_id:
        out["hpc_job"] = workload.slurm_job_id
    if out:
        out["training_job"] = workload.training_job
        out["training_rank"] = workload.training_job and workload.training_rank
    return {k: v for k, v in out.items() if v}


class DcgmRenderer:
    """Builds the DCGM families from a snapshot.

    It keeps one piece of state across snapshots: per GPU, the XID counts it last saw,
    to tell which XID came last (``DCGM_FI_DEV_XID_ERRORS``). Rendering the same
    snapshot again gives the same output. Safe to call from several threads.
    """

    def __init__(self, selection: Selection):
        self.selection = selection
        self._wants_xid = any(f.uses_last_xid for f, _, _ in selection.metrics)
        self._lock = threading.Lock()
        self._xid: dict[str, tuple[int, Mapping[str, int], int]] = {}  # key -> (seq, counts, last)
        self._label_cache: dict[tuple[str, ...], dict[str, str]] = {}

    def _last_xid(self, snapshot: Snapshot, device: DeviceSample) -> int:
        with self._lock:
            seq, counts, last = self._xid.get(device.key, (-1, {}, 0))
            if snapshot.seq <= seq:
                return last
            grown = [int(code) for code, count in device.xid_errors.items()
                     if count > counts.get(code, 0) and str(code).isdigit()]
            if grown:
                last = max(grown)  # several new codes in one pass: no order is known, take the highest
            self._xid[device.key] = (snapshot.seq, dict(device.xid_errors), last)
            return last

    def _device_labels(self, node: str, device: DeviceSample, parent_uuid: str) -> dict[str, str]:
        extras = tuple(str(f.value(FieldDevice(device, None, None)) or "") for f in self.selection.labels)
        hostname_label = self.selection.hostname_label
        key = (node, device.key, str(device.index), parent_uuid, device.model, device.pci_bus_id,
               device.gpu_instance) + extras
        labels = self._label_cache.get(key)
        if labels is None:
            labels = {"gpu": str(device.index), "UUID": parent_uuid, "pci_bus_id": device.pci_bus_id,
                      "device": f"nvidia{device.index}", "modelName": device.model}
            if device.gpu_instance:
                labels["GPU_I_ID"] = device.gpu_instance
            if hostname_label != "none":
                labels[hostname_label] = node
            for spec, value in zip(self.selection.labels, extras):
                labels[spec.name] = value
            labels = {k: v for k, v in labels.items() if v}
            if len(self._label_cache) > 1024:  # devices come and go rarely; keep it bounded
                self._label_cache.clear()
            self._label_cache[key] = labels
        return labels

    def families(self, snapshot: Snapshot) -> list[Metric]:
        """Every selected family for ``snapshot`` (NVIDIA devices only)."""
        samples = [d for d in snapshot.devices if d.up and d.vendor == "nvidia"]
        parents = {d.index: d.uuid for d in samples if not d.gpu_instance}
        devices: list[tuple[FieldDevice, dict[str, str]]] = []
        for sample in samples:
            last_xid = self._last_xid(snapshot, sample) if self._wants_xid and not sample.gpu_instance else None
            device = FieldDevice(sample, snapshot.device_energy_joules.get(sample.key), last_xid, snapshot)
            devices.append((device, self._device_labels(snapshot.node, sample, parents.get(sample.index, sample.uuid))))
        workloads = self._workloads(snapshot, {d.sample.key: labels for d, labels in devices})
        out: list[Metric] = []
        for spec, kind, help_text in self.selection.metrics:
            family = Metric(spec.name, help_text, kind)
            if kind == "counter":
                family.name = BareCounterName(spec.name)
            name = spec.name
            append = family.samples.append
            for device, labels in devices:
                value = spec.value(device)
                if value is not None:
                    append(Sample(name, labels, float(value)))
                share = spec.workload
                if share is None:
                    continue
                for usage, wlabels in workloads.get(device.sample.key, ()):
                    if not usage.present and spec.type != "counter":
                        continue
                    part = share(usage, device)
                    if part is not None:
                        append(Sample(name, wlabels, part))
            out.append(family)
        return out

    @staticmethod
    def _workloads(snapshot: Snapshot, device_labels: Mapping[str, dict[str, str]]
                   ) -> dict[str, list[tuple[WorkloadUsage, dict[str, str]]]]:
        """Per device key, each workload with its series labels (device labels + its own).

        Two workloads with the same labels on one GPU (a pod replaced by one of the same
        name while the old one's counters are kept for the grace period) would make
        duplicate series: the present one wins.
        """
        by_device: dict[str, dict[tuple[tuple[str, str], ...], tuple[WorkloadUsage, dict[str, str]]]] = {}
        for usage in snapshot.workloads:
            base = device_labels.get(usage.device_key)
            if base is None:
                continue
            own = workload_labels(usage)
            if not own:
                continue
            key = tuple(own.items())
            series = by_device.setdefault(usage.device_key, {})
            if key in series and series[key][0].present and not usage.present:
                continue
            series[key] = (usage, {**base, **own})
        return {key: list(series.values()) for key, series in by_device.items()}


class DcgmSnapshotCollector(PrometheusCollector):
    """A prometheus_client collector serving the DCGM families of the current snapshot.

    Args:
        get_snapshot: returns the current snapshot (None before the first pass).
        selection: the fields to serve (`default_selection` or a counters file's).
    """

    def __init__(self, get_snapshot: Callable[[], Snapshot | None], selection: Selection | None = None):
        self._get_snapshot = get_snapshot
        self.renderer = DcgmRenderer(selection if selection is not None else default_selection())

    def collect(self) -> Iterator[Metric]:
        snapshot = self._get_snapshot()
        if snapshot is None:
            return iter(())
        return iter(self.renderer.families(snapshot))

    def describe(self) -> Iterator[Metric]:
        return iter(())


