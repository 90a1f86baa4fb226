"""A container runtime's CRI socket, as the kubelet's containerd or CRI-O serves it.

`FakeRuntime` is a grpcio server on a unix socket that implements
``runtime.v1.RuntimeService/ListContainers`` from the agent's own ``cri_api.proto``
(``exporter/attribution/cri_api.proto``), with the real service and message names;
`container` builds a container labelled the way the kubelet labels it
(``io.kubernetes.pod.uid``, ``io.kubernetes.pod.name``, ...). A test sets `containers`,
reads `requests`, makes every call hang with `hang` until `release` is set, or serves
another service than CRI (``serve_cri=False``: a socket that serves no CRI, as Docker's own
containerd).
"""

from __future__ import annotations

import os
import threading
from concurrent import futures
from typing import Any

import grpc

from exporter.attribution import cri
from exporter.attribution import cri_api_pb2 as api


def container(cid: str, uid: str, pod: str, namespace: str, name: str, **extra: str) -> Any:
    """A running container as CRI lists it, with the labels the kubelet sets (``extra``: more labels)."""
    labels = {cri.POD_UID: uid, cri.POD_NAME: pod, cri.POD_NAMESPACE: namespace, cri.CONTAINER_NAME: name, **extra}
    return api.Container(id=cid, pod_sandbox_id="sandbox-" + uid[:8], metadata=api.ContainerMetadata(name=name),
                         state=api.CONTAINER_RUNNING, labels=labels,
                         annotations={"io.kubernetes.container.restartCount": "0"})


class FakeRuntime:
    """A CRI runtime that answers ListContainers from `containers` (or hangs, or is not CRI)."""

    def __init__(self, directory: str, serve_cri: bool = True):
        self.path = os.path.join(directory, "containerd.sock")
        self.containers: list[Any] = []
        self.requests: list[Any] = []
        self.hang = threading.Event()  # set: every call blocks until `release` is set
        self.release = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        service = "runtime.v1.RuntimeService" if serve_cri else "runtime.v1.ImageService"
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {
            "ListContainers": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=api.ListContainersRequest.FromString,
                response_serializer=api.ListContainersResponse.SerializeToString)}),))
        self.server.add_insecure_port("unix:" + self.path)
        self.server.start()

    def _list(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        if self.hang.is_set():
            self.release.wait(10)
        return api.ListContainersResponse(containers=list(self.containers))

    def stop(self) -> None:
        self.release.set()
        self.server.stop(0).wait(5)
