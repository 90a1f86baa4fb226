"""Pod metadata: owner resolution, container ids, and the list + watch against a local API server."""

from __future__ import annotations

import logging
import time

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")

from fakes.kubernetes_apiserver import FakeApiServer, make_pod  # noqa: E402
from kubernetes import client  # noqa: E402
from waiting import wait_until, within  # noqa: E402

from exporter.attribution.kubernetes import PodIndex, PodWatcher, pod_meta, resolve_owner  # noqa: E402

C1, C2, C3 = "a" * 64, "b" * 64, "c" * 64


@pytest.mark.parametrize("kind,name,labels,expected", [
    ("ReplicaSet", "vllm-6d8b94df7", {"pod-template-hash": "6d8b94df7"}, ("Deployment", "vllm")),
    ("ReplicaSet", "plain-rs", {}, ("ReplicaSet", "plain-rs")),
    ("ReplicaSet", "api-7c9f5b", {"pod-template-hash": "other"}, ("ReplicaSet", "api-7c9f5b")),
    ("StatefulSet", "jupyter-alice", {}, ("StatefulSet", "jupyter-alice")),
    ("DaemonSet", "node-agent", {}, ("DaemonSet", "node-agent")),
    ("Job", "llm-finetune", {}, ("Job", "llm-finetune")),
    ("Job", "nightly-eval-28571520", {}, ("CronJob", "nightly-eval")),
    ("RayCluster", "ray-head", {}, ("RayCluster", "ray-head")),
])
def test_owner_resolution(kind: str, name: str, labels: dict[str, str], expected: tuple[str, str]) -> None:
    assert resolve_owner([{"kind": kind, "name": name, "controller": True}], labels) == expected


def test_owner_prefers_the_controller_reference_and_bare_pods_have_none() -> None:
    refs = [{"kind": "ConfigMap", "name": "x"}, {"kind": "StatefulSet", "name": "db", "controller": True}]
    assert resolve_owner(refs, {}) == ("StatefulSet", "db")
    assert resolve_owner([], {}) == ("", "")


def test_pod_meta_maps_every_container_id_including_init_and_ephemeral() -> None:
    pod = make_pod("p", "ns", "u-1", "n", containers={"main": C1}, init_containers={"setup": C2},
                   labels={"team": "a"})
    pod["status"]["ephemeralContainerStatuses"] = [{"name": "debugger", "containerID": f"cri-o://{C3}"}]
    meta = pod_meta(pod)
    assert meta is not None
    assert meta.containers == {C1: "main", C2: "setup", C3: "debugger"}
    assert meta.labels == (("team", "a"),)


@pytest.mark.parametrize("bad", [None, 3, "x", {}, {"metadata": None}, {"metadata": {"name": "no-uid"}},
                                 {"metadata": {"uid": "u", "labels": "oops", "ownerReferences": "x"},
                                  "status": {"containerStatuses": [None, {"name": 5}]}}])
def test_pod_meta_survives_malformed_objects(bad: object) -> None:
    meta = pod_meta(bad)
    assert meta is None or meta.uid == "u"


def _watcher(server: FakeApiServer, index: PodIndex, node: str = "node-a") -> PodWatcher:
    cfg = client.Configuration()
    cfg.host = server.url
    return PodWatcher(client.ApiClient(cfg), node, index, watch_seconds=5, backoff=(0.05, 0.2))


def test_list_then_watch_only_this_nodes_pods(apiserver: FakeApiServer) -> None:
    apiserver.add(make_pod("mine", "ns", "uid-1", "node-a", {"c": C1}))
    apiserver.add(make_pod("other-node", "ns", "uid-2", "node-b", {"c": C2}))
    index = PodIndex()
    watcher = _watcher(apiserver, index)
    watcher.start()
    try:
        wait_until(lambda: index.get("uid-1") is not None, what="the listed pod in the index")
        assert index.get("uid-2") is None
        assert apiserver.requests[0][1]["fieldSelector"] == "spec.nodeName=node-a"
        apiserver.add(make_pod("new", "ns", "uid-3", "node-a", {"c": C3}, owner=("StatefulSet", "db")))
        wait_until(lambda: index.get("uid-3") is not None, what="the watched ADDED pod in the index")
        assert index.by_container(C3).name == "new" and index.get("uid-3").owner_kind == "StatefulSet"
        apiserver.delete("uid-1")
        wait_until(lambda: index.get("uid-1") is None, what="the DELETED pod gone from the index")
        assert watcher.healthy()
        # The watch resumed from the list's resourceVersion, not from scratch.
        watch_queries = [q for k, q in apiserver.requests if k == "watch"]
        assert watch_queries[0]["resourceVersion"] == "102"
    finally:
        watcher.stop()


def test_410_gone_relists_and_a_dropped_stream_resumes(apiserver: FakeApiServer, caplog) -> None:
    apiserver.add(make_pod("a", "ns", "uid-a", "node-a", {"c": C1}))
    index = PodIndex()
    watcher = _watcher(apiserver, index)
    watcher.start()
    try:
        wait_until(lambda: index.get("uid-a") is not None and apiserver.count("watch") >= 1, what="list, then a watch")
        lists = apiserver.count("list")
        # Dropped connection: resume the watch from the last version, no relist.
        apiserver.drop_watches()
        apiserver.add(make_pod("b", "ns", "uid-b", "node-a", {"c": C2}))
        wait_until(lambda: index.get("uid-b") is not None, what="the pod added after the drop")
        assert apiserver.count("list") == lists
        # History compacted: the resumed watch gets 410 Gone and the watcher lists again.
        with caplog.at_level(logging.INFO, logger="exporter.attribution.kubernetes"):
            apiserver.expire()
            apiserver.add(make_pod("c", "ns", "uid-c", "node-a", {"c": C3}))
            wait_until(lambda: index.get("uid-c") is not None and apiserver.count("list") > lists,
                       what="a relist after 410 Gone")
        assert "410 Gone" in caplog.text
        assert {index.get(u).name for u in ("uid-a", "uid-b", "uid-c")} == {"a", "b", "c"}
    finally:
        watcher.stop()


def test_server_down_keeps_names_and_recovers(apiserver: FakeApiServer) -> None:
    apiserver.add(make_pod("a", "ns", "uid-a", "node-a", {"c": C1}))
    index = PodIndex()
    watcher = _watcher(apiserver, index)
    watcher.start()
    try:
        wait_until(lambda: index.get("uid-a") is not None and watcher.healthy(), what="a healthy watch")
        apiserver.stop()
        wait_until(lambda: not watcher.healthy(), within(watcher.outage_bound), "unhealthy once the server is down")
        assert index.get("uid-a").name == "a"  # what was known stays known
        apiserver.add(make_pod("b", "ns", "uid-b", "node-a", {"c": C2}))  # happens while down
        apiserver.start()
        wait_until(lambda: watcher.healthy() and index.get("uid-b") is not None,
                   within(watcher.outage_bound + watcher.backoff[1]), "healthy again, with the pod added meanwhile")
    finally:
        watcher.stop()


def test_a_server_that_stops_answering_is_noticed_within_the_bound(apiserver: FakeApiServer) -> None:
    """The open watch ends on time, the next request gets no answer: the HTTP client
    would wait out its read timeout several times over (it retries a request that got no
    answer), yet the watcher reports unhealthy within its bound of the last answer."""
    index = PodIndex()
    cfg = client.Configuration()
    cfg.host = apiserver.url
    watcher = PodWatcher(client.ApiClient(cfg), "node-a", index, watch_seconds=1, stall_seconds=3,
                         backoff=(0.05, 0.2))
    watcher.start()
    try:
        wait_until(lambda: watcher.healthy() and apiserver.count("watch") >= 2, what="a healthy watch")
        apiserver.stall(streams=False)
        stalled = time.monotonic()
        wait_until(lambda: not watcher.healthy(), within(watcher.outage_bound), "unhealthy while held")
        # The bound counts from the last answer, at most one watch (1 s) before the stall;
        # 5 s of slack for a busy machine, still far below the 4 x 4 s the client's retries take.
        assert time.monotonic() - stalled < watcher.watch_seconds + watcher.outage_bound + 5.0
        wait_until(lambda: apiserver.held >= 1, what="the request held")
        assert not watcher.healthy()
        apiserver.resume()
        wait_until(watcher.healthy, what="healthy once the server answers")
    finally:
        watcher.stop()


@pytest.mark.parametrize("body,reason", [
    ('{"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": "x"}', "items is a JSON str, not a list"),
    ('{"kind": "PodList", "metadata": {"resourceVersion": "7"}}', "pod list has no items"),
    ('{"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": [1, "p"]}', "2 item(s) that are not objects"),
    ('{"kind": "PodList", "items": []}', "no metadata.resourceVersion"),
    ('{"kind": "Status", "status": "Failure"}', "'Status', not a PodList"),
    ('[{"metadata": {"uid": "u"}}]', "a JSON list, not an object"),
    ("<html>502 Bad Gateway</html>", "not JSON"),
])
def test_a_malformed_pod_list_fails_with_its_reason_and_keeps_the_last_good_names(
        apiserver: FakeApiServer, caplog, body: str, reason: str) -> None:
    """A list answered 200 with something that is not a pod list (from a broken server or
    proxy) does not empty the index: the watcher turns unhealthy (the ``kubernetes``
    collector's success 0), says why, and keeps the names of the last good list."""
    apiserver.add(make_pod("a", "ns", "uid-a", "node-a", {"c": C1}))
    index = PodIndex()
    watcher = _watcher(apiserver, index)
    watcher.start()
    try:
        wait_until(lambda: index.get("uid-a") is not None and watcher.healthy(), what="the first good list")
        lists = apiserver.count("list")
        with caplog.at_level(logging.WARNING, logger="exporter.attribution.kubernetes"):
            apiserver.garble(body)
            apiserver.expire()  # the resumed watch gets 410 Gone: the watcher lists again
            wait_until(lambda: apiserver.count("list") > lists and not watcher.healthy(),
                       what="a failed relist")
            wait_until(lambda: reason in caplog.text, what="the reason in the log")
        assert index.get("uid-a").name == "a" and len(index) == 1
        assert "Traceback" not in caplog.text
        apiserver.garble(None)
        apiserver.add(make_pod("b", "ns", "uid-b", "node-a", {"c": C2}))
        wait_until(lambda: watcher.healthy() and index.get("uid-b") is not None,
                   what="healthy again once the list is good")
    finally:
        watcher.stop()


def test_a_hung_api_server_does_not_hold_up_building_the_attributor(apiserver: FakeApiServer, tmp_path) -> None:
    """The first pod list runs in the watch thread: building the attributor (and so the
    agent's start-up) returns while the API server holds the request unanswered."""
    from cgroup_helpers import kubeconfig

    from exporter.attribution import build_attributor

    apiserver.add(make_pod("a", "ns", "uid-a", "node-a", {"c": C1}))
    apiserver.stall()
    started = time.monotonic()
    attributor = build_attributor(_args(kubernetes="on", kubeconfig=kubeconfig(tmp_path, apiserver)), "node-a")
    # returned before the list could even time out once (it waited out 4 of them: 41 s)
    assert time.monotonic() - started < attributor.pod_source.request_timeout
    try:
        wait_until(lambda: apiserver.held >= 1, what="the first list held by the hung server")
        assert attributor.statuses() == {"kubernetes": False}
        assert attributor.pod_source.index.get("uid-a") is None
        apiserver.resume()
        wait_until(lambda: attributor.pod_source.index.get("uid-a") is not None, what="names once it answers")
        wait_until(lambda: attributor.statuses() == {"kubernetes": True}, what="healthy once it answers")
    finally:
        attributor.close()


def test_forbidden_is_reported_with_the_rbac_hint(caplog) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Forbidden(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return None

        def do_GET(self) -> None:  # noqa: N802
            body = b'{"kind":"Status","code":403,"reason":"Forbidden"}'
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forbidden)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    watcher = PodWatcher(client.ApiClient(cfg), "n", PodIndex(), backoff=(0.05, 0.1))
    try:
        with caplog.at_level(logging.WARNING, logger="exporter.attribution.kubernetes"):
            watcher.start()
            wait_until(lambda: "get, list and watch on pods" in caplog.text, what="the RBAC hint in the log")
        assert not watcher.healthy()
        assert "Traceback" not in caplog.text
    finally:
        watcher.stop()
        server.shutdown()
        server.server_close()


def _args(**kw: object):  # type: ignore[no-untyped-def]
    import argparse

    base = dict(proc_root="/proc", kubernetes="auto", kubeconfig=None, pod_label=[])
    base.update(kw)
    return argparse.Namespace(**base)


def test_auto_outside_a_cluster_is_quietly_off(monkeypatch, caplog) -> None:
    from exporter.attribution import build_attributor

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with caplog.at_level(logging.INFO):
        attributor = build_attributor(_args(), "n")
    assert attributor.pod_source is None and attributor.statuses() == {}
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    attributor.close()


def test_on_without_the_package_or_a_config_is_a_clear_error(monkeypatch) -> None:
    import sys

    from exporter.attribution import build_attributor

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(ValueError, match="not in a cluster"):
        build_attributor(_args(kubernetes="on"), "n")
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if not installed
    with pytest.raises(ValueError, match="needs the kubernetes package"):
        build_attributor(_args(kubernetes="on"), "n")


def test_cli_accepts_the_attribution_flags() -> None:
    from exporter.app.cli import build_parser

    args = build_parser().parse_args(["snapshot", "--kubernetes", "off", "--pod-label", "team",
                                      "--pod-label", "cost-center", "--proc-root", "/host/proc"])
    assert (args.kubernetes, args.pod_label, args.proc_root) == ("off", ["team", "cost-center"], "/host/proc")
