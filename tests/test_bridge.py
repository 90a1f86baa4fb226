"""OTLP bridge: the registry /metrics serves, pushed over OTLP gRPC and HTTP.

Conversion and settings are checked in-process; pushing is checked end to end against
real OTLP receivers on loopback (tests/fakes/otlp_receivers.py) with `l9gpu serve` as a
subprocess.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time
from argparse import Namespace
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk.metrics", reason="opentelemetry-sdk is not installed (pip install '.[otlp]' in l9gpu's checkout)")
pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="opentelemetry-exporter-otlp-proto-grpc missing")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="opentelemetry-exporter-otlp-proto-http missing")
pytest.importorskip("opentelemetry.proto", reason="opentelemetry-proto is not installed")

from agent import parse_metrics, run_cli
from fakes.otlp_receivers import GrpcReceiver, HttpReceiver
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry, Counter, Summary
from prometheus_client import Histogram as PromHistogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from waiting import PATIENCE, wait_until, within

from bridge import config as bconfig
from bridge.convert import StartTimes, attributes, to_metrics_data, unit_for
from bridge.push import ExportCounter, OtlpPusher
from exporter.app.wiring import build_registry
from exporter.collect.collector import Collector
from exporter.core.labels import device_label_values, label_schema
from exporter.core.model import DeviceSample, Snapshot, Workload, WorkloadUsage
from exporter.devices.simulated.backend import SimulatedBackend
from exporter.output import catalogue as cat

SCOPE = InstrumentationScope("l9gpu", "test")
RESOURCE = Resource({"service.name": "l9gpu"})
CUMULATIVE = AggregationTemporality.CUMULATIVE
CUMULATIVE_PB = 2  # AGGREGATION_TEMPORALITY_CUMULATIVE in the protobuf enum


class _Fixed:
    """A registry stand-in that yields the same families every time (one snapshot)."""

    def __init__(self, families):
        self.families = list(families)

    def collect(self):
        return iter(self.families)


def _points(data):
    """OTel SDK MetricsData -> {(name, frozenset(attrs)): (metric, point)}, asserting no duplicates."""
    out = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, frozenset(point.attributes.items()))
                    assert key not in out, f"series sent twice: {key}"
                    out[key] = (metric, point)
    return out


def _expected_attrs(labels):
    return frozenset((cat.otel_attribute(k), v) for k, v in labels.items() if v != "")


# ---- conversion --------------------------------------------------------------------


def _workload_snapshot() -> Snapshot:
    device = DeviceSample(index=3, uuid="GPU-1b849e72-0003-4c1d-9a3e-5f0c2d7b0003", model="NVIDIA H100 80GB HBM3",
                          memory_used_bytes=75_000_000_000, memory_total_bytes=85_899_345_920, power_watts=650.0)
    workload = Workload(kind="kubernetes", namespace="ml-production", pod="vllm-llama3-70b-6d8b94df7-q5z82",
                        container="inference-engine", pod_uid="uid-1", owner_kind="Deployment",
                        owner_name="vllm-llama3-70b", labels=(("team", "inference"),))
    labels = device_label_values("sim-node-01", device) + label_schema(["team"])[1](workload)
    usage = WorkloadUsage(device_key=device.key, workload=workload, labels=labels, memory_used_bytes=73_819_750_400, utilization=0.9,
                          processes=1, idle_seconds=0.0, usage_seconds_total=12.5, allocation_seconds_total=30.0,
                          energy_joules_total=9000.0)
    return Snapshot(seq=1, node="sim-node-01", timestamp=time.time(), devices=(device,),
                    device_energy_joules={device.key: 123456.0}, workloads=(usage,))


def test_workload_memory_point_has_the_semantic_convention_attributes():
    extra, _ = label_schema(["team"])
    snap = _workload_snapshot()
    registry = build_registry(lambda: snap, cat.enabled_names(), extra)
    points = _points(to_metrics_data(registry.collect(), RESOURCE, SCOPE, 10**18, StartTimes(0)))
    found = [(m, p) for (name, _), (m, p) in points.items() if name == "container_gpu_memory_used_bytes"]
    assert len(found) == 1
    metric, point = found[0]
    assert metric.unit == "By"
    assert isinstance(metric.data, Gauge)
    assert point.value == 73_819_750_400
    assert dict(point.attributes) == {
        "k8s.node.name": "sim-node-01", "gpu.index": "3", "gpu.id": "GPU-1b849e72-0003-4c1d-9a3e-5f0c2d7b0003",
        "gpu.model": "NVIDIA H100 80GB HBM3", "k8s.namespace.name": "ml-production",
        "k8s.pod.name": "vllm-llama3-70b-6d8b94df7-q5z82", "k8s.container.name": "inference-engine",
        "k8s.pod.uid": "uid-1", "k8s.workload.kind": "Deployment", "k8s.workload.name": "vllm-llama3-70b",
        "k8s.pod.label.team": "inference",
    }
    assert "slurm.job.id" not in point.attributes and "gpu.mig.instance" not in point.attributes
    usage = [(m, p) for (name, _), (m, p) in points.items() if name == "container_gpu_usage_seconds_total"]
    (metric, point), = usage
    assert isinstance(metric.data, Sum) and metric.data.is_monotonic
    assert metric.data.aggregation_temporality == CUMULATIVE and metric.unit == "s"


def _simulated_families():
    backend = SimulatedBackend()
    backend.open()
    try:
        collector = Collector([backend], "sim-node-01", 0.5)
        collector.collect_once()
        snap = collector.collect_once()
    finally:
        backend.close()
    registry = build_registry(lambda: snap, cat.enabled_names(), label_schema([])[0])
    registry.register(ExportCounter())
    return list(registry.collect())


def test_every_series_of_a_scrape_becomes_one_point_with_the_same_value():
    families = _simulated_families()
    text = generate_latest(_Fixed(families)).decode()
    points = _points(to_metrics_data(families, RESOURCE, SCOPE, 10**18, StartTimes(5 * 10**17)))
    scraped = {}
    types = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, _expected_attrs(s.labels))
            assert key not in scraped
            scraped[key] = s.value
            types[s.name] = family.type
    assert set(points) == set(scraped)
    assert len(points) > 150
    for key, value in scraped.items():
        metric, point = points[key]
        assert point.value == value, key
        assert point.time_unix_nano == 10**18
        if types[key[0]] == "counter":
            assert isinstance(metric.data, Sum), key
            assert metric.data.is_monotonic and metric.data.aggregation_temporality == CUMULATIVE
            assert point.start_time_unix_nano == 5 * 10**17
        else:
            assert isinstance(metric.data, Gauge), key
        spec = cat.BY_NAME.get(key[0])
        if spec is not None:
            assert metric.unit == spec.ucum, key
            assert metric.description == spec.help
    names = {name for name, _ in points}
    for family in ("process_cpu_seconds_total", "python_gc_collections_total", "python_info", "gpu_info",
                   "l9gpu_build_info", "l9gpu_otlp_exports_total", "gpu_energy_joules_total"):
        assert family in names
    units = {name: m.unit for (name, _), (m, _p) in points.items()}
    assert units["process_resident_memory_bytes"] == "By"
    assert units["process_cpu_seconds_total"] == "s"
    assert units["gpu_pcie_rx_bytes_total"] == "By"
    assert units["gpu_temperature_celsius"] == "Cel"
    assert units["gpu_power_watts"] == "W"
    assert units["gpu_sm_clock_hertz"] == "Hz"
    assert units["gpu_utilization_ratio"] == "1"
    assert units["python_gc_collections_total"] == ""


def test_counter_start_times_are_stable_per_series_and_forgotten_when_gone():
    starts = StartTimes(agent_start_ns=100)
    one = CounterMetricFamily("jobs", "h", labels=["pod"])
    one.add_metric(["a"], 1.0)
    first = _points(to_metrics_data([one], RESOURCE, SCOPE, 1000, starts))
    assert first[("jobs_total", frozenset({("k8s.pod.name", "a")}))][1].start_time_unix_nano == 100
    two = CounterMetricFamily("jobs", "h", labels=["pod"])
    two.add_metric(["a"], 2.0)
    two.add_metric(["b"], 1.0)
    second = _points(to_metrics_data([two], RESOURCE, SCOPE, 2000, starts))
    assert second[("jobs_total", frozenset({("k8s.pod.name", "a")}))][1].start_time_unix_nano == 100
    assert second[("jobs_total", frozenset({("k8s.pod.name", "b")}))][1].start_time_unix_nano == 1000
    three = CounterMetricFamily("jobs", "h", labels=["pod"])
    three.add_metric(["b"], 3.0)
    to_metrics_data([three], RESOURCE, SCOPE, 3000, starts)
    assert len(starts) == 1  # "a" is gone and forgotten: the table never outgrows the live series


def test_created_samples_give_the_start_time_and_are_not_sent():
    registry = CollectorRegistry()
    Counter("requests", "h", registry=registry).inc(3)
    points = _points(to_metrics_data(registry.collect(), RESOURCE, SCOPE, 10**19, StartTimes(0)))
    assert set(name for name, _ in points) == {"requests_total"}
    metric, point = points[("requests_total", frozenset())]
    assert point.value == 3 and abs(point.start_time_unix_nano / 1e9 - time.time()) < 60


def test_histograms_and_summaries():
    registry = CollectorRegistry()
    hist = PromHistogram("latency_seconds", "h", buckets=(0.1, 1.0), registry=registry)
    for v in (0.05, 0.5, 0.7, 3.0):
        hist.observe(v)
    Summary("size_bytes", "h", registry=registry).observe(10)
    points = _points(to_metrics_data(registry.collect(), RESOURCE, SCOPE, 10**19, StartTimes(0)))
    metric, point = points[("latency_seconds", frozenset())]
    assert isinstance(metric.data, Histogram) and metric.unit == "s"
    assert list(point.explicit_bounds) == [0.1, 1.0] and list(point.bucket_counts) == [1, 2, 1]
    assert point.count == 4 and point.sum == pytest.approx(4.25)
    assert points[("size_bytes_count", frozenset())][1].value == 1
    assert points[("size_bytes_sum", frozenset())][0].unit == "By"


def test_units_and_attributes_helpers():
    assert unit_for("process_virtual_memory_bytes") == "By"
    assert unit_for("something_bytes_per_second") == "By/s"
    assert unit_for("python_gc_objects_collected_total") == ""
    assert unit_for("gpu_ecc_errors_total") == "1"  # catalogue count
    assert attributes({"pod": "p", "slurm_job_id": "", "generation": "0"}) == {"k8s.pod.name": "p", "generation": "0"}


# ---- settings ----------------------------------------------------------------------


def _args(**kw):
    base = dict(otlp_endpoint=None, otlp_protocol=None, otlp_insecure=None, otlp_header=[], otlp_interval=None,
                otlp_timeout=None, otlp_certificate=None)
    base.update(kw)
    return Namespace(**base)


def test_no_endpoint_means_no_push():
    assert bconfig.resolve(_args(), env={}) is None


def test_flags_win_over_variables_and_variables_follow_the_spec():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://env-collector:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
           "OTEL_EXPORTER_OTLP_HEADERS": "api-key=from%20env,x-tenant=a", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
           "OTEL_METRIC_EXPORT_INTERVAL": "15000"}
    s = bconfig.resolve(_args(), env=env)
    assert (s.protocol, s.endpoint, s.tls) == ("http/protobuf", "http://env-collector:4318/v1/metrics", False)
    assert s.headers == {"api-key": "from env", "x-tenant": "a"}
    assert (s.interval, s.timeout) == (15.0, 2.5)  # milliseconds, as the specification says
    s = bconfig.resolve(_args(otlp_endpoint="collector:4317", otlp_protocol="grpc", otlp_insecure=True,
                              otlp_header=[("X-Tenant", "b")], otlp_interval=5.0, otlp_timeout=1.0), env=env)
    assert (s.protocol, s.endpoint, s.tls) == ("grpc", "collector:4317", False)
    assert s.headers == {"api-key": "from env", "x-tenant": "b"}  # gRPC metadata keys are lower-case
    assert (s.interval, s.timeout) == (5.0, 1.0)


def test_endpoint_forms():
    r = bconfig.resolve
    assert r(_args(otlp_endpoint="collector"), env={}).endpoint == "collector:4317"
    assert r(_args(otlp_endpoint="collector"), env={}).tls is True
    assert r(_args(otlp_endpoint="http://collector:4317"), env={}).tls is False
    assert r(_args(otlp_endpoint="https://collector:4317"), env={}).tls is True
    assert r(_args(otlp_endpoint="collector:4317"), env={"OTEL_EXPORTER_OTLP_INSECURE": "true"}).tls is False
    http = dict(otlp_protocol="http/protobuf")
    assert r(_args(otlp_endpoint="https://c:4318/", **http), env={}).endpoint == "https://c:4318/v1/metrics"
    assert r(_args(otlp_endpoint="https://c:4318/v1/metrics", **http), env={}).endpoint == "https://c:4318/v1/metrics"
    assert r(_args(otlp_endpoint="c:4318", otlp_insecure=True, **http), env={}).endpoint == "http://c:4318/v1/metrics"
    signal = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/custom", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}
    assert r(_args(**http), env=signal).endpoint == "http://c:4318/custom"  # signal-specific: used as given


def test_incident_log_records_go_beside_the_metrics():
    r = bconfig.resolve
    http = dict(otlp_protocol="http/protobuf")
    grpc = r(_args(otlp_endpoint="collector:4317"), env={})
    assert bconfig.logs_endpoint(grpc, env={}) == "collector:4317"  # one receiver serves both services
    settings = r(_args(otlp_endpoint="https://c:4318/otlp", **http), env={})
    assert bconfig.logs_endpoint(settings, env={}) == "https://c:4318/otlp/v1/logs"
    assert bconfig.logs_endpoint(settings, env={"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "https://logs:4318/in"}) == (
        "https://logs:4318/in")
    custom = r(_args(**http), env={"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4318/custom"})
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_LOGS_ENDPOINT .*--otlp-incidents off"):
        bconfig.logs_endpoint(custom, env={})
    with pytest.raises(ValueError, match="give the full URL"):
        bconfig.logs_endpoint(settings, env={"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "logs:4318"})


def test_a_metrics_endpoint_with_its_own_path_and_no_logs_endpoint_is_a_usage_error():
    result = run_cli(["serve", "--backend", "simulated", "--listen", "127.0.0.1:0", "--otlp-protocol",
                      "http/protobuf"], env={"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:1/custom"})
    assert result.returncode == 2, result.stderr
    assert "set OTEL_EXPORTER_OTLP_LOGS_ENDPOINT" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("kw, env, message", [
    (dict(otlp_endpoint="ftp://c:1"), {}, "scheme must be http or https"),
    (dict(otlp_endpoint="c:notaport"), {}, "invalid port"),
    (dict(otlp_endpoint="https://c:4317", otlp_insecure=True), {}, "contradicts"),
    (dict(otlp_endpoint="c:4317"), {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "supports grpc and http/protobuf"),
    (dict(otlp_endpoint="c:4317"), {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}, "not a duration"),
    (dict(otlp_endpoint="c:4317"), {"OTEL_EXPORTER_OTLP_INSECURE": "maybe"}, "not a boolean"),
    (dict(otlp_endpoint="c:4317"), {"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "invalid entry"),
    (dict(otlp_endpoint="c:4317", otlp_certificate="/nonexistent/ca.pem"), {}, "not readable"),
])
def test_bad_settings_raise_one_line(kw, env, message):
    with pytest.raises(ValueError, match=message) as info:
        bconfig.resolve(_args(**kw), env=env)
    assert "\n" not in str(info.value)


def test_header_values_and_url_credentials_are_never_described():
    s = bconfig.resolve(_args(otlp_endpoint="http://user:pw@c:4317", otlp_header=[("authorization", "Bearer s3cret")]),
                        env={})
    text = s.describe()
    assert "authorization" in text and "s3cret" not in text and "pw" not in text


@pytest.mark.parametrize("flag", [["--otlp-timeout", "soon"], ["--otlp-protocol", "http/json"],
                                  ["--otlp-header", "novalue"], ["--otlp-endpoint", "ftp://c:1"]])
def test_cli_rejects_bad_otlp_flags_with_exit_2(flag):
    result = run_cli(["serve", "--backend", "simulated", "--listen", "127.0.0.1:0", "--otlp-endpoint", "c:4317", *flag],
                     timeout=30)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# ---- in-process push loop ----------------------------------------------------------


class _HungExporter:
    """Fails its first export, then hangs in every later one until released."""

    def __init__(self):
        self.calls = 0
        self.release = threading.Event()

    def export(self, data, timeout_millis=None):
        from opentelemetry.sdk.metrics.export import MetricExportResult
        self.calls += 1
        if self.calls > 1:
            self.release.wait(PATIENCE)
        return MetricExportResult.FAILURE

    def shutdown(self, timeout_millis=None):
        pass


def test_a_hung_exporter_never_blocks_the_caller_and_stop_is_bounded():
    registry = CollectorRegistry()
    registry.register(ExportCounter())
    exporter = _HungExporter()
    pusher = OtlpPusher(registry, exporter, RESOURCE, interval=0.05, timeout=0.3).start()
    try:
        wait_until(lambda: exporter.calls >= 2, what="an export hanging after a failed one")
        assert pusher.counter.value("failure") == 1
        t0 = time.monotonic()
        pusher.stop(timeout=1.0)
        # stop() gives up after its timeout (1 s) plus at most 1 s for the exporter's
        # shutdown, while the export would hang for PATIENCE seconds.
        assert time.monotonic() - t0 < PATIENCE / 4
    finally:
        exporter.release.set()


def _dead_endpoint() -> str:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_failed_export_leaves_nothing_behind_for_the_garbage_collector(protocol):
    """The SDK's exporter leaves each failed batch in a reference cycle (its RpcError, the
    traceback's frames holding the batch's protobuf request and, over gRPC, the channel it
    closed): the pusher frees it at once, so memory does not wait on the cyclic GC's
    schedule while the endpoint is down."""
    import gc

    from bridge.cli import build_exporter

    endpoint = _dead_endpoint()
    settings = bconfig.resolve(Namespace(otlp_endpoint=endpoint if protocol == "grpc" else f"http://{endpoint}",
                                         otlp_protocol=protocol, otlp_insecure=True, otlp_timeout=0.15), env={})
    registry = CollectorRegistry()
    registry.register(ExportCounter())
    Counter("work_done", "Work.", ["gpu"], registry=registry).labels("0").inc()
    pusher = OtlpPusher(registry, build_exporter(settings), RESOURCE, interval=60, timeout=0.15)

    def left_over() -> list[str]:
        return sorted(type(o).__name__ for o in gc.get_objects()
                      if type(o).__name__ in ("ExportMetricsServiceRequest", "_InactiveRpcError", "Channel", "frame"))

    gc.collect()
    before = left_over()
    gc.disable()  # only what the pusher frees itself is freed
    try:
        for _ in range(3):
            assert pusher.export_once() is False
        assert left_over() == before
    finally:
        gc.enable()
        pusher.stop(timeout=1.0)


# ---- end to end against real receivers --------------------------------------------

STATIC = ("gpu_info", "gpu_memory_total_bytes", "gpu_power_limit_watts", "gpu_up", "l9gpu_build_info",
          "python_info", "process_max_fds", "process_start_time_seconds")
# Series whose presence depends on the moment (the failure counter appears with the first failure).
MOMENTARY = {("l9gpu_otlp_exports_total", frozenset({("l9gpu.result", "failure")}))}


def _series(points):
    return {(p["name"], frozenset(p["attributes"].items())): p for p in points}


def _scrape_series(text):
    return {(name, _expected_attrs(labels)): value
            for name, rows in parse_metrics(text).items() for labels, value in rows}


def _agent_args(receiver, protocol, *extra):
    args = ["--backend", "simulated", "--interval", "500ms", "--otlp-endpoint", receiver.endpoint,
            "--otlp-protocol", protocol, "--otlp-interval", "1s", "--otlp-timeout", "2s"]
    if protocol == "grpc":
        args.append("--otlp-insecure")
    return args + list(extra)


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request):
    rec = GrpcReceiver() if request.param == "grpc" else HttpReceiver()
    rec.start()
    rec.protocol = request.param
    yield rec
    rec.stop()


def test_push_matches_the_scrape(receiver, agent_factory):
    agent = agent_factory(*_agent_args(receiver, receiver.protocol, "--otlp-header", "authorization=Bearer s3cret",
                                       "--otlp-header", "X-Tenant=gpu-team"),
                          env={"OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test,k8s.cluster.name=lab"})
    receiver.wait_for(2)
    scraped = _scrape_series(agent.scrape())
    first = len(receiver.snapshot())
    requests = receiver.wait_for(first + 6)[first - 1:]
    # Once per interval (1 s), no bursts: a late push is never made up for by extra ones,
    # so n pushes span at least n - 1 intervals, less the lateness of the first one
    # (up to 2 s allowed here for a busy machine).
    span = requests[-1].at - requests[0].at
    assert len(requests) - 1 <= span / 1.0 + 2, [r.at for r in requests]
    last = requests[-1]
    assert last.headers["authorization"] == "Bearer s3cret"
    assert last.headers["x-tenant"] == "gpu-team"
    pushed = _series(last.points)
    assert len(pushed) == len(last.points), "a series arrived twice in one request"
    assert set(pushed) - MOMENTARY == set(scraped) - MOMENTARY
    types = {f.name: f.type for f in text_string_to_metric_families(agent.scrape())}
    for key, point in pushed.items():
        name = key[0]
        family_type = types.get(name) or types.get(name[: -len("_total")])
        if family_type == "counter":
            assert point["kind"] == "sum" and point["monotonic"] and point["temporality"] == CUMULATIVE_PB, key
        else:
            assert point["kind"] == "gauge", key
        if name in STATIC:
            assert point["value"] == scraped[key], key
        spec = cat.BY_NAME.get(name)
        if spec is not None:
            assert point["unit"] == spec.ucum
    resource = last.points[0]["resource"]
    assert resource["service.name"] == "l9gpu" and resource["k8s.node.name"] == "sim-node-01"
    assert resource["deployment.environment"] == "test" and resource["k8s.cluster.name"] == "lab"
    assert resource["host.name"] == socket.gethostname() and resource["service.version"]
    # Counters keep their start time and only grow from one push to the next.
    before = _series(requests[-2].points)
    energy = [k for k in pushed if k[0] == "gpu_energy_joules_total"]
    assert len(energy) == 8
    for key in energy:
        assert pushed[key]["start"] == before[key]["start"] <= before[key]["time"]
        assert pushed[key]["value"] >= before[key]["value"]
    assert "s3cret" not in agent.log()
    status, _, body = agent.get("/metrics")
    assert 'l9gpu_otlp_exports_total{result="success"}' in body.decode()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _counter(agent, result):
    values = [v for labels, v in parse_metrics(agent.scrape()).get("l9gpu_otlp_exports_total", [])
              if labels["result"] == result]
    return values[0] if values else 0.0


def _rss_floor_kib(agent, result: str, exports: int = 5) -> int:
    """The agent's least RSS while ``exports`` more exports end with ``result``: what it
    keeps between exports. A single reading may catch a batch in flight (its points and
    protobuf request, about 2.5 MB here, freed when the export ends) and so swings by that
    much from one reading to the next."""
    until = _counter(agent, result) + exports
    floor = _rss_kib(agent.proc.pid)
    while True:
        for _ in range(10):
            floor = min(floor, _rss_kib(agent.proc.pid))
            time.sleep(0.005)  # readings spread over the exports, not a wait for them
        if _counter(agent, result) >= until:
            return floor


def test_receiver_outage_drops_and_counts_batches_then_pushing_resumes(receiver, agent_factory):
    agent = agent_factory("--backend", "simulated", "--interval", "500ms", "--otlp-endpoint", receiver.endpoint,
                          "--otlp-protocol", receiver.protocol, "--otlp-interval", "200ms", "--otlp-timeout", "150ms",
                          *(["--otlp-insecure"] if receiver.protocol == "grpc" else []))
    receiver.wait_for(5)
    rss_before = _rss_floor_kib(agent, "success")
    failures_before = _counter(agent, "failure")
    receiver.stop()
    # Down: /metrics keeps answering while batches fail (the black-hole test below shows
    # it never waits on an export), and nothing accumulates per failed batch.
    # (the first failures still grow the heap to its high-water mark: measure after them)
    wait_until(lambda: "gpu_up" in agent.scrape() and _counter(agent, "failure") >= failures_before + 15,
               what="15 failed exports")
    rss_down = _rss_floor_kib(agent, "failure")
    wait_until(lambda: "gpu_up" in agent.scrape() and _counter(agent, "failure") >= failures_before + 35,
               what="20 more failed exports")
    rss_later = _rss_floor_kib(agent, "failure")
    assert rss_later - rss_down < 2 * 1024, (rss_down, rss_later)
    receiver.clear()
    receiver.start()
    got = receiver.wait_for(3)
    assert any(p["name"] == "gpu_info" for p in got[-1].points)
    assert agent.proc.poll() is None
    successes = _counter(agent, "success")
    wait_until(lambda: _counter(agent, "success") > successes, what="more successful exports")
    rss_after = _rss_floor_kib(agent, "success")
    assert rss_after - rss_before < 8 * 1024, (rss_before, rss_after)  # no queue of dropped batches


def test_push_only_serves_no_metrics_but_health(agent_factory):
    rec = GrpcReceiver().start()
    try:
        agent = agent_factory(*_agent_args(rec, "grpc", "--no-metrics-endpoint"))
        assert agent.get("/metrics")[0] == 404
        assert agent.get("/healthz")[0] == 200
        got = rec.wait_for(1)
        assert any(p["name"] == "gpu_memory_total_bytes" for p in got[-1].points)
    finally:
        rec.stop()


def _self_signed(tmp: Path) -> tuple[bytes, bytes, Path]:
    crypto = pytest.importorskip("cryptography", reason="cryptography is needed to make a test certificate")
    del crypto
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "l9gpu-test-receiver")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    ca = tmp / "ca.pem"
    ca.write_bytes(cert_pem)
    return cert_pem, key_pem, ca


@pytest.mark.parametrize("how", ["env", "flag"])
def test_grpc_over_tls_with_a_self_signed_certificate(tmp_path, agent_factory, how):
    cert, key, ca = _self_signed(tmp_path)
    rec = GrpcReceiver(tls=(cert, key)).start()
    try:
        args = ["--backend", "simulated", "--interval", "500ms", "--otlp-endpoint", rec.endpoint,
                "--otlp-interval", "500ms", "--otlp-timeout", "2s", "--otlp-header", "authorization=Bearer tls"]
        env = {}
        if how == "env":
            env["OTEL_EXPORTER_OTLP_CERTIFICATE"] = str(ca)
        else:
            args += ["--otlp-certificate", str(ca)]
        agent = agent_factory(*args, env=env)
        got = rec.wait_for(1)
        assert got[-1].headers["authorization"] == "Bearer tls"
        assert any(p["name"] == "gpu_info" for p in got[-1].points)
        assert "plaintext" not in agent.log() and "TLS" in agent.log()
    finally:
        rec.stop()


def test_tls_without_the_ca_fails_and_is_counted(tmp_path, agent_factory):
    cert, key, _ = _self_signed(tmp_path)
    rec = GrpcReceiver(tls=(cert, key)).start()
    try:
        agent = agent_factory("--backend", "simulated", "--interval", "500ms", "--otlp-endpoint", rec.endpoint,
                              "--otlp-interval", "300ms", "--otlp-timeout", "250ms")
        wait_until(lambda: _counter(agent, "failure") >= 2, what="2 failed exports")
        assert rec.snapshot() == []
    finally:
        rec.stop()


def test_a_black_hole_endpoint_never_delays_metrics_and_shutdown_is_bounded(agent_factory):
    # Accepts connections, never answers: every export runs into its timeout.
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    conns = []
    stop = threading.Event()

    def accept():
        hole.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(hole.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        port = hole.getsockname()[1]
        # Each export hangs for its whole timeout (6 s): scrapes meanwhile take a small
        # fraction of that, as they never wait on an export.
        agent = agent_factory("--backend", "simulated", "--interval", "500ms", "--otlp-endpoint",
                              f"http://127.0.0.1:{port}", "--otlp-protocol", "http/protobuf",
                              "--otlp-interval", "300ms", "--otlp-timeout", "6s")
        wait_until(lambda: conns, what="an export connected to the black hole")
        for _ in range(10):
            t = time.monotonic()
            agent.scrape()
            assert time.monotonic() - t < 3.0
        wait_until(lambda: _counter(agent, "failure") >= 1, what="a timed-out export")
        # Shutdown gives up on the hanging last export after the export timeout + 1 s.
        t = time.monotonic()
        assert agent.stop(timeout=PATIENCE) == 0
        assert time.monotonic() - t < within(6.0 + 2.0, factor=2.0)
    finally:
        stop.set()
        hole.close()
        for c in conns:
            c.close()

