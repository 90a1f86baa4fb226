"""A small Kubernetes API server for tests: the pod list and the chunked pod watch.

It speaks what the real server speaks on ``GET /api/v1/pods``: a ``PodList`` with a
``resourceVersion`` for a list, and for ``watch=true`` a chunked stream of JSON events
(ADDED, MODIFIED, DELETED, BOOKMARK, ERROR) after the requested resourceVersion,
honouring ``fieldSelector=spec.nodeName=<node>`` and ``timeoutSeconds``. Tests drive it:
``add``/``modify``/``delete`` pods, ``expire()`` (the next resumed watch gets an ERROR
event with code 410 Gone, as after etcd compaction), ``drop_watches()`` (open streams
are cut mid-stream), ``stop()``/``start()`` (the server is down: every open connection,
idle keep-alive ones included, is closed and new ones are refused, then it is back on the
same port), and ``stall()``/``resume()`` (the server hangs: it keeps accepting
connections but sends nothing more on any of them, as behind a partition or a stuck
proxy, until it resumes; ``stall(streams=False)`` holds only new requests, so open
watches still end on time and the next one gets no answer), and ``garble(body)``
(every pod list is answered ``200 OK`` with ``body`` instead of the PodList, as a broken
server or proxy might; ``garble(None)`` answers properly again).

It also takes core v1 Events as the real server does: ``POST`` (a name that is not a DNS
subdomain is answered 422 Invalid, as the API server validates it) and ``PATCH`` (a merge
patch) on ``/api/v1/namespaces/{ns}/events[/{name}]``, kept in ``core_events`` by
(namespace, name), every request logged in ``event_requests``. ``refuse_events(code)``
answers each of them with that status (403 Forbidden, 429 Too Many Requests or 503 with a
Retry-After) until ``refuse_events(None)``; ``hold_events(gate)`` holds each until the
test sets the ``threading.Event`` (a slow server).

And Nodes (``add_node``): ``GET /api/v1/nodes[/{name}]``, a strategic-merge ``PATCH`` of
``/api/v1/nodes/{name}/status`` (conditions merge by ``type``, as the real server merges
them) and a ``PATCH`` of ``/api/v1/nodes/{name}`` (a ``metadata.resourceVersion`` in the
patch that is not the node's is answered 409 Conflict); each logged in ``node_requests``;
``refuse_nodes(code, what)`` answers one kind of them with that status. With the discovery
documents and the events list it serves, ``kubectl describe node`` works against it.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


def make_pod(name: str, namespace: str, uid: str, node: str, containers: dict[str, str] | None = None,
             labels: dict[str, str] | None = None, owner: tuple[str, str] | None = None,
             init_containers: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod as the API returns it; ``containers`` maps name -> 64-hex container id."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "labels": dict(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                    "uid": "00000000-0000-0000-0000-000000000001", "controller": True}]
    containers = containers or {}
    init_containers = init_containers or {}
    return {
        "kind": "Pod", "apiVersion": "v1", "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": n, "image": "busybox"} for n in containers],
                 "initContainers": [{"name": n, "image": "busybox"} for n in init_containers]},
        "status": {"phase": "Running",
                   "containerStatuses": [{"name": n, "containerID": f"containerd://{cid}", "ready": True,
                                          "restartCount": 0, "image": "busybox", "imageID": ""}
                                         for n, cid in containers.items()],
                   "initContainerStatuses": [{"name": n, "containerID": f"containerd://{cid}", "ready": False,
                                              "restartCount": 0, "image": "busybox", "imageID": ""}
                                             for n, cid in init_containers.items()]},
    }


# The API server's check of an object's name (k8s.io/apimachinery validation.IsDNS1123Subdomain).
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_SUBDOMAIN_ERROR = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                       "'.', and must start and end with an alphanumeric character")


def is_dns_subdomain(name: str) -> bool:
    """Whether the API server takes ``name`` as an object's name (an RFC 1123 subdomain)."""
    return len(name) <= 253 and DNS_SUBDOMAIN.fullmatch(name) is not None


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """A JSON merge patch (RFC 7386) of ``target``, in place: what a strategic merge patch
    does to an Event, which has no lists to merge."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


def _merge_by(current: list[dict[str, Any]], patch: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """A strategic merge patch of a list whose items merge by ``key`` (a node's conditions by
    ``type``): items of ``patch`` update or add, the others stay."""
    out = [copy.deepcopy(item) for item in current]
    for item in patch:
        match = next((o for o in out if o.get(key) == item.get(key)), None)
        if match is None:
            out.append(copy.deepcopy(item))
        else:
            _merge(match, item)
    return out


def _field(obj: dict[str, Any], path: str) -> Any:
    """``obj``'s value at a dotted field path (a field selector's), "" where absent."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return value


# What kubectl reads before it asks for a node (the legacy discovery documents).
_DISCOVERY: dict[str, Any] = {
    "/version": {"major": "1", "minor": "31", "gitVersion": "v1.31.0", "platform": "linux/amd64"},
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node",
         "verbs": ["get", "list", "patch"], "shortNames": ["no"]},
        {"name": "nodes/status", "singularName": "", "namespaced": False, "kind": "Node", "verbs": ["get", "patch"]},
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": ["get", "list", "watch"],
         "shortNames": ["po"]},
        {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event",
         "verbs": ["create", "get", "list", "patch"], "shortNames": ["ev"]},
    ]},
}


class _QuietServer(ThreadingHTTPServer):
    """Keeps track of its open connections, so that stopping it closes them all."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self.connections_lock:
            connections = list(self.connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        return None  # clients cut off by stop() or drop_watches() are expected


class FakeApiServer:
    """Serves ``/api/v1/pods`` list and watch on 127.0.0.1 (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._rv = 100
        self._pods: dict[str, dict[str, Any]] = {}
        self._events: list[tuple[int, str, dict[str, Any]]] = []
        self._expired_before = 0
        self._generation = 0  # bumps to cut open watch streams
        self._stalled = False  # set: answer nothing (see stall())
        self._holding = False  # set: answer no new request (see stall(streams=False))
        self.held = 0  # requests that arrived while stalled
        self._garbage: bytes | None = None  # set: the body of every list answer (see garble())
        self.requests: list[tuple[str, dict[str, str]]] = []  # ("list"|"watch", query)
        self.core_events: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> Event
        self.event_requests: list[tuple[str, str, str]] = []  # (method, path, Content-Type)
        self._refuse_events: int | None = None  # set: the status every events request gets
        self._retry_after: str | None = "1"  # the Retry-After of a refused events request
        self._events_gate: threading.Event | None = None  # set: events requests wait on it
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> Node
        self.node_name = ""
        self.node_requests: list[tuple[str, str, str, Any]] = []  # (method, path, Content-Type, JSON body)
        self._refuse_nodes: dict[str, int] = {}  # "get" | "patch" | "patch_status" -> status
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- control -------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = _QuietServer(("127.0.0.1", self.port), self._handler())
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Take the server down: close the listener, then every open connection.

        The listener goes first, so no client can slip in a new request in between, and
        every accepted connection (a watch stream, an idle keep-alive one, one not yet
        read) is shut down: the client sees the server gone at once, as when the real
        one's process dies.
        """
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._cond:
            self._stalled = self._holding = False
            self._generation += 1
            self._cond.notify_all()
        if server is not None:
            server.close_connections()

    def stall(self, streams: bool = True) -> None:
        """Hang: keep every connection open and accept new ones, but send nothing more.

        With ``streams=False`` open watch streams go on (and end on time); only new
        requests get no answer.
        """
        with self._cond:
            self._holding = True
            self._stalled = streams
            self._cond.notify_all()

    def resume(self) -> None:
        """Answer again after `stall` (held requests are answered, streams go on)."""
        with self._cond:
            self._stalled = self._holding = False
            self._cond.notify_all()

    def garble(self, body: bytes | str | None) -> None:
        """Answer every pod list ``200 OK`` with ``body`` (None: the real PodList again)."""
        with self._cond:
            self._garbage = body.encode() if isinstance(body, str) else body

    def refuse_events(self, code: int | None, retry_after: str | None = "1") -> None:
        """Answer every events request with ``code`` (403, 429, 500...); None: take them.
        A 429 or 503 carries ``retry_after`` as its Retry-After header (None: none)."""
        with self._cond:
            self._refuse_events = code
            self._retry_after = retry_after

    def add_node(self, name: str, labels: dict[str, str] | None = None,
                 conditions: list[dict[str, Any]] | None = None, taints: list[dict[str, Any]] | None = None) -> None:
        """A Node as the kubelet registers it (its own conditions, e.g. Ready, included)."""
        with self._cond:
            self._rv += 1
            self.node_name = name
            self.nodes[name] = {
                "kind": "Node", "apiVersion": "v1",
                "metadata": {"name": name, "uid": f"node-uid-{name}", "resourceVersion": str(self._rv),
                             "creationTimestamp": "2026-01-01T00:00:00Z", "labels": dict(labels or {})},
                "spec": {"taints": list(taints or [])},
                "status": {"conditions": list(conditions or []),
                           "nodeInfo": {"kubeletVersion": "v1.31.0", "osImage": "Debian GNU/Linux 12",
                                        "kernelVersion": "6.1.0", "containerRuntimeVersion": "containerd://1.7.0",
                                        "architecture": "amd64", "operatingSystem": "linux", "machineID": "",
                                        "systemUUID": "", "bootID": "", "kubeProxyVersion": ""}},
            }

    def node(self, name: str) -> dict[str, Any]:
        """A copy of the Node as the server holds it now."""
        with self._cond:
            return copy.deepcopy(self.nodes[name])

    def refuse_nodes(self, code: int | None, what: str = "patch_status") -> None:
        """Answer node requests of kind ``what`` (get, patch, patch_status) with ``code``; None: take them."""
        with self._cond:
            if code is None:
                self._refuse_nodes.pop(what, None)
            else:
                self._refuse_nodes[what] = code

    def hold_events(self, gate: threading.Event | None) -> None:
        """Hold every events request until ``gate`` is set (None: answer at once)."""
        with self._cond:
            self._events_gate = gate

    def _wait_while_stalled(self, new_request: bool = False) -> None:
        """Block (under ``_cond``) while stalled; returns early when stopped."""
        generation = self._generation
        while (self._stalled or (new_request and self._holding)) and self._generation == generation:
            self._cond.wait(0.2)

    def _bump(self, kind: str, pod: dict[str, Any]) -> None:
        self._rv += 1
        pod = copy.deepcopy(pod)
        pod["metadata"]["resourceVersion"] = str(self._rv)
        if kind == "DELETED":
            self._pods.pop(pod["metadata"]["uid"], None)
        else:
            self._pods[pod["metadata"]["uid"]] = pod
        self._events.append((self._rv, kind, pod))
        self._cond.notify_all()

    def add(self, pod: dict[str, Any]) -> None:
        with self._cond:
            self._bump("ADDED", pod)

    def modify(self, pod: dict[str, Any]) -> None:
        with self._cond:
            self._bump("MODIFIED", pod)

    def delete(self, uid: str) -> None:
        with self._cond:
            self._bump("DELETED", self._pods[uid])

    def send_event(self, kind: str, obj: dict[str, Any]) -> None:
        """Stream a watch event as given (any ``type``, an object without a UID) to the
        watches of ``obj``'s node, without changing the pods listed."""
        with self._cond:
            self._rv += 1
            obj = copy.deepcopy(obj)
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            self._events.append((self._rv, kind, obj))
            self._cond.notify_all()

    def expire(self) -> None:
        """Compact history: a watch resuming from any version seen so far gets 410 Gone."""
        with self._cond:
            self._expired_before = self._rv + 1
            self._generation += 1
            self._cond.notify_all()

    def drop_watches(self) -> None:
        """Cut every open watch stream mid-chunk (a dropped connection)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.requests if k == kind)

    # ---- HTTP ----------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                return None

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                with api._cond:
                    if api._stalled or api._holding:
                        api.held += 1
                    api._wait_while_stalled(new_request=True)
                url = urlparse(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                if url.path != "/api/v1/pods":
                    self._other_get(url.path, query)
                    return
                selector = query.get("fieldSelector", "")
                node = selector.split("=", 1)[1] if selector.startswith("spec.nodeName=") else None
                if query.get("watch") in ("true", "1"):
                    api.requests.append(("watch", query))
                    self._watch(node, int(query.get("resourceVersion") or 0), float(query.get("timeoutSeconds", 300)))
                else:
                    api.requests.append(("list", query))
                    if api._garbage is not None:
                        self._raw(200, api._garbage)
                        return
                    with api._cond:
                        items = [p for p in api._pods.values() if node is None or p["spec"]["nodeName"] == node]
                        body = {"kind": "PodList", "apiVersion": "v1",
                                "metadata": {"resourceVersion": str(api._rv)}, "items": items}
                    self._json(200, body)

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                self._event_request("POST")

            def do_PATCH(self) -> None:  # noqa: N802 - http.server's naming
                if self.path.startswith("/api/v1/nodes/"):
                    self._node_patch()
                    return
                self._event_request("PATCH")

            # ---- nodes, and what kubectl asks first ---------------------------------------

            def _other_get(self, path: str, query: dict[str, str]) -> None:
                discovery = _DISCOVERY.get(path)
                if discovery is not None:
                    self._json(200, discovery)
                elif path == "/api/v1/nodes":
                    with api._cond:
                        items = [copy.deepcopy(n) for n in api.nodes.values()]
                    self._json(200, {"kind": "NodeList", "apiVersion": "v1",
                                     "metadata": {"resourceVersion": str(api._rv)}, "items": items})
                elif path.startswith("/api/v1/nodes/"):
                    name = path.removeprefix("/api/v1/nodes/")
                    api.node_requests.append(("GET", path, "", None))
                    refusal = api._refuse_nodes.get("get")
                    if refusal is not None:
                        self._node_refusal(refusal, "get", "nodes")
                        return
                    with api._cond:
                        node = copy.deepcopy(api.nodes.get(name))
                    if node is None:
                        self._status(404, "NotFound", f'nodes "{name}" not found')
                    else:
                        self._json(200, node)
                elif path == "/api/v1/events" or (path.startswith("/api/v1/namespaces/") and path.endswith("/events")):
                    wanted = dict(term.split("=", 1) for term in query.get("fieldSelector", "").split(",")
                                  if "=" in term and "!=" not in term)
                    with api._cond:
                        items = [copy.deepcopy(e) for e in api.core_events.values()
                                 if all(str(_field(e, k)) == v for k, v in wanted.items())]
                    self._json(200, {"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                                     "items": items})
                else:
                    self._status(404, "NotFound", f"the server could not find the requested resource ({path})")

            def _node_patch(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = urlparse(self.path).path
                content_type = self.headers.get("Content-Type", "")
                parts = path.strip("/").split("/")  # api v1 nodes <name> [status]
                try:
                    patch = json.loads(body)
                except ValueError:
                    patch = None
                api.node_requests.append(("PATCH", path, content_type, patch))
                if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "status"):
                    self._status(404, "NotFound", f"the server could not find the requested resource ({path})")
                    return
                what = "patch_status" if len(parts) == 5 else "patch"
                refusal = api._refuse_nodes.get(what)
                if refusal is not None:
                    self._node_refusal(refusal, "patch", "nodes/status" if what == "patch_status" else "nodes")
                    return
                if not isinstance(patch, dict):
                    self._status(400, "BadRequest", "the body of the request was not a JSON object")
                    return
                if content_type.split(";")[0] not in ("application/strategic-merge-patch+json",
                                                      "application/merge-patch+json"):
                    self._status(415, "UnsupportedMediaType", f"the body of the request was in an unknown format "
                                 f"({content_type})")
                    return
                strategic = content_type.startswith("application/strategic-merge-patch+json")
                with api._cond:
                    node = api.nodes.get(parts[3])
                    if node is None:
                        self._status(404, "NotFound", f'nodes "{parts[3]}" not found')
                        return
                    version = (patch.get("metadata") or {}).get("resourceVersion")
                    if version is not None and version != node["metadata"]["resourceVersion"]:
                        self._status(409, "Conflict", f'Operation cannot be fulfilled on nodes "{parts[3]}": the '
                                     "object has been modified; please apply your changes to the latest version "
                                     "and try again")
                        return
                    patch = copy.deepcopy(patch)
                    (patch.get("metadata") or {}).pop("resourceVersion", None)
                    if len(parts) == 5:  # the status subresource changes only the status
                        patch = {"status": patch.get("status") or {}}
                    else:
                        patch.pop("status", None)
                    conditions = (patch.get("status") or {}).pop("conditions", None)
                    _merge(node, patch)
                    if conditions is not None:
                        node.setdefault("status", {})["conditions"] = (
                            _merge_by(node["status"].get("conditions") or [], conditions, "type") if strategic
                            else conditions)
                    api._rv += 1
                    node["metadata"]["resourceVersion"] = str(api._rv)
                    answer = copy.deepcopy(node)
                self._json(200, answer)

            def _node_refusal(self, code: int, verb: str, resource: str) -> None:
                if code == 403:
                    self._status(403, "Forbidden", f'{resource} "{api.node_name}" is forbidden: User '
                                 f'"system:serviceaccount:l9gpu:l9gpu" cannot {verb} resource "{resource.split("/")[0]}"'
                                 f'{" (subresource status)" if "/" in resource else ""} in API group "" at the '
                                 "cluster scope")
                elif code in (429, 503):
                    self._status(code, "TooManyRequests" if code == 429 else "ServiceUnavailable", "try again later",
                                 headers={"Retry-After": "1"})
                else:
                    self._status(code, "InternalError", "an error on the server has prevented the request")

            def _event_request(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = urlparse(self.path).path
                parts = path.strip("/").split("/")  # api v1 namespaces <ns> events [<name>]
                api.event_requests.append((method, path, self.headers.get("Content-Type", "")))
                gate = api._events_gate
                while gate is not None and not gate.wait(0.2):
                    if api._server is None:  # stopped meanwhile
                        return
                if len(parts) not in (5, 6) or parts[:3] != ["api", "v1", "namespaces"] or parts[4] != "events" \
                        or (method == "POST") != (len(parts) == 5):
                    self._status(404, "NotFound", f"the server could not find the requested resource ({path})")
                    return
                namespace = parts[3]
                refusal = api._refuse_events
                if refusal is not None:
                    self._refusal(refusal, namespace)
                    return
                try:
                    doc = json.loads(body)
                except ValueError:
                    doc = None
                if not isinstance(doc, dict):
                    self._status(400, "BadRequest", "the body of the request was not a JSON object")
                    return
                if method == "POST":
                    self._create_event(namespace, doc)
                else:
                    self._patch_event(namespace, parts[5], doc)

            def _create_event(self, namespace: str, doc: dict[str, Any]) -> None:
                meta = doc.setdefault("metadata", {})
                if meta.get("namespace", namespace) != namespace:
                    self._status(400, "BadRequest",
                                 "the namespace of the provided object does not match the namespace sent on the request")
                    return
                name = meta.get("name", "")
                if not is_dns_subdomain(name):
                    self._status(422, "Invalid", f'Event "{name}" is invalid: metadata.name: Invalid value: '
                                 f'"{name}": {DNS_SUBDOMAIN_ERROR}')
                    return
                with api._cond:
                    if (namespace, name) in api.core_events:
                        self._status(409, "AlreadyExists", f'events "{name}" already exists')
                        return
                    api._rv += 1
                    meta.update(namespace=namespace, uid=f"event-{api._rv}", resourceVersion=str(api._rv),
                                creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
                    api.core_events[(namespace, name)] = doc
                self._json(201, doc)

            def _patch_event(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
                with api._cond:
                    event = api.core_events.get((namespace, name))
                    if event is None:
                        self._status(404, "NotFound", f'events "{name}" not found')
                        return
                    _merge(event, patch)
                    api._rv += 1
                    event["metadata"]["resourceVersion"] = str(api._rv)
                    answer = copy.deepcopy(event)
                self._json(200, answer)

            def _refusal(self, code: int, namespace: str) -> None:
                if code == 403:
                    self._status(403, "Forbidden", 'events is forbidden: User "system:serviceaccount:l9gpu:l9gpu" '
                                 f'cannot create resource "events" in API group "" in the namespace "{namespace}"')
                elif code in (429, 503):
                    retry = {"Retry-After": api._retry_after} if api._retry_after is not None else None
                    if code == 429:
                        self._status(429, "TooManyRequests", "too many requests, please try again later", headers=retry)
                    else:
                        self._status(503, "ServiceUnavailable", "the server is currently unable to handle the request",
                                     headers=retry)
                else:
                    self._status(code, "InternalError", "an error on the server has prevented the request")

            def _status(self, code: int, reason: str, message: str, headers: dict[str, str] | None = None) -> None:
                body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": message, "reason": reason, "code": code}
                self._raw(code, json.dumps(body).encode(), headers)

            def _json(self, code: int, body: Any) -> None:
                self._raw(code, json.dumps(body).encode())

            def _raw(self, code: int, data: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _chunk(self, event: dict[str, Any]) -> None:
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _watch(self, node: str | None, since: int, timeout: float) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                deadline = time.monotonic() + timeout
                with api._cond:
                    generation = api._generation
                    if since and since < api._expired_before:
                        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                  "message": f"too old resource version: {since} ({api._expired_before})",
                                  "reason": "Expired", "code": 410}
                        self._chunk({"type": "ERROR", "object": status})
                        self.wfile.write(b"0\r\n\r\n")
                        return
                    cursor = since
                    while True:
                        api._wait_while_stalled()
                        pending = [(rv, kind, pod) for rv, kind, pod in api._events if rv > cursor]
                        for rv, kind, pod in pending:
                            cursor = rv
                            if node is None or pod["spec"]["nodeName"] == node:
                                self._chunk({"type": kind, "object": pod})
                        if api._generation != generation:
                            # Cut: no terminating chunk, close the socket under the client.
                            self.close_connection = True
                            try:
                                self.connection.shutdown(socket.SHUT_RDWR)
                            except OSError:
                                pass
                            return
                        left = deadline - time.monotonic()
                        if left <= 0:
                            self.wfile.write(b"0\r\n\r\n")
                            return
                        api._cond.wait(min(left, 0.2))

        return Handler
