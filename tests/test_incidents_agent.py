"""The agent's incidents end to end: a kernel log line names the process, the pod's
workload is the cause, and /api/v1/incidents, the counters, the peaks and the log say so."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

# GPU 2 of the simulated node (PCI 00000000:38:00.0) runs pid 52001 of
# ml-research/llm-finetune-worker-0/trainer.
XID_31 = ("3,9001,123456789,-;NVRM: Xid (PCI:0000:38:00): 31, pid=52001, name=python3, Ch 00000008, "
          "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1e_00000000\n")


def _samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_an_xid_in_the_kernel_log_names_the_pod_that_caused_it(agent_factory, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,1,-;an unrelated line\n")
    agent = agent_factory("--backend", "simulated", "--interval", "200ms", "--kernel-log", str(kmsg),
                          "--log-format", "json")
    status, _, body = agent.get("/api/v1/incidents")
    assert status == 200 and json.loads(body)["incidents"] == []
    with kmsg.open("a") as f:
        f.write(XID_31)

    def incidents() -> list:
        return json.loads(agent.get("/api/v1/incidents")[2])["incidents"]

    [incident] = wait_until(incidents, what="the Xid's incident")
    assert incident["kind"] == "xid" and incident["xid"] == 31 and incident["gpu"] == 2
    assert incident["action"] == "restart_app" and incident["cause_known"] is True
    assert [(w["namespace"], w["pod"], w["container"]) for w in incident["caused_by"]] == [
        ("ml-research", "llm-finetune-worker-0", "trainer")]
    assert "pid 52001 (python3)" in incident["detail"]
    caused = wait_until(lambda: [s for s in _samples(agent.scrape(), "container_gpu_incidents_total")
                                 if s.labels["role"] == "caused"], what="the incident counter")
    assert [(s.labels["pod"], s.labels["gpu"], s.labels["kind"], s.value) for s in caused] == [
        ("llm-finetune-worker-0", "2", "xid", 1.0)]
    scrape = agent.scrape()
    peaks = {s.labels["gpu"]: s.value for s in _samples(scrape, "gpu_memory_peak_bytes")}
    used = {s.labels["gpu"]: s.value for s in _samples(scrape, "gpu_memory_used_bytes")}
    assert set(peaks) == set(used) and all(peaks[g] >= used[g] * 0.95 for g in used)
    records = {s.labels["outcome"]: s.value for s in _samples(scrape, "l9gpu_kernel_log_records_total")}
    assert records["xid"] == 1.0
    log = agent.log_path.read_text()
    line = next(json.loads(x) for x in log.splitlines() if '"incident"' in x)
    assert line["level"] == "warning" and line["incident"]["xid"] == 31
    # the page's Incidents panel, newest first
    def page_with_panel() -> str | None:
        body = agent.get("/")[2].decode()
        return body if 'class="incidents"' in body else None

    page = wait_until(page_with_panel, what="the page's Incidents panel")
    panel = page[page.index('<section class="incidents">'):]
    panel = panel[:panel.index("</section>")]
    assert '<tr data-kind="xid"><td>GPU 2</td><td>xid 31</td>' in panel
    assert "ml-research/llm-finetune-worker-0/trainer" in panel and "restart app" in panel


def test_the_running_agent_posts_the_incident_as_events_on_the_pods(agent_factory, apiserver, tmp_path):
    from cgroup_helpers import kubeconfig

    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    agent = agent_factory("--backend", "simulated", "--interval", "200ms", "--kernel-log", str(kmsg),
                          "--kubeconfig", kubeconfig(tmp_path, apiserver))
    with kmsg.open("a") as f:
        f.write(XID_31)
    caused = wait_until(lambda: [e for e in apiserver.core_events.values() if e["reason"] == "GPUFaultCaused"],
                        what="the Event on the pod that caused the Xid")
    [event] = caused
    assert event["type"] == "Warning"
    assert (event["involvedObject"]["kind"], event["involvedObject"]["namespace"],
            event["involvedObject"]["name"]) == ("Pod", "ml-research", "llm-finetune-worker-0")
    assert event["message"].startswith("GPU 2 (GPU-") and "raised Xid 31" in event["message"]
    assert event["source"]["component"] == "l9gpu"
    posted = wait_until(lambda: {s.labels["outcome"]: s.value for s in
                                 _samples(agent.scrape(), "l9gpu_kubernetes_events_total")}.get("posted"),
                        what="the posted Events counted")
    assert posted >= 1
