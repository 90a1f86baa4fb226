"""Writes the node's GPU condition (and the opt-in taint) through the API server, from a
thread of its own.

The collector thread calls `NodeStatusWriter.observe` after each pass: it works out what the
Node should say (`condition.node_verdict`, pure and cheap), hands the Node's Events to the
event sink (which posts from its own thread), and leaves the verdict for the writer's
thread. Nothing here makes a pass wait on the API server.

The writer's thread:

- at start-up reads the Node once (``get`` on nodes): the condition a previous agent left,
  to keep its ``lastTransitionTime`` where the status is unchanged, and the taints;
- writes the condition with a strategic-merge PATCH of ``nodes/<name>/status`` holding only
  this condition (conditions merge by ``type``: the ones other writers own are untouched),
  when it changes and otherwise as a heartbeat no more often than ``heartbeat`` seconds;
  ``lastTransitionTime`` moves only when the status does;
- during ``settle`` seconds after start keeps a ``True`` condition a previous agent left
  while its own verdict says ``False``: some reasons take a few health reads to be seen
  again (a PCIe link degraded for three reads), and a DaemonSet rollout must not make a
  sick node look healthy for a moment. A ``True`` verdict is written at once;
- with a taint, adds it to or removes it from ``spec.taints`` with a PATCH of the node that
  carries the ``resourceVersion`` it read (a concurrent change is answered 409 and retried);
- on a clean shutdown, sets the condition ``False`` (and removes the taint) only when asked.

Each request's outcome is counted (`NodeStatusWriter.counts`, for
``l9gpu_kubernetes_node_updates_total``); a refusal is logged once per outcome every five
minutes, retried with a growing pause (a ``Retry-After`` honoured), and said in one line by
`NodeStatusWriter.note` (for ``/healthz`` and the page) until a write succeeds.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from exporter.core.model import Snapshot
from exporter.incidents.events import PodEvent, retry_after
from exporter.nodestatus.condition import (
    DEFAULT_CONDITION_TYPE,
    HEALTHY,
    NodeVerdict,
    gpu_states,
    gpu_transitions,
    node_verdict,
    track_since,
)
from exporter.output.snapshot_json import rfc3339

log = logging.getLogger(__name__)

# Outcomes of the requests to the API server, for l9gpu_kubernetes_node_updates_total.
OUTCOMES = ("updated", "forbidden", "conflict", "throttled", "server_error", "timeout", "failed")
_WHY = {
    "forbidden": "refused (the service account needs get on nodes and patch on nodes/status, and patch on nodes "
                 "for the taint)",
    "conflict": "the node changed meanwhile (tried again)",
    "throttled": "the API server asked to slow down",
    "server_error": "the API server failed",
    "timeout": "the API server did not answer in time",
    "failed": "the request failed",
}
DEFAULT_HEARTBEAT = 60.0
DEFAULT_SETTLE = 120.0
DEFAULT_TAINT_KEY = "l9gpu.io/gpu-unhealthy"
TAINT_EFFECT = "NoSchedule"
LOG_EVERY_SECONDS = 300.0
REQUEST_TIMEOUT = (5.0, 10.0)
FIRST_RETRY = 1.0  # doubled before each retry: a failed change is tried again after 2 s, 4, 8, ... up to the heartbeat


@dataclass(frozen=True)
class Taint:
    """The taint the node carries while its condition is True (``--node-taint unhealthy``)."""

    key: str = DEFAULT_TAINT_KEY
    effect: str = TAINT_EFFECT

    def body(self) -> dict[str, str]:
        return {"key": self.key, "effect": self.effect}

    def is_ours(self, taint: Any) -> bool:
        """Whether ``taint`` (one of a Node's) is the one the agent writes: its key and effect,
        no value. An administrator's taint with the same key and another effect or a value
        (``l9gpu.io/gpu-unhealthy=manual:NoExecute``) is not, and is never removed."""
        return (isinstance(taint, dict) and taint.get("key") == self.key and taint.get("effect") == self.effect
                and not taint.get("value"))

    def holds(self, taints: Any) -> bool:
        """Whether the Node's ``taints`` already keep pods off as this taint would: its key and
        effect, whatever the value (the API takes one taint per key and effect)."""
        return any(isinstance(t, dict) and t.get("key") == self.key and t.get("effect") == self.effect
                   for t in taints or ())


def default_api_factory(kubeconfig: str | None = None) -> Any:
    """A ``kubernetes.client.CoreV1Api`` configured as the pod watch's."""
    from exporter.incidents.events import default_api_factory as factory

    return factory(kubeconfig)


def _classify(exc: Exception) -> tuple[str, str, float | None]:
    """(outcome, one line, Retry-After seconds or None) of a failed request."""
    from exporter.incidents.events import _refusal

    status, detail = _refusal(exc)
    if status == 403:
        return "forbidden", detail, None
    if status == 409:
        return "conflict", detail, None
    if status in (429, 503):
        return "throttled", detail, retry_after(exc)
    if status is not None and status >= 500:
        return "server_error", detail, None
    if status is None and ("timed out" in detail.lower() or "timeout" in f"{type(exc).__name__} {exc}".lower()):
        return "timeout", detail, None
    return "failed", detail, None


class NodeStatusWriter:
    """The node's GPU condition, Events and taint (see the module docstring).

    Args:
        api_factory: builds the ``CoreV1Api`` (called once, in the thread).
        node: this node's name.
        condition_type: the condition's ``type``.
        heartbeat: seconds between two writes of an unchanged condition, at least.
        settle: seconds after start during which a ``True`` condition left by a previous agent
            is kept while this agent's verdict is ``False``.
        taint: the taint to keep while the condition is True, or None (``--node-taint off``).
        clear_on_exit: on `close`, set the condition ``False`` and remove the taint.
        events: an `exporter.incidents.events.EventSink` for the Node's Events, or None.
        clock: monotonic seconds; wall: seconds since the epoch.
        request_timeout: (connect, read) seconds of one request.
    """

    def __init__(self, api_factory: Callable[[], Any], node: str, condition_type: str = DEFAULT_CONDITION_TYPE,
                 heartbeat: float = DEFAULT_HEARTBEAT, settle: float = DEFAULT_SETTLE, taint: Taint | None = None,
                 clear_on_exit: bool = False, events: Any = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, request_timeout: tuple[float, float] = REQUEST_TIMEOUT):
        self._api_factory = api_factory
        self.node = node
        self.condition_type = condition_type
        self.heartbeat = heartbeat
        self.settle = settle
        self.taint = taint
        self.clear_on_exit = clear_on_exit
        self.events = events
        self.request_timeout = request_timeout
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._counts = dict.fromkeys(OUTCOMES, 0)
        self._logged: dict[str, float] = {}
        self._note = ""
        # The collector thread's:
        self._since: dict[str, tuple[str, float]] = {}
        self._states: dict[str, str] | None = None
        self._latest: NodeVerdict | None = None
        # The writer thread's:
        self._api: Any = None
        self._started_at: float | None = None  # the first verdict's arrival: the settle time counts from it
        self._read = False
        self._prior: dict[str, Any] | None = None  # the condition a previous agent left, as read
        self._written: dict[str, Any] | None = None  # the condition on the node, as last written
        self._heartbeat_at = 0.0
        self._holding = False  # a previous agent's True condition stands (the settle time)
        self._seen_problem = False  # this agent's own verdict has been True
        self._last_up: dict[str, Snapshot] = {}  # per GPU, the last snapshot that saw it up (its holders)
        self._doing = "GPU condition"  # what the request under way writes, for the note
        self._retry_at = 0.0
        self._failed = False  # the last try failed: the next is due at _retry_at, not at the heartbeat
        self._backoff = FIRST_RETRY
        self._thread = threading.Thread(target=self._run, name="l9gpu-node-status", daemon=True)
        self._thread.start()

    # ---- the collector's side ------------------------------------------------------

    def observe(self, snap: Snapshot) -> None:
        """Fold one published snapshot in (the collector thread's hook); never blocks."""
        self._since = track_since(self._since, snap)
        verdict = node_verdict(snap, self._since)
        states = gpu_states(snap)
        if self._states is not None and self.events is not None:
            for change in gpu_transitions(self._states, snap, self._last_up):
                self.events.submit(PodEvent("default", self.node, self.node, change.event_reason, change.message(),
                                            type=change.event_type, kind="Node"))
        self._states = states
        for device in snap.devices:
            if device.up and not device.gpu_instance:
                self._last_up[device.key] = snap
        with self._lock:
            changed = self._latest != verdict
            self._latest = verdict
        if changed:
            self._wake.set()

    def counts(self) -> dict[str, int]:
        """Requests by outcome since start (every name of `OUTCOMES`, zeros included)."""
        with self._lock:
            return dict(self._counts)

    def note(self) -> str:
        """One line while the node's condition cannot be written ("" otherwise)."""
        with self._lock:
            return self._note

    def close(self, timeout: float = 1.0) -> bool:
        """Stop the thread (first clearing the condition and the taint with ``clear_on_exit``),
        waiting at most ``timeout`` seconds; True when it stopped in time."""
        self._closing = True
        self._wake.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- the thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self._next_wait())
            self._wake.clear()
            with self._lock:
                verdict = self._latest
            if self._closing:
                if self.clear_on_exit:
                    self._attempt(lambda: self._sync(HEALTHY, force=True))
                return
            if verdict is not None and self._started_at is None:
                self._started_at = self._clock()
            if verdict is not None and self._clock() >= self._retry_at:
                self._attempt(lambda wanted=verdict: self._sync(wanted))  # type: ignore[misc]

    def _next_wait(self) -> float | None:
        if self._written is None and self._latest is None:
            return None
        now = self._clock()
        due = self._heartbeat_at + self.heartbeat if self._written is not None and not self._failed else now
        if self._holding and self._started_at is not None:  # the settle time ends: the verdict is written then
            due = min(due, self._started_at + self.settle)
        return max(0.05, max(due, self._retry_at) - now)

    def _attempt(self, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - sorted out, counted and logged once
            outcome, detail, pause = _classify(exc)
            self._backoff = min(self.heartbeat, self._backoff * 2)
            # a Retry-After is honoured up to the heartbeat: the agent decides, never the server alone
            self._retry_at = self._clock() + max(self._backoff, min(pause or 0.0, self.heartbeat))
            self._failed = True
            self._outcome(outcome, detail)
        else:
            self._failed = False
            self._backoff = FIRST_RETRY
            with self._lock:
                self._note = ""

    def _client(self) -> Any:
        if self._api is None:
            self._api = self._api_factory()
        return self._api

    def _get_node(self) -> dict[str, Any]:
        response = self._client().read_node(self.node, _preload_content=False, _request_timeout=self.request_timeout)
        return json.loads(_body(response))

    def _read_node(self) -> tuple[dict[str, Any] | None, Exception | None]:
        """The Node as it is now, read when the condition a previous agent left is not known
        yet (at start-up) and, with a taint, at every write: the taint follows the Node, not a
        memory of what was written (a Node deleted and registered again comes back bare)."""
        if self._read and self.taint is None:
            return None, None
        try:
            node = self._get_node()
        except Exception as exc:  # noqa: BLE001 - counted by the caller
            return None, exc
        if not self._read:
            self._read = True
            for condition in (node.get("status") or {}).get("conditions") or ():
                if condition.get("type") == self.condition_type:
                    self._prior = condition
        return node, None

    def _sync(self, verdict: NodeVerdict, force: bool = False) -> None:
        node, failure = self._read_node()
        if failure is not None and self.taint is None:
            # the start-up read only: counted once, not retried; the writes go on without it
            self._read = True
            outcome, detail, _ = _classify(failure)
            self._outcome(outcome, f"reading node {self.node}: {detail}")
        wanted = self._held(verdict)
        now = self._clock()
        current = self._written or self._prior
        same = current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
            wanted.status, wanted.reason, wanted.message)
        if node is not None and self._written is not None and not _carries(node, self._written, self.condition_type):
            same = False  # the Node lost it (recreated, or another writer's change): write it now
        if force or not same or self._written is None or now - self._heartbeat_at >= self.heartbeat:
            answer = self._write_condition(wanted, current)
            if node is not None and isinstance(answer, dict):
                node = answer  # the Node after the write: its resourceVersion is the one to patch against
        if self.taint is not None:
            if failure is not None:
                self._doing = "taint"
                raise failure  # counted by `_attempt`; tried again on the backoff
            assert node is not None
            if self.taint.holds((node.get("spec") or {}).get("taints")) != wanted.problem:
                self._write_taint(wanted.problem, node)

    def _held(self, verdict: NodeVerdict) -> NodeVerdict:
        """During the settle time, a True condition left by a previous agent stands against a
        False verdict, until this agent's own verdict has been True once (then a False is a
        recovery it saw; see the module docstring)."""
        prior = self._prior
        self._seen_problem = self._seen_problem or verdict.problem
        self._holding = (not verdict.problem and not self._seen_problem and prior is not None
                         and prior.get("status") == "True" and not self._closing
                         and self._clock() - (self._started_at or self._clock()) < self.settle)
        if self._holding and prior is not None:
            return NodeVerdict("True", str(prior.get("reason") or ""), str(prior.get("message") or ""))
        return verdict

    def _write_condition(self, verdict: NodeVerdict, current: dict[str, Any] | None) -> Any:
        """PATCH the condition; the Node as the server answered (None where it is no JSON)."""
        self._doing = "GPU condition"
        stamp = rfc3339_seconds(self._wall())
        transition = stamp
        if current is not None and current.get("status") == verdict.status and current.get("lastTransitionTime"):
            transition = current["lastTransitionTime"]
        condition = {"type": self.condition_type, "status": verdict.status, "reason": verdict.reason,
                     "message": verdict.message, "lastHeartbeatTime": stamp, "lastTransitionTime": transition}
        answer = _body(self._client().patch_node_status(self.node, {"status": {"conditions": [condition]}},
                                                        _preload_content=False,
                                                        _request_timeout=self.request_timeout))
        self._written = condition
        self._heartbeat_at = self._clock()
        self._outcome("updated")
        try:
            return json.loads(answer)
        except ValueError:
            return None

    def _write_taint(self, on: bool, node: dict[str, Any]) -> None:
        """Add the taint to (or remove it from) the Node as just read, with its resourceVersion:
        a change made meanwhile is answered 409 and tried again on the backoff."""
        assert self.taint is not None
        self._doing = "taint"
        taints = [t for t in (node.get("spec") or {}).get("taints") or () if not self.taint.is_ours(t)]
        if on:
            taints.append(self.taint.body())
        version = (node.get("metadata") or {}).get("resourceVersion")
        body: dict[str, Any] = {"spec": {"taints": taints}}
        if version:
            body["metadata"] = {"resourceVersion": version}
        _body(self._client().patch_node(self.node, body, _preload_content=False,
                                        _request_timeout=self.request_timeout))
        self._outcome("updated")

    def _outcome(self, outcome: str, detail: str = "") -> None:
        now = self._clock()
        with self._lock:
            self._counts[outcome] += 1
            if outcome == "updated":
                return
            self._note = f"node {self.node}'s {self._doing} is not written: {detail or _WHY[outcome]}"
            last = self._logged.get(outcome)
            if last is not None and now - last < LOG_EVERY_SECONDS:
                return
            self._logged[outcome] = now
        log.warning("updating node %s failed: %s%s (logged once per %d minutes; the agent goes on without it)",
                    self.node, _WHY[outcome], f": {detail}" if detail else "", LOG_EVERY_SECONDS // 60)


def _carries(node: dict[str, Any], written: dict[str, Any], condition_type: str) -> bool:
    """Whether ``node`` carries the condition as last ``written`` (status, reason, message)."""
    for condition in (node.get("status") or {}).get("conditions") or ():
        if isinstance(condition, dict) and condition.get("type") == condition_type:
            return all(condition.get(k) == written.get(k) for k in ("status", "reason", "message"))
    return False


def _body(response: Any) -> bytes:
    """A raw answer's body, read whole, its connection handed back to the client's pool (the
    answers are read as JSON here, not turned into the client's model objects)."""
    try:
        return bytes(response.data)
    finally:
        response.release_conn()


def rfc3339_seconds(unix_seconds: float) -> str:
    """A condition's time: RFC 3339 UTC in whole seconds (``2026-12-03T08:00:00Z``), as the
    API server stores it."""
    return rfc3339(int(unix_seconds))[:19] + "Z"
