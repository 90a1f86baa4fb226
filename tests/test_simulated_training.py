"""The simulated training job (``--scenario training``, `make demo-training`): its ranks'
phases, the environment that plays other nodes of the job, and the demo's promise that the
page names the stalled GPUs within the stall time it sets (played on a fake clock)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter.collect.collector import Collector
from exporter.devices.simulated.backend import ScenarioError, SimulatedBackend, load_scenario, parse_scenario
from exporter.devices.simulated.training import with_environment
from exporter.output.snapshot_json import snapshot_document
from exporter.stall import parse_stall_after
from exporter.stall.watch import StallWatch
from exporter.web.page import render_main, with_stalls

REPO = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _backend(monkeypatch, **env: str) -> tuple[SimulatedBackend, Clock]:
    for name in ("L9GPU_TRAINING_NODE", "L9GPU_TRAINING_RANKS", "L9GPU_TRAINING_ODD_RANK",
                 "L9GPU_TRAINING_THROTTLED_GPU", "L9GPU_TRAINING_WEDGE_AT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    clock = Clock()
    backend = SimulatedBackend("training", clock=clock)
    backend.open()
    return backend, clock


def test_the_ranks_compute_checkpoint_evaluate_then_all_but_the_odd_one_wedge(monkeypatch) -> None:
    backend, clock = _backend(monkeypatch)
    assert backend.node_name() == "sim-train-01"
    seen = {}
    for t in (5, 40, 90, 102, 125):
        clock.t = t
        samples = backend.sample(t)
        seen[t] = samples
    assert [d.utilization for d in seen[5]] == [0.98] * 8  # compute
    assert [d.utilization for d in seen[40]] == [0.0] * 8  # checkpoint: no kernel
    assert 0.3 < seen[102][0].utilization < 0.6  # evaluation
    wedged = seen[125]
    assert [d.utilization for d in wedged] == [1.0] * 5 + [0.0] + [1.0] * 2  # rank 5 idles
    assert wedged[0].gpm["tensor_active"] == 0.0 and wedged[0].power_watts / wedged[0].power_limit_watts < 0.3
    assert wedged[0].gpm["pcie_tx_bytes_per_second"] == 0.0
    assert wedged[5].memory_used_bytes > 70 * 2**30  # the odd rank still holds its memory


def test_the_environment_plays_another_node_of_the_job(monkeypatch) -> None:
    backend, clock = _backend(monkeypatch, L9GPU_TRAINING_NODE="gpu-b", L9GPU_TRAINING_RANKS="8-15",
                              L9GPU_TRAINING_ODD_RANK="13", L9GPU_TRAINING_THROTTLED_GPU="2",
                              L9GPU_TRAINING_WEDGE_AT="10s")
    assert backend.node_name() == "gpu-b"
    scenario = backend.scenario
    assert scenario is not None
    pods = [p.workload["pod"] for p in scenario.processes]
    assert pods == [f"llama-pretrain-worker-{r}" for r in range(8, 16)]
    assert scenario.processes[0].workload["labels"] == {
        "training.kubeflow.org/job-name": "llama-pretrain", "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "8"}
    clock.t = 5
    computing = backend.sample(5)
    hot = computing[2]
    assert hot.throttle_reasons["hw_thermal_slowdown"] and hot.sm_clock_hertz < computing[0].sm_clock_hertz
    clock.t = 12
    wedged = backend.sample(12)
    assert wedged[5].utilization == 0.0 and wedged[4].utilization == 1.0  # rank 13 is GPU 5 here


@pytest.mark.parametrize("block,message", [
    ({"ranks": "0-8"}, "expected 1 to 8 distinct ranks"),
    ({"ranks": "a-b"}, "expected ranks like 0-7"),
    ({"throttled_gpu": 9}, "throttled_gpu: expected a GPU index 0-7"),
    ({"odd_rank": "five"}, "odd_rank: expected a whole number or none"),
    ({"phases": []}, "phases: expected a list"),
    ({"phases": [{"for": "10s", "utilization": 1.5}]}, "are ratios 0-1"),
])
def test_a_bad_training_block_is_one_line_naming_the_field(block, message) -> None:
    doc = {"gpus": {"count": 8}, "training": {"phases": [{"for": "10s", "utilization": 0.9}], **block}}
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(doc, "s.yaml")


def test_the_environment_only_touches_a_scenario_with_a_training_block() -> None:
    plain = {"gpus": {"count": 1}, "node": "n"}
    assert with_environment(plain, {"L9GPU_TRAINING_NODE": "x"}) is plain
    assert load_scenario("default").node == "sim-node-01"


def _demo_stall_after() -> float:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(["make", "-n", "-C", str(REPO), "demo-training"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    [command] = [line for line in dry.stdout.splitlines() if "l9gpu serve" in line]
    assert "--scenario training" in command
    stall_after = parse_stall_after(re.search(r"--stall-after (\S+)", command).group(1))
    assert stall_after is not None
    return stall_after


def test_make_demo_training_names_the_stalled_gpus_within_the_stall_time_it_sets(monkeypatch) -> None:
    stall_after = _demo_stall_after()
    backend, clock = _backend(monkeypatch)
    collector = Collector([backend], "sim-train-01", clock=clock, wall=clock)
    watch = StallWatch("sim-train-01", stall_after)
    wedge_at = 120.0  # the scenario's
    banner_at = None
    while clock.t <= wedge_at + stall_after + 5:
        snap = collector.collect_once()
        watch.observe(snap)
        page = render_main(with_stalls(snapshot_document(snap), watch.gpu_entries()))
        if "<b>stalled</b>" in page and banner_at is None:
            banner_at = clock.t
            assert page.count("<b>stalled</b>") == 7 and "GPU 5 busy" not in page
        clock.t += 1.0
    assert banner_at is not None and wedge_at + stall_after <= banner_at <= wedge_at + stall_after + 1
    collector.stop()
