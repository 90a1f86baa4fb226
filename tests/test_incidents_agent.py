"""The agent's incidents end to end: a kernel log line names the process, the pod's
workload is the cause, and /api/v1/incidents, the counters, the peaks and the log say so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

# GPU 2 of the simulated node (PCI 00000000:38:00.0) runs pid 52001 of
# ml-research/llm-finetune-worker-0/trainer.
XID_31 = ("3,9001,123456789,-;NVRM: Xid (PCI:0000:38:00): 31, pid=52001, name=python3, Ch 00000008, "
          "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1e_00000000\n")


def stamped(line: str) -> str:
    """A kmsg record stamped now (microseconds since boot, the kernel's clock), as the kernel
    stamps what it logs: a record's time decides which process held the PID it names."""
    head, _, rest = line.partition(";")
    prio, seq, _, flags = head.split(",")
    return f"{prio},{seq},{int(time.monotonic() * 1e6)},{flags};{rest}"


def _samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def test_an_xid_in_the_kernel_log_names_the_pod_that_caused_it(agent_factory, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("6,1,1,-;an unrelated line\n")
    agent = agent_factory("--backend", "simulated", "--interval", "200ms", "--enable-metric", "gpu_memory_peak_bytes",
                          "--kernel-log", str(kmsg),
                          "--log-format", "json")
    status, _, body = agent.get("/api/v1/incidents")
    assert status == 200 and json.loads(body)["incidents"] == []
    with kmsg.open("a") as f:
        f.write(stamped(XID_31))

    def incidents() -> list:
        return json.loads(agent.get("/api/v1/incidents")[2])["incidents"]

    [incident] = wait_until(incidents, what="the Xid's incident")
    assert incident["kind"] == "xid" and incident["xid"] == 31 and incident["gpu"] == 2
    assert incident["action"] == "restart_app" and incident["cause_known"] is True
    assert incident["cause_basis"] == "kernel_log"
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
    assert line["incident"]["cause_basis"] == "kernel_log" and "(by kernel log)" in line["message"]
    # the page's Incidents panel, newest first
    def page_with_panel() -> str | None:
        body = agent.get("/")[2].decode()
        return body if 'class="incidents"' in body else None

    page = wait_until(page_with_panel, what="the page's Incidents panel")
    panel = page[page.index('<section class="incidents">'):]
    panel = panel[:panel.index("</section>")]
    assert '<tr data-kind="xid"><td>GPU&nbsp;2</td><td>xid 31</td>' in panel  # never wrapped
    assert "ml-research/llm-finetune-worker-0/trainer" in panel and "restart app" in panel
    assert '<span class="basis">(kernel log)</span>' in panel


def test_the_running_agent_posts_the_incident_as_events_on_the_pods(agent_factory, apiserver, tmp_path):
    from cgroup_helpers import kubeconfig

    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    agent = agent_factory("--backend", "simulated", "--interval", "200ms", "--kernel-log", str(kmsg),
                          "--kubeconfig", kubeconfig(tmp_path, apiserver))
    with kmsg.open("a") as f:
        f.write(stamped(XID_31))
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


# GPU 6 of the simulated node (PCI 00000000:78:00.0) is time-shared by four pods and Slurm
# job 4242; Xid 79 is a device fault: every workload on it is affected.
XID_79 = "3,9002,123456790,-;NVRM: Xid (PCI:0000:78:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"


@pytest.fixture(params=["grpc", "http/protobuf"])
def otlp_receiver(request):
    from fakes.otlp_receivers import GrpcReceiver, HttpReceiver

    receiver = (GrpcReceiver() if request.param == "grpc" else HttpReceiver()).start()
    receiver.protocol = request.param
    yield receiver
    receiver.stop()


def test_with_otlp_on_each_incident_is_a_log_record_per_workload(agent_factory, otlp_receiver, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    args = ["--backend", "simulated", "--interval", "200ms", "--kernel-log", str(kmsg), "--pod-label", "team",
            "--otlp-endpoint", otlp_receiver.endpoint, "--otlp-protocol", otlp_receiver.protocol,
            "--otlp-interval", "1h"]
    if otlp_receiver.protocol == "grpc":
        args.append("--otlp-insecure")
    agent = agent_factory(*args)
    wait_until(lambda: json.loads(agent.get("/api/v1/snapshot")[2]).get("seq", 0) >= 2, what="two passes")
    with kmsg.open("a") as f:
        f.write(stamped(XID_31))
        f.write(stamped(XID_79))
    records = otlp_receiver.wait_for_logs(6)
    [incident_31, incident_79] = sorted(json.loads(agent.get("/api/v1/incidents")[2])["incidents"],
                                        key=lambda i: i["xid"])
    by_id: dict[str, list[dict]] = {}
    for record in records:
        by_id.setdefault(record["attributes"]["l9gpu.incident.id"], []).append(record)
    assert set(by_id) == {incident_31["id"], incident_79["id"]}
    [caused] = by_id[incident_31["id"]]
    attrs = caused["attributes"]
    assert caused["event_name"] == "l9gpu.gpu.incident" and caused["severity_text"] == "WARN"
    assert caused["time"] == int(incident_31["time"] * 1e9)
    assert (attrs["k8s.namespace.name"], attrs["k8s.pod.name"], attrs["k8s.container.name"]) == (
        "ml-research", "llm-finetune-worker-0", "trainer")
    assert attrs["k8s.pod.label.team"] == "research" and attrs["k8s.workload.kind"] == "Job"
    assert (attrs["gpu.index"], attrs["k8s.node.name"], attrs["gpu.id"]) == ("2", "sim-node-01", incident_31["uuid"])
    assert (attrs["l9gpu.incident.kind"], attrs["l9gpu.incident.role"], attrs["l9gpu.incident.xid"]) == (
        "xid", "caused", 31)
    assert attrs["l9gpu.incident.action"] == "restart_app" and attrs["l9gpu.incident.cause_known"] is True
    assert attrs["l9gpu.incident.cause_basis"] == "kernel_log"
    assert "slurm.job.id" not in attrs
    assert "Xid 31" in caused["body"] and "llm-finetune-worker-0" in caused["body"]
    assert caused["resource"]["service.name"] == "l9gpu"
    # Xid 79: every holder of the time-shared GPU 6 affected, the Slurm job with its job id
    hurt = by_id[incident_79["id"]]
    assert {r["attributes"]["l9gpu.incident.role"] for r in hurt} == {"affected"}
    assert sorted(r["attributes"].get("k8s.pod.name", "") for r in hurt) == [
        "", "embedder-7c9f5-abcde", "jupyter-alice-0", "ocr-worker-66f7d-klmno", "reranker-5b8d4-fghij"]
    [slurm] = [r["attributes"] for r in hurt if "slurm.job.id" in r["attributes"]]
    assert slurm["slurm.job.id"] == "4242" and "k8s.pod.name" not in slurm and slurm["gpu.index"] == "6"
    assert len(hurt) == len(incident_79["affected"]) == 5


def test_snapshot_prints_the_incidents_the_nodes_agent_remembers(agent_factory, tmp_path):
    from agent import run_cli

    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    agent = agent_factory("--backend", "simulated", "--interval", "200ms", "--kernel-log", str(kmsg))
    kmsg.write_text(stamped(XID_31))  # after the first pass saw the process
    wait_until(lambda: json.loads(agent.get("/api/v1/incidents")[2])["incidents"], what="the Xid's incident")
    result = run_cli(["snapshot", "--backend", "simulated", "--incidents-from", agent.url])
    assert result.returncode == 0, result.stderr
    block = result.stdout[result.stdout.index("recent incidents"):].splitlines()
    assert block[0] == f"recent incidents (the agent at {agent.url}), newest first:"
    assert "GPU 2  xid 31" in block[1]
    assert "caused by ml-research/llm-finetune-worker-0/trainer (kernel log); affected -" in block[1]
    assert block[1].endswith("affected -; action restart app") and " ago " in block[1]
    # nobody there: said so in one line, and the table is still printed
    agent.stop()
    result = run_cli(["snapshot", "--backend", "simulated", "--incidents-from", agent.url])
    assert result.returncode == 0 and result.stdout.startswith("node sim-node-01")
    assert result.stdout.rstrip().splitlines()[-1] == (
        f"recent incidents: unknown, the agent at {agent.url}: no agent answered (Connection refused)")
    quiet = run_cli(["snapshot", "--backend", "simulated", "--incidents-from", "off"])
    assert "recent incidents" not in quiet.stdout


def _row(table: str, gpu: int) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"{gpu} "))


def test_snapshot_shows_the_verdicts_of_the_agent_serving_the_node(agent_factory):
    """The page shows GPU 3 degraded (its narrowed PCIe link has lasted): so does the snapshot
    that reads the agent, in its table and its "needs a look"; one pass alone cannot tell."""
    from agent import run_cli

    agent = agent_factory("--backend", "simulated", "--interval", "200ms")

    def gpu_3_health() -> str | None:
        doc = json.loads(agent.get("/api/v1/snapshot")[2])
        return next(((g.get("health") or {}).get("state") for g in doc["gpus"] if g["index"] == 3), None)

    wait_until(lambda: gpu_3_health() == "degraded", what="the agent's verdict on GPU 3")
    result = run_cli(["snapshot", "--backend", "simulated", "--incidents-from", agent.url])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "HEALTH     PROCESSES" in lines[1] and "1 PASS" not in lines[1]
    assert "  degraded  " in _row(result.stdout, 3) and "  degraded  " in _row(result.stdout, 4)
    assert "  healthy  " in _row(result.stdout, 2)
    assert any(line.startswith("  GPU 3 is degraded (action: inspect hardware): the PCIe link") for line in lines)
    assert f"health: the verdicts of the agent at {agent.url}, which knows each GPU's history" in lines
    # without the agent, the column says whose verdict it is: this pass's, which has no history
    alone = run_cli(["snapshot", "--backend", "simulated", "--incidents-from", "off"])
    assert "HEALTH (1 PASS) PROCESSES" in alone.stdout.splitlines()[1]
    assert "  healthy  " in _row(alone.stdout, 3) and "GPU 3 is degraded" not in alone.stdout
    assert alone.stdout.rstrip().splitlines()[-1].startswith("health: from this one pass;")


def test_a_snapshot_of_the_scenario_an_agent_runs_says_it_replays_it_from_the_start(agent_factory):
    """Beside the incidents demo after GPU 3 fell off the bus, the command's own pass is the
    scenario's first second (GPU 3 up, its pods on it): the node line says so, and the
    agent's verdicts say where the node is now."""
    from agent import run_cli

    agent = agent_factory("--backend", "simulated", "--scenario", "incidents", "--kernel-log", "auto",
                          "--interval", "500ms")
    wait_until(lambda: any(i["kind"] == "xid" and i["xid"] == 31
                           for i in json.loads(agent.get("/api/v1/incidents")[2])["incidents"]),
               what="the scenario's first incident (30 s)", timeout=120)
    result = run_cli(["snapshot", "--backend", "simulated", "--scenario", "incidents", "--incidents-from", agent.url])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("node sim-incidents-01 (simulated: its scenario replayed from the start, not where an "
                        "agent running it is now)")
    assert "xid 31" in result.stdout.split("recent incidents")[-1]  # the agent's, after the table


def test_snapshot_does_not_print_another_nodes_incidents(agent_factory, tmp_path):
    from agent import run_cli

    kmsg = tmp_path / "kmsg"
    kmsg.write_text(XID_31)
    other = agent_factory("--backend", "simulated", "--interval", "200ms", "--kernel-log", str(kmsg),
                          "--node-name", "gpu-node-9")
    wait_until(lambda: json.loads(other.get("/api/v1/incidents")[2])["incidents"], what="the other node's Xid")
    result = run_cli(["snapshot", "--backend", "simulated", "--incidents-from", other.url])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("node sim-node-01 (simulated: its scenario replayed from the start")
    assert "xid 31" not in result.stdout and "llm-finetune" not in result.stdout.split("needs a look")[-1]
    assert result.stdout.rstrip().splitlines()[-1] == (
        f"recent incidents: unknown, the agent at {other.url}: it serves node gpu-node-9, not sim-node-01: "
        "its incidents and health verdicts are not this node's")
    assert "HEALTH (1 PASS)" in result.stdout.splitlines()[1]  # nor its verdicts


def test_recent_incidents_are_listed_newest_first_escaped_and_bounded():
    from exporter.app.snapshot_cmd import format_incidents

    items = [{"kind": "memory_exhausted", "time": 1000.0 - 30 * n, "gpu": 2, "xid": None, "action": "restart_app",
              "caused_by": [{"owner": "ml/trainer\x1b[2J/main"}], "affected": [{"owner": "ml/nb/main"}]}
             for n in range(12)]
    text = format_incidents("http://127.0.0.1:9835", items, now=1000.0)
    lines = text.splitlines()
    assert lines[1] == ("        0s ago  GPU 2  memory_exhausted   caused by ml/trainer\\x1b[2J/main; affected "
                        "ml/nb/main; action restart app")
    assert lines[2].lstrip().startswith("30s ago  GPU 2") and lines[10].lstrip().startswith("4m 30s ago  GPU 2")
    assert lines[-1] == "  (2 older at http://127.0.0.1:9835/api/v1/incidents)" and len(lines) == 12
    assert format_incidents("http://x", []).endswith("none since it started")


def test_a_sequence_number_of_10_to_the_309_is_counted_malformed_and_metrics_still_answer(agent_factory, tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    agent = agent_factory("--backend", "simulated", "--interval", "200ms", "--kernel-log", str(kmsg))
    with kmsg.open("a") as f:
        f.write(stamped("6,9000,1,-;fine\n"))
        f.write(f"3,{10**309},1,-;" + XID_31.partition(";")[2])  # beyond any float
        f.write(f"3,{2**64},1,-;" + XID_31.partition(";")[2])  # beyond a u64
        f.write(stamped(XID_31))  # the valid Xid read with them

    def counted() -> dict | None:
        status, _, body = agent.get("/metrics")
        assert status == 200
        records = {s.labels["outcome"]: s.value for s in _samples(body.decode(), "l9gpu_kernel_log_records_total")}
        return records if records.get("xid") == 1.0 else None

    records = wait_until(counted, what="the valid Xid counted beside the hostile records")
    assert records["malformed"] == 2.0 and records["overwritten"] == 0.0 and records["read"] == 4.0
    [incident] = json.loads(agent.get("/api/v1/incidents")[2])["incidents"]
    assert incident["xid"] == 31 and incident["cause_basis"] == "kernel_log"
    for _ in range(3):  # and it stays that way, scrape after scrape
        assert agent.get("/metrics")[0] == 200
    assert "Traceback" not in agent.log()


def _journal_without_kmsg_launcher(journal_dir) -> list[str] | None:
    """A launcher running the agent where /dev/kmsg cannot be read (CAP_SYSLOG dropped) and
    the host's journal is ``journal_dir`` (bound over /var/log/journal in a mount namespace
    of its own): None where that cannot be arranged here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("setpriv") is None:
        return None
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            f"mount --bind {journal_dir} /var/log/journal && setpriv --bounding-set -syslog "
                            f"{sys.executable} -c \"import os; os.open('/dev/kmsg', os.O_RDONLY)\""],
                           capture_output=True, text=True)
    if probe.returncode == 0 or "Operation not permitted" not in probe.stderr:
        return None  # /dev/kmsg still readable (dmesg_restrict=0), or no mount namespace
    script = ("import os, sys; os.execvp('unshare', ['unshare', '-m', '--propagation', 'private', 'sh', '-c', "
              "'mount --bind \"$0\" /var/log/journal && (mount -t tmpfs none /run/log 2>/dev/null; true) && "
              "exec setpriv --bounding-set -syslog \"$@\"', sys.argv[1], sys.executable, '-m', 'exporter', "
              "*sys.argv[2:]])")
    return ["-c", script, str(journal_dir)]


def test_auto_without_kmsg_reads_the_journal_and_names_the_culprit_on_a_time_shared_gpu(agent_factory, tmp_path):
    from agent import AgentProcess
    from journal_helpers import append_entries, journal_unavailable, kernel_entry

    if journal_unavailable():
        pytest.skip(journal_unavailable())
    journal_dir = tmp_path / "journal"
    machine = journal_dir / "0123456789abcdef0123456789abcdef"
    machine.mkdir(parents=True)
    append_entries(machine / "system.journal", [kernel_entry("Linux version 6.8.0")])
    launcher = _journal_without_kmsg_launcher(journal_dir)
    if launcher is None:
        pytest.skip("needs root, unshare and setpriv, and a kernel that refuses /dev/kmsg without CAP_SYSLOG")
    agent = AgentProcess(["--backend", "simulated", "--interval", "200ms", "--kernel-log", "auto"],
                         log_path=tmp_path / "agent.log", launcher=launcher)
    agent.start()
    try:
        assert "reading the kernel log from the journal (/var/log/journal" in agent.log()
        # GPU 6 (PCI 0000:78:00) is time-shared by four pods and a Slurm job; the reranker's process faults
        line = "NVRM: Xid (PCI:0000:78:00): 13, pid=62101, name=reranker, Graphics SM Warp Exception on (GPC 0)"
        append_entries(machine / "system.journal", [kernel_entry(line)])
        [incident] = wait_until(lambda: json.loads(agent.get("/api/v1/incidents")[2])["incidents"],
                                what="the Xid read from the journal")
        assert (incident["xid"], incident["gpu"], incident["cause_basis"]) == (13, 6, "kernel_log")
        assert [w["owner"] for w in incident["caused_by"]] == ["search/reranker-5b8d4-fghij/reranker"]
        assert len(incident["affected"]) >= 3
    finally:
        agent.stop()


def test_a_count_no_float_holds_is_clamped_and_a_failing_source_left_out_with_one_line_each(caplog):
    import logging

    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.core.labels import label_schema
    from exporter.incidents import watch as watch_module
    from exporter.incidents.watch import IncidentFamilies, IncidentWatch
    from exporter.output import catalogue as cat

    class Absurd:
        def counts(self) -> dict:
            return {"read": 10**309, "xid": 3}

        def close(self) -> None:
            return None

    class Broken(Absurd):
        def counts(self) -> dict:
            raise RuntimeError("the source's own bug")

    watch_module._unrepresentable_logged.clear()
    names, labeller = label_schema([])
    watch = IncidentWatch("n", labeller, names, kernel_log=Absurd(), events=Broken())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(IncidentFamilies(watch, frozenset(s.name for s in cat.METRICS)))
    with caplog.at_level(logging.WARNING, logger="l9gpu.incidents"):
        for _ in range(3):  # scrape after scrape
            text = generate_latest(registry).decode()
    records = {s.labels["outcome"]: s.value for s in _samples(text, "l9gpu_kernel_log_records_total")}
    assert records == {"read": float(2**53), "xid": 3.0}
    assert _samples(text, "l9gpu_kubernetes_events_total") == []  # left out, the rest served
    assert caplog.text.count("cannot be exported as it is; clamped to") == 1
    assert caplog.text.count("its counts cannot be read") == 1


def test_a_reader_that_raises_costs_its_records_of_that_pass_only(caplog):
    import argparse
    import logging

    from exporter.core.labels import label_schema
    from exporter.devices.simulated.backend import SimulatedBackend
    from exporter.incidents.engine import IncidentConfig, IncidentTracker
    from exporter.incidents.kmsg import parse_xid
    from exporter.incidents.watch import IncidentWatch

    class Flaky:
        def __init__(self) -> None:
            self.polls = 0

        def poll(self) -> list:
            self.polls += 1
            if self.polls <= 3:
                raise OSError(5, "Input/output error")
            line = XID_31.partition(";")[2].strip()
            return [parse_xid(line, seq=self.polls, boot_usec=int(now[0] * 1e6))]

        def counts(self) -> dict:
            return {}

        def close(self) -> None:
            return None

    from exporter.attribution import build_attributor
    from exporter.collect.collector import Collector

    now = [1000.0]
    backend = SimulatedBackend(None, clock=lambda: now[0])
    backend.open()
    attributor = build_attributor(argparse.Namespace(), backend.node_name(), scenario=backend.scenario)
    names, labeller = label_schema([])
    collector = Collector([backend], backend.node_name(), attributor=attributor, labeller=labeller,
                          clock=lambda: now[0])
    watch = IncidentWatch("n", labeller, names, tracker=IncidentTracker("n", IncidentConfig()), kernel_log=Flaky(),
                          clock=lambda: now[0])
    try:
        with caplog.at_level(logging.WARNING, logger="l9gpu.incidents"):
            for _ in range(5):
                watch.observe(collector.collect_once())  # never raises
                now[0] += 1.0
    finally:
        attributor.close()
    assert caplog.text.count("reading the kernel log failed") == 1
    incidents = watch.recent_json()
    assert incidents and all(i["xid"] == 31 for i in incidents)
    assert [w["pod"] for w in incidents[-1]["caused_by"]] == ["llm-finetune-worker-0"]
