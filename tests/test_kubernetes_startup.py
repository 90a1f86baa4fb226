"""The agent and a Kubernetes API server that hangs or answers garbage: start-up never
waits on it, and a malformed pod list is a failure of the ``kubernetes`` collector.

The agent runs as a subprocess on the NVML fake (tests/fakes/nvml_node.py) with a real
GPU process in a real pod cgroup, against the local API server (tests/fakes/kubernetes_apiserver.py).
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")

from agent import pick  # noqa: E402
from cgroup_helpers import cgroup2_unwritable  # noqa: E402
from fakes.nvml_node import NODE, GiB, Node  # noqa: E402
from waiting import wait_until  # noqa: E402

from exporter.attribution.kubernetes import REQUEST_TIMEOUT  # noqa: E402

pytestmark = pytest.mark.skipif(bool(cgroup2_unwritable()), reason=cgroup2_unwritable() or "ok")


@pytest.fixture
def node(fake_nvml_node):
    return fake_nvml_node


def _kubernetes_success(node: Node) -> list[float]:
    return pick(node.agent.samples(), "l9gpu_collector_success", collector="kubernetes")


def test_endpoints_listen_while_the_api_server_hangs(node: Node) -> None:
    """The API server accepts the pod list and never answers: the agent listens, is live
    and ready, and serves its GPU process by pod UID with the kubernetes collector down;
    names come once the server answers. (Nothing listened until the list gave up, 41 s.)"""
    node.apiserver.stall()
    child = node.add_gpu_process("trainer")
    started = time.monotonic()
    agent = node.start(wait_ready=False)
    wait_until(lambda: _answers(agent, "/healthz"), what="/healthz answering")
    listening = time.monotonic() - started
    # before the list could time out even once (the client then retries it three times)
    assert listening < REQUEST_TIMEOUT, listening
    wait_until(lambda: _answers(agent, "/readyz"), what="/readyz answering")
    assert node.apiserver.held >= 1  # the list was asked for, and is held unanswered
    wait_until(lambda: _kubernetes_success(node) == [0.0], what="the kubernetes collector reported down")
    metrics = agent.samples()
    by_uid = [lab for lab, _ in metrics["container_gpu_memory_used_bytes"] if lab.get("pod_uid")]
    assert len(by_uid) == 1 and by_uid[0]["pod"] == ""
    node.apiserver.resume()
    wait_until(lambda: node.pod_memory("trainer") == [1 * GiB], what="the pod named once the server answers")
    wait_until(lambda: _kubernetes_success(node) == [1.0], what="the kubernetes collector up")
    assert child.poll() is None


def test_a_malformed_pod_list_fails_the_kubernetes_collector_and_keeps_the_names(node: Node) -> None:
    """A relist answered 200 with ``"items": "x"``: l9gpu_collector_success{collector=
    "kubernetes"} turns 0, the log says why, and the pod keeps the name the last good list
    gave it (it silently emptied the index, success staying 1)."""
    node.add_gpu_process("embedder")
    agent = node.start()
    wait_until(lambda: node.pod_memory("embedder") == [1 * GiB], what="the pod named")
    assert _kubernetes_success(node) == [1.0]
    node.apiserver.garble('{"kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": "x"}')
    node.apiserver.expire()  # the resumed watch gets 410 Gone: the agent lists again
    wait_until(lambda: _kubernetes_success(node) == [0.0], what="the kubernetes collector reported down")
    wait_until(lambda: "pod list items is a JSON str, not a list" in agent.log(), what="the reason logged")
    assert node.pod_memory("embedder") == [1 * GiB]
    assert "Traceback" not in agent.log()
    node.apiserver.garble(None)
    wait_until(lambda: _kubernetes_success(node) == [1.0], what="the kubernetes collector up again")


def test_text_from_the_api_server_reaches_the_log_escaped(node: Node) -> None:
    """A watch event whose type a hostile or broken API server filled with a newline, a
    forged log line and terminal controls: the agent's log line says what it ignored,
    on one line, with every control character a visible escape."""
    node.add_gpu_process("embedder")
    agent = node.start()
    wait_until(lambda: node.pod_memory("embedder") == [1 * GiB], what="the pod named")
    forged = "2026-12-01 00:00:00,000 ERROR l9gpu: GPU 0 fell off the bus"
    kind = f"ADDED\n{forged}\x1b]0;owned\x07\u202e"
    node.apiserver.send_event(kind, {"metadata": {"name": "no-uid"}, "spec": {"nodeName": NODE}})
    wait_until(lambda: "watch event without a pod UID" in agent.log(), what="the event logged")
    log = agent.log()
    said = [line for line in log.splitlines() if "watch event without a pod UID" in line]
    assert len(said) == 1
    assert f"ignored a ADDED\\x0a{forged}\\x1b]0;owned\\x07\\u202e watch event" in said[0]
    assert not any(line.startswith(forged) for line in log.splitlines())
    assert not {"\x1b", "\x07", "\u202e"} & set(log)
    assert node.pod_memory("embedder") == [1 * GiB]  # the watch goes on


def _answers(agent, path: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        return agent.get(path)[0] == 200
    except OSError:
        return False
