"""A row of the metric table, and what it declares.

`MetricSpec` is one family of `exporter.output.catalogue`: its name, type, unit, help and
labels, and what renders it (its extractor, `exporter.output.extract`), the OpenTelemetry
names its labels take, its nearest dcgm-exporter field, and the dcgm-exporter fields
``--metric-schema dcgm`` serves from its series (`DcgmAlias`). Everything that serves a
family reads it from its row; nothing branches on a family's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.output.extract import Extractor, PerDevice

# Prometheus label key -> OpenTelemetry attribute (semantic conventions where they exist).
LABEL_ATTRIBUTES: dict[str, str] = {
    "node": "k8s.node.name",
    "gpu": "gpu.index",
    "uuid": "gpu.id",
    "model": "gpu.model",
    "vendor": "gpu.vendor",
    "gpu_instance": "gpu.mig.instance",
    "driver_version": "gpu.driver.version",
    "pci_bus_id": "gpu.pci.bus_id",
    "serial": "gpu.serial",
    "namespace": "k8s.namespace.name",
    "pod": "k8s.pod.name",
    "container": "k8s.container.name",
    "pod_uid": "k8s.pod.uid",
    "slurm_job_id": "slurm.job.id",
    "slurm_user": "slurm.user",
    "slurm_account": "slurm.account",
    "training_job": "training.job.name",
    "training_rank": "training.job.rank",
    "owner_kind": "k8s.workload.kind",
    "owner_name": "k8s.workload.name",
    "pid": "process.pid",
    "comm": "process.executable.name",
    "collector": "l9gpu.collector",
    "type": "gpu.ecc.type",
    "xid": "gpu.xid",
    "reason": "gpu.throttle.reason",
    "state": "gpu.health.state",
    "action": "gpu.health.action",
    "link": "gpu.nvlink.link",
    "result": "l9gpu.result",
    "backend": "l9gpu.backend",
    "version": "service.version",
}

# Prometheus unit word (as in the metric name) -> UCUM unit for OTLP.
UCUM: dict[str, str] = {
    "bytes": "By",
    "bytes_per_second": "By/s",
    "watts": "W",
    "joules": "J",
    "celsius": "Cel",
    "hertz": "Hz",
    "seconds": "s",
    "ratio": "1",
    "": "1",
}

GAUGE = "gauge"
COUNTER = "counter"
INFO = "info"  # rendered as a gauge named *_info with value 1

# Which rows feed a family: its labels (workload families take the configured workload
# labels too), its section of docs/METRICS.md, and which families a command serves.
DEVICE = "device"
WORKLOAD = "workload"
WORKLOAD_GPM = "workload_gpm"  # a device's GPM values, labelled with its only workload
UNATTRIBUTED = "unattributed"
HEALTH = "health"  # the verdict and the last health read's signals (exporter.output.render_health)
PROCESS = "process"
INCIDENT = "incident"  # per workload and GPU, by kind and role (exporter.incidents.watch)
SELF = "self"


def otel_attribute(label: str) -> str:
    """Map a Prometheus label key to its OpenTelemetry attribute key.

    Pod labels copied with ``--pod-label`` (``label_team``) become ``k8s.pod.label.team``.
    """
    if label in LABEL_ATTRIBUTES:
        return LABEL_ATTRIBUTES[label]
    if label.startswith("label_"):
        return "k8s.pod.label." + label[len("label_"):]
    return label


@dataclass(frozen=True)
class DcgmAlias:
    """A dcgm-exporter field that ``--metric-schema dcgm`` serves from a family's series.

    The field's value on a GPU is the sum of the family's series there that carry the
    ``where`` label values (summed over the family's other labels, e.g. over NVLink links),
    times ``factor``; no such series, no value.

    Attributes:
        name: the DCGM field, which is also the series name.
        type: "gauge" or "counter", as dcgm-exporter serves it.
        unit: DCGM's unit, for the docs ("µs", "rows", ...).
        factor: from the family's unit to DCGM's (seconds to microseconds: 1e6).
        where: (label, value) pairs picking the family's series.
    """

    name: str
    type: str
    unit: str
    factor: float = 1.0
    where: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class MetricSpec:
    """One metric family.

    Attributes:
        name: the Prometheus family name (counters include ``_total``).
        type: GAUGE, COUNTER or INFO.
        unit: the Prometheus unit word ("bytes", "watts", ...; "" for counts).
        help: the HELP text.
        labels: label names, in order.
        scope: which rows feed it (DEVICE, HEALTH, WORKLOAD, UNATTRIBUTED, PROCESS, SELF, ...).
        extract: what renders it from a snapshot (`exporter.output.extract`): called with
            the render's frame and this row, it yields (label values, value) per series.
        dcgm: the nearest DCGM exporter field and the factor from our unit to its unit,
            for users moving dashboards over ("" where DCGM has none); by default the first
            of ``dcgm_fields``.
        default_enabled: exported unless disabled; False means opt-in.
        vendors_note: which vendors cannot provide it (docs only).
        dcgm_fields: the DCGM fields ``--metric-schema dcgm`` serves from this family's
            series (its extractor must read one device at a time: `PerDevice`).
        registered_by: the part that registers the family on the registry itself, instead
            of a render of the snapshot (then there is no ``extract``).
    """

    name: str
    type: str
    unit: str
    help: str
    labels: tuple[str, ...]
    scope: str
    extract: Extractor | None = None
    dcgm: tuple[str, float] = ("", 1.0)
    default_enabled: bool = True
    vendors_note: str = ""
    dcgm_fields: tuple[DcgmAlias, ...] = ()
    registered_by: str = ""

    def __post_init__(self) -> None:
        if (self.extract is None) == (not self.registered_by):
            raise ValueError(f"{self.name}: a family is rendered from the snapshot (extract) or registered "
                             "by a part of its own (registered_by): give exactly one")
        if self.dcgm_fields and not isinstance(self.extract, PerDevice):
            raise ValueError(f"{self.name}: DCGM fields are served per GPU: its extractor must be PerDevice")
        for alias in self.dcgm_fields:
            unknown = {label for label, _ in alias.where} - set(self.labels)
            if unknown:
                raise ValueError(f"{self.name}: {alias.name} picks series by labels it lacks: {sorted(unknown)}")
        if self.dcgm_fields and not self.dcgm[0]:
            object.__setattr__(self, "dcgm", (self.dcgm_fields[0].name, self.dcgm_fields[0].factor))

    @property
    def is_counter(self) -> bool:
        """Whether the family is a counter (it keeps counting for a workload that is gone)."""
        return self.type == COUNTER

    @property
    def ucum(self) -> str:
        """The OTLP unit (UCUM) for this family."""
        return UCUM[self.unit]

    @property
    def otel_attributes(self) -> tuple[str, ...]:
        """The OTLP attribute key of each label, in label order."""
        return tuple(otel_attribute(label) for label in self.labels)
