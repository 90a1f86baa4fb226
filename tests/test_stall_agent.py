"""The training scenario's wedge end to end: the agent (``l9gpu serve --scenario training``)
calls the wedged ranks' GPUs stalled after --stall-after and says so everywhere: /metrics,
/api/v1/snapshot, /api/v1/incidents, OTLP log records, the page in a real browser, and
``l9gpu snapshot --incidents-from``. The odd rank (5) idles: it is no stall, it is the lead."""

from __future__ import annotations

import json

import pytest
from agent import parse_metrics, run_cli
from browser import dump_dom
from waiting import wait_until

STALL_AFTER = 3.0
# the job wedges 2 s into the scenario; ranks 0-7 of llama-pretrain on GPUs 0-7, rank 5 the odd one
ENV = {"L9GPU_TRAINING_WEDGE_AT": "2s"}
ARGS = ("--backend", "simulated", "--scenario", "training", "--interval", "250ms", "--stall-after", f"{STALL_AFTER:g}s")
WEDGED = [0, 1, 2, 3, 4, 6, 7]


def _incidents(agent) -> list[dict]:
    return json.loads(agent.get("/api/v1/incidents")[2])["incidents"]


def _stalled(agent) -> list[dict]:
    items = [i for i in _incidents(agent) if i["kind"] == "stalled"]
    return items if len(items) == len(WEDGED) else []


@pytest.fixture
def otlp_receiver():
    from fakes.otlp_receivers import HttpReceiver

    receiver = HttpReceiver().start()
    yield receiver
    receiver.stop()


def test_the_wedged_ranks_are_stalled_on_every_surface_and_the_odd_rank_is_not(agent_factory, otlp_receiver):
    agent = agent_factory(*ARGS, "--otlp-endpoint", otlp_receiver.endpoint, "--otlp-protocol", "http/protobuf",
                          "--otlp-interval", "1h", env=ENV)
    incidents = wait_until(lambda: _stalled(agent), what="the wedged ranks' stalls")
    assert sorted(i["gpu"] for i in incidents) == WEDGED
    for incident in incidents:
        [who] = incident["affected"]
        assert (who["namespace"], who["pod"], who["owner_kind"]) == (
            "batch", f"llama-pretrain-worker-{incident['gpu']}", "PyTorchJob")
        assert (who["training_job"], who["training_rank"]) == ("llama-pretrain", f"worker-{incident['gpu']}")
        assert incident["declared"] - incident["began"] >= STALL_AFTER and incident["ended"] is None
        assert incident["signals"]["tensor_active"] == 0.0 and incident["signals"]["utilization"] == 1.0
        assert incident["signals"]["power_ratio"] <= 0.35 and incident["action"] == "restart_app"
    # /metrics: one gpu_stalled per GPU, container_gpu_stalled per rank
    metrics = parse_metrics(agent.scrape())
    assert {labels["gpu"]: v for labels, v in metrics["gpu_stalled"]} == {
        str(g): float(g in WEDGED) for g in range(8)}
    assert {labels["pod"]: v for labels, v in metrics["container_gpu_stalled"]} == {
        f"llama-pretrain-worker-{g}": float(g in WEDGED) for g in range(8)}
    assert all(v >= STALL_AFTER for labels, v in metrics["gpu_stalled_seconds_total"] if int(labels["gpu"]) in WEDGED)
    # /api/v1/snapshot: each GPU's stall object; rank 5 is judged and not stalled (no kernel resident)
    gpus = {g["index"]: g for g in json.loads(agent.get("/api/v1/snapshot")[2])["gpus"]}
    assert {i: g["stall"]["state"] for i, g in gpus.items()} == {
        i: "stalled" if i in WEDGED else "clear" for i in range(8)}
    assert gpus[3]["stall"]["headline"].startswith("GPU 3 busy with no work for ")
    assert gpus[3]["stall"]["headline"].endswith(": batch/llama-pretrain-worker-3 (job llama-pretrain, rank worker-3)")
    assert gpus[3]["stall"]["holders"] == [{"owner": "batch/llama-pretrain-worker-3 (job llama-pretrain, rank worker-3)",
                                            "training_job": "llama-pretrain", "training_rank": "worker-3"}]
    assert "utilisation 0%" in gpus[5]["stall"]["why_not"]
    # OTLP: one warning record per stalled rank, with its pod's attributes
    records = otlp_receiver.wait_for_logs(len(WEDGED))
    stalls = [r for r in records if r["attributes"].get("l9gpu.incident.kind") == "stalled"]
    assert sorted(r["attributes"]["k8s.pod.name"] for r in stalls) == [f"llama-pretrain-worker-{g}" for g in WEDGED]
    assert {r["attributes"]["l9gpu.incident.id"] for r in stalls} == {i["id"] for i in incidents}
    assert all("busy with no work" in r["body"] and r["severity_text"] == "WARN" for r in stalls)
    # the log says it once per GPU, as a warning
    lines = [line for line in agent.log_path.read_text().splitlines() if "GPU stall:" in line]
    assert len(lines) == len(WEDGED) and all("WARNING" in line for line in lines)
    # l9gpu snapshot reads the agent's stalls and incidents (its own pass plays the scenario wedged from its start)
    result = run_cli(["snapshot", "--backend", "simulated", "--scenario", "training", "--incidents-from", agent.url],
                     env={"L9GPU_TRAINING_WEDGE_AT": "0s"})
    assert result.returncode == 0, result.stderr
    look = result.stdout[result.stdout.index("needs a look:"):]
    assert "stalled: GPU 0 busy with no work for" in look and "(job llama-pretrain, rank worker-0)" in look
    assert "idle holder: batch/llama-pretrain-worker-5/pytorch" in look
    assert sum(" stalled " in line for line in result.stdout.splitlines() if "ago" in line) == len(WEDGED)


def test_the_page_in_a_browser_shows_the_stall_banner(agent_factory, tmp_path):
    agent = agent_factory(*ARGS, env=ENV)
    wait_until(lambda: _stalled(agent), what="the wedged ranks' stalls")
    result = dump_dom(agent.url + "/", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    attention = result.stdout[result.stdout.index('<ul class="attention">'):].split("</ul>")[0]
    banner = [line for line in attention.split("<li") if "<b>stalled</b>" in line]
    assert len(banner) == len(WEDGED)
    assert any("GPU 6 busy with no work for" in line and
               "batch/llama-pretrain-worker-6 (job llama-pretrain, rank worker-6)" in line for line in banner)
    assert not any("GPU 5 busy" in line for line in banner)
    panel = result.stdout[result.stdout.index('<section class="incidents">'):].split("</section>")[0]
    assert panel.count('data-kind="stalled"') == len(WEDGED)


def test_stall_after_off_serves_no_stall_families_and_no_stall_objects(agent_factory):
    agent = agent_factory("--backend", "simulated", "--scenario", "training", "--interval", "250ms",
                          "--stall-after", "off", env=ENV)
    wait_until(lambda: json.loads(agent.get("/api/v1/snapshot")[2]).get("seq", 0) >= 3, what="three passes")
    metrics = parse_metrics(agent.scrape())
    assert not {"gpu_stalled", "gpu_stalled_seconds_total", "container_gpu_stalled"} & set(metrics)
    assert all("stall" not in g for g in json.loads(agent.get("/api/v1/snapshot")[2])["gpus"])


def test_a_bad_stall_after_is_one_line() -> None:
    result = run_cli(["serve", "--backend", "simulated", "--stall-after", "soon"])
    assert result.returncode == 2
    assert "--stall-after" in result.stderr and "duration such as 5m" in result.stderr
    assert "Traceback" not in result.stderr
