"""Pod metadata from the node's container runtime over the CRI socket: the fallback.

The kubelet labels every container it creates with its pod's name, namespace and UID and
the container's name (``io.kubernetes.pod.name``, ``io.kubernetes.pod.namespace``,
``io.kubernetes.pod.uid``, ``io.kubernetes.container.name``). The runtime (containerd,
CRI-O) serves them through ``runtime.v1.RuntimeService/ListContainers`` on its unix
socket, on the node itself: so where the API server is off or unreachable, GPU series can
still say which pod and container they belong to.

`CriPodSource` lists the running containers on a slow cadence in its own daemon thread,
and at once (rate-limited) when the resolver meets a container id the index does not
know. Every RPC has a short deadline, so a hung runtime delays a collection pass by at
most that much. The pods it finds go into the same `PodIndex` as the API watch's, as
fallback entries: a pod the API has provided keeps the API's data (owner and labels,
which CRI does not have).

``grpcio`` and ``protobuf`` are imported only when the source is built (the ``k8s`` extra);
the messages come from ``cri_api.proto`` (see there how ``cri_api_pb2.py`` is generated).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from exporter.attribution import training
from exporter.attribution.kubernetes import PodIndex, PodMeta
from exporter.attribution.unixgrpc import STARTUP_TIMEOUT, SocketLister

log = logging.getLogger(__name__)

# Where the common runtimes put their CRI socket, in the order auto-detection tries them.
CRI_SOCKETS = (
    "/run/containerd/containerd.sock",
    "/run/k3s/containerd/containerd.sock",
    "/run/crio/crio.sock",
)
LIST_CONTAINERS = "/runtime.v1.RuntimeService/ListContainers"

POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"

def detect_socket(candidates: Sequence[str] | None = None,
                  exists: Callable[[str], bool] = os.path.exists) -> str | None:
    """The first runtime socket (of `CRI_SOCKETS` unless given) that exists, or None."""
    return next((path for path in (CRI_SOCKETS if candidates is None else candidates) if exists(path)), None)


def pods_from_containers(containers: Iterable[Any]) -> list[PodMeta]:
    """`PodMeta` entries from CRI ``Container`` messages (or anything shaped like them).

    Containers without the kubelet's pod UID label (not started by the kubelet, e.g.
    ``nerdctl run``) are skipped. Owner and pod labels are not in CRI: they stay empty.
    The training job and rank are read from the container's labels and annotations by the
    same rule as the API's (`training.from_pod`); the kubelet copies none of a pod's
    labels or annotations onto its containers (only onto the pod sandbox), so they are
    found only where a runtime hook or the image put the scheduler's keys there.
    """
    pods: dict[str, tuple[str, str, dict[str, str]]] = {}
    jobs: dict[str, training.Identity] = {}
    for container in containers:
        labels: Mapping[str, str] = getattr(container, "labels", None) or {}
        uid = str(labels.get(POD_UID, "")).strip()
        if not uid:
            continue
        name, namespace, names = pods.setdefault(
            uid, (str(labels.get(POD_NAME, "")), str(labels.get(POD_NAMESPACE, "")), {}))
        cid = str(getattr(container, "id", "") or "").strip().lower()
        metadata = getattr(container, "metadata", None)
        cname = str(labels.get(CONTAINER_NAME, "") or getattr(metadata, "name", "") or "")
        if cid and cname:
            names[cid] = cname
        if uid not in jobs or jobs[uid] == training.NO_JOB:
            jobs[uid] = training.from_pod(labels, getattr(container, "annotations", None) or {})
    return [PodMeta(uid=uid, name=name, namespace=namespace, containers=names,
                    training_job=jobs[uid][0], training_rank=jobs[uid][1])
            for uid, (name, namespace, names) in sorted(pods.items())]


class CriPodSource(SocketLister):
    """Keeps the fallback part of a `PodIndex` in step with the runtime's containers.

    Args:
        socket: the runtime's CRI socket (a path or ``unix://`` target).
        index: the index to fill (shared with the API watch, whose data wins).
        interval: seconds between background listings.
        min_refresh: at least this many seconds between on-demand listings.
        timeout: deadline of one ListContainers call, seconds.
        clock: monotonic seconds (injectable for tests).

    Raises:
        ImportError: ``grpcio`` or ``protobuf`` is not installed.
    """

    name = "cri"
    thread_name = "l9gpu-cri"

    def __init__(self, socket: str, index: PodIndex, interval: float = 30.0, min_refresh: float = 5.0,
                 timeout: float = 0.5, clock: Callable[[], float] = time.monotonic):
        from exporter.attribution import cri_api_pb2 as api

        request = api.ListContainersRequest(filter=api.ContainerFilter(
            state=api.ContainerStateValue(state=api.CONTAINER_RUNNING)))
        super().__init__(socket, LIST_CONTAINERS, request, api.ListContainersResponse, interval, timeout)
        self.index = index
        self.min_refresh = min_refresh
        self._clock = clock
        self._last_attempt: float | None = None
        self._asked: frozenset[str] = frozenset()
        self._pods = 0
        self.quiet = False  # log failures at debug only (while probing an auto-detected socket)

    def before_call(self) -> None:
        self._last_attempt = self._clock()

    def listed(self, response: Any) -> bool:
        """Put the running containers' pods into the index; True when it changed."""
        pods = pods_from_containers(response.containers)
        self._pods = len(pods)
        return self.index.replace_fallback(pods)

    def recovered(self) -> None:
        log.info("CRI socket %s answers again (%d pod(s))", self.socket, self._pods)

    def failed(self, first: bool) -> None:
        if self.last_code == "UNIMPLEMENTED":
            self.last_error += " (the socket serves no CRI RuntimeService: is it the runtime's CRI endpoint?)"
        self._report(logging.WARNING if first and not self.quiet else logging.DEBUG)

    def _report(self, level: int) -> None:
        log.log(level, "listing containers over the CRI socket %s failed (%s: %s); pods the API has not named "
                "keep their pod UID only", self.socket, self.last_code, self.last_error)

    def missing(self, container_ids: Iterable[str]) -> bool:
        """Called by the resolver with the container ids a pass could not name.

        Lists at once when one of them was not asked about before and the last listing is
        at least ``min_refresh`` seconds old; True when the index changed (names now known).
        Ids still unknown after a listing wait for the background cadence.
        """
        ids = frozenset(container_ids)
        new = ids - self._asked
        self._asked = ids  # forget ids no longer met, so the set stays small
        if not new:
            return False
        last = self._last_attempt
        if last is not None and self._clock() - last < self.min_refresh:
            self._asked = self._asked - new  # not asked yet: ask on a later pass
            return False
        return self.refresh()

def build(socket: str, index: PodIndex, detected: bool = False, **kwargs: Any) -> CriPodSource | None:
    """A `CriPodSource` that has asked the runtime once (so the first pass has names).

    That first call, before any pass, has a longer deadline (`STARTUP_TIMEOUT`).

    Returns None when ``grpcio``/``protobuf`` is not installed (with one warning), or when
    an auto-``detected`` socket serves no CRI (Docker's containerd has its CRI plugin off:
    UNIMPLEMENTED), which is no fault of the node. A socket given by path that fails is
    kept, reported unhealthy, and asked again on the cadence.
    """
    try:
        source = CriPodSource(socket, index, **kwargs)
    except ImportError as exc:
        log.warning("pod names from the container runtime are off: %s is not installed "
                    "(pip install '.[k8s]' in l9gpu's checkout)", exc.name or "grpcio")
        return None
    source.quiet = detected
    source.refresh(timeout=max(source.timeout, STARTUP_TIMEOUT))
    source.quiet = False
    if detected and source.last_code == "UNIMPLEMENTED":
        log.info("%s serves no CRI RuntimeService: pod names from the container runtime are off", source.socket)
        source.stop()
        return None
    if not source.healthy() and detected:  # the quiet probe's failure, said once after all
        source._report(logging.WARNING)
    return source
