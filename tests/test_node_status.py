"""The node's GPU condition worked out from snapshots (pure), and the writer's behaviour
towards the API server (heartbeat, clearing on exit, conflicts, throttling, timeouts) in
process against the project's fake API server."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from exporter.core.model import DeviceSample, ProcessRow, Snapshot, Workload
from exporter.health import Reason, Verdict
from exporter.health import policy as p
from exporter.nodestatus import parse_condition_type, parse_taint_key
from exporter.nodestatus.condition import REASONS, gpu_transitions, node_verdict, track_since

NODE = "gpu-node-4"
TRAINER = Workload(kind="kubernetes", namespace="ml", pod="trainer-0", container="main", pod_uid="u1")


def _verdict(action: str, *reasons: str) -> Verdict:
    if action == p.NONE:
        return Verdict(p.HEALTHY, p.NONE, ())
    state = p.DEGRADED if action in (p.RESTART_APP, p.RESET_GPU) else p.UNHEALTHY
    return Verdict(state, action, tuple(Reason(r, action, r) for r in reasons))


def _snap(seq: int, actions: dict[int, tuple[str, ...]], timestamp: float = 1_790_000_000.0) -> Snapshot:
    devices = tuple(DeviceSample(index=i, uuid=f"GPU-{i}") for i in range(8))
    health = {f"GPU-{i}": _verdict(*actions.get(i, (p.NONE,))) for i in range(8)}
    processes = (ProcessRow("GPU-4", 100, "python3", TRAINER, 1, None),)
    return Snapshot(seq=seq, node=NODE, timestamp=timestamp + seq, devices=devices, processes=processes,
                    verdicts=health)


def test_the_condition_is_true_only_beyond_restart_app_with_the_highest_action_as_reason() -> None:
    assert node_verdict(_snap(1, {}), {}).status == "False"
    restart = node_verdict(_snap(1, {2: (p.RESTART_APP, "xid_13")}), {})
    assert (restart.status, restart.reason) == ("False", "GPUsHealthy")
    snap = _snap(1, {4: (p.RESET_GPU, "row_remap_pending"), 6: (p.REBOOT_NODE, "xid_79"),
                     1: (p.RESTART_APP, "xid_31")})
    verdict = node_verdict(snap, track_since({}, snap))
    assert (verdict.status, verdict.reason) == ("True", "RebootNode")
    assert verdict.message == ("2 GPUs need more than an application restart: "
                               "GPU 4 (GPU-4): row_remap_pending; action reset_gpu; since 2026-09-21T14:13:21.000Z; "
                               "GPU 6 (GPU-6): xid_79; action reboot_node; since 2026-09-21T14:13:21.000Z")
    for action, reason in REASONS.items():
        assert node_verdict(_snap(1, {0: (action, "r")}), {}).reason == reason
    assert set(REASONS) == {p.RESET_GPU, p.REBOOT_NODE, p.DRAIN_AND_RESET, p.INSPECT_HARDWARE, p.CONTACT_SUPPORT}


def test_since_is_kept_while_the_action_stays() -> None:
    first = _snap(1, {4: (p.RESET_GPU, "row_remap_pending")})
    since = track_since({}, first)
    later = _snap(50, {4: (p.RESET_GPU, "row_remap_pending")})
    assert track_since(since, later) == since
    worse = _snap(60, {4: (p.REBOOT_NODE, "xid_79")})
    assert track_since(since, worse)["GPU-4"] == (p.REBOOT_NODE, worse.timestamp)
    assert track_since(since, _snap(70, {})) == {}


def test_transitions_name_the_workloads_holding_the_gpu() -> None:
    before = {f"GPU-{i}": p.HEALTHY for i in range(8)}
    [change] = gpu_transitions(before, _snap(2, {4: (p.REBOOT_NODE, "xid_79")}))
    assert (change.event_type, change.event_reason) == ("Warning", "GPUUnhealthy")
    assert change.message() == ("GPU 4 (GPU-4) became unhealthy (was healthy): xid_79; action reboot_node; "
                                "held by ml/trainer-0/main")
    [back] = gpu_transitions({**before, "GPU-4": p.UNHEALTHY}, _snap(3, {}))
    assert (back.event_type, back.event_reason) == ("Normal", "GPURecovered")
    assert gpu_transitions({}, _snap(2, {4: (p.REBOOT_NODE, "xid_79")})) == []  # a new agent saw no change


def test_a_gpu_that_fell_off_the_bus_is_held_by_the_workloads_on_it_when_it_failed() -> None:
    before = {f"GPU-{i}": p.HEALTHY for i in range(8)}
    up = _snap(1, {})
    lost = _snap(2, {4: (p.REBOOT_NODE, "gpu_lost", "xid_79")})
    # Lost: its processes can no longer be read, so the pass has none on GPU 4.
    lost = replace(lost, devices=tuple(replace(d, up=False) if d.index == 4 else d for d in lost.devices),
                   processes=())
    [change] = gpu_transitions(before, lost, {"GPU-4": up})
    assert change.message() == ("GPU 4 (GPU-4) became unhealthy (was healthy): gpu_lost, xid_79; "
                                "action reboot_node; held by ml/trainer-0/main")
    [unknown] = gpu_transitions(before, lost)  # no pass saw it up: nobody is named
    assert unknown.message().endswith("held by no workload")


@pytest.mark.parametrize("text", ["GPUUnhealthy", "example.com/GPUProblem", "Gpu2"])
def test_condition_types_taken(text: str) -> None:
    assert parse_condition_type(text) == text


@pytest.mark.parametrize("text", ["", "gpu unhealthy", "9GPU", "Example.com/GPU", "a/b/C", "GPU-Unhealthy"])
def test_condition_types_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a condition type"):
        parse_condition_type(text)


@pytest.mark.parametrize("text", ["l9gpu.io/gpu-unhealthy", "gpu", "example.com/GPU_bad.1"])
def test_taint_keys_taken(text: str) -> None:
    assert parse_taint_key(text) == text


@pytest.mark.parametrize("text", ["", "-gpu", "l9gpu.io/", "UPPER.io/gpu", "x" * 64])
def test_taint_keys_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a taint key"):
        parse_taint_key(text)


# ---- the writer against the fake API server --------------------------------------------

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")

from cgroup_helpers import kubeconfig  # noqa: E402
from waiting import FakeClock, wait_until  # noqa: E402

from exporter.incidents.events import default_api_factory  # noqa: E402
from exporter.nodestatus.writer import NodeStatusWriter, Taint  # noqa: E402


@pytest.fixture
def writers():
    made: list[NodeStatusWriter] = []
    yield made
    for writer in made:
        writer.close(timeout=5.0)


def _writer(writers: list[NodeStatusWriter], apiserver: Any, tmp_path: Path, **kw: Any) -> NodeStatusWriter:
    writer = NodeStatusWriter(functools.partial(default_api_factory, kubeconfig(tmp_path, apiserver)), NODE, **kw)
    writers.append(writer)
    return writer


def _status_writes(apiserver: Any) -> list[dict[str, Any]]:
    return [body["status"]["conditions"][0] for method, path, _, body in apiserver.node_requests
            if method == "PATCH" and path.endswith("/status")]


def test_an_unchanged_condition_is_written_once_per_heartbeat(apiserver, tmp_path, writers) -> None:
    apiserver.add_node(NODE)
    clock = FakeClock()
    writer = _writer(writers, apiserver, tmp_path, clock=clock, heartbeat=60.0)
    sick = {4: (p.RESET_GPU, "row_remap_pending")}
    writer.observe(_snap(1, sick))
    wait_until(lambda: writer.counts()["updated"] == 1, what="the first write")
    for seq in range(2, 40):  # 38 passes within the minute, the GPU as it was: nothing to write
        clock.now += 1.0
        writer.observe(_snap(seq, sick))
    assert writer.counts()["updated"] == 1
    clock.now += 30.0  # 68 s after the write: a heartbeat is due
    writer._wake.set()  # as the thread's own timer does at the heartbeat
    wait_until(lambda: writer.counts()["updated"] == 2, what="the heartbeat")
    first, second = _status_writes(apiserver)
    assert first["lastTransitionTime"] == second["lastTransitionTime"]
    assert len(_status_writes(apiserver)) == 2


def test_clear_on_exit_sets_false_and_removes_the_taint_only_when_asked(apiserver, tmp_path, writers) -> None:
    apiserver.add_node(NODE, taints=[{"key": "other", "effect": "NoExecute"}])
    keeper = _writer(writers, apiserver, tmp_path, taint=Taint())
    keeper.observe(_snap(1, {4: (p.REBOOT_NODE, "xid_79")}))
    wait_until(lambda: len(apiserver.node(NODE)["spec"]["taints"]) == 2, what="the taint")
    assert keeper.close(timeout=5.0)
    node = apiserver.node(NODE)
    assert node["status"]["conditions"][0]["status"] == "True" and len(node["spec"]["taints"]) == 2
    clearer = _writer(writers, apiserver, tmp_path, taint=Taint(), clear_on_exit=True)
    clearer.observe(_snap(1, {4: (p.REBOOT_NODE, "xid_79")}))
    wait_until(lambda: clearer.counts()["updated"] >= 1, what="the re-assertion")
    assert clearer.close(timeout=5.0)
    node = apiserver.node(NODE)
    assert node["status"]["conditions"][0]["status"] == "False"
    assert node["spec"]["taints"] == [{"key": "other", "effect": "NoExecute"}]


def test_a_taint_conflict_is_counted_and_retried(apiserver, tmp_path, writers) -> None:
    apiserver.add_node(NODE)

    class Racing:
        """The node changes between the writer's read and its patch, once."""

        def __init__(self) -> None:
            self.api = default_api_factory(kubeconfig(tmp_path, apiserver))
            self.raced = False

        def __getattr__(self, name: str) -> Any:
            return getattr(self.api, name)

        def patch_node(self, *args: Any, **kw: Any) -> Any:
            if not self.raced:
                self.raced = True
                apiserver.add_node(NODE, taints=[{"key": "added-meanwhile", "effect": "NoSchedule"}])
            return self.api.patch_node(*args, **kw)

    writer = NodeStatusWriter(Racing, NODE, taint=Taint(), heartbeat=1.0)
    writers.append(writer)
    writer.observe(_snap(1, {4: (p.REBOOT_NODE, "xid_79")}))
    wait_until(lambda: len(apiserver.node(NODE)["spec"]["taints"]) == 2, what="the taint after the conflict")
    assert writer.counts()["conflict"] == 1
    assert apiserver.node(NODE)["spec"]["taints"][0]["key"] == "added-meanwhile"  # the other writer's kept


def test_a_taint_the_agent_may_not_set_is_counted_and_noted_as_the_taint(apiserver, tmp_path, writers) -> None:
    apiserver.add_node(NODE)
    apiserver.refuse_nodes(403, "patch")
    writer = _writer(writers, apiserver, tmp_path, taint=Taint(), heartbeat=1.0)
    writer.observe(_snap(1, {4: (p.REBOOT_NODE, "xid_79")}))
    wait_until(lambda: writer.counts()["forbidden"] >= 1, what="the refused taint counted")
    assert apiserver.node(NODE)["status"]["conditions"][0]["status"] == "True"  # the condition is written
    assert writer.note().startswith(f"node {NODE}'s taint is not written: 403 Forbidden")


@pytest.mark.parametrize(("code", "outcome"), [(403, "forbidden"), (429, "throttled"), (503, "throttled"),
                                               (500, "server_error")])
def test_refusals_are_counted_and_noted(apiserver, tmp_path, writers, code, outcome) -> None:
    apiserver.add_node(NODE)
    apiserver.refuse_nodes(code, "patch_status")
    writer = _writer(writers, apiserver, tmp_path, heartbeat=1.0)
    writer.observe(_snap(1, {}))
    wait_until(lambda: writer.counts()[outcome] >= 1, what=f"the {code} counted")
    assert writer.note().startswith(f"node {NODE}'s GPU condition is not written: {code}")
    apiserver.refuse_nodes(None, "patch_status")
    wait_until(lambda: writer.counts()["updated"] >= 1, what="the write once allowed")
    assert writer.note() == ""


def test_a_server_that_does_not_answer_counts_timeout_and_observe_never_waits(apiserver, tmp_path,
                                                                              writers) -> None:
    apiserver.add_node(NODE)
    apiserver.stall(streams=False)
    try:
        # the agent decides retries: the first timeout is counted, not hidden behind the client's own
        writer = _writer(writers, apiserver, tmp_path, request_timeout=(0.5, 0.5))
        for seq in range(1, 200):
            writer.observe(_snap(seq, {4: (p.RESET_GPU, "row_remap_pending")} if seq % 2 else {}))
        assert sum(writer.counts().values()) == 0, "observe() waited on the API server"
        wait_until(lambda: writer.counts()["timeout"] >= 1, what="the timeout counted")
        assert apiserver.held == 1, "the client retried the GET itself before the agent saw the first timeout"
    finally:
        apiserver.resume()


OURS = {"key": "l9gpu.io/gpu-unhealthy", "effect": "NoSchedule"}


def _taints(apiserver: Any) -> list[dict[str, Any]]:
    return list(apiserver.node(NODE)["spec"].get("taints") or [])


def _condition(apiserver: Any) -> str | None:
    try:
        conditions = apiserver.node(NODE)["status"]["conditions"]
    except KeyError:
        return None
    return next((c["status"] for c in conditions if c["type"] == "GPUUnhealthy"), None)


def test_a_recreated_node_is_tainted_again(apiserver, tmp_path, writers) -> None:
    apiserver.add_node(NODE)
    writer = _writer(writers, apiserver, tmp_path, taint=Taint(), heartbeat=1.0)
    sick = {4: (p.REBOOT_NODE, "xid_79")}
    writer.observe(_snap(1, sick))
    wait_until(lambda: _taints(apiserver) == [OURS], what="the taint")
    apiserver.delete_node(NODE)  # deleted and registered again bare, the GPU still unhealthy
    apiserver.add_node(NODE)
    writer.observe(_snap(2, sick))
    wait_until(lambda: _taints(apiserver) == [OURS] and _condition(apiserver) == "True",
               what="the taint and the condition back on the recreated Node")


def test_a_taint_with_the_agents_key_but_not_its_own_is_left_alone(apiserver, tmp_path, writers) -> None:
    manual = {"key": "l9gpu.io/gpu-unhealthy", "value": "manual", "effect": "NoExecute"}
    apiserver.add_node(NODE, taints=[manual])
    writer = _writer(writers, apiserver, tmp_path, taint=Taint(), heartbeat=1.0)
    writer.observe(_snap(1, {}))  # healthy at start-up: nothing of the agent's to remove
    wait_until(lambda: writer.counts()["updated"] >= 3, what="the condition and two heartbeats")
    assert _taints(apiserver) == [manual]
    writer.observe(_snap(2, {4: (p.REBOOT_NODE, "xid_79")}))
    wait_until(lambda: _taints(apiserver) == [manual, OURS], what="the agent's taint beside the administrator's")
    writer.observe(_snap(3, {}))
    wait_until(lambda: _taints(apiserver) == [manual], what="only the agent's taint removed")


# A change that failed is tried again on the backoff (2 s, then 4, 8, ...), not at the next
# heartbeat (a minute): well within this bound, however busy the machine.
WITHIN_BACKOFF = 20.0


@pytest.mark.parametrize(("code", "what"), [(500, "patch_status"), (409, "patch")])
def test_a_change_that_failed_once_lands_on_the_backoff_not_the_heartbeat(apiserver, tmp_path, writers, code,
                                                                          what) -> None:
    apiserver.add_node(NODE)
    writer = _writer(writers, apiserver, tmp_path, taint=Taint(), heartbeat=60.0)
    writer.observe(_snap(1, {}))
    wait_until(lambda: _condition(apiserver) == "False", what="the condition written False")
    apiserver.refuse_nodes(code, what, times=1)
    writer.observe(_snap(2, {4: (p.REBOOT_NODE, "xid_79")}))
    outcome = {500: "server_error", 409: "conflict"}[code]
    wait_until(lambda: writer.counts()[outcome] == 1, what=f"the {code} counted")
    wait_until(lambda: _condition(apiserver) == "True" and _taints(apiserver) == [OURS], timeout=WITHIN_BACKOFF,
               what="the condition and the taint after one failure")


def test_a_long_retry_after_is_capped_and_counted_throttled(apiserver, tmp_path, writers) -> None:
    apiserver.add_node(NODE)
    apiserver.refuse_nodes(429, "get", times=1, retry_after="600")
    writer = _writer(writers, apiserver, tmp_path, taint=Taint(), heartbeat=5.0)
    writer.observe(_snap(1, {4: (p.REBOOT_NODE, "xid_79")}))
    wait_until(lambda: writer.counts()["throttled"] == 1, timeout=WITHIN_BACKOFF, what="the 429 counted throttled")
    # the pause is capped at the heartbeat (5 s here), not the 600 s asked
    wait_until(lambda: _condition(apiserver) == "True" and _taints(apiserver) == [OURS], timeout=WITHIN_BACKOFF,
               what="the condition and the taint after the capped pause")
    assert [r for r in apiserver.node_requests if r[0] == "GET"][:2] == [("GET", f"/api/v1/nodes/{NODE}", "", None)] * 2
