"""The collector: one background thread, one pass per interval, one immutable snapshot.

Each pass reads ``now`` once, reads every device once, resolves every GPU PID's owner,
folds the pass into the derived counters and publishes a new `Snapshot` by swapping a
single reference. Scrapes only ever read the published snapshot, so they never wait on
hardware, /proc or the network. A failing part (the backend, attribution) is reported in
``l9gpu_collector_success`` and degrades only its own part of the snapshot.

The devices are read through a bulkhead (`exporter.core.bulkhead`): each backend's parts of a
pass (`Backend.reads`: one per GPU where the backend offers them, else the whole backend)
have a deadline, and a part stuck in a driver call is published down, with the call,
while the others go on; nothing more is asked of it until the call returns
(docs/HEALTH.md).

Per-process SM shares of a backend with `exporter.devices.capabilities.ProcessShareReads` are planned in
`exporter.core.shares`: the collector keeps each backend's `PassPlan` for its next pass.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import replace
from operator import is_
from typing import Callable, Mapping, NamedTuple, NoReturn, Sequence

from exporter.attribution import Attributor, NullAttributor
from exporter.collect.derive import DeriveState, step
from exporter.collect.health_stage import HealthStageState, health_step
from exporter.collect.xids import XidBaseline, xid_step
from exporter.core.bulkhead import DEFAULT_READ_TIMEOUT, Bulkhead, Failed, Read, Stuck
from exporter.core.labels import Labeller, default_labeller
from exporter.core.model import (
    UNKNOWN,
    AllocationRow,
    CollectorStatus,
    DeviceSample,
    ProcessRow,
    ProcessSample,
    Snapshot,
    StuckCall,
    Workload,
    frozen_mapping,
)
from exporter.core.shares import PassPlan, passes_between_reads, plan_shares
from exporter.devices.base import Backend
from exporter.devices.capabilities import ProcessShareReads

log = logging.getLogger(__name__)


def _raise(exc: BaseException) -> NoReturn:
    raise exc


class _DeviceRows(NamedTuple):
    """A GPU's process rows as one pass made them (in process order, and by PID), with
    what they were made of: its processes tuple and each process's owner, name and start."""

    processes: tuple[ProcessSample, ...]
    owners: list[Workload]
    names: list[str]
    starts: list[float | None]
    rows: list[ProcessRow]
    by_pid: dict[int, ProcessRow]


class Collector:
    """Runs collection passes and holds the current snapshot.

    Args:
        backends: the node's opened device backends (one, or several on a mixed-vendor
            node: their devices' keys are then prefixed with the backend's name).
        node: node name for the ``node`` label.
        interval: seconds between passes.
        attributor: PID -> workload resolver (default: none, all unattributed).
        labeller: workload label values after the device labels.
        grace_seconds: how long counters of a vanished workload stay exported.
        clock: monotonic clock (seconds); wall: wall clock (Unix seconds).
        on_snapshot: called from the collector thread after each publish (e.g. to
            pre-render the exposition while no scrape is waiting).
        read_timeout: seconds one device's read may take in a pass before it is given up
            on and the device reported stuck (a backend may ask for longer: Gaudi's
            hl-smi has its own timeout).
        process_metrics: per-process series are exported (``--process-metrics``): read
            every GPU's per-process samples every pass. Otherwise a GPU all of whose
            processes belong to one owner is not asked for them (they cost more than the rest
            of its pass, docs/PERFORMANCE.md): the owner's SM share is the GPU's utilisation;
            a GPU several owners share is asked every `shares.SHARED_READ_PERIOD` seconds,
            its shares carried in between.
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        node: str,
        interval: float = 1.0,
        attributor: Attributor | None = None,
        labeller: Labeller = default_labeller,
        grace_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_snapshot: Callable[[Snapshot], None] | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        process_metrics: bool = False,
    ):
        self.backends = list(backends)
        self.name = ",".join(b.name for b in self.backends)  # the devices' collector label
        self.node = node
        self.interval = interval
        self.attributor: Attributor = attributor or NullAttributor()
        self._labeller = labeller
        self._grace = grace_seconds
        self._clock = clock
        self._wall = wall
        self.on_snapshot = on_snapshot
        self._state = DeriveState()
        self._health = HealthStageState()
        self._xids = XidBaseline()
        self._snapshot: Snapshot | None = None
        self._rows: dict[str, _DeviceRows] = {}  # the last pass's, by device key
        self._rows_seq = 0  # the seq of the snapshot ``_rows`` were made for
        self._rows_generation: int | None = None  # the attributor's `generation` when they were made
        self.read_timeout = read_timeout
        self._bulkhead = Bulkhead(read_timeout)
        self.process_metrics = process_metrics
        # Per backend, the plan of its next pass: backends that leave per-process samples
        # until the owners are known (NVML) read them all only with per-process series on.
        # A GPU several owners share has its samples read every few passes, its shares
        # carried in between (`exporter.core.shares`).
        every = passes_between_reads(interval)
        self._plans = [PassPlan(process_metrics=process_metrics or not isinstance(b, ProcessShareReads), every=every)
                       for b in self.backends]
        self._progress_clock = time.monotonic  # real time: liveness is about a stuck thread
        self._published_at: float | None = None
        self._started_at: float | None = None
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def snapshot(self) -> Snapshot | None:
        """The last published snapshot (None before the first pass)."""
        return self._snapshot

    def collect_once(self) -> Snapshot:
        """Run one pass and publish its snapshot.

        Never waits on a stuck driver call for longer than the read timeout: a device
        whose read overruns is published down, with the call it is stuck in (see
        `exporter.core.bulkhead`), and the others as they were read.
        """
        now = self._clock()
        wall = self._wall()
        statuses: list[CollectorStatus] = []

        started = time.perf_counter()
        devices, sources, stuck, ok = self._read_devices(now)
        read_seconds = time.perf_counter() - started

        pids = sorted({p.pid for d in devices if d.up for p in d.processes})
        started = time.perf_counter()
        try:
            owners = dict(self.attributor.resolve(pids, now))
            attributed = True
        except Exception as exc:  # noqa: BLE001 - attribution failure degrades labels only
            log.warning("attributing GPU processes failed: %s", exc)
            owners = {}
            attributed = False
        attribution_seconds = time.perf_counter() - started
        if not all(plan.process_metrics for plan in self._plans):
            started = time.perf_counter()
            devices, more_stuck, shares_ok = self._process_shares(devices, sources, owners)
            stuck, ok = stuck + more_stuck, ok and shares_ok
            read_seconds += time.perf_counter() - started
        statuses.append(CollectorStatus(self.name, ok, read_seconds))
        statuses.append(CollectorStatus("attribution", attributed, attribution_seconds))
        allocations = self._allocations(devices)
        for name, healthy in self.attributor.statuses().items():
            statuses.append(CollectorStatus(name, healthy, 0.0))

        self._state, derived = step(self._state, now, self.node, devices, owners, self._labeller, self._grace,
                                    allocations=allocations)
        self._xids, new_xids = xid_step(self._xids, devices)
        self._health, health = health_step(self._health, now, devices, new_xids, {k for s in stuck for k in s.devices})
        for line in health.problems:
            log.warning("GPU health: %s", line)
        rows, unchanged = self._process_rows(devices, owners)
        backend_errors = {}
        for backend in self.backends:
            for reason, count in backend.errors().items():
                backend_errors[(backend.name, reason)] = count
        info = dict(self.attributor.info())
        info["unattributed_processes"] = float(derived.unattributed_processes)
        self._seq += 1
        snapshot = Snapshot(
            seq=self._seq,
            node=self.node,
            timestamp=wall,
            devices=tuple(devices),
            device_energy_joules=frozen_mapping(derived.device_energy_joules),
            device_capacity_seconds=frozen_mapping(derived.device_capacity_seconds),
            workloads=derived.workloads,
            unattributed=derived.unattributed,
            processes=rows,
            unchanged_processes=unchanged,
            allocations=allocations or (),
            collectors=tuple(statuses),
            backend_errors=frozen_mapping(backend_errors),
            info=frozen_mapping(info),
            stuck=stuck,
            verdicts=frozen_mapping(health.verdicts),
            health_transitions=frozen_mapping(health.transitions),
            device_unhealthy_seconds=frozen_mapping(health.unhealthy_seconds),
            health_signals=frozen_mapping(health.signals),
            new_xids=new_xids,
        )
        self._snapshot = snapshot  # the atomic swap readers rely on
        self._published_at = self._progress_clock()
        if self.on_snapshot is not None:
            try:
                self.on_snapshot(snapshot)
            except Exception:  # noqa: BLE001
                log.exception("snapshot hook failed")
        return snapshot

    def _process_rows(self, devices: Sequence[DeviceSample], owners: Mapping[int, Workload]
                      ) -> tuple[tuple[ProcessRow, ...], frozenset[str]]:
        """The pass's processes joined to their owners; a row equal to the last pass's is
        that row again (most are, pass after pass: building them is most of their cost), and
        a GPU whose processes tuple, owners, names and starts are the last pass's has the
        last pass's rows, without a look at each.

        Returns:
            The rows, and the keys of the GPUs whose processes are the last pass's in that
            sense (`Snapshot.unchanged_processes`: the one place that tells).
        """
        last, rows = self._rows, []
        kept: dict[str, _DeviceRows] = {}
        unchanged: list[str] = []
        published = self._rows_seq == self._seq  # the last rows are the last snapshot's (no pass failed since)
        comm = self.attributor.comm
        start_of = self.attributor.start_time
        generation = self.attributor.generation
        # the attributor names and starts every PID as it did for the last rows
        same_answers = generation == self._rows_generation
        get_owner = owners.get
        for d in devices:
            if not d.up:
                continue
            key, procs = d.key, d.processes
            pids = [p.pid for p in procs]
            here_owners = [get_owner(pid, UNKNOWN) for pid in pids]
            before = last.get(key)
            # the last rows, where the GPU's processes tuple and owner objects are theirs
            same = before if before is not None and before.processes is procs and all(
                map(is_, here_owners, before.owners)) else None
            if same is not None and same_answers:
                names, starts = same.names, same.starts
            else:
                names, starts = [comm(pid) for pid in pids], [start_of(pid) for pid in pids]
            if same is not None and names == same.names and starts == same.starts:
                kept[key] = same
                rows += same.rows
                if published:
                    unchanged.append(key)
                continue
            last_here = before.by_pid if before is not None else {}
            here: list[ProcessRow] = []
            by_pid: dict[int, ProcessRow] = {}
            for p, owner, name, started in zip(procs, here_owners, names, starts):
                pid = p.pid
                row = last_here.get(pid)
                if (row is None or row.workload is not owner or row.comm != name or row.start_time != started
                        or row.used_memory_bytes != p.used_memory_bytes or row.sm_utilization != p.sm_utilization):
                    row = ProcessRow(key, pid, name, owner, p.used_memory_bytes, p.sm_utilization, started)
                by_pid[pid] = row
                here.append(row)
            kept[key] = _DeviceRows(procs, here_owners, names, starts, here, by_pid)
            rows += here
        self._rows, self._rows_seq, self._rows_generation = kept, self._seq + 1, generation
        return tuple(rows), frozenset(unchanged)

    def _read_devices(self, now: float) -> tuple[list[DeviceSample], list[int], tuple[StuckCall, ...], bool]:
        """Every backend's reads for this pass, each within its deadline.

        Returns:
            The devices in order, the place in `backends` of the backend each came from,
            the calls stuck past their deadline, and whether every read answered (the
            backend collector's success).
        """
        reads: list[Read] = []
        owners: list[int] = []
        for place, (backend, plan) in enumerate(zip(self.backends, self._plans)):
            parts = self._parts(backend, self._backend_reads(backend, now, plan))
            reads.extend(parts)
            owners.extend([place] * len(parts))
        per_read, stuck, ok = self._outcomes(reads, owners)
        devices: list[DeviceSample] = []
        sources: list[int] = []
        for got, owner in zip(per_read, owners):
            devices.extend(got)
            sources.extend([owner] * len(got))
        return devices, sources, stuck, ok

    def _parts(self, backend: Backend, reads: list[Read]) -> list[Read]:
        """A backend's reads as parts of this collector's pass: keyed per backend where
        there are several (two backends' GPU 0 told apart), with a deadline no shorter
        than the collector's."""
        several = len(self.backends) > 1
        out = []
        for read in reads:
            if read.timeout is not None and read.timeout < self.read_timeout:
                read = replace(read, timeout=self.read_timeout)
            out.append(replace(read, key=(backend.name, read.key)) if several else read)
        return out

    def _outcomes(self, reads: list[Read], owners: list[int]
                  ) -> tuple[list[list[DeviceSample]], tuple[StuckCall, ...], bool]:
        """Run ``reads`` (each of the backend at its place in ``owners``) through the bulkhead.

        Returns:
            Per read, the devices it returned, or those it covers reported down while it
            is stuck or after it failed; the calls stuck past their deadline; and whether
            every read answered.
        """
        outcomes = self._bulkhead.run(reads)
        per_read: list[list[DeviceSample]] = []
        stuck: list[StuckCall] = []
        ok = True
        for read, owner, outcome in zip(reads, owners, outcomes):
            name = self.backends[owner].name
            got: list[DeviceSample] = []
            if isinstance(outcome, Stuck):
                ok = False
                reason = (f"stuck in {outcome.call} for {outcome.seconds:.1f} s, since "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(outcome.since))}")
                got = list(read.down(reason)) if read.down is not None else []
                stuck.append(StuckCall(name, outcome.what, outcome.call, outcome.since, outcome.seconds,
                                       tuple(d.key for d in got)))
            elif isinstance(outcome, Failed):
                ok = False
                log.warning("reading devices (%s: %s) failed: %s", name, read.what, outcome.error)
                if read.down is not None:
                    got = list(read.down(str(outcome.error)))
            elif outcome:
                got = list(outcome)
            per_read.append(got)
        return per_read, tuple(stuck), ok

    def _process_shares(self, devices: list[DeviceSample], sources: list[int], owners: Mapping[int, Workload]
                        ) -> tuple[list[DeviceSample], tuple[StuckCall, ...], bool]:
        """The SM shares of the processes on GPUs whose backend left them until the owners
        were known (`exporter.core.shares.plan_shares`): the device's utilisation for the one
        owner of a GPU; read now, with deadlines, for a GPU that a second owner has just
        joined. Each backend's plan for its next pass is kept.

        Returns:
            The devices with their processes' shares, the calls stuck past their deadline,
            and whether every read answered.
        """
        reads: list[Read] = []
        read_owners: list[int] = []
        places: list[int] = []
        for place, (backend, plan) in enumerate(zip(self.backends, self._plans)):
            if plan.process_metrics or not isinstance(backend, ProcessShareReads):
                continue
            positions = [n for n, source in enumerate(sources) if source == place]
            decided = plan_shares([devices[n] for n in positions], owners, self._labeller, plan)
            self._plans[place] = decided.next_plan
            for n, device in zip(positions, decided.devices):
                devices[n] = device
            if not decided.read_now:
                continue
            to_read = [positions[i] for i in decided.read_now]
            parts = self._parts(backend, backend.process_share_reads([devices[n] for n in to_read]))
            for n, read in zip(to_read, parts):
                reads.append(read)
                read_owners.append(place)
                places.append(n)
        if not reads:
            return devices, (), True
        per_read, stuck, ok = self._outcomes(reads, read_owners)
        for n, got in zip(places, per_read):
            if len(got) == 1:
                devices[n] = got[0]
        return devices, stuck, ok

    def _backend_reads(self, backend: Backend, now: float, plan: PassPlan) -> list[Read]:
        """A backend's parts of a pass (`Backend.reads`); one that cannot even say them
        is one failed part."""
        try:
            return list(backend.reads(now, plan))
        except Exception as exc:  # noqa: BLE001 - a broken backend must not stop the agent
            return [Read(backend.name, f"the {backend.name} backend", functools.partial(_raise, exc))]

    def _allocations(self, devices: list[DeviceSample]) -> tuple[AllocationRow, ...] | None:
        """This pass's device allocations (kubelet pod-resources), None when unknown.

        The attributor serves its source's last listing: this never waits on the kubelet.
        """
        try:
            return self.attributor.allocations(devices)
        except Exception as exc:  # noqa: BLE001 - allocations degrade their own series only
            log.warning("joining GPU allocations failed: %s", exc)
            return None

    def _run(self) -> None:
        deadline = self._clock()
        while not self._stop.is_set():
            try:
                self.collect_once()
            except Exception:  # noqa: BLE001 - keep collecting whatever happens
                log.exception("collection pass failed")
            deadline += self.interval
            delay = deadline - self._clock()
            if delay < 0:  # overran: skip the missed ticks rather than bursting
                log.debug("collection pass overran the %.3fs interval", self.interval)
                deadline = self._clock()
                delay = 0.0
            self._stop.wait(delay)

    def start(self) -> None:
        """Start the background thread (the first pass runs immediately)."""
        self._started_at = self._progress_clock()
        self._thread = threading.Thread(target=self._run, name="l9gpu-collector", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        """True while the collector thread runs."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def stall_limit(self) -> float:
        """Seconds without a finished pass after which the collector counts as stuck itself.

        Passes never wait on a stuck driver call for long (a pass that meets one ends
        within two read timeouts), so only something outside the device reads can hold
        a pass this long: a minute, or three intervals and two read timeouts if longer.
        """
        timeout = max([self.read_timeout] + [b.read_timeout or 0.0 for b in self.backends])
        return max(60.0, 3 * self.interval + 2 * timeout)

    def liveness(self) -> tuple[bool, str]:
        """For /healthz: whether the collector thread runs and finishes passes, and what is
        degraded meanwhile (GPUs stuck in driver calls, which a restart would not unstick).
        """
        if not self.alive():
            return False, "collector thread is not running"
        last = self._published_at if self._published_at is not None else self._started_at
        idle = self._progress_clock() - last if last is not None else 0.0
        if idle > self.stall_limit:
            return False, (f"no collection pass has finished for {idle:.0f} s (limit {self.stall_limit:.0f} s): "
                           "the collector is stuck outside the device reads")
        return True, self.degraded()

    def degraded(self) -> str:
        """What the last snapshot could not read, in one line ("" when nothing)."""
        snap = self._snapshot
        if snap is None or not snap.stuck:
            return ""
        parts = [f"{s.what}: {s.call} for {s.seconds:.0f} s" for s in snap.stuck]
        return "stuck in driver calls: " + "; ".join(parts)

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the thread, waiting at most ``timeout`` seconds for the current pass."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._bulkhead.close()
