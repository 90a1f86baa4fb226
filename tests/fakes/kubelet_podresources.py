"""The kubelet's pod-resources socket, as a node's kubelet serves it.

`FakeKubelet` is a grpcio server on a unix socket that implements
``v1.PodResourcesLister`` (``List`` and ``GetAllocatableResources``) from the agent's own
``podresources_api.proto`` (``exporter/attribution/podresources_api.proto``), with the real
service and message names; `pod` builds a pod's resources as the kubelet lists them (the
device plugin's resource name and device IDs per container, on NUMA node 0). A test sets
`pods` and `allocatable` (None: a kubelet older than 1.23, which answers
``GetAllocatableResources`` with UNIMPLEMENTED, as it does), counts `requests`, and makes
every ``List`` hang with `hang` until `release` is set.
"""

from __future__ import annotations

import os
import threading
from concurrent import futures
from typing import Any

import grpc

from exporter.attribution import podresources_api_pb2 as api


class FakeKubelet:
    """A kubelet that answers List with `pods` (or hangs until released)."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, "kubelet.sock")
        self.pods: list[Any] = []
        # GetAllocatableResources: [(resource name, [device ids])], or None for a kubelet
        # older than 1.23 (the method is unimplemented)
        self.allocatable: list[tuple[str, list[str]]] | None = None
        self.requests = 0
        self.hang = threading.Event()  # set: every call blocks until `release` is set
        self.release = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=api.ListPodResourcesRequest.FromString,
                response_serializer=api.ListPodResourcesResponse.SerializeToString),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                self._allocatable, request_deserializer=api.AllocatableResourcesRequest.FromString,
                response_serializer=api.AllocatableResourcesResponse.SerializeToString)}),))
        self.server.add_insecure_port("unix:" + self.path)
        self.server.start()

    def _list(self, request: Any, context: Any) -> Any:
        self.requests += 1
        if self.hang.is_set():
            self.release.wait(10)
        return api.ListPodResourcesResponse(pod_resources=list(self.pods))

    def _allocatable(self, request: Any, context: Any) -> Any:
        if self.allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
        return api.AllocatableResourcesResponse(devices=[
            api.ContainerDevices(resource_name=resource, device_ids=ids) for resource, ids in self.allocatable])

    def stop(self) -> None:
        self.release.set()
        self.server.stop(0).wait(5)


def pod(namespace: str, name: str, **containers: list[tuple[str, list[str]]]) -> Any:
    """PodResources with containers {name: [(resource_name, [device ids])]}."""
    return api.PodResources(name=name, namespace=namespace, containers=[
        api.ContainerResources(name=cname, devices=[
            api.ContainerDevices(resource_name=resource, device_ids=ids,
                                 topology=api.TopologyInfo(nodes=[api.NUMANode(ID=0)]))
            for resource, ids in devices])
        for cname, devices in containers.items()])
