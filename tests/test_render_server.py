"""Rendering from snapshots and the HTTP endpoints, in process."""

import asyncio
import gzip
import time

from agent import parse_metrics, pick
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from exporter.collect.collector import Collector
from exporter.core.labels import label_schema
from exporter.core.model import DeviceSample, ProcessSample, Workload
from exporter.devices.base import Backend
from exporter.devices.simulated.backend import SimulatedBackend
from exporter.output import catalogue as cat
from exporter.output.render import SnapshotCollector
from exporter.web.app import make_app
from exporter.web.exposition import Exposition


class Clock:
    def __init__(self, t=0.0):
        self.t = t

    def __call__(self):
        return self.t


class StaticBackend(Backend):
    name = "static"

    def __init__(self, devices):
        self.devices = devices

    def open(self):
        pass

    def sample(self, now):
        return list(self.devices)

    def close(self):
        pass


class Owners:
    def __init__(self, owners):
        self.owners = owners

    def resolve(self, pids, now):
        return {p: self.owners[p] for p in pids if p in self.owners}

    def comm(self, pid):
        return "python3"

    def start_time(self, pid):
        return None

    generation = 0

    def statuses(self):
        return {"kubernetes": True}

    def info(self):
        return {}

    def close(self):
        pass


def render(collector, enabled=None, extra=()):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, enabled, extra))
    return parse_metrics(generate_latest(registry).decode())


def test_values_nvml_cannot_give_are_omitted_not_zero():
    device = DeviceSample(index=0, uuid="GPU-a", model="T4", utilization=0.5, power_watts=None, fan_speed_ratio=None)
    c = Collector([StaticBackend([device])], "node-1", clock=Clock())
    c.collect_once()
    m = render(c)
    assert pick(m, "gpu_utilization_ratio", gpu="0", uuid="GPU-a", model="T4", node="node-1") == [0.5]
    assert "gpu_power_watts" not in m and "gpu_fan_speed_ratio" not in m
    assert pick(m, "gpu_up", uuid="GPU-a") == [1.0]


def test_lost_gpu_is_down_and_the_others_carry_on():
    devices = [DeviceSample(index=0, uuid="GPU-a", model="H100", power_watts=300.0),
               DeviceSample(index=1, uuid="GPU-b", model="H100", up=False, error="GPU is lost")]
    c = Collector([StaticBackend(devices)], "n", clock=Clock())
    c.collect_once()
    m = render(c)
    assert pick(m, "gpu_up", uuid="GPU-a") == [1.0] and pick(m, "gpu_up", uuid="GPU-b") == [0.0]
    assert pick(m, "gpu_power_watts", uuid="GPU-a") == [300.0] and pick(m, "gpu_power_watts", uuid="GPU-b") == []
    assert pick(m, "gpu_info", uuid="GPU-b", model="H100") == [1.0]


def test_workload_series_and_a_vanished_pod_vanishes():
    web = Workload(kind="kubernetes", namespace="shop", pod="web-1", container="app", pod_uid="u1",
                   owner_kind="Deployment", owner_name="web", labels=(("team", "shop"),))
    devices = [DeviceSample(index=0, uuid="GPU-a", model="H100", energy_joules=0.0,
                            processes=(ProcessSample(10, 2**30, 0.25), ProcessSample(11, 2**29, None)))]
    backend = StaticBackend(devices)
    clock = Clock(0.0)
    names, labeller = label_schema(["team"])
    c = Collector([backend], "n", attributor=Owners({10: web}), labeller=labeller, clock=clock, grace_seconds=60)
    c.collect_once()
    clock.t = 4.0
    backend.devices = [DeviceSample(index=0, uuid="GPU-a", model="H100", energy_joules=400.0,
                                    processes=devices[0].processes)]
    c.collect_once()
    m = render(c, cat.enabled_names(detail=True), extra=names)  # the share and process count are --detail
    labels = dict(namespace="shop", pod="web-1", container="app", pod_uid="u1", slurm_job_id="",
                  owner_kind="Deployment", owner_name="web", label_team="shop", gpu="0", uuid="GPU-a")
    assert pick(m, "container_gpu_memory_used_bytes", **labels) == [2**30]
    assert pick(m, "container_gpu_utilization_ratio", **labels) == [0.25]
    assert pick(m, "container_gpu_processes", **labels) == [1.0]
    assert "container_gpu_utilization_ratio" not in render(c, extra=names)  # not by default
    assert pick(m, "container_gpu_usage_seconds_total", **labels) == [1.0]
    assert pick(m, "gpu_unattributed_memory_used_bytes", uuid="GPU-a") == [2**29]
    assert pick(m, "l9gpu_unattributed_processes", node="n") == [1.0]
    energy = pick(m, "container_gpu_energy_joules_total", **labels)[0] + pick(
        m, "gpu_unattributed_energy_joules_total", uuid="GPU-a")[0]
    assert energy == 400.0
    # the pod goes: gauges vanish at once, counters stay for the grace period
    clock.t = 10.0
    backend.devices = [DeviceSample(index=0, uuid="GPU-a", model="H100", energy_joules=400.0)]
    c.collect_once()
    m = render(c, extra=names)
    assert pick(m, "container_gpu_memory_used_bytes", pod="web-1") == []
    assert pick(m, "container_gpu_usage_seconds_total", pod="web-1") == [1.0]
    clock.t = 100.0
    c.collect_once()
    assert pick(render(c, extra=names), "container_gpu_usage_seconds_total", pod="web-1") == []


def _app(collector, max_age=60.0, clock=time.monotonic):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: collector.snapshot, cat.enabled_names()))
    exposition = Exposition(registry, lambda: collector.snapshot, max_age=max_age, clock=clock)
    return make_app(exposition, lambda: collector.snapshot, lambda: True, "n"), exposition


def _with_client(app, body):
    async def run():
        async with TestClient(TestServer(app)) as client:
            return await body(client)

    return asyncio.run(run())


def test_readyz_waits_for_the_first_snapshot_and_metrics_are_served():
    clock = Clock(10.0)
    backend = SimulatedBackend(clock=clock)
    backend.open()
    c = Collector([backend], "sim", clock=clock)
    app, _ = _app(c)

    async def body(client):
        r = await client.get("/readyz")
        assert r.status == 503 and "first collection pass" in await r.text()
        c.collect_once()
        r = await client.get("/readyz")
        assert r.status == 200
        assert (await client.get("/healthz")).status == 200
        r = await client.get("/metrics")
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await r.text()
        m = parse_metrics(text)
        assert len(pick(m, "gpu_up")) == 8
        r = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        assert r.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(await r.read()).decode() == text
        r = await client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        om = await r.text()
        assert om.rstrip().endswith("# EOF")
        names = {f.name for f in parse_openmetrics(om)}
        assert "gpu_energy_joules" in names and "gpu_power_watts" in names
        landing = await (await client.get("/")).text()
        assert 'href="/metrics"' in landing and 'href="/readyz"' in landing

    _with_client(app, body)


def _simulated_collector():
    clock = Clock(10.0)
    backend = SimulatedBackend(clock=clock)
    backend.open()
    c = Collector([backend], "sim", clock=clock)
    c.collect_once()
    return clock, c


def test_bytes_are_rendered_once_per_snapshot():
    clock, c = _simulated_collector()
    _, exposition = _app(c)
    first, _ = exposition.render(None, False)
    assert exposition.render(None, False)[0] is first
    clock.t = 11.0
    snap = c.collect_once()
    # until the collector thread has rendered the new pass, scrapes get the previous bytes
    assert exposition.render(None, False)[0] is first
    exposition.render(None, False)  # a second scrape: this client scrapes continuously
    exposition.warm(snap)
    second, _ = exposition.render(None, False)
    assert second is not first and exposition.render(None, False)[0] is second
    assert b"gpu_energy_joules_total" in second


def test_stalled_collector_shows_a_growing_snapshot_age():
    c = Collector([StaticBackend([])], "n", clock=Clock(), wall=lambda: 1000.0)
    c.collect_once()
    _, exposition = _app(c, max_age=0.0)
    ages = []
    for _ in range(2):
        body, _ = exposition.render(None, False)
        ages.append(pick(parse_metrics(body.decode()), "l9gpu_snapshot_age_seconds")[0])
    assert ages[1] > ages[0] > 0


PROMETHEUS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def _counting(exposition):
    calls = []
    real_collect = exposition.registry.collect
    exposition.registry.collect = lambda: (calls.append(1), real_collect())[1]
    return calls


def test_renders_only_for_the_scrapes_it_expects():
    """Passes every second, Prometheus every 15 s: one render per scrape, done before it
    arrives, instead of one per pass."""
    clock, c = _simulated_collector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: c.snapshot, cat.enabled_names()))
    exposition = Exposition(registry, lambda: c.snapshot, max_age=2.0, interval=1.0, clock=clock)
    calls = _counting(exposition)
    scrape_steps = {2 + 60 * k for k in range(8)}  # at 0.5 s, 15.5 s, 30.5 s, ...
    scrape_renders = []
    t = 10.0
    for step in range(120 * 4):  # 120 s in quarter seconds
        t = 10.0 + step * 0.25
        clock.t = t
        if step % 4 == 0:  # a pass every second, and the collector thread's warm after it
            exposition.warm(c.collect_once())
        if step in scrape_steps:
            before = len(calls)
            body, content_type = exposition.render(PROMETHEUS_ACCEPT, True, client="10.0.0.7")
            scrape_renders.append(len(calls) - before)
            assert content_type.startswith("application/openmetrics-text")
            assert gzip.decompress(body).endswith(b"# EOF\n")
    # The first two scrapes render by themselves (no period known yet); from the third on
    # the bytes are ready when the scrape comes.
    assert scrape_renders[:2] == [1, 1] and scrape_renders[2:] == [0] * 6
    # 120 passes, 8 scrapes: one render per scrape, not one per pass.
    assert len(calls) == len(scrape_steps)


def test_a_scrape_right_after_a_pass_is_rendered_for_once():
    """A scrape that falls just after a pass boundary is due for two passes' horizons:
    the first pass that sees it due renders for it, the next one does not render again."""
    clock, c = _simulated_collector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: c.snapshot, cat.enabled_names()))
    exposition = Exposition(registry, lambda: c.snapshot, max_age=2.0, interval=1.0, clock=clock)
    calls = _counting(exposition)
    scrape_renders, ages = [], []
    for second in range(0, 121):
        clock.t = 10.0 + second
        exposition.warm(c.collect_once())
        if second % 15 == 0:
            clock.t += 0.02  # 20 ms after the pass
            before = len(calls)
            body, _ = exposition.render(PROMETHEUS_ACCEPT, True, client="10.0.0.7")
            scrape_renders.append(len(calls) - before)
            ages.append(pick(parse_metrics(gzip.decompress(body).decode().replace("# EOF\n", "")),
                             "l9gpu_snapshot_age_seconds")[0])
    assert scrape_renders[:2] == [1, 1] and scrape_renders[2:] == [0] * (len(scrape_renders) - 2)
    # 9 scrapes, 9 renders: not two for each scrape foreseen
    assert len(calls) == len(scrape_renders)
    # what a foreseen scrape gets was rendered one pass before it, never older
    assert all(age <= 1.5 for age in ages)


def test_each_scraper_of_an_ha_pair_is_foreseen():
    clock, c = _simulated_collector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: c.snapshot, cat.enabled_names()))
    exposition = Exposition(registry, lambda: c.snapshot, max_age=2.0, interval=1.0, clock=clock)
    calls = _counting(exposition)
    late_renders = []
    for second in range(0, 91):
        clock.t = 10.0 + second
        exposition.warm(c.collect_once())
        clock.t += 0.5
        for client, phase in (("10.0.0.7", 3), ("10.0.0.8", 11)):  # same period, other phase
            if second % 15 == phase:
                before = len(calls)
                exposition.render(PROMETHEUS_ACCEPT, True, client=client)
                late_renders.append(len(calls) - before)
    assert late_renders[4:] == [0] * (len(late_renders) - 4)


def test_a_scrape_with_nothing_recent_renders_by_itself():
    clock, c = _simulated_collector()
    _, exposition = _app(c, max_age=2.0, clock=clock)
    first, _ = exposition.render(None, False)
    clock.t = 30.0
    c.collect_once()
    second, _ = exposition.render(None, False)  # the cache is 20 s old: render now
    assert second is not first
