"""The simulated node's kubelet: which pod was allocated which GPU, through the real join."""

import argparse

import pytest

from exporter.attribution.simulated import pod_uid, scenario_allocations
from exporter.collect.collector import Collector
from exporter.core.labels import label_schema
from exporter.devices.simulated.backend import ScenarioError, SimulatedBackend, load_scenario, parse_scenario


def test_default_scenario_allocates_each_pod_its_gpus_and_reserves_gpu_7():
    scenario = load_scenario()
    uuid = {g.index: g.uuid for g in scenario.gpus}
    got = {(a.pod, a.container, a.device_id) for a in scenario_allocations(scenario)}
    assert ("vllm-llama3-70b-6d8b94df7-q5z82", "inference-engine", uuid[0]) in got
    assert ("vllm-llama3-70b-6d8b94df7-q5z82", "inference-engine", uuid[1]) in got
    assert {d for p, _, d in got if p == "llm-finetune-worker-0"} == {uuid[i] for i in (2, 3, 4, 5)}
    # GPU 6 is time-sliced between four pods: one replica each; the Slurm step is no pod
    assert sorted(d for _, _, d in got if d.startswith(uuid[6])) == [f"{uuid[6]}::{n}" for n in range(4)]
    assert ("idle-reservation-0", "trainer", uuid[7]) in got
    assert not any(d.startswith(uuid[1] + "::") for _, _, d in got)  # GPU 1's host process is no pod


def test_the_idle_reservation_has_series_with_its_pod_identity_and_gpu_7_stays_idle():
    now = [100.0]
    backend = SimulatedBackend(clock=lambda: now[0])
    backend.open()
    from exporter.attribution import build_attributor

    attributor = build_attributor(argparse.Namespace(), "sim-node-01", scenario=backend.scenario)
    names, labeller = label_schema(["team"])
    collector = Collector([backend], "sim-node-01", attributor=attributor, labeller=labeller, clock=lambda: now[0])
    try:
        collector.collect_once()
        now[0] += 30
        snap = collector.collect_once()
        gpu7 = next(d for d in snap.devices if d.index == 7)
        assert gpu7.processes == () and gpu7.utilization == 0.0
        [row] = [u for u in snap.workloads if u.device_key == gpu7.key]
        labels = dict(zip(("node", "gpu", "uuid", "model", "gpu_instance", "namespace", "pod", "container",
                           "pod_uid", "slurm_job_id") + names, row.labels))
        assert (labels["namespace"], labels["pod"], labels["container"], labels["pod_uid"], labels["owner_kind"],
                labels["owner_name"], labels["label_team"]) == (
            "ml-research", "idle-reservation-0", "trainer", pod_uid("ml-research", "idle-reservation-0"),
            "StatefulSet", "idle-reservation", "research")
        assert (row.allocated, row.processes, row.memory_used_bytes, row.utilization) == (True, 0, 0, 0.0)
        assert row.idle_seconds == 30.0 and row.allocation_seconds_total == 30.0
        assert dict(c for c in ((s.name, s.success) for s in snap.collectors))["pod_resources"] is True
        # the Slurm step on GPU 6 carries its user and account, for chargeback by either
        jobs = [dict(zip(("node", "gpu", "uuid", "model", "gpu_instance", "namespace", "pod", "container",
                          "pod_uid", "slurm_job_id") + names, u.labels)) for u in snap.workloads]
        [job] = [j for j in jobs if j["slurm_job_id"] == "4242"]
        assert (job["slurm_user"], job["slurm_account"], job["namespace"]) == ("bob", "nlp-lab", "")
    finally:
        attributor.close()


@pytest.mark.parametrize("entry,match", [
    ("not a mapping", r"allocations\[0\]: expected a mapping"),
    ({"gpus": [9], "workload": {"pod": "p"}}, r"allocations\[0\]\.gpus"),
    ({"gpus": [0], "workload": {"namespace": "x"}}, r"allocations\[0\]\.workload"),
])
def test_bad_allocations_name_the_field(entry, match):
    doc = {"gpus": {"count": 2}, "processes": [], "allocations": [entry]}
    with pytest.raises(ScenarioError, match=match):
        parse_scenario(doc, "s.yaml")


def test_snapshot_lists_allocations_per_gpu_and_the_flag_turns_them_off(capsys):
    import json

    from exporter.app.cli import main

    assert main(["snapshot", "--backend", "simulated", "--json"]) == 0
    gpus = {g["index"]: g for g in json.loads(capsys.readouterr().out)["gpus"]}
    assert [(a["namespace"], a["pod"], a["container"], a["resource_name"]) for a in gpus[7]["allocations"]] == [
        ("ml-research", "idle-reservation-0", "trainer", "nvidia.com/gpu")]
    assert gpus[7]["allocations"][0]["pod_uid"] == pod_uid("ml-research", "idle-reservation-0")
    assert len(gpus[6]["allocations"]) == 4 and gpus[7]["processes"] == []
    assert main(["snapshot", "--backend", "simulated"]) == 0
    assert "allocated to ml-research/idle-reservation-0/trainer (nvidia.com/gpu GPU-" in capsys.readouterr().out
    assert main(["snapshot", "--backend", "simulated", "--json", "--pod-resources-socket", "off"]) == 0
    gpus = json.loads(capsys.readouterr().out)["gpus"]
    assert all(g["allocations"] == [] for g in gpus)
