"""A simulated GPU node driven by a scenario file, for the demo and the tests.

The scenario (YAML) describes the GPUs (model, memory, power curve) and the processes
on them over time: memory that is constant or grows towards a ceiling, utilisation that
is constant or waves. Values are pure functions of the time since the backend opened,
so tests can predict them; energy is the integral of the simulated power.

Each process may name its workload (Kubernetes pod and container, or Slurm job): the
wiring (`exporter.app.wiring`) hands the opened backend's `SimulatedBackend.scenario` to
the attribution layer, which plays its pods and its kubelet.

Scenario format (see ``exporter/devices/simulated/scenarios/default.yaml``)::

    node: sim-node-01
    gpus: {count: 8, model: ..., memory_gib: 80, driver_version: ...,
           power: {idle_watts: 72, max_watts: 700, limit_watts: 700},
           reserved_memory_mib: 512}
    processes:
      - name: vllm            # the process's comm
        gpus: [0, 1]          # one process per listed GPU, PIDs pid, pid+1, ...
        pid: 41001
        memory_gib: 72.5      # or memory: {start_gib, growth_gib_per_hour, max_gib}
        utilization: 0.5      # or utilization: {wave: {min, max, period}}
        tensor: 1.0           # optional, 0-1: how much of a bf16 job's tensor-core and FP work its
                              # kernels do (GPM); 0 for a process that keeps the SMs busy doing no math
        from: 30s             # optional: the process starts this long after the node (default: 0;
                              # its memory and utilisation curves count from then)
        until: 65s            # optional: and exits then (default: never)
        workload: {...}       # free-form, read by attribution
    allocations:              # pods given GPUs by the device plugin that run nothing there
      - gpus: [7]
        workload: {namespace: ..., pod: ..., container: ...}
        resource: nvidia.com/gpu   # optional
    time_slicing:             # optional: GPUs the device plugin shares as replicas
      gpus: [6]
      replicas: 5             # each listed GPU is allocatable as <uuid>::0 .. <uuid>::4
    training: {...}           # optional: a training job, one rank per GPU, that wedges
                              # (`exporter.devices.simulated.training`, ``--scenario training``)
    xids:                     # optional: Xid errors, counted by NVML's XID events and logged
      - at: 30s               # by the simulated node's kernel (`kernel_lines`, read by
                              # `--kernel-log auto`: `exporter.incidents.simulated`); after
                              # Xid 79 (fallen off the bus) the GPU is lost, as below
        gpu: 1
        xid: 31
        pid: 52001            # optional: the process the driver's line names
        name: python3         # optional: its comm
        text: "Ch 00000008, MMU Fault"   # optional: the rest of the line

The simulated kubelet allocates every pod's container the GPUs its processes run on,
plus the ``allocations`` entries (see `exporter.attribution.simulated.scenario_allocations`).
Without ``time_slicing``, a GPU allocated to more than one container is time-sliced into
as many replicas as it has containers.

A lost GPU (after an Xid 79, or while a ``health`` entry says ``gpu_lost``) is what a real
one is: the driver answers every call about it with ``NVML_ERROR_GPU_IS_LOST``, so its
sample is down (no values, no processes; its Xid counts and the ``gpu_lost`` health
signal stay) and ``l9gpu_backend_errors_total{reason="gpu_lost"}`` counts each pass.

``exporter/devices/simulated/scenarios/incidents.yaml`` plays the incidents of docs/INCIDENTS.md on a small
node: ``--scenario incidents`` names it (a built-in scenario by its name); ``--scenario training``
a training job that wedges (docs/TRAINING.md).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import yaml

from exporter.core.model import DeviceSample, ProcessSample, frozen_mapping
from exporter.devices.base import SOURCE_FLAGS, Backend, BackendUnavailable
from exporter.devices.simulated.health import (
    SIMULATED_BOOT_ID,
    HealthScenarioError,
    HealthSpec,
    parse_health,
    scenario_duration,
    simulated_signals,
)
from exporter.devices.simulated.processes import (
    GIB,
    ProcessSpec,
    ScenarioError,
    gpu_indexes,
    memory_curve,
    number,
    utilization_curve,
)
from exporter.devices.simulated.training import training_processes, with_environment
from exporter.health import HealthSignals

MIB = 2**20
# The Xid of a GPU that has fallen off the bus: from then on the driver answers every call
# about it with NVML_ERROR_GPU_IS_LOST, until the node reboots.
XID_FALLEN_OFF_THE_BUS = 79
# What the NVML backend reports for such a GPU (`exporter.devices.nvml.common`: NVML's text
# for the error, which says it).
GPU_LOST_ERROR = "GPU is lost"
DEFAULT_SCENARIO = Path(__file__).resolve().parent / "scenarios" / "default.yaml"


@dataclass(frozen=True)
class GpuSpec:
    index: int
    model: str
    memory_bytes: int
    idle_watts: float
    max_watts: float
    limit_watts: float
    driver_version: str
    reserved_bytes: int
    thermal_throttled: bool = False  # a hardware straggler: hot, its SM clock held down while busy

    @property
    def uuid(self) -> str:
        # Stable, realistic-looking UUIDs so dashboards and tests can key on them.
        return f"GPU-1b849e72-{self.index:04x}-4c1d-9a3e-5f0c2d7b{self.index:04x}"


@dataclass(frozen=True)
class XidSpec:
    """An Xid error the simulated driver raises on one GPU at one time."""

    at: float
    gpu: int
    xid: int
    pid: int | None = None
    name: str = ""
    text: str = ""

    def kernel_line(self, pci_bus_id: str) -> str:
        """The message the NVIDIA driver logs for it (``NVRM: Xid (PCI:...): ...``)."""
        domain, bus, device = pci_bus_id.split(":")
        who = f"pid={self.pid}, name={self.name or '<unknown>'}" if self.pid is not None else \
            "pid='<unknown>', name=<unknown>"
        return f"NVRM: Xid (PCI:{domain[-4:].lower()}:{bus.lower()}:{device.split('.')[0]}): {self.xid}, {who}, " \
            f"{self.text}"


class KernelLine(NamedTuple):
    """A line the simulated node's kernel logged."""

    text: str  # as the NVIDIA driver writes it (`XidSpec.kernel_line`)
    at: float  # when, in seconds on the node's clock (that of the passes), as the kernel stamps it


@dataclass(frozen=True)
class AllocationSpec:
    """A pod's container that holds GPUs through the device plugin and runs nothing on them."""

    gpus: tuple[int, ...]
    workload: Mapping[str, Any]
    resource: str = "nvidia.com/gpu"


@dataclass(frozen=True)
class Scenario:
    node: str
    gpus: tuple[GpuSpec, ...]
    processes: tuple[ProcessSpec, ...]
    allocations: tuple[AllocationSpec, ...] = ()
    # GPU index -> time-slicing replicas the device plugin advertises for it
    replicas: Mapping[int, int] = field(default_factory=frozen_mapping)
    # what the GPUs' health reads say where it is not a healthy H100's (simulated_health)
    health: tuple[HealthSpec, ...] = ()
    xids: tuple[XidSpec, ...] = ()


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a loaded scenario document (pure; raises `ScenarioError`)."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: expected a mapping with 'gpus' and 'processes'")
    gpus_doc = data.get("gpus")
    if not isinstance(gpus_doc, Mapping):
        raise ScenarioError(f"{source}: 'gpus' must be a mapping (count, model, memory_gib, power)")
    count = int(number(f"{source}: gpus.count", gpus_doc.get("count", 1), 1))
    power = gpus_doc.get("power", {}) or {}
    if not isinstance(power, Mapping):
        raise ScenarioError(f"{source}: gpus.power must be a mapping")
    idle = number(f"{source}: gpus.power.idle_watts", power.get("idle_watts", 60))
    peak = number(f"{source}: gpus.power.max_watts", power.get("max_watts", 700))
    gpus = tuple(
        GpuSpec(
            index=i,
            model=str(gpus_doc.get("model", "NVIDIA H100 80GB HBM3")),
            memory_bytes=int(number(f"{source}: gpus.memory_gib", gpus_doc.get("memory_gib", 80), 1) * GIB),
            idle_watts=idle,
            max_watts=max(idle, peak),
            limit_watts=number(f"{source}: gpus.power.limit_watts", power.get("limit_watts", peak)),
            driver_version=str(gpus_doc.get("driver_version", "550.54.15")),
            reserved_bytes=int(number(f"{source}: gpus.reserved_memory_mib",
                                       gpus_doc.get("reserved_memory_mib", 512)) * MIB),
        )
        for i in range(count)
    )
    processes: list[ProcessSpec] = []
    next_pid = 40000
    seen: set[int] = set()
    for n, proc in enumerate(data.get("processes") or []):
        where = f"{source}: processes[{n}]"
        if not isinstance(proc, Mapping):
            raise ScenarioError(f"{where}: expected a mapping")
        on = gpu_indexes(where, proc.get("gpus", []), count)
        base_pid = int(number(f"{where}.pid", proc.get("pid", next_pid), 2))
        memory = memory_curve(where, proc)
        utilization = utilization_curve(f"{where}.utilization", proc.get("utilization", 0.0))
        workload = proc.get("workload") or {}
        if not isinstance(workload, Mapping):
            raise ScenarioError(f"{where}.workload: expected a mapping")
        tensor = number(f"{where}.tensor", proc.get("tensor", 1.0))
        if tensor > 1.0:
            raise ScenarioError(f"{where}.tensor: a ratio 0-1, got {proc['tensor']!r}")
        start = _seconds(f"{where}.from", proc.get("from", 0))
        end = _seconds(f"{where}.until", proc["until"]) if proc.get("until") is not None else math.inf
        if end <= start:
            raise ScenarioError(f"{where}: until must come after from")
        for offset, index in enumerate(on):
            pid = base_pid + offset
            if pid in seen:
                raise ScenarioError(f"{where}: PID {pid} is used twice")
            seen.add(pid)
            processes.append(ProcessSpec(pid, index, str(proc.get("name", "python")), memory, utilization,
                                         frozen_mapping(workload), tensor, start, end))
        next_pid = max(next_pid, base_pid + len(on)) + 100
    if data.get("training") is not None:
        ranks, throttled = training_processes(f"{source}: training", data["training"], count)
        taken = {p.pid for p in processes} & {p.pid for p in ranks}
        if taken:
            raise ScenarioError(f"{source}: training: PID {min(taken)} is used twice")
        processes += ranks
        gpus = tuple(replace(g, thermal_throttled=g.index in throttled) for g in gpus)
    for gpu in gpus:
        sharing = [p for p in processes if p.gpu == gpu.index]
        # memory only grows while a process runs: the most is held just before one exits, or for ever after
        moments = [1e9] + [p.end - 1e-6 for p in sharing if p.end != math.inf]
        peak_memory = max(sum(p.memory_at(t) for p in sharing if p.running(t)) for t in moments) + gpu.reserved_bytes
        if peak_memory > gpu.memory_bytes:
            raise ScenarioError(f"{source}: processes on GPU {gpu.index} can use more memory than it has")
    allocations: list[AllocationSpec] = []
    for n, entry in enumerate(data.get("allocations") or []):
        where = f"{source}: allocations[{n}]"
        if not isinstance(entry, Mapping):
            raise ScenarioError(f"{where}: expected a mapping with gpus and workload")
        on = gpu_indexes(where, entry.get("gpus", []), count)
        workload = entry.get("workload")
        if not isinstance(workload, Mapping) or not workload.get("pod"):
            raise ScenarioError(f"{where}.workload: expected a mapping with at least a pod")
        allocations.append(AllocationSpec(tuple(on), frozen_mapping(workload),
                                          str(entry.get("resource", "nvidia.com/gpu"))))
    replicas: dict[int, int] = {}
    slicing = data.get("time_slicing")
    if slicing is not None:
        where = f"{source}: time_slicing"
        if not isinstance(slicing, Mapping):
            raise ScenarioError(f"{where}: expected a mapping with gpus and replicas")
        count_doc = slicing.get("replicas")
        if isinstance(count_doc, bool) or not isinstance(count_doc, int) or count_doc < 2:
            raise ScenarioError(f"{where}.replicas: expected a whole number of replicas >= 2, got {count_doc!r}")
        replicas = dict.fromkeys(gpu_indexes(where, slicing.get("gpus", []), count), count_doc)
    try:
        health = parse_health(f"{source}: health", data.get("health"),
                              lambda where, value: gpu_indexes(where, value, count))
    except HealthScenarioError as exc:
        raise ScenarioError(str(exc)) from None
    xids = _xids(f"{source}: xids", data.get("xids"), count)
    return Scenario(str(data.get("node", "")), gpus, tuple(processes), tuple(allocations),
                    frozen_mapping(replicas), health, xids)


def _seconds(where: str, value: Any) -> float:
    """A scenario time, as the ``health`` entries' (`simulated_health.scenario_duration`)."""
    try:
        return scenario_duration(where, value)
    except HealthScenarioError as exc:
        raise ScenarioError(str(exc)) from None


def _xids(where: str, doc: Any, count: int) -> tuple[XidSpec, ...]:
    if doc is None:
        return ()
    if not isinstance(doc, list):
        raise ScenarioError(f"{where}: expected a list of {{at, gpu, xid, pid, name, text}}")
    out = []
    for n, entry in enumerate(doc):
        here = f"{where}[{n}]"
        if not isinstance(entry, Mapping):
            raise ScenarioError(f"{here}: expected a mapping with at, gpu and xid")
        unknown = set(entry) - {"at", "gpu", "xid", "pid", "name", "text"}
        if unknown:
            raise ScenarioError(f"{here}: unknown field {sorted(unknown)[0]!r} (at, gpu, xid, pid, name, text)")
        gpu, xid, pid = entry.get("gpu"), entry.get("xid"), entry.get("pid")
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < count:
            raise ScenarioError(f"{here}.gpu: expected a GPU index 0-{count - 1}, got {gpu!r}")
        if isinstance(xid, bool) or not isinstance(xid, int) or not 1 <= xid <= 999:
            raise ScenarioError(f"{here}.xid: expected an Xid code 1-999, got {xid!r}")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid < 1):
            raise ScenarioError(f"{here}.pid: expected a PID, got {pid!r}")
        out.append(XidSpec(_seconds(f"{here}.at", entry.get("at", 0)), gpu, xid, pid,
                           str(entry.get("name") or ""), str(entry.get("text") or "")))
    return tuple(sorted(out, key=lambda x: x.at))


def load_scenario(path: str | Path | None = None) -> Scenario:
    """Read and validate a scenario file (the built-in default when None; a built-in one
    by its name, e.g. ``incidents``)."""
    target = Path(path) if path else DEFAULT_SCENARIO
    if path and not target.exists() and "/" not in str(path):
        builtin = DEFAULT_SCENARIO.parent / f"{path}.yaml"
        target = builtin if builtin.exists() else target
    try:
        text = target.read_text(encoding="utf-8")
    except OSError as exc:
        builtins = ", ".join(sorted(f.stem for f in DEFAULT_SCENARIO.parent.glob("*.yaml")))
        raise ScenarioError(f"cannot read scenario {target}: {exc.strerror or exc} (built-in ones by name: "
                            f"{builtins})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"scenario {target} is not valid YAML: {exc}") from None
    return parse_scenario(with_environment(data, os.environ), str(target))


class SimulatedBackend(Backend):
    """Serves a scenario as if it were a real node (vendor "nvidia", NVML-like values).

    Args:
        scenario: path of a scenario file; the built-in default when None.
        clock: monotonic clock in seconds; time zero is when `open()` runs.
    """

    name = "simulated"

    @classmethod
    def add_arguments(cls, group: Any, place: str) -> None:
        if place == SOURCE_FLAGS:
            group.add_argument("--scenario", metavar="FILE",
                               help="scenario file for --backend simulated (default: the built-in node)")

    @classmethod
    def options_from(cls, args: Any) -> dict[str, Any]:
        return {"scenario": args.scenario} if args.scenario is not None else {}

    def __init__(self, scenario: str | Path | None = None, clock: Callable[[], float] = time.monotonic):
        self._path = scenario
        self._clock = clock
        self.scenario: Scenario | None = None
        self._start = 0.0
        self._last: float | None = None
        self._energy: dict[int, float] = {}
        self._pcie_bytes: dict[int, list[float]] = {}
        self._on_gpu: dict[int, list[ProcessSpec]] = {}
        self._capped: dict[int, float] = {}  # seconds at the power limit (violation time)
        self._errors: dict[str, int] = {}

    def open(self) -> None:
        try:
            self.scenario = load_scenario(self._path)
        except ScenarioError as exc:
            raise BackendUnavailable(str(exc)) from None
        self._start = self._clock()
        # Like NVML's counter, energy starts at what the GPU used since the driver loaded.
        self._energy = {g.index: 3.6e6 * (1 + g.index) for g in self.scenario.gpus}
        # PCIe byte counters (tx, rx), like NVML's, count from the driver's load.
        self._pcie_bytes = {g.index: [7.0e11 * (1 + g.index), 1.3e12 * (1 + g.index)] for g in self.scenario.gpus}
        self._on_gpu = {g.index: [p for p in self.scenario.processes if p.gpu == g.index] for g in self.scenario.gpus}

    def close(self) -> None:
        return None

    def node_name(self) -> str:
        """The scenario's node."""
        return self.scenario.node if self.scenario is not None else ""

    def now(self) -> float:
        return self._clock()

    def kernel_lines(self, start: int = 0) -> list[KernelLine]:
        """The scenario's Xids the simulated driver has logged by now, as it logs them, from
        the ``start``-th on (the ones a reader has not had yet); none before `open`."""
        if self.scenario is None:
            return []
        t = self.elapsed(self.now())
        due = itertools.takewhile(lambda spec: spec.at <= t, self.scenario.xids[start:])  # sorted by time
        return [KernelLine(spec.kernel_line(_pci_bus_id(spec.gpu)), self._start + spec.at) for spec in due]

    def _xid_counts(self, index: int, t: float) -> Mapping[str, int]:
        assert self.scenario is not None
        counts: dict[str, int] = {}
        for spec in self.scenario.xids:
            if spec.gpu == index and spec.at <= t:
                counts[str(spec.xid)] = counts.get(str(spec.xid), 0) + 1
        return frozen_mapping(counts)

    def start_time(self) -> float:
        """When the backend opened, on its clock (that of the passes)."""
        return self._start

    def lost(self, index: int, t: float) -> bool:
        """Whether GPU ``index`` is lost at ``t`` seconds: after an Xid 79 on it, or while a
        health entry says so."""
        assert self.scenario is not None
        return (any(spec.gpu == index and spec.xid == XID_FALLEN_OFF_THE_BUS and spec.at <= t
                    for spec in self.scenario.xids)
                or simulated_signals(index, t, 0.0, 0.0, self.scenario.health).gpu_lost)

    def errors(self) -> Mapping[str, int]:
        return dict(self._errors)

    def _lost_sample(self, gpu: GpuSpec, t: float) -> DeviceSample:
        """GPU ``gpu`` as the NVML backend reports a GPU every call about which fails with
        GPU_IS_LOST: down, its identity, its Xid counts and the ``gpu_lost`` signal."""
        self._errors["gpu_lost"] = self._errors.get("gpu_lost", 0) + 1
        identity = DeviceSample(index=gpu.index, uuid=gpu.uuid, model=gpu.model, vendor="nvidia",
                                driver_version=gpu.driver_version, pci_bus_id=_pci_bus_id(gpu.index),
                                serial=_serial(gpu.index))
        return replace(identity.down(GPU_LOST_ERROR, xid_errors=self._xid_counts(gpu.index, t)),
                       health_signals=HealthSignals(gpu_lost=True, boot_id=SIMULATED_BOOT_ID))

    def elapsed(self, now: float) -> float:
        """Seconds since the backend opened, at pass time ``now``."""
        return max(0.0, now - self._start)

    def sample(self, now: float) -> list[DeviceSample]:
        assert self.scenario is not None, "open() first"
        t = self.elapsed(now)
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        samples = []
        for gpu in self.scenario.gpus:
            if self.lost(gpu.index, t):
                samples.append(self._lost_sample(gpu, t))
                continue
            procs = [p for p in self._on_gpu[gpu.index] if p.running(t)]
            phases = [p.phase_at(t) for p in procs]
            shares = [min(1.0, max(0.0, phase.utilization)) for phase in phases]
            memories = [p.memory_at(t) for p in procs]
            busy = min(1.0, sum(shares))
            # how much math, power and traffic the busy time makes, weighted by each process's SM share
            math_share, power_share, traffic = (
                sum(s * float(getattr(phase, k)) for phase, s in zip(phases, shares)) / sum(shares)
                if sum(shares) else 1.0
                for k in ("tensor", "power", "traffic"))
            power = gpu.idle_watts + (gpu.max_watts - gpu.idle_watts) * busy * power_share
            self._energy[gpu.index] += power * dt
            pcie_tx, pcie_rx = 1.2e8 * busy * traffic, 2.5e8 * busy * traffic
            hot = gpu.thermal_throttled and busy > 0
            counters = self._pcie_bytes[gpu.index]
            counters[0] += pcie_tx * dt
            counters[1] += pcie_rx * dt
            if power >= gpu.limit_watts:
                self._capped[gpu.index] = self._capped.get(gpu.index, 0.0) + dt
            samples.append(
                DeviceSample(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    model=gpu.model,
                    vendor="nvidia",
                    driver_version=gpu.driver_version,
                    pci_bus_id=_pci_bus_id(gpu.index),
                    serial=_serial(gpu.index),
                    utilization=busy,
                    memory_utilization=0.6 * busy * max(traffic, 0.02),
                    memory_used_bytes=gpu.reserved_bytes + sum(memories),
                    memory_total_bytes=gpu.memory_bytes,
                    temperature_celsius=89.0 if hot else round(31 + 45 * busy, 1),
                    memory_temperature_celsius=round(35 + 40 * busy, 1),
                    power_watts=round(power, 3),
                    power_limit_watts=gpu.limit_watts,
                    energy_joules=self._energy[gpu.index],
                    sm_clock_hertz=(1155e6 if hot else 1980e6 if busy > 0 else 345e6),
                    memory_clock_hertz=2619e6,
                    pcie_tx_bytes_total=int(counters[0]),
                    pcie_rx_bytes_total=int(counters[1]),
                    gpm=(_gpm_values(busy, pcie_tx, pcie_rx, math_share) if dt > 0 else frozen_mapping()),
                    ecc_errors=frozen_mapping({"corrected": 0, "uncorrected": 0}),
                    xid_errors=self._xid_counts(gpu.index, t),
                    throttle_reasons=frozen_mapping({
                        "gpu_idle": busy == 0,
                        "sw_power_cap": power >= gpu.limit_watts,
                        "hw_slowdown": False,
                        "sw_thermal_slowdown": hot,
                        "hw_thermal_slowdown": hot,
                    }),
                    processes=tuple(
                        ProcessSample(pid=p.pid, used_memory_bytes=m, sm_utilization=s,
                                      memory_utilization=0.6 * s)
                        for p, m, s in zip(procs, memories, shares)
                    ),
                    health_signals=simulated_signals(gpu.index, t, busy, self._capped.get(gpu.index, 0.0),
                                             self.scenario.health),
                )
            )
        return samples


def _serial(index: int) -> str:
    return f"165232{index:07d}"


def _pci_bus_id(index: int) -> str:
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def _gpm_values(busy: float, pcie_tx: float, pcie_rx: float, math_share: float = 1.0) -> Mapping[str, float]:
    """GPM metrics of a simulated H100 whose SMs are busy ``busy`` (0-1) of the time.

    Like NVML's GPM, the values average over the time between two samples, so none
    exist on the first pass. The shapes follow a bf16 training or inference job: the
    graphics engine is active whenever a kernel runs, SMs slightly less, tensor pipes
    (HMMA) about nine tenths of SM time, DRAM bandwidth a fifth. ``math_share`` (0-1)
    scales the tensor, FP and most of the DRAM activity: 0 is a kernel that keeps the
    SMs busy doing no math (a spin-wait, a hung collective).
    """
    work = busy * math_share
    return frozen_mapping({
        "graphics_active": round(busy, 4),
        "sm_active": round(0.93 * busy, 4),
        "sm_occupancy": round(0.14 * busy, 4),
        "tensor_active": round(0.85 * work, 4),
        "tensor_hmma_active": round(0.85 * work, 4),
        "tensor_imma_active": 0.0,
        "tensor_dfma_active": 0.0,
        "dram_active": round(0.02 * busy + 0.18 * work, 4),
        "fp16_active": round(0.05 * work, 4),
        "fp32_active": round(0.08 * work, 4),
        "fp64_active": 0.0,
        "pcie_tx_bytes_per_second": pcie_tx,
        "pcie_rx_bytes_per_second": pcie_rx,
        "nvlink_tx_bytes_per_second": 0.0,
        "nvlink_rx_bytes_per_second": 0.0,
    })
