"""XID events on NVML: critical XID errors counted per GPU and XID code.

At ``open()`` an NVML event set is registered for critical XID events on every device
that supports them; each pass drains it without waiting (its own part of the pass, key
``"events"``) and counts events per device and XID code, cumulatively since the agent
started. A storm of events cannot stall a pass: at most `MAX_EVENTS_PER_PASS` are drained.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from exporter.devices.nvml.common import NvmlState
from exporter.devices.nvml.libnvml import MAX_EVENTS_PER_PASS, NA, NVML_ERROR_TIMEOUT, Nvml, handle_key, text

log = logging.getLogger(__name__)


class XidMixin(NvmlState):
    """The XID event set of the backend's GPUs (part of `NvmlBackend`)."""

    _event_set: Any
    _xid_devices: dict[Any, int]
    _xid_counts: dict[int, Counter[str]]

    def _register_xid_events(self) -> None:
        nvml = self._require()
        try:
            event_set = nvml.call("nvmlEventSetCreate")
        except nvml.error as exc:
            log.info("NVML event set unavailable, XID errors will not be counted: %s", exc)
            return
        if event_set is NA:
            return
        self._event_set = event_set
        for index, handle in list(self._handles.items()):
            self._register_xid(nvml, index, handle)
        if not self._xid_devices:
            log.info("no GPU supports XID events; XID errors will not be counted")

    def _register_xid(self, nvml: Nvml, index: int, handle: Any) -> None:
        xid = nvml.const("nvmlEventTypeXidCriticalError")
        try:
            supported = nvml.call("nvmlDeviceGetSupportedEventTypes", handle)
            if supported is not NA and not int(supported) & xid:
                log.debug("GPU %d does not report XID events", index)
                return
            if nvml.call("nvmlDeviceRegisterEvents", handle, xid, self._event_set) is NA:
                log.debug("GPU %d does not support XID events", index)
                return
        except nvml.error as exc:
            log.debug("cannot register XID events on GPU %d: %s", index, exc)
            return
        self._xid_devices[handle_key(handle)] = index

    def _drain_xid_events(self, nvml: Nvml) -> None:
        if self._event_set is None:
            return
        timeout = nvml.const("NVML_ERROR_TIMEOUT", NVML_ERROR_TIMEOUT)
        xid = nvml.const("nvmlEventTypeXidCriticalError")
        for _ in range(MAX_EVENTS_PER_PASS):
            try:
                event = nvml.call("nvmlEventSetWait", self._event_set, 0)
            except nvml.error as exc:
                if nvml.code(exc) != timeout:
                    self._errors["event_wait_error"] += 1
                    log.debug("nvmlEventSetWait failed: %s", exc)
                return
            if event is NA:
                return
            if not int(getattr(event, "eventType", 0) or 0) & xid:
                continue
            index = self._event_device(nvml, getattr(event, "device", None))
            if index is None:
                self._errors["xid_unknown_device"] += 1
                continue
            code = str(int(getattr(event, "eventData", 0) or 0))
            self._xid_counts[index][code] += 1
            log.warning("GPU %d: XID %s", index, code)

    def _event_device(self, nvml: Nvml, device: Any) -> int | None:
        """Map an event's device handle back to a GPU index."""
        if device is None:
            return None
        index = self._xid_devices.get(handle_key(device))
        if index is not None:
            return index
        try:
            uuid = text(nvml.call("nvmlDeviceGetUUID", device))
        except nvml.error:
            return None
        for known, static in list(self._static.items()):
            if uuid and static.get("uuid") == uuid:
                return known
        return None
