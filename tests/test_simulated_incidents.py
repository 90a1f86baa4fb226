"""The incidents scenario (``--scenario incidents``, `make demo-incidents`) through the real
pipeline: the simulated node's GPUs, its kubelet, the collector, its kernel log and the
incident watch, pass after pass on a clock the test moves."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest
import yaml
from waiting import wait_until

from exporter.attribution import build_attributor
from exporter.collect.collector import Collector
from exporter.core.labels import label_schema
from exporter.devices.simulated.backend import DEFAULT_SCENARIO, ScenarioError, SimulatedBackend, parse_scenario
from exporter.incidents.engine import IncidentConfig, IncidentTracker
from exporter.incidents.simulated import scenario_kernel_log
from exporter.incidents.watch import IncidentWatch

GIB = 2**30


class JournalNode:
    """The simulated node's kernel log kept by journald: each of the scenario's Xid lines,
    once its time has come, written to a journal file by systemd-journal-remote (as a
    kernel record, stamped on the node's clock) and read back by the journal reader."""

    def __init__(self, backend: SimulatedBackend, directory: Path):
        from journal_helpers import append_entries, kernel_entry

        from exporter.incidents.journal import JournalKernelLog

        self._append, self._entry = append_entries, kernel_entry
        self.backend, self.path, self.next = backend, directory / "system.journal", 0
        append_entries(self.path, [kernel_entry("Linux version 6.8.0 (the node boots)", backend.start_time())])
        self.reader = JournalKernelLog(str(directory))

    def poll(self) -> list:
        due = [self._entry(line.text, line.at) for line in self.backend.kernel_lines(self.next)]
        self.next += len(due)
        if due:
            self._append(self.path, due)
        return self.reader.poll()

    def counts(self) -> dict:
        return self.reader.counts()

    def close(self) -> None:
        self.reader.close()


def play(scenario: str | None, seconds: float, step: float = 1.0, kernel_log: bool = True,
         journal: Path | None = None) -> list[dict]:
    """Run the node for ``seconds`` of its time, a pass every ``step``; the incidents, oldest
    first. The kernel log is the node's own, or (``journal``) kept in a journal there."""
    now = [1000.0]
    backend = SimulatedBackend(scenario, clock=lambda: now[0])
    backend.open()
    node = backend.node_name()
    attributor = build_attributor(argparse.Namespace(), node, scenario=backend.scenario)
    names, labeller = label_schema(["team"])
    collector = Collector([backend], node, attributor=attributor, labeller=labeller, clock=lambda: now[0])
    config = IncidentConfig(xid_hold=2.0 if kernel_log else 0.0)
    source = None  # the node's own kernel log, as --kernel-log auto reads it there, or the journal's
    if kernel_log:
        source = JournalNode(backend, journal) if journal is not None else scenario_kernel_log(backend)
    watch = IncidentWatch(node, labeller, names, tracker=IncidentTracker(node, config),
                          kernel_log=source, clock=lambda: now[0])
    try:
        while now[0] - 1000.0 <= seconds:
            watch.observe(collector.collect_once())
            now[0] += step
    finally:
        attributor.close()
        watch.close()
    return list(reversed(watch.recent_json()))


def owners(workloads: list[dict]) -> list[str]:
    return [w["owner"] for w in workloads]


@pytest.fixture(scope="module")
def incidents() -> list[dict]:
    return play("incidents", 130)


def test_each_story_plays_the_same_with_the_kernel_log_kept_in_the_journal(incidents, tmp_path):
    from journal_helpers import journal_unavailable

    if journal_unavailable():
        pytest.skip(journal_unavailable())
    from_journal = play("incidents", 130, journal=tmp_path)

    def story(i: dict) -> tuple:
        return (i["kind"], i["gpu"], i["xid"], owners(i["caused_by"]), sorted(owners(i["affected"])),
                i["cause_basis"], i["action"], i["detail"])

    assert [story(i) for i in from_journal] == [story(i) for i in incidents]
    assert [i["cause_basis"] for i in from_journal] == ["kernel_log", "memory_growth", None, None, None]


def test_the_incidents_scenario_plays_each_story_once_in_its_order(incidents):
    assert [(i["kind"], i["gpu"], i["xid"]) for i in incidents] == [
        ("xid", 1, 31), ("memory_exhausted", 2, None), ("xid", 3, 79), ("gpu_lost", 3, None), ("xid", 1, 119)]


def test_a_trainer_fills_gpu_2_and_the_notebook_that_exits_is_hurt(incidents):
    [full] = [i for i in incidents if i["kind"] == "memory_exhausted"]
    assert owners(full["affected"]) == ["data-science/jupyter-alice-0/notebook"]
    assert owners(full["caused_by"]) == ["ml-research/llm-finetune-worker-0/trainer"]
    # 6 GiB a minute from 70 GiB: under 1.6 GiB free (2% of 80 GiB) from the pass at 60 s, grown 6 GiB by then
    assert "grew 6.0 GiB over the minute before" in full["detail"] and full["action"] == "restart_app"
    assert full["cause_known"] is True


def test_xid_31_names_the_pod_whose_process_raised_it(incidents):
    [xid] = [i for i in incidents if i["xid"] == 31]
    assert owners(xid["caused_by"]) == ["batch/embed-backfill-7x9zq/worker"] and xid["affected"] == []
    assert "pid 45001 (python3)" in xid["detail"] and xid["action"] == "restart_app"


def test_xid_79_on_the_time_shared_gpu_hurts_all_three_pods_and_blames_none(incidents):
    [xid] = [i for i in incidents if i["xid"] == 79]
    assert xid["caused_by"] == [] and xid["cause_known"] is False
    assert sorted(owners(xid["affected"])) == ["docs/ocr-worker-66f7d-klmno/ocr",
                                               "search/embedder-7c9f5-abcde/embedder",
                                               "search/reranker-5b8d4-fghij/reranker"]
    assert xid["action"] == "reboot_node"
    # the driver then answers every call about GPU 3 with GPU_IS_LOST: the GPU is lost, the same pods hurt
    [lost] = [i for i in incidents if i["kind"] == "gpu_lost"]
    assert (lost["gpu"], lost["action"], lost["caused_by"]) == (3, "reboot_node", [])
    assert sorted(owners(lost["affected"])) == sorted(owners(xid["affected"]))


def test_each_incident_is_one_log_line_naming_it_once(caplog):
    caplog.set_level(logging.WARNING, logger="l9gpu.incidents")
    play("incidents", 95)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("GPU incident: ")]
    assert [line.split(" on GPU ")[0] for line in lines] == [
        "GPU incident: Xid 31", "GPU incident: memory_exhausted", "GPU incident: Xid 79", "GPU incident: gpu_lost"]
    assert not any("xid Xid" in line for line in lines)


def test_xid_119_naming_nvidia_smi_blames_no_one(incidents):
    [xid] = [i for i in incidents if i["xid"] == 119]
    assert xid["caused_by"] == [] and owners(xid["affected"]) == ["batch/embed-backfill-7x9zq/worker"]
    assert "nvidia-smi" in xid["detail"] and "not a cause" in xid["detail"]


def test_without_the_kernel_log_xid_31_names_the_pod_that_alone_held_the_gpu():
    incidents = play("incidents", 40, kernel_log=False)
    [xid] = [i for i in incidents if i["kind"] == "xid"]
    assert (xid["xid"], owners(xid["caused_by"]), xid["cause_known"], xid["cause_basis"]) == (
        31, ["batch/embed-backfill-7x9zq/worker"], True, "sole_holder")
    assert "from NVML; batch/embed-backfill-7x9zq/worker alone held the GPU then" in xid["detail"]


def test_a_vllm_pod_keeping_its_gpu_full_for_an_hour_raises_nothing(tmp_path):
    # vLLM at 92% (the scenario's GPU 0), and over the "full" line (0.4 GiB free): no exit, no drop
    doc = yaml.safe_load((DEFAULT_SCENARIO.parent / "incidents.yaml").read_text())
    doc["processes"] = [p for p in doc["processes"] if p["name"] == "vllm"]
    doc["processes"].append({**doc["processes"][0], "gpus": [1], "pid": 41101, "memory_gib": 79.1})
    doc["xids"] = []
    path = tmp_path / "vllm.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert play(str(path), 3600, step=15) == []


def test_the_default_demo_node_raises_no_incident_in_its_first_minutes():
    assert play(None, 180, step=2) == []


@pytest.mark.parametrize("entry, match", [
    ({"xids": [{"at": "soon", "gpu": 0, "xid": 31}]}, r"xids\[0\]\.at"),
    ({"xids": [{"at": 1, "gpu": 9, "xid": 31}]}, r"xids\[0\]\.gpu: expected a GPU index 0-3"),
    ({"xids": [{"at": 1, "gpu": 0, "xid": "31"}]}, r"xids\[0\]\.xid"),
    ({"xids": [{"at": 1, "gpu": 0, "xid": 31, "when": 2}]}, r"unknown field 'when'"),
    ({"processes": [{"gpus": [0], "memory_gib": 1, "from": 60, "until": 30}]}, "until must come after from"),
    ({"processes": [{"gpus": [0], "memory_gib": 50, "until": "1m"}, {"gpus": [0], "memory_gib": 40, "from": 30}]},
     "can use more memory than it has"),
])
def test_bad_incident_fields_name_the_field(entry, match):
    doc = {"gpus": {"count": 4}, "processes": [], **entry}
    with pytest.raises(ScenarioError, match=match):
        parse_scenario(doc, "s.yaml")


def test_a_process_that_exits_before_another_starts_may_use_the_same_memory():
    doc = {"gpus": {"count": 1}, "processes": [{"gpus": [0], "memory_gib": 50, "until": "1m"},
                                               {"gpus": [0], "pid": 9000, "memory_gib": 50, "from": "1m"}]}
    scenario = parse_scenario(doc, "s.yaml")
    assert [(p.start, p.end) for p in scenario.processes] == [(0.0, 60.0), (60.0, float("inf"))]


def test_the_demo_agent_reads_the_scenarios_kernel_log_with_kernel_log_auto(agent_factory, caplog):
    agent = agent_factory("--backend", "simulated", "--scenario", "incidents", "--kernel-log", "auto",
                          "--interval", "500ms")
    caplog.set_level(logging.INFO)

    def first() -> list:
        return json.loads(agent.get("/api/v1/incidents")[2])["incidents"]

    [xid] = wait_until(first, what="the scenario's Xid 31 at 30 s", timeout=120)
    assert (xid["xid"], owners(xid["caused_by"]), xid["node"]) == (31, ["batch/embed-backfill-7x9zq/worker"],
                                                                   "sim-incidents-01")
    assert agent.log().count("--kernel-log auto: reading the kernel log from the simulated node's scenario") == 1


def test_kernel_log_auto_on_the_simulated_node_says_once_which_log_it_reads(caplog):
    from exporter.app.cli import build_parser
    from exporter.app.wiring import build_incident_watch

    backend = SimulatedBackend("incidents")
    backend.open()
    args = build_parser().parse_args(["serve", "--backend", "simulated", "--scenario", "incidents",
                                      "--kernel-log", "auto"])
    caplog.set_level(logging.INFO)
    watch = build_incident_watch(args, None, [backend])
    watch.close()
    said = [r.getMessage() for r in caplog.records if "--kernel-log" in r.getMessage()]
    assert said == ["--kernel-log auto: reading the kernel log from the simulated node's scenario (sim-incidents-01)"]


def test_after_xid_79_the_simulated_driver_answers_for_that_gpu_as_a_lost_one():
    from exporter.core.model import Snapshot
    from exporter.output.render import families

    now = [1000.0]
    backend = SimulatedBackend("incidents", clock=lambda: now[0])
    backend.open()
    before = {d.index: d for d in backend.sample(now[0] + 89)}
    assert before[3].up and before[3].processes and backend.errors() == {}
    now[0] += 91
    after = {d.index: d for d in backend.sample(now[0])}
    lost = after[3]
    assert (lost.up, lost.error, lost.processes, lost.utilization, lost.memory_used_bytes) == (
        False, "GPU is lost", (), None, None)
    assert lost.health_signals is not None and lost.health_signals.gpu_lost and dict(lost.xid_errors) == {"79": 1}
    assert (lost.uuid, lost.model, lost.pci_bus_id) == (before[3].uuid, before[3].model, before[3].pci_bus_id)
    assert all(after[i].up for i in (0, 1, 2)) and backend.errors() == {"gpu_lost": 1}
    # its Xid count stays on /metrics while it is down (the alert on Xids sees Xid 79)
    snapshot = Snapshot(seq=1, node="n", timestamp=0.0, devices=(lost,))
    [xids] = list(families(snapshot, frozenset({"gpu_xid_errors_total"})))
    assert [(s.labels["gpu"], s.labels["xid"], s.value) for s in xids.samples if s.name.endswith("_total")] == [
        ("3", "79", 1.0)]
