"""The node's GPU condition, its Events and the opt-in taint, written by the running agent
(the simulated node) to the project's fake API server, which merges a node's conditions by
type as the real one does; every body sent is validated against the Kubernetes API schema,
and kubectl (where installed) reads the node back as ``kubectl describe node`` prints it."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate checks the bodies sent")

from agent import parse_metrics  # noqa: E402
from cgroup_helpers import kubeconfig  # noqa: E402
from waiting import PATIENCE, wait_until  # noqa: E402

NODE = "gpu-node-4"
CONDITION = "GPUUnhealthy"
TAINT = "l9gpu.io/gpu-unhealthy"
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
         "lastHeartbeatTime": "2026-12-03T08:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z"}
OTHER_TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
VERSIONS = ("1.25", kubernetes_validate.latest_version())

SCENARIO = """\
node: gpu-node-4
gpus: {count: 8, model: NVIDIA H100 80GB HBM3, memory_gib: 80, driver_version: "550.54.15",
       power: {idle_watts: 72, max_watts: 700, limit_watts: 700}}
processes:
  - name: python3
    gpus: [4]
    pid: 52001
    memory_gib: 40
    utilization: 0.9
    workload: {namespace: ml-research, pod: llm-finetune-worker-0, container: trainer,
               owner: {kind: Job, name: llm-finetune}}
health:
  - gpus: [4]
    row_remap: {pending: true, uncorrectable: 1}
"""
# The remap waits for a reset for as long as the agent runs.
REMAP = SCENARIO
# The GPU is reset 20 s after the agent opened it (its first pass comes long before, even on a
# loaded machine), and falls off the bus (Xid 79) at 22 s.
REMAP_RESET_XID79 = SCENARIO.replace("row_remap: {pending: true, uncorrectable: 1}",
                                     "row_remap: {pending: true, uncorrectable: 1}\n    until: 20s") + \
    "xids:\n  - {at: 22s, gpu: 4, xid: 79, text: GPU has fallen off the bus.}\n"
HEALTHY = SCENARIO.split("health:")[0]


def _scenario(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def _condition(apiserver: Any) -> dict[str, Any] | None:
    node = apiserver.node(NODE)
    return next((c for c in node["status"]["conditions"] if c["type"] == CONDITION), None)


def _status_patches(apiserver: Any, since: int = 0) -> list[dict[str, Any]]:
    return [body["status"]["conditions"][0] for method, path, _, body in apiserver.node_requests[since:]
            if method == "PATCH" and path.endswith("/status") and isinstance(body, dict)]


def _validate_all_sent(apiserver: Any) -> None:
    """Every body the agent sent, as the Node it patches, and the Node and Events as they are."""
    for method, path, content_type, body in apiserver.node_requests:
        if method != "PATCH":
            continue
        assert content_type.startswith("application/strategic-merge-patch+json"), content_type
        as_node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}
        for key, value in body.items():
            as_node[key] = {**as_node.get(key, {}), **value} if isinstance(value, dict) else value
        if path.endswith("/status"):
            assert set(body) == {"status"} and set(body["status"]) == {"conditions"}, body  # conditions only
            assert [c["type"] for c in body["status"]["conditions"]] == [CONDITION]
        for version in VERSIONS:
            kubernetes_validate.validate(as_node, version, strict=True)
    for version in VERSIONS:
        kubernetes_validate.validate(apiserver.node(NODE), version, strict=True)
        for event in apiserver.core_events.values():
            kubernetes_validate.validate(event, version, strict=True)


def _start(agent_factory: Any, apiserver: Any, tmp_path: Path, scenario: str, *extra: str) -> Any:
    return agent_factory("--backend", "simulated", "--scenario", scenario, "--interval", "200ms",
                         "--kubeconfig", kubeconfig(tmp_path, apiserver), *extra)


def _counts(agent: Any) -> dict[str, float]:
    return {labels["outcome"]: value for labels, value in
            parse_metrics(agent.scrape()).get("l9gpu_kubernetes_node_updates_total", [])}


def _describe(tmp_path: Path, apiserver: Any) -> str | None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    done = subprocess.run([kubectl, "--kubeconfig", kubeconfig(tmp_path, apiserver), "describe", "node", NODE],
                          capture_output=True, text=True, timeout=PATIENCE)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _condition_row(described: str) -> list[str]:
    """The condition's row of ``kubectl describe node``'s Conditions table, split in columns."""
    row = next(line for line in described.splitlines() if line.strip().startswith(CONDITION + " "))
    return [cell.strip() for cell in row.strip().split("   ") if cell.strip()]


def test_the_node_condition_through_remap_restart_reset_xid79_and_a_403(agent_factory, apiserver, tmp_path) -> None:
    apiserver.add_node(NODE, conditions=[READY], taints=[OTHER_TAINT])
    remap = _scenario(tmp_path, "remap", REMAP)

    # 1. A row remap waits for a reset on GPU 4: True, ResetGPU, the message names GPU 4.
    first = _start(agent_factory, apiserver, tmp_path, remap)
    condition = wait_until(lambda: _condition(apiserver), what="the GPU condition on the node")
    assert (condition["status"], condition["reason"]) == ("True", "ResetGPU")
    assert condition["message"].startswith("1 GPU needs more than an application restart: GPU 4 (GPU-")
    assert "row_remap_pending; action reset_gpu; since 20" in condition["message"]
    assert condition["lastTransitionTime"] == condition["lastHeartbeatTime"]
    assert apiserver.node(NODE)["status"]["conditions"][0] == READY  # the kubelet's condition untouched
    assert apiserver.node(NODE)["spec"]["taints"] == [OTHER_TAINT]  # no taint without --node-taint
    described = _describe(tmp_path, apiserver)
    if described is not None:
        columns = _condition_row(described)
        assert columns[:2] == [CONDITION, "True"] and columns[4] == "ResetGPU", columns
        assert "GPU 4 (GPU-" in columns[5]
        assert "Ready" in described and "dedicated=ml:NoSchedule" in described
    wait_until(lambda: _counts(first).get("updated") == 1, what="the write counted")
    assert len(_status_patches(apiserver)) == 1  # unchanged since: no write before the heartbeat
    transition = condition["lastTransitionTime"]

    # 2. The agent restarts (a rollout): the new one re-asserts what it sees, and the
    # condition is not flapped: never False, its lastTransitionTime kept.
    first.stop()
    assert _condition(apiserver)["status"] == "True"  # a clean stop leaves it (no --node-condition-clear-on-exit)
    sent = len(apiserver.node_requests)
    second = _start(agent_factory, apiserver, tmp_path, _scenario(tmp_path, "reset", REMAP_RESET_XID79),
                    "--node-taint", "unhealthy", "--node-heartbeat", "1s")
    [reasserted, *_] = wait_until(lambda: _status_patches(apiserver, sent), what="the restarted agent's write")
    assert (reasserted["status"], reasserted["reason"], reasserted["lastTransitionTime"]) == ("True", "ResetGPU",
                                                                                            transition)
    # --node-taint unhealthy: the node is tainted while the GPU waits for its reset
    taints = wait_until(lambda: len(apiserver.node(NODE)["spec"]["taints"]) == 2 and apiserver.node(NODE)["spec"]["taints"],
                        what="the taint")
    assert taints == [OTHER_TAINT, {"key": TAINT, "effect": "NoSchedule"}]

    # 3. The GPU is reset (the remap applied): False, GPUsHealthy, the taint removed.
    healthy = wait_until(lambda: (c := _condition(apiserver)) and c["status"] == "False" and c,
                         what="the condition False after the reset")
    assert healthy["reason"] == "GPUsHealthy" and healthy["lastTransitionTime"] != transition
    wait_until(lambda: apiserver.node(NODE)["spec"]["taints"] == [OTHER_TAINT], what="the taint removed")
    statuses = [c["status"] for c in _status_patches(apiserver, sent)]
    assert statuses[:statuses.index("False")] == ["True"] * statuses.index("False")  # True until the reset
    recovered = wait_until(lambda: [e for e in apiserver.core_events.values() if e["reason"] == "GPURecovered"],
                           what="the Normal Event on the node")
    assert recovered[0]["type"] == "Normal" and recovered[0]["involvedObject"]["kind"] == "Node"
    assert "GPU 4 (GPU-" in recovered[0]["message"] and "ml-research/llm-finetune-worker-0/trainer" in \
        recovered[0]["message"]

    # 4. Xid 79, the GPU fell off the bus: True, RebootNode; tainted again; a Warning Event
    # on the node naming the workload that held the GPU.
    rebooting = wait_until(lambda: (c := _condition(apiserver)) and c["reason"] == "RebootNode" and c,
                           what="the condition after Xid 79")
    assert rebooting["status"] == "True" and "xid_79" in rebooting["message"] and "GPU 4 (GPU-" in rebooting["message"]
    wait_until(lambda: len(apiserver.node(NODE)["spec"]["taints"]) == 2, what="the taint again")
    [warning] = wait_until(lambda: [e for e in apiserver.core_events.values() if e["reason"] == "GPUUnhealthy"],
                           what="the Warning Event on the node")
    assert warning["type"] == "Warning" and warning["involvedObject"] == {"apiVersion": "v1", "kind": "Node",
                                                                           "name": NODE, "uid": NODE}
    assert warning["metadata"]["namespace"] == "default"
    assert "became unhealthy" in warning["message"] and "llm-finetune-worker-0" in warning["message"]
    described = _describe(tmp_path, apiserver)
    if described is not None:
        assert _condition_row(described)[4] == "RebootNode"
        assert f"{TAINT}:NoSchedule" in described and "GPUUnhealthy" in described.split("Events:")[1]

    # 5. 403 on nodes/status: counted, logged once, said on /healthz and the page; the
    # passes go on; the writes resume when the permission is back.
    apiserver.refuse_nodes(403, "patch_status")
    wait_until(lambda: _counts(second).get("forbidden", 0) >= 2, what="the refused writes counted")
    before = json.loads(second.get("/api/v1/snapshot")[2])["seq"]
    status, _, body = second.get("/healthz")
    assert status == 200 and b"GPU condition is not written" in body and b"403" in body
    assert "GPU condition is not written" in second.get("/")[2].decode()
    wait_until(lambda: json.loads(second.get("/api/v1/snapshot")[2])["seq"] > before + 3,
               what="passes going on")
    [logged] = [line for line in second.log().splitlines() if "updating node" in line]  # logged once
    assert "403 Forbidden" in logged and "patch on nodes/status" in logged and "Traceback" not in second.log()
    apiserver.refuse_nodes(None, "patch_status")
    wait_until(lambda: second.get("/healthz")[2] == b"ok\n", what="the note gone once a write succeeds")
    _validate_all_sent(apiserver)


def test_a_stale_true_left_for_a_healthy_gpu_is_cleared_after_the_settle_time(agent_factory, apiserver,
                                                                               tmp_path) -> None:
    stale = {"type": CONDITION, "status": "True", "reason": "RebootNode", "message": "GPU 4 (GPU-x): xid_79",
             "lastHeartbeatTime": "2026-12-03T07:00:00Z", "lastTransitionTime": "2026-12-03T06:00:00Z"}
    apiserver.add_node(NODE, conditions=[READY, stale], taints=[OTHER_TAINT, {"key": TAINT, "effect": "NoSchedule"}])
    agent = _start(agent_factory, apiserver, tmp_path, _scenario(tmp_path, "healthy", HEALTHY),
                   "--node-taint", "unhealthy", "--node-condition-settle", "3s")
    [held, *_] = wait_until(lambda: _status_patches(apiserver), what="the first write")
    # within the settle time the old True stands (a reason may take several reads to be seen)
    assert (held["status"], held["reason"], held["lastTransitionTime"]) == ("True", "RebootNode",
                                                                            stale["lastTransitionTime"])
    cleared = wait_until(lambda: (c := _condition(apiserver)) and c["status"] == "False" and c,
                         what="the stale condition cleared")
    assert cleared["reason"] == "GPUsHealthy"
    assert datetime.fromisoformat(cleared["lastTransitionTime"].replace("Z", "+00:00")) > \
        datetime.fromisoformat(stale["lastTransitionTime"].replace("Z", "+00:00"))
    wait_until(lambda: apiserver.node(NODE)["spec"]["taints"] == [OTHER_TAINT], what="the stale taint removed")
    assert [c["type"] for c in apiserver.node(NODE)["status"]["conditions"]] == ["Ready", CONDITION]
    assert _counts(agent)["forbidden"] == 0
    _validate_all_sent(apiserver)


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="kubectl is not installed (Debian package kubernetes-client; make system-deps)")
def test_kubectl_describe_node_prints_the_condition_the_taint_and_the_events(apiserver, tmp_path) -> None:
    """kubectl itself reads the node back from the fake API server, as an operator would."""
    import functools

    from exporter.core.model import DeviceSample, ProcessRow, Snapshot, Workload
    from exporter.health import Reason, Verdict
    from exporter.incidents.events import EventSink, default_api_factory
    from exporter.nodestatus.writer import NodeStatusWriter, Taint

    apiserver.add_node(NODE, conditions=[READY])
    factory = functools.partial(default_api_factory, kubeconfig(tmp_path, apiserver))
    events = EventSink(factory, NODE)
    writer = NodeStatusWriter(factory, NODE, taint=Taint(), events=events)
    trainer = Workload(kind="kubernetes", namespace="ml-research", pod="llm-finetune-worker-0", container="trainer")
    devices = tuple(DeviceSample(index=i, uuid=f"GPU-{i}") for i in range(8))

    def snap(seq: int, verdict: Verdict) -> Snapshot:
        health = {d.key: Verdict("healthy", "none", ()) for d in devices} | {"GPU-4": verdict}
        return Snapshot(seq=seq, node=NODE, timestamp=1_790_000_000.0 + seq, devices=devices, verdicts=health,
                        processes=(ProcessRow("GPU-4", 52001, "python3", trainer, 1, None),))

    try:
        writer.observe(snap(1, Verdict("healthy", "none", ())))
        writer.observe(snap(2, Verdict("unhealthy", "reboot_node", (Reason("xid_79", "reboot_node", "off the bus"),))))
        wait_until(lambda: len(apiserver.node(NODE)["spec"]["taints"]) == 1 and apiserver.core_events,
                   what="the condition, the taint and the Event")
        wait_until(lambda: (c := _condition(apiserver)) and c["reason"] == "RebootNode", what="the condition")
    finally:
        writer.close(timeout=PATIENCE)
        events.close(timeout=PATIENCE)
    described = _describe(tmp_path, apiserver)
    assert described is not None
    columns = _condition_row(described)
    assert columns[:2] == [CONDITION, "True"] and columns[4] == "RebootNode", columns
    assert columns[5].startswith("1 GPU needs more than an application restart: GPU 4 (GPU-4): xid_79; action "
                                 "reboot_node; since 2026-09-21T14:13:22")
    assert f"Taints:             {TAINT}:NoSchedule" in described
    events_part = described.split("Events:")[1]
    assert "Warning" in events_part and "GPUUnhealthy" in events_part and "llm-finetune-worker-0" in events_part


def test_node_condition_off_writes_nothing(agent_factory, apiserver, tmp_path) -> None:
    apiserver.add_node(NODE, conditions=[READY])
    agent = _start(agent_factory, apiserver, tmp_path, _scenario(tmp_path, "remap", REMAP), "--node-condition", "off")
    wait_until(lambda: "gpu_health" in agent.scrape(), what="a pass")
    assert apiserver.node_requests == [] and "l9gpu_kubernetes_node_updates_total" not in agent.scrape()
