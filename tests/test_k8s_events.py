"""Kubernetes Events on pods, posted to a real HTTP server on loopback (the fake API
server the attribution tests use): the schema, aggregation, refusals, a slow server,
the per-pod rate limit."""

from __future__ import annotations

import functools
import logging
import re
import threading
from datetime import datetime
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate checks posted Events")

from cgroup_helpers import kubeconfig  # noqa: E402
from fakes.kubernetes_apiserver import FakeApiServer, is_dns_subdomain  # noqa: E402
from waiting import PATIENCE, FakeClock, wait_until  # noqa: E402

from exporter.incidents.events import EventSink, PodEvent, default_api_factory, event_name  # noqa: E402

NODE = "gpu-node-7"
UID = "6f1c2a4e-0000-4000-8000-000000000001"
FAULT = PodEvent("ml", "trainer-0", UID, "GPUFaultAffected",
                 "GPU 3 (GPU-1b84..., node gpu-node-7) raised Xid 79 (fell off the bus; action: reboot node) "
                 "while this container held it")
KUBERNETES_VERSIONS = ("1.25", kubernetes_validate.latest_version())


@pytest.fixture
def sinks():
    made: list[EventSink] = []
    yield made
    for sink in made:
        sink.close(timeout=5.0)


def _sink(sinks: list[EventSink], server: FakeApiServer, tmp_path: Path, **kw) -> EventSink:
    sink = EventSink(functools.partial(default_api_factory, kubeconfig(tmp_path, server)), NODE, **kw)
    sinks.append(sink)
    return sink


def _settled(sink: EventSink, outcome: str, n: int) -> dict[str, int]:
    return wait_until(lambda: sink.counts()[outcome] >= n and sink.counts(), what=f"{n} event(s) {outcome}")


def test_a_posted_event_validates_against_the_kubernetes_schema(apiserver, tmp_path, sinks) -> None:
    sink = _sink(sinks, apiserver, tmp_path)
    sink.submit(FAULT)
    _settled(sink, "posted", 1)
    ((key, event),) = apiserver.core_events.items()
    assert key == ("ml", event["metadata"]["name"])
    assert re.fullmatch(r"trainer-0\.[0-9a-f]+", event["metadata"]["name"])
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(event, version, strict=True)
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "trainer-0", "namespace": "ml",
                                       "uid": UID}
    assert (event["type"], event["reason"], event["message"]) == ("Warning", FAULT.reason, FAULT.message)
    assert event["source"] == {"component": "l9gpu", "host": NODE}
    assert (event["reportingComponent"], event["reportingInstance"]) == ("l9gpu", NODE)
    assert event["count"] == 1 and event["firstTimestamp"] == event["lastTimestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|\+00:00)", event["firstTimestamp"])  # RFC 3339, UTC
    assert sink.counts() == {"posted": 1, "aggregated": 0, "amended": 0, "rate_limited": 0, "queue_full": 0, "forbidden": 0,
                             "throttled": 0, "failed": 0}


def test_repeats_patch_one_event_as_the_kubelet_aggregates(apiserver, tmp_path, sinks) -> None:
    sink = _sink(sinks, apiserver, tmp_path)
    for _ in range(3):
        sink.submit(FAULT)
    counts = _settled(sink, "aggregated", 2)
    assert (counts["posted"], counts["aggregated"]) == (1, 2)
    ((_, event),) = apiserver.core_events.items()
    assert event["count"] == 3
    assert datetime.fromisoformat(event["lastTimestamp"]) >= datetime.fromisoformat(event["firstTimestamp"])
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(event, version, strict=True)
    methods = [(m, ct) for m, _, ct in apiserver.event_requests]
    assert methods[0][0] == "POST"
    assert methods[1:] == [("PATCH", "application/strategic-merge-patch+json")] * 2
    # Another message on the same pod is another Event.
    sink.submit(PodEvent("ml", "trainer-0", UID, "GPUFaultAffected", "another fault"))
    _settled(sink, "posted", 2)
    assert len(apiserver.core_events) == 2


def test_a_repeat_after_ten_minutes_is_a_new_event(apiserver, tmp_path, sinks) -> None:
    clock = FakeClock()
    sink = _sink(sinks, apiserver, tmp_path, clock=clock, burst=10)
    sink.submit(FAULT)
    _settled(sink, "posted", 1)
    clock.now += 601
    sink.submit(FAULT)
    _settled(sink, "posted", 2)
    assert sorted(e["count"] for e in apiserver.core_events.values()) == [1, 1]


def test_a_403_is_counted_forbidden_and_logged_once(apiserver, tmp_path, sinks, caplog) -> None:
    apiserver.refuse_events(403)
    sink = _sink(sinks, apiserver, tmp_path)
    with caplog.at_level(logging.WARNING, logger="exporter.incidents.events"):
        sink.submit(FAULT)
        sink.submit(PodEvent("ml", "trainer-0", UID, "GPUFaultCaused", "second"))
        counts = _settled(sink, "forbidden", 2)
    assert counts["posted"] == 0 and counts["failed"] == 0
    lines = [r for r in caplog.records if r.name == "exporter.incidents.events"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    message = lines[0].getMessage()
    assert "403" in message and "create and patch on events" in message and "\n" not in message
    assert lines[0].exc_info is None
    assert apiserver.core_events == {}


def test_a_429_is_counted_throttled_and_posting_resumes(apiserver, tmp_path, sinks, caplog) -> None:
    apiserver.refuse_events(429)
    sink = _sink(sinks, apiserver, tmp_path)
    with caplog.at_level(logging.WARNING, logger="exporter.incidents.events"):
        sink.submit(FAULT)
        _settled(sink, "throttled", 1)
    assert "429" in caplog.text and "Traceback" not in caplog.text
    apiserver.refuse_events(None)
    sink.submit(FAULT)
    counts = _settled(sink, "posted", 1)
    assert counts["throttled"] == 1 and len(apiserver.core_events) == 1


def test_a_slow_server_does_not_delay_submit(apiserver, tmp_path, sinks) -> None:
    gate = threading.Event()
    safety = threading.Timer(PATIENCE, gate.set)  # a submit that blocks fails below instead of hanging
    safety.start()
    apiserver.hold_events(gate)
    try:
        sink = _sink(sinks, apiserver, tmp_path, queue_size=4)
        sink.submit(PodEvent("ml", "pod-0", "uid-0", "GPUFaultAffected", "first"))
        wait_until(lambda: apiserver.event_requests, what="the first request held by the server")
        for i in range(1, 7):  # 4 fit the queue, 2 do not
            sink.submit(PodEvent("ml", f"pod-{i}", f"uid-{i}", "GPUFaultAffected", f"event {i}"))
        assert not gate.is_set(), "submit() waited on the API server"
        assert sink.counts()["queue_full"] == 2
        assert len(apiserver.event_requests) == 1 and sink.counts()["posted"] == 0
        assert sink.close(timeout=0.2) is False  # a request still held: close does not hang
    finally:
        gate.set()
        safety.cancel()
    counts = _settled(sink, "posted", 5)
    assert counts["queue_full"] == 2 and len(apiserver.core_events) == 5
    assert sink.close(timeout=PATIENCE) is True


def test_the_per_pod_rate_limit_drops_past_the_burst(apiserver, tmp_path, sinks) -> None:
    clock = FakeClock()
    sink = _sink(sinks, apiserver, tmp_path, clock=clock, burst=5, per_minute=1.0)
    for i in range(7):
        sink.submit(PodEvent("ml", "trainer-0", UID, "GPUFaultCaused", f"fault {i}"))
    sink.submit(PodEvent("ml", "other-0", "uid-other", "GPUFaultCaused", "another pod has its own bucket"))
    counts = wait_until(lambda: sum(sink.counts().values()) >= 8 and sink.counts(), what="8 events handled")
    assert (counts["posted"], counts["rate_limited"]) == (6, 2)
    clock.now += 60  # one more token a minute
    sink.submit(PodEvent("ml", "trainer-0", UID, "GPUFaultCaused", "a minute later"))
    sink.submit(PodEvent("ml", "trainer-0", UID, "GPUFaultCaused", "too soon again"))
    counts = wait_until(lambda: sum(sink.counts().values()) >= 10 and sink.counts(), what="10 events handled")
    assert (counts["posted"], counts["rate_limited"]) == (7, 3)


def test_an_unreachable_server_counts_failed(apiserver, tmp_path, sinks, caplog) -> None:
    sink = _sink(sinks, apiserver, tmp_path, request_timeout=(2.0, 2.0))
    apiserver.stop()
    with caplog.at_level(logging.WARNING, logger="exporter.incidents.events"):
        sink.submit(FAULT)
        sink.submit(FAULT)
        _settled(sink, "failed", 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "exporter.incidents.events"]
    assert len(lines) == 1 and "did not take them" in lines[0]


def test_no_client_configuration_is_counted_failed_with_the_reason(sinks, caplog, monkeypatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    sink = EventSink(default_api_factory, NODE)
    sinks.append(sink)
    with caplog.at_level(logging.WARNING, logger="exporter.incidents.events"):
        sink.submit(FAULT)
        _settled(sink, "failed", 1)
    assert "not in a cluster" in caplog.text and "Traceback" not in caplog.text


def test_close_returns_and_later_submits_are_ignored(apiserver, tmp_path) -> None:
    sink = EventSink(functools.partial(default_api_factory, kubeconfig(tmp_path, apiserver)), NODE)
    sink.submit(FAULT)
    assert sink.close(timeout=PATIENCE) is True
    assert sink.counts()["posted"] == 1  # what was queued was posted first
    sink.submit(FAULT)
    assert sum(sink.counts().values()) == 1


def _legal_pod_names() -> list[str]:
    """Pod names the API server takes, built to leave '-' or '.' wherever an Event name's
    cut may fall: 253 characters with dashes and dots in every position near the end, and
    shorter ones."""
    names = ["a" * 253, "trainer-0", "a.b-c", "x"]
    for mark in "-.":
        for at in range(200, 252):
            name = list("a" * 253)
            name[at] = mark
            names.append("".join(name))
        # dashes and dots all along (legal: each label starts and ends alphanumeric)
        names.append(("ab" + mark) * 84 + "a")
    names.append(("a-" * 126) + "a")
    names.append(("a--.b" * 50) + "abc")
    return [n for n in names if is_dns_subdomain(n)]


@pytest.mark.parametrize("nanos", [0, 1, 1_780_000_000_000_000_000, 2**64 - 1])
def test_event_names_are_dns_subdomains_for_every_legal_pod_name(nanos) -> None:
    pods = _legal_pod_names()
    assert len(pods) > 100 and any(len(p) == 253 for p in pods)
    for pod in pods:
        name = event_name(pod, nanos)
        assert is_dns_subdomain(name), (pod, name)
        assert name.endswith(f".{nanos:x}")
        prefix = name[: -len(f".{nanos:x}")]
        assert pod.startswith(prefix)  # the pod's own name, cut at most
        if len(pod) + 1 + len(f"{nanos:x}") <= 253:
            assert prefix == pod
    for odd in ("Trainer_0", "--x--", "...", "", "é" * 300):  # not pod names: still a valid name
        assert is_dns_subdomain(event_name(odd, nanos)), odd


def test_a_253_character_pod_gets_its_event(apiserver, tmp_path, sinks) -> None:
    """The API server (here its fake, which checks names as the real one) takes the Event of
    a pod whose 253-character name has a dash right where the old cut fell."""
    pod = "a" * 235 + "-" + "b" * 16 + "c"
    assert len(pod) == 253 and is_dns_subdomain(pod)
    sink = _sink(sinks, apiserver, tmp_path)
    sink.submit(PodEvent("ml", pod, UID, "GPUFaultCaused", "a fault"))
    _settled(sink, "posted", 1)
    ((_, event),) = apiserver.core_events.items()
    assert is_dns_subdomain(event["metadata"]["name"]) and event["involvedObject"]["name"] == pod
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(event, version, strict=True)


def test_the_fake_api_server_refuses_what_the_real_one_refuses(apiserver, tmp_path) -> None:
    """The name check above is the API server's: a name ending in '-' is answered 422."""
    from kubernetes.client.exceptions import ApiException

    api = default_api_factory(kubeconfig(tmp_path, apiserver))
    body = {"metadata": {"name": "trainer-", "namespace": "ml"}, "involvedObject": {"kind": "Pod", "name": "x"}}
    with pytest.raises(ApiException) as refused:
        api.create_namespaced_event("ml", body)
    assert refused.value.status == 422 and "RFC 1123" in refused.value.body


class _Pauses:
    """The sink's ``sleep``: records each pause and holds the thread until released."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.release = threading.Event()

    def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        self.release.wait(PATIENCE)


@pytest.mark.parametrize(("code", "header", "pause"), [(429, "7", 7.0), (503, "3", 3.0), (429, "86400", 60.0),
                                                        (429, None, 1.0)])
def test_retry_after_pauses_posting_without_delaying_submit(apiserver, tmp_path, sinks, code, header, pause) -> None:
    pauses = _Pauses()
    sink = _sink(sinks, apiserver, tmp_path, sleep=pauses)
    apiserver.refuse_events(code, retry_after=header)
    try:
        sink.submit(FAULT)
        _settled(sink, "throttled", 1)
        apiserver.refuse_events(None)
        sink.submit(PodEvent("ml", "trainer-0", UID, "GPUFaultCaused", "after the pause"))
        wait_until(lambda: pauses.asked, what="the pause the Retry-After asks for")
        assert pauses.asked == [pytest.approx(pause, abs=0.5)]
        # Paused: the second event waits in the thread, submit() did not.
        for i in range(3):
            sink.submit(PodEvent("ml", f"pod-{i}", f"uid-{i}", "GPUFaultCaused", "queued meanwhile"))
        assert len(apiserver.event_requests) == 1 and sink.counts()["posted"] == 0
    finally:
        pauses.release.set()
    counts = _settled(sink, "posted", 4)
    assert counts["throttled"] == 1 and len(apiserver.core_events) == 4
    assert len(pauses.asked) == 1  # one pause, then at the server's pace again


def test_a_500_does_not_pause(apiserver, tmp_path, sinks) -> None:
    pauses = _Pauses()
    pauses.release.set()
    sink = _sink(sinks, apiserver, tmp_path, sleep=pauses)
    apiserver.refuse_events(500)
    sink.submit(FAULT)
    _settled(sink, "failed", 1)
    apiserver.refuse_events(None)
    sink.submit(FAULT)
    _settled(sink, "posted", 1)
    assert pauses.asked == []
