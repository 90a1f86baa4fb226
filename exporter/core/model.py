"""Immutable data that flows from the device backends to rendering.

One collection pass produces `DeviceSample`s (with their `ProcessSample`s), attribution
maps PIDs to `Workload`s, and `derive` folds both into a `Snapshot`, the only object a
scrape ever reads. Everything here is a frozen dataclass: a snapshot published by the
collector thread can be read by any number of readers without locks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Mapping, TypeVar

from exporter.health.signals import HealthSignals
from exporter.health.verdict import Verdict

_EMPTY: Mapping[str, object] = MappingProxyType({})
_T = TypeVar("_T")

# Keys of `DeviceSample.gpm`: NVML GPM (GPU Performance Monitoring, Hopper and newer)
# metrics averaged between two consecutive samples of a device. Activity values are
# ratios 0-1 (NVML gives percent); the rates are bytes per second.
GPM_RATIO_KEYS: tuple[str, ...] = (
    "graphics_active",      # NVML_GPM_METRIC_GRAPHICS_UTIL  ~ DCGM_FI_PROF_GR_ENGINE_ACTIVE
    "sm_active",            # NVML_GPM_METRIC_SM_UTIL        ~ DCGM_FI_PROF_SM_ACTIVE
    "sm_occupancy",         # NVML_GPM_METRIC_SM_OCCUPANCY   ~ DCGM_FI_PROF_SM_OCCUPANCY
    "tensor_active",        # NVML_GPM_METRIC_ANY_TENSOR_UTIL ~ DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    "tensor_hmma_active",   # NVML_GPM_METRIC_HMMA_TENSOR_UTIL ~ DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE
    "tensor_imma_active",   # NVML_GPM_METRIC_IMMA_TENSOR_UTIL ~ DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE
    "tensor_dfma_active",   # NVML_GPM_METRIC_DFMA_TENSOR_UTIL ~ DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE
    "dram_active",          # NVML_GPM_METRIC_DRAM_BW_UTIL   ~ DCGM_FI_PROF_DRAM_ACTIVE
    "fp16_active",          # NVML_GPM_METRIC_FP16_UTIL      ~ DCGM_FI_PROF_PIPE_FP16_ACTIVE
    "fp32_active",          # NVML_GPM_METRIC_FP32_UTIL      ~ DCGM_FI_PROF_PIPE_FP32_ACTIVE
    "fp64_active",          # NVML_GPM_METRIC_FP64_UTIL      ~ DCGM_FI_PROF_PIPE_FP64_ACTIVE
)
GPM_RATE_KEYS: tuple[str, ...] = (
    "pcie_tx_bytes_per_second",    # NVML_GPM_METRIC_PCIE_TX_PER_SEC ~ DCGM_FI_PROF_PCIE_TX_BYTES
    "pcie_rx_bytes_per_second",    # NVML_GPM_METRIC_PCIE_RX_PER_SEC ~ DCGM_FI_PROF_PCIE_RX_BYTES
    "nvlink_tx_bytes_per_second",  # NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC ~ DCGM_FI_PROF_NVLINK_TX_BYTES
    "nvlink_rx_bytes_per_second",  # NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC ~ DCGM_FI_PROF_NVLINK_RX_BYTES
)


def frozen_mapping(values: Mapping | None = None) -> Mapping:
    """Return a read-only copy of ``values`` (an empty mapping for None)."""
    if not values:
        return _EMPTY
    return MappingProxyType(dict(values))


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def updated(sample: _T, **changes: object) -> _T:
    """``dataclasses.replace`` for the samples a pass copies once per GPU: the same new
    object without running the generated ``__init__`` again, which is cheaper. The changes
    are field names, as for replace."""
    cls: type = type(sample)
    if hasattr(cls, "__post_init__") or not hasattr(sample, "__dict__"):
        return replace(sample, **changes)  # type: ignore[type-var]
    names = _field_names(cls)
    unknown = [name for name in changes if name not in names]
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {unknown[0]!r}")
    new: _T = object.__new__(cls)
    new.__dict__.update(sample.__dict__)
    new.__dict__.update(changes)
    return new


_set = object.__setattr__
_NONE: Mapping[str, Any] = _EMPTY  # a mapping field's default in a hand-written __init__


@dataclass(frozen=True, init=False)
class ProcessSample:
    """One process that holds a GPU, as the vendor library reports it.

    Made by the hundred each pass on a busy node: its ``__init__`` fills the instance in
    one step instead of the generated one's frozen assignment per field, which costs twice
    as much (tests/test_model.py holds it to the fields).

    Attributes:
        pid: host PID (NVML and amdsmi report PIDs in the host's PID namespace).
        used_memory_bytes: device memory held by the process, in bytes; None when the
            driver does not report it (e.g. Windows WDDM or some MIG setups).
        sm_utilization: the process's share of SM (compute engine) time over the last
            interval, 0-1; None when the device cannot sample per-process utilisation.
        memory_utilization: the process's share of memory-controller time, 0-1, or None.
        kind: "compute" or "graphics".
    """

    pid: int
    used_memory_bytes: int | None = None
    sm_utilization: float | None = None
    memory_utilization: float | None = None
    kind: str = "compute"

    def __init__(self, pid: int, used_memory_bytes: int | None = None, sm_utilization: float | None = None,
                 memory_utilization: float | None = None, kind: str = "compute"):
        _set(self, "__dict__", {"pid": pid, "used_memory_bytes": used_memory_bytes, "sm_utilization": sm_utilization,
                                "memory_utilization": memory_utilization, "kind": kind})


@dataclass(frozen=True, init=False)
class DeviceSample:
    """One GPU (or one MIG instance) read once.

    Made once per GPU and pass by each backend: its ``__init__`` fills the instance in one
    step, as `ProcessSample`'s does (tests/test_model.py holds it to the fields).

    Every optional value is None when the device or driver cannot give it; rendering
    omits such values rather than exporting 0. Units are base units: bytes, watts,
    joules, degrees Celsius, hertz, and ratios 0-1.

    Attributes:
        index: the device index (``gpu`` label), as the vendor library numbers it.
        uuid: stable device id (``GPU-...`` for NVIDIA, ``MIG-...`` for MIG instances).
        gpu_instance: MIG GPU instance id, "" for a whole GPU.
        up: False when the device could not be read this pass (lost, driver error).
        error: a short reason when ``up`` is False.
        energy_joules: the device's own cumulative energy counter (NVML: millijoules
            since the driver loaded, converted to joules here; between the backend's
            reads of the counter, the last reading plus integrated power), None when
            it has none.
        ecc_errors: cumulative ECC error counts by type ("corrected", "uncorrected").
        xid_errors: XID events seen since the agent started, by XID code.
        throttle_reasons: clock throttle (clock event) reasons by name, True if active.
        pcie_tx_bytes_total, pcie_rx_bytes_total: cumulative bytes over PCIe as the
            driver counts them (NVML field values PCIE_COUNT_TX/RX_BYTES), None where the
            driver has no such counter.
        gpm: GPM metrics between this pass's sample and the previous one, keyed by
            `GPM_RATIO_KEYS` (ratios 0-1) and `GPM_RATE_KEYS` (bytes per second); empty
            where GPM is unsupported or on the first pass. A key the device does not
            report is absent, never 0.
        capacity: the part of a physical GPU this device is, 0-1: 1 for a whole GPU; for
            a MIG instance its compute slices over the GPU's total (a 1g.10gb of an H100
            is 1/7); for a GPU in MIG mode the slices that are in no instance (the
            parent then runs no process). Per pass, a device's time in GPU-seconds is
            ``capacity`` times the wall time, so a physical GPU's devices add up to one
            GPU-second per second.
        sm_share_from_device: every process on the device belongs to one owner (one
            workload, or none attributed) and its per-process utilisation was not read
            (per-process series off, see docs/ATTRIBUTION.md): that owner's SM share is
            ``utilization``. The processes' ``sm_utilization`` then stays None, except
            where the device has one process, whose share it is.
        health_signals: what the GPU's health reads said (`exporter.health.HealthSignals`), on
            the passes that read them (every ``--health-interval``); None on the others,
            where the last reading stands. A MIG instance carries none: it inherits its
            parent's verdict.
    """

    index: int
    uuid: str
    model: str = ""
    vendor: str = ""
    gpu_instance: str = ""
    up: bool = True
    error: str = ""
    driver_version: str = ""
    pci_bus_id: str = ""
    serial: str = ""
    utilization: float | None = None
    memory_utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    fan_speed_ratio: float | None = None
    pcie_tx_bytes_total: int | None = None
    pcie_rx_bytes_total: int | None = None
    gpm: Mapping[str, float] = field(default_factory=frozen_mapping)
    ecc_errors: Mapping[str, int] = field(default_factory=frozen_mapping)
    xid_errors: Mapping[str, int] = field(default_factory=frozen_mapping)
    throttle_reasons: Mapping[str, bool] = field(default_factory=frozen_mapping)
    processes: tuple[ProcessSample, ...] = ()
    capacity: float = 1.0
    sm_share_from_device: bool = False
    health_signals: HealthSignals | None = None

    def __init__(self, index: int, uuid: str, model: str = "", vendor: str = "", gpu_instance: str = "",
                 up: bool = True, error: str = "", driver_version: str = "", pci_bus_id: str = "", serial: str = "",
                 utilization: float | None = None, memory_utilization: float | None = None,
                 memory_used_bytes: int | None = None, memory_total_bytes: int | None = None,
                 temperature_celsius: float | None = None, memory_temperature_celsius: float | None = None,
                 power_watts: float | None = None, power_limit_watts: float | None = None,
                 energy_joules: float | None = None, sm_clock_hertz: float | None = None,
                 memory_clock_hertz: float | None = None, fan_speed_ratio: float | None = None,
                 pcie_tx_bytes_total: int | None = None, pcie_rx_bytes_total: int | None = None,
                 gpm: Mapping[str, float] = _NONE, ecc_errors: Mapping[str, int] = _NONE,
                 xid_errors: Mapping[str, int] = _NONE, throttle_reasons: Mapping[str, bool] = _NONE,
                 processes: tuple[ProcessSample, ...] = (), capacity: float = 1.0, sm_share_from_device: bool = False,
                 health_signals: HealthSignals | None = None):
        _set(self, "__dict__", {"index": index, "uuid": uuid, "model": model, "vendor": vendor,
            "gpu_instance": gpu_instance, "up": up, "error": error, "driver_version": driver_version,
            "pci_bus_id": pci_bus_id, "serial": serial, "utilization": utilization,
            "memory_utilization": memory_utilization, "memory_used_bytes": memory_used_bytes,
            "memory_total_bytes": memory_total_bytes, "temperature_celsius": temperature_celsius,
            "memory_temperature_celsius": memory_temperature_celsius, "power_watts": power_watts,
            "power_limit_watts": power_limit_watts, "energy_joules": energy_joules, "sm_clock_hertz": sm_clock_hertz,
            "memory_clock_hertz": memory_clock_hertz, "fan_speed_ratio": fan_speed_ratio,
            "pcie_tx_bytes_total": pcie_tx_bytes_total, "pcie_rx_bytes_total": pcie_rx_bytes_total, "gpm": gpm,
            "ecc_errors": ecc_errors, "xid_errors": xid_errors, "throttle_reasons": throttle_reasons,
            "processes": processes, "capacity": capacity, "sm_share_from_device": sm_share_from_device,
            "health_signals": health_signals})

    @property
    def key(self) -> str:
        """Identity of the device across passes (UUID, or index when it has none)."""
        return self.uuid or f"index-{self.index}-{self.gpu_instance}"

    def down(self, error: str, xid_errors: Mapping[str, int] | None = None) -> DeviceSample:
        """This device as it is reported when it could not be read: its identity (index,
        UUID, model, vendor, MIG instance, driver, PCI bus id, serial), ``up`` False, the
        ``error``, and no values but the cumulative ``xid_errors`` counts where given."""
        return DeviceSample(index=self.index, uuid=self.uuid, model=self.model, vendor=self.vendor,
                            gpu_instance=self.gpu_instance, driver_version=self.driver_version,
                            pci_bus_id=self.pci_bus_id, serial=self.serial, up=False, error=error,
                            xid_errors=frozen_mapping(xid_errors))


@dataclass(frozen=True)
class Workload:
    """The owner of a GPU process: a Kubernetes container, a Slurm job, or nothing.

    ``kind`` is one of "kubernetes", "slurm", "systemd", "docker", "host" or
    "unknown". Only kubernetes and slurm workloads get workload series; the rest count
    as unattributed so that per-GPU totals still add up.
    """

    kind: str = "unknown"
    namespace: str = ""
    pod: str = ""
    container: str = ""
    pod_uid: str = ""
    container_id: str = ""
    slurm_job_id: str = ""
    slurm_step: str = ""
    slurm_user: str = ""
    slurm_partition: str = ""
    slurm_account: str = ""
    unit: str = ""
    owner_kind: str = ""
    owner_name: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    # The distributed training job the workload is a rank of, as its scheduler names it
    # (Kubeflow, JobSet, Volcano, LeaderWorkerSet, KubeRay, Slurm), and its rank or index
    # within that job; "" for a workload of no job (docs/TRAINING.md).
    training_job: str = ""
    training_rank: str = ""

    @property
    def attributed(self) -> bool:
        """True for workloads that get their own series (pods and Slurm jobs)."""
        return self.kind in ("kubernetes", "slurm")


UNKNOWN = Workload()
HOST = Workload(kind="host")


@dataclass(frozen=True, init=False)
class ProcessRow:
    """A GPU process joined to its owner, for `l9gpu snapshot` and per-PID series.

    Made by the hundred each pass on a busy node: filled in one step, as `ProcessSample`.
    """

    device_key: str
    pid: int
    comm: str
    workload: Workload
    used_memory_bytes: int | None
    sm_utilization: float | None
    start_time: float | None = None  # seconds since boot (/proc/<pid>/stat), None where unknown

    def __init__(self, device_key: str, pid: int, comm: str, workload: Workload, used_memory_bytes: int | None,
                 sm_utilization: float | None, start_time: float | None = None):
        _set(self, "__dict__", {"device_key": device_key, "pid": pid, "comm": comm, "workload": workload,
                                "used_memory_bytes": used_memory_bytes, "sm_utilization": sm_utilization,
                                "start_time": start_time})


@dataclass(frozen=True, init=False)
class WorkloadUsage:
    """One workload on one GPU, with its derived counters.

    Made for every workload on every GPU each pass: filled in one step, as `ProcessSample`.

    Attributes:
        device_key: the `DeviceSample.key` of the GPU.
        workload: its owner (a Kubernetes container or a Slurm job). Read a workload's
            fields here; one object per workload and pass, whichever GPUs it uses.
        labels: its series label values, in `labels.WORKLOAD_LABELS` order (device labels
            first) followed by the configured extras (see `labels.label_schema`), made
            once per pass so that rendering a scrape only hands them on. Read them by name
            (`labels.workload_label_map`), never by position.
        memory_used_bytes: sum of its processes' device memory, bytes (None where the
            device reports no per-process memory, e.g. Gaudi).
        utilization: sum of its processes' SM shares, 0-1 (None when unavailable).
        processes: number of its processes on this GPU (0 while in its grace period).
        idle_seconds: how long it has held memory with zero SM utilisation (None while
            its SM share is unknown).
        usage_seconds_total: integral of its SM share over time (GPU-seconds; None while
            the device has never reported its SM share, e.g. Gaudi).
        allocation_seconds_total: its share of this GPU's time, in GPU-seconds: what it
            is billed for holding the GPU (see `splits.split_time`: device-plugin replicas
            k/N, else in proportion to the memory held). The shares of a GPU's holders
            and its unallocated seconds add up to the GPU's capacity seconds.
        energy_joules_total: its share of the device's energy (see docs/ATTRIBUTION.md;
            None while the device has reported neither SM share nor memory for it).
        allocated: True while the kubelet has this GPU allocated to the container
            (pod-resources), False for a pod's container running on a GPU it was not
            allocated; None where allocations are unknown (pod-resources off, not a pod, or a
            pod known by UID only).
        present: False while the workload is gone but its counters are kept for the
            grace period; only counter families are exported then.
        sole_owner: every process on the GPU is this workload's (no other workload's, none
            unattributed) and the GPU is up: device-wide values (GPM) are then its own and
            carry its labels. Decided once per pass, where the processes are grouped.
        stranded: the GPU is down and this workload was on it in the GPU's last pass up
            (``present`` is False: nobody can read its processes there): the GPU's last
            holders, kept for the grace period like any workload no pass sees.
    """

    device_key: str
    workload: Workload
    labels: tuple[str, ...]
    memory_used_bytes: int | None
    utilization: float | None
    processes: int
    idle_seconds: float | None
    usage_seconds_total: float | None
    allocation_seconds_total: float
    energy_joules_total: float | None
    present: bool = True
    allocated: bool | None = None
    sole_owner: bool = False
    stranded: bool = False

    def __init__(self, device_key: str, workload: Workload, labels: tuple[str, ...], memory_used_bytes: int | None,
                 utilization: float | None, processes: int, idle_seconds: float | None,
                 usage_seconds_total: float | None, allocation_seconds_total: float,
                 energy_joules_total: float | None, present: bool = True, allocated: bool | None = None,
                 sole_owner: bool = False, stranded: bool = False):
        _set(self, "__dict__", {
            "device_key": device_key, "workload": workload, "labels": labels, "memory_used_bytes": memory_used_bytes,
            "utilization": utilization, "processes": processes, "idle_seconds": idle_seconds,
            "usage_seconds_total": usage_seconds_total, "allocation_seconds_total": allocation_seconds_total,
            "energy_joules_total": energy_joules_total, "present": present, "allocated": allocated,
            "sole_owner": sole_owner, "stranded": stranded})


@dataclass(frozen=True)
class AllocationRow:
    """A device the kubelet allocated to a container (pod-resources), joined to its GPU.

    Attributes:
        device_key: the `DeviceSample.key` of the GPU (or MIG instance) the id names.
        workload: the container's owner (kind "kubernetes"; ``pod_uid``, owner and
            labels from the pod index where it knows the pod, else "").
        resource_name: the extended resource, e.g. ``nvidia.com/gpu``.
        device_id: the id as the device plugin reported it (``GPU-...::1``, a PCI bus id).
        replicas: how many ids the kubelet can allocate on this GPU (``GetAllocatableResources``:
            the time-slicing replicas ``<uuid>::0..N-1``, 1 for a whole GPU or MIG
            instance), None where the kubelet does not say.
    """

    device_key: str
    workload: Workload
    resource_name: str
    device_id: str
    replicas: int | None = None


@dataclass(frozen=True)
class Unattributed:
    """Per GPU: what belongs to no workload, so that the parts add up to the device.

    Attributes:
        unallocated_seconds_total: GPU-seconds of the device's time no workload held
            (free replicas, no holder, the GPU down): with the workloads' allocation
            seconds it adds up to the device's capacity seconds.
    """

    device_key: str
    memory_used_bytes: int | None
    processes: int
    energy_joules_total: float
    unallocated_seconds_total: float = 0.0


@dataclass(frozen=True)
class CollectorStatus:
    """Outcome of one named collector in the last pass (node_exporter style)."""

    name: str
    success: bool
    duration_seconds: float


@dataclass(frozen=True)
class StuckCall:
    """A call into a vendor library that has not returned within its deadline.

    Attributes:
        backend: the backend that made it ("nvml").
        what: the part of the pass it blocks: "GPU 1", "NVML XID events", "the amd backend".
        call: the library function it is in (``nvmlDeviceGetPowerUsage``), as far as the
            stuck thread's stack tells.
        since: wall-clock time (Unix seconds) at which that part's read started.
        seconds: how long it had been waiting when the pass was published.
        devices: `DeviceSample.key` of each device it leaves unread (reported down
            meanwhile); empty for a part that covers no device (the XID event drain).
    """

    backend: str
    what: str
    call: str
    since: float
    seconds: float
    devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """Everything a scrape serves, produced by one collection pass.

    Attributes:
        seq: increases by one with every published snapshot.
        timestamp: wall-clock time (Unix seconds) at which the pass read ``now``.
        devices: the device samples of this pass.
        device_energy_joules: per device key, the agent's monotonic energy counter.
        device_capacity_seconds: per device key, the GPU-seconds the device has existed
            for since the agent started (`DeviceSample.capacity` times wall time).
        workloads: per (GPU, workload) usage, including workloads in their grace period.
        unattributed: per GPU, what belongs to no workload.
        processes: every GPU process joined to its owner.
        allocations: the devices the kubelet allocated to containers, joined to GPUs.
        collectors: success and duration of each collector.
        backend_errors: cumulative (backend, reason) -> count from the backends.
        info: free-form self facts (e.g. "host_pids_visible": 1.0).
        stuck: calls into vendor libraries that have not returned within their deadline
            (their devices are in ``devices``, down).
        verdicts: per device key, its health verdict (`exporter.health.Verdict`; a MIG
            instance's is its parent GPU's), from `exporter.collect.health_stage`.
        health_transitions: per device key, how often its verdict's state changed since
            the agent started (``gpu_health_transitions_total``).
        device_unhealthy_seconds: per device key, capacity-seconds during which its
            verdict was ``unhealthy`` (``gpu_unhealthy_seconds_total``).
        health_signals: per physical GPU key that is up, its last health read (the raw
            signal series; between reads the last one stands).
        new_xids: per key of a device seen in an earlier pass, its XID events new in this
            one by code (the growth of ``DeviceSample.xid_errors``, `exporter.collect.xids`):
            the one reading of them that the health stage and the incident engine share.
        unchanged_processes: keys of the up devices whose processes are those of the
            snapshot before (``seq - 1``): the very same processes tuple, each process with
            the same owner (the same `Workload` object), name and start time. The collector
            tells it once, where it joins the processes to their owners; the incident
            tracker reads it instead of comparing them again. Empty: none is known to be.
    """

    seq: int
    node: str
    timestamp: float
    devices: tuple[DeviceSample, ...] = ()
    device_energy_joules: Mapping[str, float] = field(default_factory=frozen_mapping)
    device_capacity_seconds: Mapping[str, float] = field(default_factory=frozen_mapping)
    workloads: tuple[WorkloadUsage, ...] = ()
    unattributed: tuple[Unattributed, ...] = ()
    processes: tuple[ProcessRow, ...] = ()
    allocations: tuple[AllocationRow, ...] = ()
    collectors: tuple[CollectorStatus, ...] = ()
    backend_errors: Mapping[tuple[str, str], int] = field(default_factory=frozen_mapping)
    info: Mapping[str, float] = field(default_factory=frozen_mapping)
    stuck: tuple[StuckCall, ...] = ()
    verdicts: Mapping[str, Verdict] = field(default_factory=frozen_mapping)
    health_transitions: Mapping[str, int] = field(default_factory=frozen_mapping)
    device_unhealthy_seconds: Mapping[str, float] = field(default_factory=frozen_mapping)
    health_signals: Mapping[str, HealthSignals] = field(default_factory=frozen_mapping)
    new_xids: Mapping[str, Mapping[str, int]] = field(default_factory=frozen_mapping)
    unchanged_processes: frozenset[str] = frozenset()
