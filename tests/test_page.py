"""The snapshot JSON and the page at /, in process: content, laziness, caching, ETag, gzip."""

import argparse
import asyncio
import gzip
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from waiting import wait_until

from exporter.collect.collector import Collector
from exporter.core.labels import label_schema
from exporter.devices.simulated.backend import SimulatedBackend
from exporter.output import catalogue as cat
from exporter.output.render import SnapshotCollector
from exporter.output.snapshot_json import duration, snapshot_document, snapshot_json
from exporter.web.app import make_app
from exporter.web.exposition import Exposition
from exporter.web.page import SnapshotPages, render_page

GIB = 2**30


class Clock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


class CountingRegistry(CollectorRegistry):
    """A registry that counts how often it is rendered (collect() is the exposition's only way in)."""

    def __init__(self):
        super().__init__(auto_describe=False)
        self.collects = 0

    def collect(self):
        self.collects += 1
        return super().collect()


def _demo():
    """The demo node's collector: simulated backend, default scenario, the simulated kubelet."""
    from exporter.attribution import build_attributor

    clock = Clock(100.0)
    backend = SimulatedBackend(clock=clock)
    backend.open()
    names, labeller = label_schema(["team"])
    attributor = build_attributor(argparse.Namespace(), "sim-node-01", scenario=backend.scenario)
    collector = Collector([backend], "sim-node-01", attributor=attributor, labeller=labeller, clock=clock)
    return collector, clock, names


def _pass(collector, clock, seconds=1.0):
    clock.t += seconds
    return collector.collect_once()


def test_document_lists_every_workload_with_its_flags_and_the_parts_add_up():
    collector, clock, names = _demo()
    try:
        _pass(collector, clock)
        snap = _pass(collector, clock, 30.0)
        doc = snapshot_document(snap, names)
    finally:
        collector.attributor.close()
    assert doc["schema_version"] == 1 and doc["node"] == "sim-node-01" and doc["seq"] == snap.seq
    gpus = {g["index"]: g for g in doc["gpus"]}
    zombies = [(i, w["owner"]) for i, g in gpus.items() for w in g["workloads"] if w["zombie"]]
    assert zombies == [(6, "data-science/jupyter-alice-0/notebook")]
    unused = [(i, w["owner"]) for i, g in gpus.items() for w in g["workloads"] if w["allocated_unused"]]
    assert unused == [(7, "ml-research/idle-reservation-0/trainer")]
    notebook = next(w for w in gpus[6]["workloads"] if w["pod"] == "jupyter-alice-0")
    assert notebook["memory_used_bytes"] == 70 * GIB and notebook["sm_utilization_ratio"] == 0.0
    assert notebook["idle_seconds"] == 30.0 and notebook["allocated"] is True and notebook["pids"] == [61001]
    assert notebook["owner_kind"] == "StatefulSet" and notebook["pod_labels"] == {"team": "data-science"}
    slurm = next(w for w in gpus[6]["workloads"] if w["kind"] == "slurm")
    assert slurm["owner"] == "slurm job 4242 step 0 rank 0 (bob)" and slurm["allocated"] is None and not slurm["zombie"]
    assert (slurm["training_job"], slurm["training_rank"]) == ("4242", "0")
    assert notebook["training_job"] == "" and notebook["training_rank"] == ""  # a pod of no job
    assert gpus[1]["unattributed"] == {"memory_used_bytes": GIB // 4, "processes": 1}
    for gpu in doc["gpus"]:  # per GPU, workloads plus unattributed memory is every process's memory
        parts = sum(w["memory_used_bytes"] for w in gpu["workloads"]) + gpu["unattributed"]["memory_used_bytes"]
        assert parts == sum(p["memory_used_bytes"] for p in gpu["processes"])
        assert gpu["power_limit_watts"] == 700.0 and 0 <= gpu["gpm"]["sm_active"] <= 1
    json.dumps(doc)  # plain data only


def test_json_text_is_what_the_cli_prints():
    collector, clock, names = _demo()
    try:
        snap = _pass(collector, clock)
    finally:
        collector.attributor.close()
    text = snapshot_json(snap, names)
    assert text.endswith("}\n") and json.loads(text) == snapshot_document(snap, names)
    assert text == json.dumps(snapshot_document(snap, names), indent=2) + "\n"
    compact = snapshot_json(snap, names, pretty=False)  # what /api/v1/snapshot serves
    assert json.loads(compact) == json.loads(text) and "\n" not in compact[:-1] and len(compact) < len(text)


@pytest.mark.parametrize("seconds,text", [(None, "n/a"), (0, "0s"), (59.9, "59s"), (61, "1m 1s"),
                                          (5412, "1h 30m"), (2 * 86400 + 3 * 3600 + 5, "2d 3h")])
def test_durations_read_like_people_say_them(seconds, text):
    assert duration(seconds) == text


def test_a_lost_gpus_card_names_its_last_holders_and_they_stay_in_the_workload_count():
    """After a GPU falls off the bus, its card shows who was on it, worst first among the
    cards (docs/SNAPSHOT.md says the order), and the summary still counts them."""
    from exporter.collect.derive import DeriveState, step
    from exporter.core.model import DeviceSample, ProcessSample, Snapshot, Workload

    def pod(name):
        return Workload(kind="kubernetes", namespace="search", pod=name, container="c", pod_uid=f"uid-{name}")

    owners = {1: pod("embedder-0"), 2: pod("ocr-0"), 3: pod("vllm-0")}
    gpu1 = DeviceSample(index=1, uuid="GPU-1", model="H100", processes=(ProcessSample(3, GIB, 0.5),))
    up = DeviceSample(index=3, uuid="GPU-3", model="H100", processes=(ProcessSample(1, GIB, 0.5),
                                                                     ProcessSample(2, GIB, 0.2)))
    state, _ = step(DeriveState(), 0.0, "n", [gpu1, up], owners)
    lost = up.down("GPU is lost")
    _, derived = step(state, 1.0, "n", [gpu1, lost], owners)
    snap = Snapshot(seq=2, node="n", timestamp=0.0, devices=(gpu1, lost), workloads=derived.workloads)
    doc = snapshot_document(snap)
    by_index = {g["index"]: g for g in doc["gpus"]}
    assert [w["owner"] for w in by_index[3]["last_holders"]] == ["search/embedder-0/c", "search/ocr-0/c"]
    assert by_index[1]["last_holders"] == [] and by_index[3]["error"] == "GPU is lost"
    by_index[3]["health"] = {"state": "unhealthy", "action": "reboot_node", "reasons": []}
    page = render_page(doc, "n", 1.0)
    card = page[page.index('id="gpu-3"'):].split("</section>")[0]
    assert "on it when it went down:" in card and "embedder-0" in card and "ocr-0" in card
    assert page.index('id="gpu-3"') < page.index('id="gpu-1"')  # worst first
    assert "<b>1</b> of <b>2</b> GPUs up · <b>3</b> workloads" in page
    snapshot_md = (Path(__file__).resolve().parent.parent / "docs" / "SNAPSHOT.md").read_text()
    assert "One card per GPU (or MIG instance), worst first" in snapshot_md


def test_page_renders_documents_without_optional_fields_and_escapes_names():
    # A document from an older or newer agent: missing keys read "n/a" or are left out.
    doc = {"seq": 3, "timestamp": 0, "gpus": [
        {"index": 0},
        {"index": 1, "model": "H100", "up": False, "error": "GPU is lost"},
        {"index": 2, "model": "<b>x</b>", "utilization_ratio": 0.5, "workloads": [
            {"kind": "kubernetes", "namespace": "ns", "pod": "<script>alert(1)</script>", "container": "c",
             "memory_used_bytes": GIB, "sm_utilization_ratio": 0.0, "idle_seconds": 90, "zombie": True}]},
    ]}
    page = render_page(doc, "node-<1>", 2.0, ["/metrics"])
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "node-&lt;1&gt;" in page
    assert "GPU is lost" in page and 'class="gpu down"' in page
    assert "nobody on this GPU" in page and "n/a" in page
    assert 'data-flag="zombie"' in page and "(idle 1m 30s)" in page
    assert 'data-refresh-ms="2000"' in page and 'href="/metrics"' in page
    assert "http://" not in page and "https://" not in page  # no external assets
    waiting = render_page(None, "n", 1.0)
    assert "waiting for the first collection pass" in waiting


def test_page_flags_a_zombie_after_three_passes_at_zero_sm_not_one():
    def doc(idle):
        return {"seq": 1, "timestamp": 0, "gpus": [{"index": 0, "workloads": [
            {"kind": "kubernetes", "namespace": "ns", "pod": "nb-0", "container": "c", "memory_used_bytes": GIB,
             "sm_utilization_ratio": 0.0, "idle_seconds": idle, "zombie": True}]}]}

    blip = render_page(doc(1.0), "n", 1.0)  # two passes at 0%: between kernels, maybe
    assert 'data-flag="zombie"' not in blip and "nothing needs attention" in blip
    held = render_page(doc(2.0), "n", 1.0)  # three passes
    assert 'data-flag="zombie"' in held and "<b>zombie</b>" in held and "(idle 2s)" in held
    assert 'data-flag="zombie"' in render_page(doc(4.0), "n", 2.0)
    assert 'data-flag="zombie"' not in render_page(doc(2.0), "n", 2.0)


def _app(collector, names):
    registry = CountingRegistry()
    registry.register(SnapshotCollector(lambda: collector.snapshot, cat.enabled_names(), names))
    exposition = Exposition(registry, lambda: collector.snapshot, max_age=60.0)
    pages = SnapshotPages(lambda: collector.snapshot, "sim-node-01", 1.0, names)
    app = make_app(exposition, lambda: collector.snapshot, lambda: True, "sim-node-01", pages=pages)
    return app, registry, pages


def _with_client(app, body):
    async def run():
        async with TestClient(TestServer(app)) as client:
            return await body(client)

    return asyncio.run(run())


def test_page_and_json_render_on_request_once_per_snapshot_apart_from_metrics():
    collector, clock, names = _demo()
    app, registry, pages = _app(collector, names)

    async def body(client):
        r = await client.get("/")
        assert r.status == 503 and "waiting for the first collection pass" in await r.text()
        r = await client.get("/api/v1/snapshot")
        assert r.status == 503 and "first collection pass" in (await r.json())["error"]
        for _ in range(3):
            _pass(collector, clock)
        assert pages.renders == {"html": 0, "json": 0}  # nobody asked: nothing rendered
        first = await client.get("/")
        html = await first.text()
        assert first.status == 200 and first.headers["Content-Type"] == "text/html; charset=utf-8"
        assert "jupyter-alice-0" in html and 'href="/api/v1/snapshot"' in html and 'href="/metrics"' in html
        again = await client.get("/")
        assert await again.text() == html and pages.renders["html"] == 1
        r = await client.get("/", headers={"If-None-Match": first.headers["ETag"]})
        assert r.status == 304 and pages.renders["html"] == 1
        r = await client.get("/", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        assert r.headers["Content-Encoding"] == "gzip" and gzip.decompress(await r.read()).decode() == html
        api = await client.get("/api/v1/snapshot")
        assert api.headers["Content-Type"] == "application/json; charset=utf-8"
        assert await api.text() == snapshot_json(collector.snapshot, names, pretty=False)
        await client.get("/api/v1/snapshot")
        assert pages.renders == {"html": 1, "json": 1}
        assert registry.collects == 0  # the page never renders /metrics ...
        await client.get("/metrics")
        assert pages.renders == {"html": 1, "json": 1}  # ... and a scrape never renders the page
        assert registry.collects == 1
        _pass(collector, clock)  # a new snapshot: rendered again on the next request, not before
        assert pages.renders["html"] == 1
        r = await client.get("/", headers={"If-None-Match": first.headers["ETag"]})
        assert r.status == 200 and r.headers["ETag"] != first.headers["ETag"] and pages.renders["html"] == 2

    try:
        _with_client(app, body)
    finally:
        collector.attributor.close()


def test_the_collector_thread_never_renders_the_page():
    collector, clock, names = _demo()
    app, _, pages = _app(collector, names)
    collector.interval = 0.01
    try:
        collector.start()
        wait_until(lambda: collector.snapshot is not None and collector.snapshot.seq >= 5, what="five passes")
    finally:
        collector.stop()
        collector.attributor.close()
    assert pages.renders == {"html": 0, "json": 0}
