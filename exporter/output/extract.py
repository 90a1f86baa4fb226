"""What turns a snapshot into one family's series: the extractors the catalogue's rows name.

A row of `exporter.output.catalogue` carries its extractor; `exporter.output.render` calls it
with the pass's `Frame` and the row and adds each (label values, value) it yields to the
family. Nothing outside the row decides how a family is read, so adding a family is an edit
of its row. Most rows name one of the building blocks here (an attribute of each device,
workload, unattributed rest or process row); a family with a rule of its own says it in its
row. A value that is not known yields no series, never a 0.

`PerDevice` reads one device at a time. The DCGM schema reads a device's series of such a
row through `PerDevice.read` (the health families' DCGM fields, `exporter.output.dcgm.fields`).
"""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping

from exporter import __version__
from exporter.core.labels import device_label_values, training_values, workload_id_values
from exporter.core.model import DeviceSample, ProcessRow, Snapshot, Unattributed, WorkloadUsage

if TYPE_CHECKING:
    from exporter.output.spec import MetricSpec

Labels = tuple[str, ...]
Row = tuple[Labels, float]
# (the pass, the family's row) -> (label values, value) of each series
Extractor = Callable[["Frame", "MetricSpec"], Iterable[Row]]
# (the snapshot, one device) -> (label values after the device's, value) of each series
DeviceRows = Callable[[Snapshot, DeviceSample], Iterable[Row]]


@dataclass(frozen=True)
class Frame:
    """One render of a snapshot: what every extractor may read, worked out once.

    Attributes:
        snapshot: what the collector published.
        now: wall-clock time of the render, for ages and waits, in seconds.
        dev_labels: each device's `DEVICE_LABELS` values, by device key.
        devices: each device by key.
    """

    snapshot: Snapshot
    now: float
    dev_labels: Mapping[str, Labels]
    devices: Mapping[str, DeviceSample]

    @classmethod
    def of(cls, snapshot: Snapshot, now: float) -> Frame:
        """The frame of ``snapshot`` rendered at ``now``."""
        return cls(snapshot, now, {d.key: device_label_values(snapshot.node, d) for d in snapshot.devices},
                   {d.key: d for d in snapshot.devices})

    @cached_property
    def sole_workloads(self) -> tuple[WorkloadUsage, ...]:
        """The workloads that use a GPU (or MIG instance) alone (`WorkloadUsage.sole_owner`)."""
        return tuple(usage for usage in self.snapshot.workloads if usage.sole_owner)


def number(value: object) -> float | None:
    """A value as a sample: None stays None (no series), a flag is 1 or 0."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return float(value)  # type: ignore[arg-type]


def _checked(kind: type, attribute: str) -> str:
    """``attribute`` if ``kind`` has that field: a row naming a field that does not exist
    fails when the table is built, not on the first scrape."""
    if attribute not in {f.name for f in dataclasses.fields(kind)}:
        raise ValueError(f"{kind.__name__} has no field {attribute!r}")
    return attribute


class PerDevice:
    """An extractor that reads each device of the snapshot on its own.

    Args:
        read: (snapshot, device) -> (label values after the device's, value) of each series.
    """

    __slots__ = ("read",)

    def __init__(self, read: DeviceRows):
        self.read = read

    def __call__(self, frame: Frame, spec: MetricSpec) -> Iterator[Row]:
        snapshot, dev_labels = frame.snapshot, frame.dev_labels
        for device in snapshot.devices:
            labels = dev_labels[device.key]
            for extra, value in self.read(snapshot, device):
                yield labels + extra, value


def device(attribute: str, kept_when_down: bool = False) -> PerDevice:
    """A `DeviceSample` attribute of each device. A mapping (ECC counts by type, XIDs by code)
    gives one series per key, the key as the last label, in key order.

    Args:
        attribute: the `DeviceSample` field.
        kept_when_down: also for a GPU that could not be read (`DeviceSample.down` keeps
            its XID counts: an Xid 79 takes the GPU down).
    """
    _checked(DeviceSample, attribute)

    def read(snapshot: Snapshot, sample: DeviceSample) -> Iterable[Row]:
        if not sample.up and not kept_when_down:
            return ()
        value = getattr(sample, attribute)
        if isinstance(value, Mapping):
            return [((str(key),), float(value[key])) for key in sorted(value)]
        sampled = number(value)
        return () if sampled is None else (((), sampled),)

    return PerDevice(read)


def device_gpm(key: str) -> PerDevice:
    """One NVML GPM value of each device that is up (`DeviceSample.gpm`)."""

    def read(snapshot: Snapshot, sample: DeviceSample) -> Iterable[Row]:
        value = sample.gpm.get(key) if sample.up else None
        return () if value is None else (((), float(value)),)

    return PerDevice(read)


def by_device(values: Callable[[Snapshot], Mapping[str, float]]) -> PerDevice:
    """A per-device value the pass keeps in the snapshot (energy counter, capacity seconds),
    for every device it has one for, up or down."""

    def read(snapshot: Snapshot, sample: DeviceSample) -> Iterable[Row]:
        value = values(snapshot).get(sample.key)
        return () if value is None else (((), value),)

    return PerDevice(read)


def stuck_calls(frame: Frame, spec: MetricSpec) -> Iterator[Row]:
    """Per device left unread by a stuck call, how long the call has waited, labelled with it."""
    for stuck in frame.snapshot.stuck:
        seconds = max(stuck.seconds, frame.now - stuck.since)
        for key in stuck.devices:
            labels = frame.dev_labels.get(key)
            if labels is not None:
                yield labels + (stuck.call,), seconds


def workload(attribute: str) -> Extractor:
    """A `WorkloadUsage` attribute of each workload on each GPU. A workload that is gone
    (kept for the grace period) keeps only its counters."""
    _checked(WorkloadUsage, attribute)

    def extract(frame: Frame, spec: MetricSpec) -> Iterator[Row]:
        counter = spec.is_counter
        for usage in frame.snapshot.workloads:
            if usage.present or counter:
                value = number(getattr(usage, attribute))
                if value is not None:
                    yield usage.labels, value

    return extract


def sole_workload_gpm(key: str) -> Extractor:
    """One GPM value of a GPU (or MIG instance) that one workload uses alone, with that
    workload's labels. On a shared GPU a device-wide value cannot be split by process, so
    no workload gets it."""

    def extract(frame: Frame, spec: MetricSpec) -> Iterator[Row]:
        for usage in frame.sole_workloads:
            sample = frame.devices.get(usage.device_key)
            if sample is not None and sample.up:
                value = sample.gpm.get(key)
                if value is not None:
                    yield usage.labels, float(value)

    return extract


def unattributed(attribute: str) -> Extractor:
    """An `Unattributed` attribute of each GPU: what belongs to no workload there."""
    _checked(Unattributed, attribute)

    def extract(frame: Frame, spec: MetricSpec) -> Iterator[Row]:
        for rest in frame.snapshot.unattributed:
            value = number(getattr(rest, attribute))
            if value is not None and rest.device_key in frame.dev_labels:
                yield frame.dev_labels[rest.device_key], value

    return extract


def process(attribute: str) -> Extractor:
    """A `ProcessRow` attribute of each GPU process, labelled with its GPU, workload, PID and name
    (and its training job and rank where set)."""
    _checked(ProcessRow, attribute)

    def extract(frame: Frame, spec: MetricSpec) -> Iterator[Row]:
        for row in frame.snapshot.processes:
            value = number(getattr(row, attribute))
            if value is not None and row.device_key in frame.dev_labels:
                workload = row.workload
                labels = (frame.dev_labels[row.device_key] + workload_id_values(workload) + (str(row.pid), row.comm)
                          + training_values(workload))
                yield labels, value

    return extract


def node_info(key: str, default: float | None = None) -> Extractor:
    """A number the pass counted about the node (`Snapshot.info`), labelled with the node;
    ``default`` where the pass did not count it (None: no series)."""

    def extract(frame: Frame, spec: MetricSpec) -> Iterator[Row]:
        value = frame.snapshot.info.get(key, default)
        if value is not None:
            yield (frame.snapshot.node,), float(value)

    return extract


def snapshot_age(frame: Frame, spec: MetricSpec) -> Iterator[Row]:
    """How old the snapshot a scrape serves is, in seconds (never negative)."""
    yield (), max(0.0, frame.now - frame.snapshot.timestamp)


def build_info(frame: Frame, spec: MetricSpec) -> Iterator[Row]:
    """The agent's version and Python's, value 1."""
    yield (__version__, platform.python_version()), 1.0
