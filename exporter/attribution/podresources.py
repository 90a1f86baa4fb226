"""Which container was allocated which GPU: the kubelet's pod-resources API.

The kubelet serves ``v1.PodResourcesLister/List`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``): for every pod on the node, each
container's devices as the device plugins allocated them (``resource_name`` and
``device_ids``). That is the other half of the picture processes give: a container that
was given a GPU and runs nothing on it holds the GPU all the same, and no driver process
list will ever show it.

`PodResourcesSource` lists the allocations on a slow cadence (every 10 s) in its own
daemon thread, each call with a short deadline; a collection pass only reads the last
list, so a hung kubelet never delays a pass. With each listing it also asks
``GetAllocatableResources`` (kubelet 1.23+) for every device id the plugins advertise:
a time-sliced GPU is listed once per replica (``<uuid>::0`` .. ``<uuid>::<N-1>``), which
is how a container holding k of them is known to hold k/N of the GPU. `join` then maps
each device id to a GPU of the pass and each pod to the pod index:

- NVIDIA: ``GPU-<uuid>`` (time-slicing replicas add ``::<n>``, stripped here) and MIG
  ``MIG-<uuid>`` match `DeviceSample.uuid`;
- AMD: the PCI bus id (``0000:c1:00.0``; case and the width of the domain do not matter)
  matches `DeviceSample.pci_bus_id`;
- Gaudi: the Habana plugin's serial matches `DeviceSample.serial`.

Ids that match no GPU (other device plugins' devices: NICs, FPGAs; GPUs the agent cannot
see) are counted and logged at debug. pod-resources names pods without a UID, so the pod's
UID, owner and labels come from the `PodIndex` by (namespace, name): the allocation's
workload then carries the very labels its processes' series carry. Without the index (or
before it knows the pod) ``pod_uid``, owner and pod labels stay "".

``grpcio`` and ``protobuf`` are imported only when the source is built (the ``k8s`` extra);
the messages come from ``podresources_api.proto`` (see there how the ``_pb2`` module is
generated).
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from exporter.attribution.kubernetes import PodIndex
from exporter.attribution.unixgrpc import STARTUP_TIMEOUT, SocketLister, socket_path
from exporter.core.model import AllocationRow, DeviceSample, Workload

log = logging.getLogger(__name__)

POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST = "/v1.PodResourcesLister/List"
ALLOCATABLE = "/v1.PodResourcesLister/GetAllocatableResources"

# A PCI bus id: [domain:]bus:device.function, hexadecimal.
_PCI = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")


@dataclass(frozen=True)
class PodAllocation:
    """One device id the kubelet allocated to one container."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_id: str


def allocations_from_response(response: Any) -> tuple[PodAllocation, ...]:
    """`PodAllocation`s from a ``ListPodResourcesResponse`` (or anything shaped like it)."""
    found: list[PodAllocation] = []
    for pod in getattr(response, "pod_resources", ()) or ():
        for container in getattr(pod, "containers", ()) or ():
            for devices in getattr(container, "devices", ()) or ():
                for device_id in getattr(devices, "device_ids", ()) or ():
                    if device_id:
                        found.append(PodAllocation(str(pod.namespace), str(pod.name), str(container.name),
                                                   str(devices.resource_name), str(device_id)))
    return tuple(found)


def allocatable_from_response(response: Any) -> tuple[tuple[str, str], ...]:
    """(resource name, device id) for every device of an ``AllocatableResourcesResponse``."""
    return tuple((str(devices.resource_name), str(device_id))
                 for devices in getattr(response, "devices", ()) or ()
                 for device_id in getattr(devices, "device_ids", ()) or () if device_id)


def normalize_pci_bus_id(bus_id: str) -> str | None:
    """``00000000:C1:00.0``, ``0000:c1:00.0`` or ``c1:00.0`` -> ``0000:c1:00.0``; None if not one."""
    match = _PCI.match(bus_id.strip().lower())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


class DeviceMatcher:
    """Maps device-plugin device ids to the `DeviceSample.key` of one pass's GPUs."""

    def __init__(self, devices: Iterable[DeviceSample]):
        self._uuids: dict[str, str] = {}
        self._pci: dict[str, str] = {}
        self._serials: dict[str, str] = {}
        for device in devices:
            if device.uuid:
                self._uuids.setdefault(device.uuid.strip().lower(), device.key)
            if device.gpu_instance:  # a MIG instance shares its parent's bus id and serial
                continue
            pci = normalize_pci_bus_id(device.pci_bus_id) if device.pci_bus_id else None
            if pci:
                self._pci.setdefault(pci, device.key)
            if device.serial.strip():
                self._serials.setdefault(device.serial.strip(), device.key)

    def key(self, device_id: str) -> str | None:
        """The device key ``device_id`` names, or None when it names none of these GPUs."""
        base = device_id.strip().split("::", 1)[0]  # NVIDIA time-slicing replica "::<n>"
        lower = base.lower()
        if lower.startswith(("gpu-", "mig-")):
            return self._uuids.get(lower)
        pci = normalize_pci_bus_id(base)
        if pci is not None and pci in self._pci:
            return self._pci[pci]
        return self._serials.get(base) or self._uuids.get(lower)


def allocation_workload(allocation: PodAllocation, index: PodIndex | None) -> Workload:
    """The container's `Workload`, with UID, owner and labels from the index where it knows the pod."""
    pod = index.by_name(allocation.namespace, allocation.pod) if index is not None else None
    if pod is None:
        return Workload(kind="kubernetes", namespace=allocation.namespace, pod=allocation.pod,
                        container=allocation.container)
    return Workload(kind="kubernetes", namespace=pod.namespace, pod=pod.name, container=allocation.container,
                    pod_uid=pod.uid, owner_kind=pod.owner_kind, owner_name=pod.owner_name, labels=pod.labels,
                    training_job=pod.training_job, training_rank=pod.training_rank)


def join(allocations: Iterable[PodAllocation], devices: Sequence[DeviceSample],
         index: PodIndex | None, allocatable: Iterable[tuple[str, str]] | None = None
         ) -> tuple[tuple[AllocationRow, ...], tuple[str, ...]]:
    """Allocations joined to this pass's GPUs and the pod index.

    Args:
        allocations: the kubelet's ``List``.
        devices: this pass's GPUs.
        index: pod names to UIDs, owners and labels (None: not known).
        allocatable: the kubelet's ``GetAllocatableResources`` as (resource name, device
            id) pairs, None where it does not answer; each row then says how many ids
            name its GPU (`AllocationRow.replicas`).

    Returns:
        (one row per allocation whose device id names a GPU here, the ids that named none).
    """
    matcher = DeviceMatcher(devices)
    replicas: dict[str, int] = {}
    if allocatable is not None:
        for _, device_id in dict.fromkeys(allocatable):  # an id listed twice is one replica
            key = matcher.key(device_id)
            if key is not None:
                replicas[key] = replicas.get(key, 0) + 1
    rows: list[AllocationRow] = []
    unknown: list[str] = []
    workloads: dict[tuple[str, str, str], Workload] = {}
    for allocation in allocations:
        key = matcher.key(allocation.device_id)
        if key is None:
            unknown.append(allocation.device_id)
            continue
        who = (allocation.namespace, allocation.pod, allocation.container)
        workload = workloads.get(who)
        if workload is None:  # one Workload per container, however many devices it has
            workload = workloads[who] = allocation_workload(allocation, index)
        rows.append(AllocationRow(key, workload, allocation.resource_name, allocation.device_id,
                                  replicas.get(key) if allocatable is not None else None))
    return tuple(rows), tuple(unknown)


class StaticAllocationSource:
    """Serves a fixed list of allocations (and allocatable ids): the simulated node's kubelet."""

    name = "pod_resources"

    def __init__(self, allocations: Iterable[PodAllocation],
                 allocatable: Iterable[tuple[str, str]] | None = None):
        self._allocations = tuple(allocations)
        self._allocatable = None if allocatable is None else tuple(allocatable)

    def allocations(self) -> tuple[PodAllocation, ...] | None:
        return self._allocations

    def allocatable(self) -> tuple[tuple[str, str], ...] | None:
        return self._allocatable

    def healthy(self) -> bool:
        return True

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None


class PodResourcesSource(SocketLister):
    """Keeps the kubelet's device allocations, listed in a background thread.

    Args:
        socket: the kubelet's pod-resources socket (a path or ``unix://`` target).
        interval: seconds between listings.
        timeout: deadline of one List call, seconds.
        stale_after: seconds after the last successful listing for which its allocations
            are still served while the kubelet does not answer (a kubelet restart); after
            that they are unknown (None) until it answers again.
        clock: monotonic seconds (injectable for tests).

    Raises:
        ImportError: ``grpcio`` or ``protobuf`` is not installed.
    """

    name = "pod_resources"
    thread_name = "l9gpu-pod-resources"

    def __init__(self, socket: str, interval: float = 10.0, timeout: float = 1.0, stale_after: float = 300.0,
                 clock: Callable[[], float] = time.monotonic):
        from exporter.attribution import podresources_api_pb2 as api

        super().__init__(socket, LIST, api.ListPodResourcesRequest(), api.ListPodResourcesResponse,
                         interval, timeout)
        self.stale_after = stale_after
        self._clock = clock
        # (allocations, clock time of the listing): replaced as one reference
        self._last: tuple[tuple[PodAllocation, ...], float] | None = None
        self._allocatable_call = self._channel.unary_unary(
            ALLOCATABLE, request_serializer=api.AllocatableResourcesRequest.SerializeToString,
            response_deserializer=api.AllocatableResourcesResponse.FromString)
        self._allocatable_request = api.AllocatableResourcesRequest()
        self._allocatable: tuple[tuple[str, str], ...] | None = None
        self._allocatable_failing = False
        self.allocatable_served = True  # False once the kubelet says it has no such method

    def allocations(self) -> tuple[PodAllocation, ...] | None:
        """The last listing's allocations; None before the first one or once it is stale."""
        last = self._last
        if last is None or self._clock() - last[1] > self.stale_after:
            return None
        return last[0]

    def allocatable(self) -> tuple[tuple[str, str], ...] | None:
        """Every device id the kubelet can allocate, as (resource name, id); None where it
        does not say (an older kubelet, a failing call) or the allocations are unknown."""
        if self.allocations() is None:
            return None
        return self._allocatable

    def listed(self, response: Any) -> bool:
        self._last = (allocations_from_response(response), self._clock())
        self._list_allocatable()
        return True

    def _list_allocatable(self) -> None:
        """Ask GetAllocatableResources with the listing (same deadline); keep the last answer."""
        if not self.allocatable_served:
            return
        try:
            answer = self._allocatable_call(self._allocatable_request, timeout=self.timeout)
            found = allocatable_from_response(answer)
        except self._grpc.RpcError as exc:
            code = getattr(exc.code(), "name", "ERROR") if hasattr(exc, "code") else "ERROR"
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            if code == "UNIMPLEMENTED":
                self.allocatable_served = False
                self._allocatable = None
                log.info("the kubelet's pod-resources socket %s has no GetAllocatableResources (kubelet "
                         "older than 1.23): a time-sliced GPU's replicas that nobody holds cannot be seen, so "
                         "its containers share the whole GPU by the replicas they hold", self.socket)
            elif not self._allocatable_failing:
                log.warning("GetAllocatableResources on %s failed (%s: %s); the last answer is kept",
                            self.socket, code, detail)
            self._allocatable_failing = True
            return
        self._allocatable_failing = False
        if found != self._allocatable:  # the same object while unchanged: joins are cached by identity
            self._allocatable = found

    def recovered(self) -> None:
        log.info("kubelet pod-resources socket %s answers again (%d device allocation(s))",
                 self.socket, len(self._last[0]) if self._last else 0)

    def failed(self, first: bool) -> None:
        (log.warning if first else log.debug)(
            "listing device allocations over the kubelet pod-resources socket %s failed (%s: %s); "
            "container_gpu_allocated keeps the last list for %gs", self.socket, self.last_code, self.last_error,
            self.stale_after)


def resolve_socket(value: str, exists: Callable[[str], bool] = os.path.exists) -> str | None:
    """What ``--pod-resources-socket`` names: a path, or None for ``off`` (and ``auto`` without a socket)."""
    value = value.strip()
    if value.lower() == "off":
        return None
    if value.lower() == "auto":
        return POD_RESOURCES_SOCKET if exists(POD_RESOURCES_SOCKET) else None
    return socket_path(value)


def build(socket: str, **kwargs: Any) -> PodResourcesSource | None:
    """A started `PodResourcesSource` that has listed once (so the first pass has allocations).

    That first call, before any pass, has a longer deadline (`STARTUP_TIMEOUT`).

    Returns None, with one warning, when ``grpcio``/``protobuf`` is not installed. A socket
    that fails is kept, reported unhealthy and asked again on the cadence.
    """
    try:
        source = PodResourcesSource(socket, **kwargs)
    except ImportError as exc:
        log.warning("GPU allocations from the kubelet are off: %s is not installed "
                    "(pip install '.[k8s]' in l9gpu's checkout)",
                    exc.name or "grpcio")
        return None
    source.refresh(timeout=max(source.timeout, STARTUP_TIMEOUT))
    source.start()
    return source
