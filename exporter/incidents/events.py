"""Kubernetes Events on the pods an incident touched (and on the Node, for its GPUs' health),
posted from a thread of its own.

``kubectl describe pod`` lists a pod's core ``v1`` Events on every Kubernetes version,
so that is what `EventSink` writes: type Warning, the pod as ``involvedObject``, l9gpu
as the source and reporting component, this node as the host and reporting instance.
It behaves towards the API server as the kubelet's event recorder does:

- a repeat (the same pod UID, reason and message) within ten minutes patches the Event
  already posted (``count`` + 1, ``lastTimestamp``) instead of creating another;
- an incident amended (a late kernel-log line told its cause) patches the reason and message
  of the Event each pod already has for it (``amended``), never a second Event;
- each pod has a token bucket (``burst`` events, then ``per_minute``), so a GPU that
  faults every second cannot flood the API server; what it refuses is dropped;
- `EventSink.submit` only puts the event on a bounded queue and returns: a pass never
  waits on the API server, and a full queue drops the event;
- a 429 Too Many Requests or 503 Service Unavailable is counted ``throttled`` and, with a
  ``Retry-After``, pauses posting for that long (at most `MAX_PAUSE` seconds): the thread
  waits, the queue fills meanwhile and what does not fit is dropped, a pass never waits;
- an Event's name is ``<pod>.<hex nanoseconds>`` cut to a valid DNS subdomain (RFC 1123,
  what the API server checks) for every legal pod name, 253 characters long included.

Whatever is dropped or refused is counted by outcome (`EventSink.counts`) and logged once
per outcome every five minutes, a line without a traceback. Posting needs ``create`` and
``patch`` on ``events`` in the pods' namespaces (the chart's ClusterRole).

The ``kubernetes`` package is imported only where the client is built.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import logging
import math
import queue
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger(__name__)

REPORTER = "l9gpu"
# A repeat within this many seconds of the last one is the same Event (the kubelet's
# aggregation interval).
AGGREGATE_SECONDS = 600.0
# One log line per outcome per this many seconds.
LOG_EVERY_SECONDS = 300.0
# Connect and read timeout of one request to the API server.
REQUEST_TIMEOUT = (5.0, 10.0)
# Events the aggregation cache and the pods the rate limiter remember at most.
CACHE_SIZE = 4096
# Longest message posted; the rest is cut (the events.k8s.io/v1 limit on a note).
MAX_MESSAGE = 1024
# Longest pause a Retry-After can impose on posting, in seconds.
MAX_PAUSE = 60.0
# The pause after a 429 that names no Retry-After, in seconds.
DEFAULT_PAUSE = 1.0
# An object name the API server takes (a DNS subdomain, RFC 1123): at most this long.
MAX_NAME = 253

# Outcomes `EventSink.counts` reports.
OUTCOMES = ("posted", "aggregated", "amended", "rate_limited", "queue_full", "forbidden", "throttled", "failed")
_WHY = {
    "rate_limited": "more events for one pod than its rate limit allows",
    "queue_full": "the queue of events to post is full (the API server is slow or unreachable)",
    "forbidden": "the API server refused them (403: the service account needs create and patch on events)",
    "throttled": "the API server asked to slow down (429 Too Many Requests or 503 Service Unavailable; posting "
                 "pauses for its Retry-After)",
    "failed": "the API server did not take them",
}


@dataclass(frozen=True)
class PodEvent:
    """One Event to post on a pod.

    Attributes:
        namespace, pod, pod_uid: the pod (its UID, so the Event cannot land on a new pod
            of the same name).
        reason: short UpperCamelCase reason, e.g. ``GPUFaultCaused``.
        message: one line for a person (cut to `MAX_MESSAGE` characters).
        type: ``Warning`` or ``Normal``.
        kind: the object the Event is about: ``Pod``, or ``Node`` (then ``pod`` and
            ``pod_uid`` are the node's name, as the kubelet names a Node in its Events, and
            ``namespace`` is ``default``, where Events on a Node live).
        incident: the id of the incident it tells (`messages.incident_id`), or "": a later
            event of the same incident and pod (an incident amended by a late kernel-log line)
            patches the Event already posted (its reason and message) instead of posting another.
    """

    namespace: str
    pod: str
    pod_uid: str
    reason: str
    message: str
    type: str = "Warning"
    kind: str = "Pod"
    incident: str = ""


def default_api_factory(kubeconfig: str | None = None) -> Any:
    """A ``kubernetes.client.CoreV1Api`` configured as the pod watch is (in-cluster, then
    ``kubeconfig`` or ``$KUBECONFIG``), whose HTTP layer tries each request once: the
    caller counts every refusal and decides when to try again (a ``Retry-After`` capped),
    never the client library's own retries and sleeps.

    Raises:
        ImportError: the ``kubernetes`` package is not installed.
        RuntimeError: no usable configuration.
    """
    from kubernetes import client

    from exporter.attribution.kubernetes import load_client

    return client.CoreV1Api(load_client(kubeconfig, retries=False))


def _timestamp(seconds: float) -> datetime.datetime:
    """An Event's timestamp: UTC, whole seconds (the client writes it in RFC 3339)."""
    return datetime.datetime.fromtimestamp(int(seconds), tz=datetime.timezone.utc)


@dataclass
class _Posted:
    """An Event already on the server, for aggregating its repeats."""

    namespace: str
    name: str
    count: int
    last_seen: float  # clock seconds


class _TokenBucket:
    def __init__(self, burst: int, per_second: float, now: float):
        self.burst = burst
        self.per_second = per_second
        self.tokens = float(burst)
        self.stamp = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.per_second)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


_STOP = object()


class EventSink:
    """Posts `PodEvent` objects to the API server from a daemon thread (see the module
    docstring).

    Args:
        api_factory: builds the ``CoreV1Api`` (called once, in the thread), e.g.
            `default_api_factory`.
        node: this node's name (``source.host``, ``reportingInstance``).
        reporter: ``source.component`` and ``reportingComponent``.
        burst, per_minute: each pod's token bucket.
        queue_size: events waiting to be posted at most.
        clock: monotonic seconds, for aggregation, rate limits and log intervals.
        wall: seconds since the epoch, for the Events' timestamps and names.
        request_timeout: (connect, read) seconds of one request.
        sleep: waits that many seconds in the thread (a Retry-After's pause); returns early
            when the sink closes. Default: a wait that `close` interrupts.
    """

    def __init__(self, api_factory: Callable[[], Any], node: str, reporter: str = REPORTER, burst: int = 5,
                 per_minute: float = 1.0, queue_size: int = 256, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
                 sleep: Callable[[float], object] | None = None):
        self._api_factory = api_factory
        self.node = node
        self.reporter = reporter
        self.burst = burst
        self.per_second = per_minute / 60.0
        self.request_timeout = request_timeout
        self._clock = clock
        self._wall = wall
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self.pause_until = 0.0  # clock seconds: no request before then (a Retry-After)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(OUTCOMES, 0)
        self._logged: dict[str, float] = {}
        # Owned by the thread:
        self._posted: OrderedDict[tuple[str, str, str], _Posted] = OrderedDict()
        self._by_incident: OrderedDict[tuple[str, str], _Posted] = OrderedDict()  # (incident id, pod uid)
        self._buckets: OrderedDict[str, _TokenBucket] = OrderedDict()
        self._last_nanos = 0
        self._api: Any = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="l9gpu-pod-events", daemon=True)
        self._thread.start()

    # ---- the caller's side -------------------------------------------------------------

    def submit(self, event: PodEvent) -> None:
        """Queue ``event`` for posting and return at once (dropped when the queue is full)."""
        if self._closed:
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._outcome("queue_full")

    def counts(self) -> dict[str, int]:
        """Events by outcome since start (every name of `OUTCOMES`, zeros included)."""
        with self._lock:
            return dict(self._counts)

    def close(self, timeout: float = 1.0) -> bool:
        """Post what is queued, within ``timeout`` seconds, and stop the thread.

        Returns:
            True when the thread stopped in time (False: a request is still waiting on
            the API server; the thread is a daemon and goes with the process).
        """
        self._closed = True
        self._stopping.set()
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    # ---- the thread -------------------------------------------------------------------

    def _outcome(self, outcome: str, detail: str = "") -> None:
        """Count an outcome; log a refusal or a drop once per `LOG_EVERY_SECONDS`."""
        now = self._clock()
        with self._lock:
            self._counts[outcome] += 1
            if outcome in ("posted", "aggregated"):
                return
            last = self._logged.get(outcome)
            if last is not None and now - last < LOG_EVERY_SECONDS:
                return
            self._logged[outcome] = now
        log.warning("Kubernetes Events dropped: %s%s (logged once per %d minutes)", _WHY[outcome],
                    f": {detail}" if detail else "", LOG_EVERY_SECONDS // 60)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            assert isinstance(item, PodEvent)
            wait = self.pause_until - self._clock()
            if wait > 0 and not self._stopping.is_set():
                self._sleep(min(wait, MAX_PAUSE))
                self.pause_until = 0.0  # served (or closing: post what is queued)
            try:
                self._handle(item)
            except Exception as exc:  # noqa: BLE001 - never let one event end the thread
                self._refused(exc)

    def _client(self) -> Any:
        if self._api is None:
            self._api = self._api_factory()
        return self._api

    def _allowed(self, pod_uid: str, now: float) -> bool:
        bucket = self._buckets.get(pod_uid)
        if bucket is None:
            bucket = self._buckets[pod_uid] = _TokenBucket(self.burst, self.per_second, now)
            if len(self._buckets) > CACHE_SIZE:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(pod_uid)
        return bucket.take(now)

    def _handle(self, event: PodEvent) -> None:
        now = self._clock()
        if event.incident and self._amend(event, now):
            return
        if not self._allowed(event.pod_uid, now):
            self._outcome("rate_limited")
            return
        api = self._client()
        key = (event.pod_uid, event.reason, event.message)
        stamp = _timestamp(self._wall())
        known = self._posted.get(key)
        if known is not None and now - known.last_seen <= AGGREGATE_SECONDS:
            try:
                api.patch_namespaced_event(known.name, known.namespace,
                                           {"count": known.count + 1, "lastTimestamp": stamp},
                                           _request_timeout=self.request_timeout)
            except Exception as exc:  # noqa: BLE001 - sorted out below
                if _refusal(exc)[0] != 404:
                    raise
                # Gone (expired on the server, deleted): post it anew below.
            else:
                known.count += 1
                known.last_seen = now
                self._posted.move_to_end(key)
                self._outcome("aggregated")
                return
        name = self._name(event.pod)
        api.create_namespaced_event(event.namespace, self._body(event, name, stamp),
                                    _request_timeout=self.request_timeout)
        self._posted[key] = _Posted(event.namespace, name, 1, now)
        self._posted.move_to_end(key)
        if len(self._posted) > CACHE_SIZE:
            self._posted.popitem(last=False)
        if event.incident:
            self._by_incident[(event.incident, event.pod_uid)] = self._posted[key]
            if len(self._by_incident) > CACHE_SIZE:
                self._by_incident.popitem(last=False)
        self._outcome("posted")

    def _amend(self, event: PodEvent, now: float) -> bool:
        """Patch the Event this pod already has for ``event.incident`` with the new reason and
        message (the count stays: it is the same fault); False where it has none (or it is
        gone from the server), and ``event`` is posted as any other."""
        known = self._by_incident.get((event.incident, event.pod_uid))
        if known is None:
            return False
        try:
            self._client().patch_namespaced_event(
                known.name, known.namespace, {"reason": event.reason, "message": event.message[:MAX_MESSAGE],
                                              "lastTimestamp": _timestamp(self._wall())},
                _request_timeout=self.request_timeout)
        except Exception as exc:  # noqa: BLE001 - sorted out below
            if _refusal(exc)[0] != 404:
                raise
            del self._by_incident[(event.incident, event.pod_uid)]
            return False
        known.last_seen = now
        self._posted[(event.pod_uid, event.reason, event.message)] = known  # its repeats aggregate into it
        self._outcome("amended")
        return True

    def _name(self, pod: str) -> str:
        """``<pod>.<hex nanoseconds>``, as the kubelet names its Events (unique here even
        within one nanosecond), cut to a name the API server takes (`event_name`)."""
        nanos = max(int(self._wall() * 1e9), self._last_nanos + 1)
        self._last_nanos = nanos
        return event_name(pod, nanos)

    def _body(self, event: PodEvent, name: str, stamp: datetime.datetime) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": event.namespace},
            "involvedObject": ({"apiVersion": "v1", "kind": "Pod", "name": event.pod,
                                "namespace": event.namespace, "uid": event.pod_uid} if event.kind == "Pod" else
                               {"apiVersion": "v1", "kind": event.kind, "name": event.pod, "uid": event.pod_uid}),
            "reason": event.reason,
            "message": event.message[:MAX_MESSAGE],
            "type": event.type,
            "source": {"component": self.reporter, "host": self.node},
            "reportingComponent": self.reporter,
            "reportingInstance": self.node,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }

    def _refused(self, exc: Exception) -> None:
        status, detail = _refusal(exc)
        outcome = {403: "forbidden", 429: "throttled", 503: "throttled"}.get(status or 0, "failed")
        if outcome == "throttled":
            pause = retry_after(exc)
            if pause is None and status == 429:
                pause = DEFAULT_PAUSE
            if pause:
                self.pause_until = max(self.pause_until, self._clock() + pause)
                detail += f"; pausing for {pause:g}s"
        self._outcome(outcome, detail)


_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def event_name(pod: str, nanos: int) -> str:
    """``<pod>.<hex nanos>`` as a valid DNS subdomain (RFC 1123, at most `MAX_NAME`
    characters: lowercase letters, digits, ``-`` and ``.``, each dot-separated label
    starting and ending with a letter or digit), whatever ``pod`` is.

    A legal pod name is kept whole where it fits; one of 253 characters is cut, and what
    the cut leaves at its end (``-``, ``.``) is dropped. Anything else in ``pod`` (a
    simulated node's names) becomes ``-``.
    """
    suffix = f"{max(0, nanos):x}"
    room = MAX_NAME - len(suffix) - 1
    labels = []
    for label in re.sub(r"[^a-z0-9.-]", "-", pod.lower()).split("."):
        label = label.strip("-")
        if label:
            labels.append(label)
    prefix = ".".join(labels)[:room].rstrip("-.") or "pod"
    return f"{prefix}.{suffix}"


def retry_after(exc: Exception) -> float | None:
    """Seconds a refusal's ``Retry-After`` header asks to wait (a number of seconds, or an
    HTTP date), at most `MAX_PAUSE`; None where it has none or none that parses."""
    headers = getattr(exc, "headers", None)
    try:
        text = headers.get("Retry-After") if headers is not None else None
    except Exception:  # noqa: BLE001 - headers of an unknown shape: no pause
        return None
    if not text:
        return None
    text = str(text).strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_PAUSE)


def _refusal(exc: Exception) -> tuple[int | None, str]:
    """The HTTP status of a failed request (None where the server gave none: a timeout, a
    refused connection) and one short line about it, with the server's Status message
    where it gave one."""
    lines = str(exc).splitlines()
    plain = None, f"{type(exc).__name__}{': ' + lines[0] if lines else ''}"[:200]
    try:
        from kubernetes.client.exceptions import ApiException
    except ImportError:  # the client is missing: the factory's ImportError says so
        return plain
    if not isinstance(exc, ApiException):
        return plain
    status = int(exc.status) if exc.status else None
    message = ""
    try:
        doc = json.loads(exc.body or "{}")
        message = str(doc.get("message", "")) if isinstance(doc, dict) else ""
    except (ValueError, TypeError):
        pass
    return status, f"{status} {exc.reason or ''}{': ' + message if message else ''}"[:200]
