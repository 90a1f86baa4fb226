"""The NVML backend's processes: the compute and graphics process lists and the per-process
utilisation of each GPU.

Per-process utilisation. ``nvmlDeviceGetProcessUtilization(handle, lastSeenTimeStamp)``
returns the driver's samples newer than ``lastSeenTimeStamp`` (microseconds). The
backend keeps the newest timestamp it has seen per device and, each read, averages every
sample of the interval per PID (``smUtil`` and ``memUtil``, percent -> 0-1); an H200
answers one sample per process that already averages the time since that timestamp. The rule
for processes without a sample (`processes_with_shares`):

* the call answered ``NVML_ERROR_NOT_FOUND`` (no samples since the last pass), or it
  returned samples that do not include this PID: the device does sample processes and
  this one did not run a kernel, so it gets ``sm_utilization = 0.0`` (idle). Holding
  memory at 0 SM is exactly what ``container_gpu_idle_seconds`` is about.
* the call is not supported (or missing), or the device is a MIG instance: per-process
  utilisation is unknown, so ``sm_utilization`` stays None.

What is asked. Per-process utilisation is asked only of GPUs that have processes, with
``nvmlDeviceGetProcessesUtilizationInfo`` where the driver has it (cheaper than
``nvmlDeviceGetProcessUtilization``, which remains the fallback), and, under a
`exporter.core.shares.PassPlan` without per-process metrics, only of GPUs that more than one
owner shares: the GPUs the plan names (shared in the last pass) in their own part of the
pass, the ones a second owner has just joined in `ProcessesMixin.process_share_reads` once
the collector knows the owners. A GPU held by one owner takes its utilisation as the
owner's SM share (docs/ATTRIBUTION.md). The graphics process list is asked every
`GRAPHICS_PERIOD` while a GPU has no graphics process.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from exporter.core.bulkhead import Read
from exporter.core.model import DeviceSample, ProcessSample
from exporter.core.shares import LastRead, carried_utilization
from exporter.devices.nvml.common import GRAPHICS_PERIOD, NvmlState
from exporter.devices.nvml.libnvml import (
    CALL_PREFIXES,
    COMPUTE_PROCESS_FUNCTIONS,
    GRAPHICS_PROCESS_FUNCTIONS,
    NA,
    NVML_ERROR_NOT_FOUND,
    NVML_SUCCESS,
    PROCESS_UTIL_FUNCTIONS,
    DeviceDown,
    Nvml,
    handle_key,
    process_memory,
)


class ProcessesMixin(NvmlState):
    """The processes of a GPU and their shares (part of `NvmlBackend`)."""

    _last_seen: dict[int, int]
    _unfinished: set[int]
    _last_processes: dict[tuple[int, Any], _Listing]

    def _went_down(self, index: int, down: DeviceDown) -> list[DeviceSample]:
        raise NotImplementedError

    def _down_samples(self, index: int, error: str) -> list[DeviceSample]:
        raise NotImplementedError

    def _processes(
        self, nvml: Nvml, index: int, handle: Any, per_process_util: bool, now: float,
        utilization: float | None = None,
    ) -> tuple[ProcessSample, ...]:
        """The GPU's processes, with their SM shares where this pass reads them or carries
        them (``utilization``: the GPU's, this pass)."""
        graphics_key = (index, "graphics", handle_key(handle))
        kinds = [("compute", COMPUTE_PROCESS_FUNCTIONS)]
        if self._slow_values.get(graphics_key) or self._due(index, graphics_key[1:], now, GRAPHICS_PERIOD):
            kinds.append(("graphics", GRAPHICS_PROCESS_FUNCTIONS))
        listed: list[tuple[str, list[tuple[Any, Any]]]] = []
        for kind, functions in kinds:
            infos = self._guard(nvml, nvml.first, functions, handle)
            if kind == "graphics":
                self._slow_values[graphics_key] = bool(infos)
            if infos is not NA and infos:
                listed.append((kind, _pids_and_memory(infos)))
        key = (index, handle_key(handle))
        last = self._last_processes.get(key)
        if last is not None and last.listed == listed:
            # The driver listed what it listed last pass: the same processes, the same memory.
            entries, previous = last.entries, last.processes
        else:
            entries, previous = _entries(listed), ()
        if not entries:
            # No process, nothing to ask the driver's per-process samples about (they
            # cost milliseconds). The last-seen timestamp stays, so the next pass with
            # processes reads only samples newer than the last one read.
            self._last_processes[key] = _Listing(listed, entries, ())
            return ()
        util: Mapping[int, tuple[float, float | None]] | None = None
        carried_from: tuple[LastRead, float | None] | None = None
        if per_process_util and self._plan.reads_shares(index):
            util = self._process_utilization(nvml, index, handle)
        elif per_process_util and index in self._plan.carried:
            # a shared GPU between two reads: the last read's shares, carried (`exporter.core.shares`)
            carried_from = (self._plan.carried[index], utilization)
            if previous and last is not None and last.carried_from is not None and \
                    last.carried_from[0] is carried_from[0] and last.carried_from[1] == utilization:
                # the same processes, the same read carried at the same utilisation: the same shares
                self._last_processes[key] = last
                return previous
            util = carried_utilization(carried_from[0], [pid for pid, _, _ in entries], utilization)
        processes = processes_with_shares(entries, util, previous)
        self._last_processes[key] = _Listing(listed, entries, processes, carried_from if util is not None else None)
        return processes

    def process_share_reads(self, devices: Sequence[DeviceSample]) -> list[Read]:
        """The per-process samples of these GPUs, as parts of the pass (`exporter.core.bulkhead`).

        Under a `PassPlan` without per-process metrics, a GPU's part of the pass leaves
        its processes' SM shares unread (unless the plan names it in ``shared``), so that
        the collector can ask for them once it knows the processes' owners: only for GPUs
        that more than one owner shares (the per-process read costs more than the rest of a
        GPU's pass, docs/PERFORMANCE.md).
        Each part returns the GPU's sample with its processes' shares, or the GPU down
        when it was lost meanwhile; its key is the GPU's, so it is not asked while a call
        of its first part is stuck.

        Args:
            devices: whole GPUs of this pass (MIG instances have no per-process samples).
        """
        reads = []
        for device in devices:
            if device.gpu_instance or not device.processes or not device.up:
                continue
            index = device.index
            reads.append(Read(index, f"GPU {index}", functools.partial(self._read_shares, device),
                              calls=CALL_PREFIXES, down=functools.partial(self._down_samples, index)))
        return reads

    def _read_shares(self, device: DeviceSample) -> list[DeviceSample]:
        nvml = self._require()
        index = device.index
        handle = self._handles.get(index)
        if handle is None:  # lost since its first part: the next pass reads it afresh
            return [device]
        self._unfinished.add(index)
        try:
            util = self._process_utilization(nvml, index, handle)
        except DeviceDown as down:
            self._unfinished.discard(index)
            return self._went_down(index, down)
        self._unfinished.discard(index)
        processes = [(p.pid, p.used_memory_bytes, p.kind) for p in device.processes]
        return [replace(device, processes=processes_with_shares(processes, util))]

    def _process_utilization(self, nvml: Nvml, index: int, handle: Any) -> dict[int, tuple[float, float]] | None:
        """Mean SM and memory utilisation (0-1) per PID over the samples since last pass.

        Asks ``nvmlDeviceGetProcessesUtilizationInfo`` where the driver has it, else
        ``nvmlDeviceGetProcessUtilization``; both take and return the same timestamps.

        Returns:
            PID -> (sm, memory) for PIDs with samples; an empty dict when the device
            samples processes but has none new (NOT_FOUND: all idle); None when the
            device cannot sample processes at all.
        """
        last_seen = self._last_seen.get(index, 0)
        for name in PROCESS_UTIL_FUNCTIONS:
            fn = getattr(nvml.module, name, None)
            if not callable(fn):
                nvml.call(name)  # not in this binding: logs that once
                continue
            if nvml.unsupported(name, handle):
                continue
            try:
                samples = nvml.invoke(name, fn, handle, last_seen)
            except nvml.mismatch:
                nvml.remember_unsupported(name, handle)
                continue
            except nvml.error as exc:
                code = nvml.code(exc)
                # NOT_FOUND: no sample newer than last_seen. pynvml raises NVMLError(SUCCESS)
                # when the driver answers "success, zero samples" to its sizing call.
                if code in (nvml.const("NVML_ERROR_NOT_FOUND", NVML_ERROR_NOT_FOUND), NVML_SUCCESS):
                    return {}
                if code in (nvml.not_supported, nvml.function_not_found):
                    nvml.remember_unsupported(name, handle)
                    continue
                self._query_failed(nvml, name, exc)  # a lost GPU stops the device; other errors are counted
                return None
            return self._aggregate_utilization(index, last_seen, samples or ())
        return None

    def _aggregate_utilization(
        self, index: int, last_seen: int, samples: Iterable[Any]
    ) -> dict[int, tuple[float, float]]:
        sums: dict[int, list[float]] = {}
        newest = last_seen
        for sample in samples:
            try:  # the binding's samples always have these (ctypes structs)
                stamp, pid, sm, mem = sample.timeStamp, sample.pid, sample.smUtil, sample.memUtil
            except AttributeError:
                stamp, pid = getattr(sample, "timeStamp", 0), getattr(sample, "pid", 0)
                sm, mem = getattr(sample, "smUtil", 0), getattr(sample, "memUtil", 0)
            stamp = int(stamp or 0)
            if stamp > newest:
                newest = stamp
            if stamp <= last_seen:
                continue  # the driver promises newer samples only; be safe anyway
            pid = int(pid or 0)
            acc = sums.get(pid)
            if acc is None:
                sums[pid] = [float(sm or 0), float(mem or 0), 1]
            else:
                acc[0] += float(sm or 0)
                acc[1] += float(mem or 0)
                acc[2] += 1
        self._last_seen[index] = newest
        return {
            pid: (min(sm / n / 100.0, 1.0), min(mem / n / 100.0, 1.0))
            for pid, (sm, mem, n) in sums.items()
        }

    # ---- MIG --------------------------------------------------------------------


def processes_with_shares(processes: Sequence[tuple[int, int | None, str]],
                          util: Mapping[int, tuple[float, float | None]] | None,
                          previous: Sequence[ProcessSample] = ()) -> tuple[ProcessSample, ...]:
    """(pid, memory, kind) of each process, with its SM and memory shares from ``util`` (see
    the module doc for the rule): a process without a sample was idle (0); None (the
    device cannot sample processes, or they were not read) leaves the shares unknown.

    ``previous``: the GPU's samples of the last pass when its processes were the same ones
    in the same order (else empty); one whose shares are this pass's is that sample again
    (a pass builds only what changed), and where all are, the tuple is ``previous`` itself:
    the later stages of the pass take an unchanged tuple for unchanged processes.
    """
    out = []
    changed = not previous
    for n, (pid, memory, kind) in enumerate(processes):
        sm, mem = (None, None) if util is None else util.get(pid, (0.0, 0.0))
        last = previous[n] if previous else None
        if last is not None and last.sm_utilization == sm and last.memory_utilization == mem:
            out.append(last)
        else:
            out.append(ProcessSample(pid, memory, sm, mem, kind))
            changed = True
    if not changed and len(out) == len(previous):
        return tuple(previous)
    return tuple(out)


class _Listing(NamedTuple):
    """A GPU's processes as its last pass listed them.

    Attributes:
        listed: what the driver's process lists said, per kind asked: (kind, [(pid,
            memory) as the binding gave them]).
        entries: (pid, memory bytes or None, kind) per process, by PID.
        processes: the samples made of them.
        carried_from: where their shares were carried from a read (`carried_utilization`):
            that read and the GPU's utilisation they were carried to; None otherwise.
    """

    listed: list[tuple[str, list[tuple[Any, Any]]]]
    entries: list[tuple[int, int | None, str]]
    processes: tuple[ProcessSample, ...]
    carried_from: tuple[LastRead, float | None] | None = None


def _pids_and_memory(infos: Iterable[Any]) -> list[tuple[Any, Any]]:
    """(pid, usedGpuMemory) of each process the binding listed."""
    try:  # the binding's process objects always have both
        return [(info.pid, info.usedGpuMemory) for info in infos]
    except AttributeError:
        return [(getattr(info, "pid", 0), getattr(info, "usedGpuMemory", None)) for info in infos]


def _entries(listed: Sequence[tuple[str, Sequence[tuple[Any, Any]]]]) -> list[tuple[int, int | None, str]]:
    """(pid, memory bytes or None, kind) per process of the lists, by PID. A process in both
    the compute and the graphics list shares its memory figure between its contexts: it
    keeps its first kind and a figure if either has one."""
    found: dict[int, tuple[int | None, str]] = {}
    for kind, processes in listed:
        for pid, memory in processes:
            pid = int(pid or 0)
            if pid <= 0:
                continue
            memory = process_memory(memory)
            known = found.get(pid)
            if known is None:
                found[pid] = (memory, kind)
            elif known[0] is None:
                found[pid] = (memory, known[1])
    return [(pid, *found[pid]) for pid in sorted(found)]
