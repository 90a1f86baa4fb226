"""MIG on NVML: a GPU in MIG mode reports each MIG device as its own `DeviceSample`.

Each has the parent's ``index``, the MIG ``uuid``, ``gpu_instance`` = its GPU instance id,
its own memory, processes and GPM values, and its ``capacity`` (its compute slices over
the GPU's MIG slots). The parent GPU is still reported for whole-board values (power,
energy, temperature, clocks, ECC, XIDs) but without processes, so that no process is
counted twice, with the slices that are in no instance as its capacity.

MIG mode is re-read every `SLOW_PERIOD` seconds; when it changes, every call on the GPU
is worth asking again (`Nvml.forget`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from exporter.core.model import DeviceSample, frozen_mapping
from exporter.devices.nvml.libnvml import NA, Nvml, int_or_none, ratio, text
from exporter.devices.nvml.processes import ProcessesMixin

log = logging.getLogger(__name__)


class MigMixin(ProcessesMixin):
    """MIG mode and instances of a GPU (part of `NvmlBackend`)."""

    _mig_enabled: dict[int, bool]
    _mig_slots: dict[int, Any]
    _mig_capacities: dict[str, float]
    _fields_unsupported: dict[int, set[int]]

    def _read_mig_mode(self, nvml: Nvml, index: int, handle: Any) -> bool:
        """Whether MIG is on; a change makes every call on the GPU worth asking again."""
        mig_mode = self._opt(nvml, "nvmlDeviceGetMigMode", handle)
        enabled = (
            mig_mode is not NA
            and bool(mig_mode)
            and mig_mode[0] == nvml.const("NVML_DEVICE_MIG_ENABLE")
        )
        before = self._mig_enabled.get(index)
        if before is not None and before != enabled:
            log.info("GPU %d: MIG mode is now %s", index, "on" if enabled else "off")
            nvml.forget(handle)
            self._mig_slots.pop(index, None)
            self._fields_unsupported.pop(index, None)
        self._mig_enabled[index] = enabled
        return enabled


    def _sample_mig(self, nvml: Nvml, index: int, handle: Any, parent: Mapping[str, Any],
                    now: float) -> list[DeviceSample]:
        count = self._mig_slots.get(index)
        if count is None:
            count = self._mig_slots[index] = self._opt(nvml, "nvmlDeviceGetMaxMigDeviceCount", handle)
        if count is NA:
            return []
        samples = []
        for slot in range(int(count)):
            mig = self._opt(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is NA or mig is None:
                continue  # an empty slot
            try:
                uuid = text(nvml.call("nvmlDeviceGetUUID", mig))
                instance = nvml.call("nvmlDeviceGetGpuInstanceId", mig)
                memory = nvml.call("nvmlDeviceGetMemoryInfo", mig)
            except nvml.error as exc:
                down = self._down(nvml, exc)
                if down.reason != "device_error":
                    raise down from exc
                self._errors["mig_error"] += 1
                log.debug("MIG device %d/%d not readable: %s", index, slot, exc)
                continue
            utilization = self._opt(nvml, "nvmlDeviceGetUtilizationRates", mig)
            gpm = frozen_mapping() if instance is NA else self._read_gpm(nvml, handle, index, int(instance))
            capacity = self._mig_capacity(nvml, mig, uuid, int(count), memory, parent)
            samples.append(
                DeviceSample(
                    index=index,
                    uuid=uuid,
                    model=parent["model"],
                    vendor="nvidia",
                    gpu_instance="" if instance is NA else str(instance),
                    driver_version=self._driver_version,
                    pci_bus_id=parent["pci_bus_id"],
                    serial=parent["serial"],
                    utilization=ratio(getattr(utilization, "gpu", None)) if utilization is not NA else None,
                    memory_utilization=(
                        ratio(getattr(utilization, "memory", None)) if utilization is not NA else None
                    ),
                    memory_used_bytes=int_or_none(getattr(memory, "used", None)) if memory is not NA else None,
                    memory_total_bytes=int_or_none(getattr(memory, "total", None)) if memory is not NA else None,
                    gpm=gpm,
                    # NVML has no per-process utilisation on MIG devices.
                    processes=self._processes(nvml, index, mig, per_process_util=False, now=now),
                    capacity=capacity,
                )
            )
        return samples

    def _mig_capacity(self, nvml: Nvml, mig: Any, uuid: str, slots: int, memory: Any,
                      parent: Mapping[str, Any]) -> float:
        """A MIG instance's part of its GPU: its compute slices over the GPU's MIG slots
        (``nvmlDeviceGetAttributes``: a 1g.10gb of an H100 is 1/7), read once per instance.

        Where the driver does not say, its memory's share of the GPU's is the nearest figure.
        """
        capacity = self._mig_capacities.get(uuid)
        if capacity is not None:
            return capacity
        attributes = self._opt(nvml, "nvmlDeviceGetAttributes", mig)
        slices = 0 if attributes is NA else int(getattr(attributes, "computeInstanceSliceCount", 0)
                                                  or getattr(attributes, "gpuInstanceSliceCount", 0) or 0)
        total = parent.get("memory_total_bytes") or 0
        if slices and slots:
            capacity = min(1.0, slices / slots)
        elif memory is not NA and total and getattr(memory, "total", 0):
            capacity = min(1.0, int(memory.total) / total)
        else:
            capacity = 1.0 / slots if slots else 1.0
        if len(self._mig_capacities) > 4096:  # instances come and go with new UUIDs: stay bounded
            self._mig_capacities.clear()
        self._mig_capacities[uuid] = capacity
        return capacity
