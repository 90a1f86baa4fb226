"""Pod metadata for this node from the Kubernetes API: one list + watch, one index.

The cgroup path gives a process's pod UID and container id; the names operators query
by (namespace, pod, container, the owning Deployment/Job/...) and the pod labels come
from the API server. `PodWatcher` lists the pods of this node only
(``fieldSelector=spec.nodeName=<node>``), then watches from the list's resourceVersion
in its own daemon thread, resuming from the last resourceVersion it saw, relisting on
410 Gone, and backing off exponentially on errors. It fills a `PodIndex` that the
collector thread reads; while the API server is unreachable the index keeps what it
knew, and processes of pods it has never seen keep their pod UID until names arrive.

How soon an outage is noticed is bounded (`PodWatcher.outage_bound`): each watch asks
the server to end it after ``watch_seconds`` (so a healthy stream is never silent for
longer, bookmarks or not), and the stream's read timeout is ``watch_seconds +
stall_seconds``. A server that is gone (connection refused or reset) is noticed at the
next read, at once; one that keeps the connection open and sends nothing (a hung
server, a proxy or a network partition that drops the stream silently) is noticed when
the read timeout expires. TCP keepalive would only catch the second case's dead peer,
not a live one that stops sending, so the read timeout is the mechanism. And whatever
the watch thread waits on (the HTTP client retrying a request that got no answer, a
slow name lookup), `PodWatcher.healthy` also turns False once nothing has been heard
from the server for that long: the bound holds however the thread is held up.

The ``kubernetes`` package is imported only when the watch starts.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, cast

from exporter.attribution import training

if TYPE_CHECKING:
    import urllib3

log = logging.getLogger(__name__)

IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

# Server-side timeout of one watch request, and how much longer its stream may stay
# silent before the agent calls it stuck: together the longest an outage goes unnoticed
# (docs/ATTRIBUTION.md, "How soon an outage shows"). One watch a minute per node is cheap
# (the API server serves it from its watch cache).
WATCH_SECONDS = 60
STALL_SECONDS = 30.0
# Connect timeout of every request to the API server, and read timeout of a list.
REQUEST_TIMEOUT = 10.0

_CRONJOB_JOB = re.compile(r"^(.+)-(\d{8,})$")  # <cronjob>-<scheduled time in minutes>
_GENERATED_SUFFIX = re.compile(r"^(.+)-([a-z0-9]{5,10})$")


@dataclass(frozen=True)
class PodMeta:
    """What the agent keeps about one pod.

    Attributes:
        uid: the pod UID (with dashes).
        name, namespace: the pod's name and namespace.
        owner_kind, owner_name: the top-level controller (Deployment through its
            ReplicaSet, StatefulSet, DaemonSet, Job, CronJob through its Job, or the
            raw kind/name of a custom controller); "" for bare pods.
        labels: the pod's labels, sorted (key, value) pairs.
        containers: container id (64 hex, no ``containerd://`` scheme) -> container
            name, for regular, init and ephemeral containers.
        resource_version: of the object last seen.
        training_job, training_rank: the training job the pod is a rank of and its rank,
            as its scheduler labelled (or annotated) it (`training.from_pod`); "" for
            a pod of no job.
    """

    uid: str
    name: str
    namespace: str
    owner_kind: str = ""
    owner_name: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    containers: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    training_job: str = ""
    training_rank: str = ""


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def container_id(raw: str) -> str:
    """``containerd://<id>`` (or ``cri-o://``, ``docker://``) -> ``<id>``."""
    return raw.split("://", 1)[-1].strip().lower()


def resolve_owner(owner_refs: Iterable[Mapping[str, Any]], labels: Mapping[str, str]) -> tuple[str, str]:
    """The pod's top-level controller as (kind, name), from its ownerReferences.

    A ReplicaSet whose name ends in the pod's ``pod-template-hash`` belongs to a
    Deployment (the name without the hash); a Job whose name ends in a scheduled time
    (``<name>-<minutes since epoch>``) belongs to a CronJob. Other controllers are
    reported as they are.
    """
    refs = [r for r in owner_refs if isinstance(r, Mapping)]
    if not refs:
        return "", ""
    ref = next((r for r in refs if r.get("controller") is True), refs[0])
    kind, name = _str(ref.get("kind")), _str(ref.get("name"))
    if kind == "ReplicaSet":
        template_hash = _str(labels.get("pod-template-hash"))
        if template_hash and name.endswith("-" + template_hash):
            return "Deployment", name[: -len(template_hash) - 1]
        match = _GENERATED_SUFFIX.match(name)
        if not template_hash and match:  # label stripped by a mutating hook: best guess
            return "Deployment", match.group(1)
        return kind, name
    if kind == "Job":
        match = _CRONJOB_JOB.match(name)
        if match:
            return "CronJob", match.group(1)
    return kind, name


def pod_meta(obj: Any) -> PodMeta | None:
    """A `PodMeta` from a pod as the API returns it (JSON dict); None when unusable."""
    pod = _dict(obj)
    meta = _dict(pod.get("metadata"))
    uid = _str(meta.get("uid"))
    if not uid:
        return None
    labels = {str(k): str(v) for k, v in _dict(meta.get("labels")).items()}
    training_job, training_rank = training.from_pod(labels, _dict(meta.get("annotations")))
    owner_kind, owner_name = resolve_owner(_list(meta.get("ownerReferences")), labels)
    status = _dict(pod.get("status"))
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in _list(status.get(key)):
            cs = _dict(cs)
            cid, name = container_id(_str(cs.get("containerID"))), _str(cs.get("name"))
            if cid and name:
                containers[cid] = name
            # A restarted container's previous id may still hold the GPU while it exits.
            last = _dict(_dict(cs.get("lastState")).get("terminated"))
            old = container_id(_str(last.get("containerID")))
            if old and name:
                containers.setdefault(old, name)
    return PodMeta(uid=uid, name=_str(meta.get("name")), namespace=_str(meta.get("namespace")),
                   owner_kind=owner_kind, owner_name=owner_name, labels=tuple(sorted(labels.items())),
                   containers=containers, resource_version=_str(meta.get("resourceVersion")),
                   training_job=training_job, training_rank=training_rank)


def parse_pod_list(data: bytes | str) -> tuple[list[PodMeta], int, str]:
    """The pods of a ``PodList`` answer, how many were skipped (no UID), its resourceVersion.

    An answer that is not a pod list (not JSON, not an object, another ``kind``, ``items``
    missing or not a list of objects, no ``metadata.resourceVersion`` to watch from) is
    refused as a whole, so that a broken proxy or server cannot empty the pod index.

    Raises:
        ValueError: one line saying what is wrong.
    """
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"pod list is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError(f"pod list is a JSON {type(body).__name__}, not an object")
    kind = body.get("kind")
    if kind is not None and kind != "PodList":
        raise ValueError(f"pod list answer is a {str(kind)[:40]!r}, not a PodList")
    if "items" not in body:
        raise ValueError("pod list has no items")
    items = body["items"]
    if items is None:  # Go encodes an empty list as null
        items = []
    if not isinstance(items, list):
        raise ValueError(f"pod list items is a JSON {type(items).__name__}, not a list")
    bad = sum(1 for item in items if not isinstance(item, dict))
    if bad:
        raise ValueError(f"pod list has {bad} item(s) that are not objects")
    version = _str(_dict(body.get("metadata")).get("resourceVersion"))
    if not version:
        raise ValueError("pod list has no metadata.resourceVersion to watch from")
    pods = [p for p in (pod_meta(item) for item in items) if p is not None]
    return pods, len(items) - len(pods), version


class PodIndex:
    """Pod UID -> `PodMeta`, written by a pod source, read by the collector thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PodMeta] = {}
        # Pods from a fallback source (the container runtime's CRI socket), used only where
        # the API has not provided the pod; `_merged` is what readers see.
        self._fallback: dict[str, PodMeta] = {}
        self._merged: dict[str, PodMeta] = {}
        self._by_container: dict[str, PodMeta] = {}
        self._by_name: dict[tuple[str, str], PodMeta] = {}
        # Bumped on every change, so readers can cache what they derived from the index.
        self.generation = 0

    def replace(self, pods: Iterable[PodMeta]) -> None:
        """Replace everything (after a list)."""
        table = {p.uid: p for p in pods}
        with self._lock:
            self._pods = table
            self._reindex()

    def upsert(self, pod: PodMeta) -> None:
        with self._lock:
            self._pods = {**self._pods, pod.uid: pod}
            self._reindex()

    def delete(self, uid: str) -> None:
        with self._lock:
            if uid in self._pods:
                pods = dict(self._pods)
                del pods[uid]
                self._pods = pods
                self._reindex()

    def replace_fallback(self, pods: Iterable[PodMeta]) -> bool:
        """Replace the fallback source's pods; returns True when that changed anything.

        API data wins: a pod the API has provided keeps its names, owner and labels, and
        only gains the fallback's container names for container ids it does not list yet
        (a container started since the last watch event).
        """
        table = {p.uid: p for p in pods}
        with self._lock:
            if table == self._fallback:
                return False  # unchanged: keep the generation, so readers keep their caches
            self._fallback = table
            self._reindex()
            return True

    def _reindex(self) -> None:
        merged = {**self._fallback, **self._pods}
        for uid, fallback in self._fallback.items():
            pod = self._pods.get(uid)
            if pod is not None and not fallback.containers.keys() <= pod.containers.keys():
                merged[uid] = replace(pod, containers={**fallback.containers, **pod.containers})
        self._merged = merged
        self._by_container = {cid: p for p in merged.values() for cid in p.containers}
        # API pods come after fallback ones in `merged`, so they win a (namespace, name) clash.
        self._by_name = {(p.namespace, p.name): p for p in merged.values() if p.name}
        self.generation += 1

    def get(self, uid: str) -> PodMeta | None:
        return self._merged.get(uid)

    def by_container(self, cid: str) -> PodMeta | None:
        return self._by_container.get(cid)

    def by_name(self, namespace: str, name: str) -> PodMeta | None:
        """The pod named ``namespace/name`` (pod-resources names pods without a UID)."""
        return self._by_name.get((namespace, name))

    def __len__(self) -> int:
        return len(self._pods)


class StaticPodSource:
    """Serves a fixed list of pods (JSON dicts) into an index: the simulated node's API."""

    name = "kubernetes"

    def __init__(self, index: PodIndex, pods: Iterable[Mapping[str, Any]]):
        self.index = index
        self.index.replace(p for p in (pod_meta(d) for d in pods) if p is not None)

    def healthy(self) -> bool:
        return True

    def start(self) -> None:
        return None

    def stop(self) -> None:
        return None


def load_client(kubeconfig: str | None) -> Any:
    """A configured ``kubernetes.client.ApiClient`` (in-cluster, then kubeconfig).

    Raises:
        ImportError: the ``kubernetes`` package is not installed.
        RuntimeError: no usable configuration.
    """
    from kubernetes import client, config  # imported here: optional dependency

    if kubeconfig:
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        return client.ApiClient(cfg)
    try:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except config.ConfigException:
        pass
    path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if path:
        cfg = client.Configuration()
        config.load_kube_config(config_file=path, client_configuration=cfg)
        return client.ApiClient(cfg)
    raise RuntimeError("not in a cluster (no service account token) and neither --kubeconfig nor $KUBECONFIG is set")


def in_cluster() -> bool:
    """True when the agent runs in a pod with a service account (or $KUBECONFIG is set)."""
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(IN_CLUSTER_TOKEN)) or bool(
        os.environ.get("KUBECONFIG"))


class PodWatcher:
    """Keeps a `PodIndex` in step with the pods of one node (list + watch thread).

    Args:
        api_client: a ``kubernetes.client.ApiClient``.
        node: the node name (``spec.nodeName``).
        index: the index to fill.
        watch_seconds: server-side timeout of one watch request; the watch then resumes.
            A healthy server ends the stream by then, so it is the longest a healthy
            stream stays silent.
        stall_seconds: how much longer than ``watch_seconds`` the stream may stay
            silent before it counts as stuck (the read timeout is the sum).
        backoff: (first, max) seconds to wait after an error, doubling in between.
        request_timeout: connect timeout of every request, and read timeout of a list.
        sleep: waits on errors (injectable for tests); returns True when stopping.
        clock: monotonic seconds (injectable for tests).
    """

    name = "kubernetes"

    def __init__(self, api_client: Any, node: str, index: PodIndex, watch_seconds: int = WATCH_SECONDS,
                 backoff: tuple[float, float] = (1.0, 30.0), request_timeout: float = REQUEST_TIMEOUT,
                 sleep: Callable[[float], bool] | None = None, stall_seconds: float = STALL_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        from kubernetes import client

        self.api = client.CoreV1Api(api_client)
        self.api_client = api_client
        self.node = node
        self.index = index
        self.watch_seconds = watch_seconds
        self.stall_seconds = stall_seconds
        self.backoff = backoff
        self.request_timeout = request_timeout
        self.resource_version: str | None = None
        self._healthy = False
        self._clock = clock
        self._heard = clock()  # when the server last answered: a response, an event, a watch's end
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._thread: threading.Thread | None = None
        self._watch: Any = None
        self._failures = 0
        self._first_list = threading.Event()  # set once the first list was answered or failed
        self.relists = 0
        self.events = 0
        self.errors = 0  # failed lists and watches (stuck streams included), since start

    @property
    def selector(self) -> str:
        return f"spec.nodeName={self.node}"

    def healthy(self) -> bool:
        """True while the last list or watch request worked and the server was heard lately.

        "Lately": within ``watch_seconds + stall_seconds``, the longest a healthy server
        stays silent, whatever the watch thread is waiting on meanwhile.
        """
        return self._healthy and self._clock() - self._heard <= self.watch_seconds + self.stall_seconds

    def _answered(self) -> None:
        """The server answered: healthy, and heard now."""
        self._heard = self._clock()
        self._healthy = True

    @property
    def outage_bound(self) -> float:
        """Seconds within which `healthy` turns False once the API server is gone or stuck.

        ``watch_seconds + stall_seconds`` after the server last answered (`healthy` says
        so even while the watch thread still waits on a request); a refused or reset
        connection turns it False at once.
        """
        return self.watch_seconds + self.stall_seconds

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="l9gpu-pod-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    def list_pods(self) -> None:
        """List this node's pods into the index and remember the list's resourceVersion.

        Raises:
            ValueError: the answer is not a pod list (`parse_pod_list`); the index keeps
                the pods of the last good list.
        """
        resp = self.api.list_pod_for_all_namespaces(field_selector=self.selector, _preload_content=False,
                                                    _request_timeout=self.request_timeout)
        raw = cast("urllib3.BaseHTTPResponse", resp)  # _preload_content=False: the raw response
        pods, skipped, version = parse_pod_list(raw.data)
        if skipped:
            log.warning("ignored %d pod(s) without a UID in the pod list", skipped)
        self.index.replace(pods)
        self.resource_version = version
        self.relists += 1
        self._answered()
        log.debug("listed %d pod(s) on node %s at resourceVersion %s", len(pods), self.node, self.resource_version)

    def wait_listed(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first list to be answered or to fail
        (for a one-shot ``l9gpu snapshot``; the agent itself never waits). True when it was."""
        return self._first_list.wait(timeout)

    def watch_once(self) -> None:
        """One watch request from the last resourceVersion, until it ends or fails."""
        from kubernetes import watch

        self._watch = watch.Watch()
        kwargs: dict[str, Any] = dict(field_selector=self.selector, timeout_seconds=self.watch_seconds,
                                      allow_watch_bookmarks=True,
                                      _request_timeout=(self.request_timeout,
                                                        self.watch_seconds + self.stall_seconds))
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        # A wrapper without a return-type docstring: the watch then yields the raw JSON
        # events, so a pod the client's models would reject cannot stall the watch.
        def list_pods(**kw: Any) -> Any:
            response = self.api.list_pod_for_all_namespaces(**kw)
            # The server answered the watch (the client raised on an error status): healthy
            # from here, not from the moment the request was sent, so a server that accepts
            # connections and never answers stays unhealthy.
            if self._failures:
                log.info("pod watch for node %s works again", self.node)
            self._answered()
            self._failures = 0  # a new outage is a first failure again (logged as a warning)
            return response

        for event in self._watch.stream(list_pods, **kwargs):
            if self._stop.is_set():
                break
            self._handle(event)

    def _handle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        raw = _dict(event.get("raw_object"))
        version = _str(_dict(raw.get("metadata")).get("resourceVersion"))
        self._heard = self._clock()
        if kind == "BOOKMARK":
            self.resource_version = version or self.resource_version
            return
        pod = pod_meta(raw)
        if pod is None:
            log.warning("ignored a %s watch event without a pod UID", kind)
            return
        if kind in ("ADDED", "MODIFIED"):
            self.index.upsert(pod)
        elif kind == "DELETED":
            self.index.delete(pod.uid)
        if version:
            self.resource_version = version
        self.events += 1
        self._answered()
        self._failures = 0

    def _run(self) -> None:
        from kubernetes.client.rest import ApiException

        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    try:
                        self.list_pods()
                    finally:
                        self._first_list.set()
                self.watch_once()
                self._heard = self._clock()  # the server ended the watch (on time, or closed it)
                self._failures = 0
                continue  # the watch timed out or the server closed it: resume
            except ApiException as exc:
                if exc.status == 410:
                    log.info("pod watch: resourceVersion %s is too old (410 Gone); listing again",
                             self.resource_version)
                    self.resource_version = None
                    continue
                reason = f"HTTP {exc.status} {exc.reason}"
                if exc.status in (401, 403):
                    reason += " (the agent's service account needs get, list and watch on pods)"
            except Exception as exc:  # noqa: BLE001 - network, protocol or decoding errors
                reason = f"{type(exc).__name__}: {exc}"
            if self._stop.is_set():
                return
            self._healthy = False
            self.errors += 1
            delay = min(self.backoff[1], self.backoff[0] * 2 ** self._failures)
            self._failures += 1
            (log.warning if self._failures == 1 else log.debug)(
                "pod watch for node %s failed (%s); pod names keep their last known values, retrying in %.2gs",
                self.node, reason, delay)
            if self._sleep(delay):
                return


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass (for callers and tests)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()
