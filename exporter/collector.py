"""The collector: one background thread, one pass per interval, one immutable snapshot.

Each pass reads ``now`` once, reads every device once, resolves every GPU PID's owner,
folds the pass into the derived counters and publishes a new `Snapshot` by swapping a
single reference. Scrapes only ever read the published snapshot, so they never wait on
hardware, /proc or the network. A failing part (the backend, attribution) is reported in
``l9gpu_collector_success`` and degrades only its own part of the snapshot.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from exporter.attribution import Attributor, NullAttributor
from exporter.derive import DeriveState, Labeller, default_labeller, step
from exporter.devices.base import Backend
from exporter.model import (
    UNKNOWN,
    AllocationRow,
    CollectorStatus,
    DeviceSample,
    ProcessRow,
    Snapshot,
    frozen_mapping,
)

log = logging.getLogger(__name__)


def _down(device: DeviceSample, error: str) -> DeviceSample:
    """The identity of a device that could not be read this pass, with no values."""
    return DeviceSample(index=device.index, uuid=device.uuid, model=device.model, vendor=device.vendor,
                        gpu_instance=device.gpu_instance, driver_version=device.driver_version,
                        pci_bus_id=device.pci_bus_id, serial=device.serial, up=False, error=error)


class Collector:
    """Runs collection passes and holds the current snapshot.

    Args:
        backend: an opened device backend.
        node: node name for the ``node`` label.
        interval: seconds between passes.
        attributor: PID -> workload resolver (default: none, all unattributed).
        labeller: workload label values after the device labels.
        grace_seconds: how long counters of a vanished workload stay exported.
        clock: monotonic clock (seconds); wall: wall clock (Unix seconds).
        on_snapshot: called from the collector thread after each publish (e.g. to
            pre-render the exposition while no scrape is waiting).
    """

    def __init__(
        self,
        backend: Backend,
        node: str,
        interval: float = 1.0,
        attributor: Attributor | None = None,
        labeller: Labeller = default_labeller,
        grace_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_snapshot: Callable[[Snapshot], None] | None = None,
    ):
        self.backend = backend
        self.node = node
        self.interval = interval
        self.attributor: Attributor = attributor or NullAttributor()
        self._labeller = labeller
        self._grace = grace_seconds
        self._clock = clock
        self._wall = wall
        self.on_snapshot = on_snapshot
        self._state = DeriveState()
        self._snapshot: Snapshot | None = None
        self._last_devices: list[DeviceSample] = []
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def snapshot(self) -> Snapshot | None:
        """The last published snapshot (None before the first pass)."""
        return self._snapshot

    def collect_once(self) -> Snapshot:
        """Run one pass and publish its snapshot."""
        now = self._clock()
        wall = self._wall()
        statuses: list[CollectorStatus] = []

        started = time.perf_counter()
        try:
            devices = list(self.backend.sample(now))
            ok = True
        except Exception as exc:  # noqa: BLE001 - a broken backend must not stop the agent
            log.warning("reading devices (%s) failed: %s", self.backend.name, exc)
            devices = [_down(d, str(exc)) for d in self._last_devices]
            ok = False
        statuses.append(CollectorStatus(self.backend.name, ok, time.perf_counter() - started))
        if ok:
            self._last_devices = devices

        pids = sorted({p.pid for d in devices if d.up for p in d.processes})
        started = time.perf_counter()
        try:
            owners = dict(self.attributor.resolve(pids, now))
            ok = True
        except Exception as exc:  # noqa: BLE001 - attribution failure degrades labels only
            log.warning("attributing GPU processes failed: %s", exc)
            owners = {}
            ok = False
        statuses.append(CollectorStatus("attribution", ok, time.perf_counter() - started))
        allocations = self._allocations(devices)
        for name, healthy in self.attributor.statuses().items():
            statuses.append(CollectorStatus(name, healthy, 0.0))

        self._state, derived = step(self._state, now, self.node, devices, owners, self._labeller, self._grace,
                                    allocations=allocations)
        rows = tuple(
            ProcessRow(d.key, p.pid, self.attributor.comm(p.pid), owners.get(p.pid, UNKNOWN),
                       p.used_memory_bytes, p.sm_utilization)
            for d in devices if d.up for p in d.processes
        )
        backend_errors = {}
        for backend in getattr(self.backend, "backends", [self.backend]):  # MultiBackend or one
            errors = getattr(backend, "errors", None)
            for reason, count in (errors() if callable(errors) else {}).items():
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
            allocations=allocations or (),
            collectors=tuple(statuses),
            backend_errors=frozen_mapping(backend_errors),
            info=frozen_mapping(info),
        )
        self._snapshot = snapshot  # the atomic swap readers rely on
        if self.on_snapshot is not None:
            try:
                self.on_snapshot(snapshot)
            except Exception:  # noqa: BLE001
                log.exception("snapshot hook failed")
        return snapshot

    def _allocations(self, devices: list[DeviceSample]) -> tuple[AllocationRow, ...] | None:
        """This pass's device allocations (kubelet pod-resources), None when unknown.

        The attributor serves its source's last listing: this never waits on the kubelet.
        """
        allocations = getattr(self.attributor, "allocations", None)  # attributors may predate it
        if allocations is None:
            return None
        try:
            return allocations(devices)
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
        self._thread = threading.Thread(target=self._run, name="l9gpu-collector", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        """True while the collector thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the thread, waiting at most ``timeout`` seconds for the current pass."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
