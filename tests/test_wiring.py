"""Wiring (`exporter.app.wiring`): from the flags of ``l9gpu serve`` to the agent's parts.

What a flag turns into: the collector's pass settings, the families /metrics exports, the
DCGM fields, the registry that /metrics and the OTLP bridge read, the listener's limits,
the Node status writer. The flags are parsed by the real parser (`exporter.app.cli`), and
the devices are the simulated node's (or the NVML fake's, where the NVML read matters), in
process. What the commands print and how they exit is in tests/test_cli.py.
"""

from __future__ import annotations

import logging
import resource
import threading
from typing import Any, Mapping

import pytest
from fakes.pynvml_fake import FakeGpu, FakeNvml, FakeProcess

from exporter.app.cli import build_parser
from exporter.app.errors import UsageError
from exporter.app.wiring import (
    build_collector,
    build_node_status,
    build_registry,
    close_backends_within,
    connection_limits,
    enabled_families,
    gpm_keys,
    gpm_status,
    open_sources,
    select_dcgm_fields,
    web_config_watcher,
)
from exporter.core.labels import label_schema
from exporter.core.model import GPM_RATE_KEYS, GPM_RATIO_KEYS, DeviceSample
from exporter.devices import close_backends
from exporter.devices.base import Backend
from exporter.devices.capabilities import GpmStatus
from exporter.devices.nvml import NvmlBackend
from exporter.nodestatus import NodeStatusWriter
from exporter.output import catalogue as cat
from exporter.output.dcgm import fields as dcgm

UTIL_CALL = "nvmlDeviceGetProcessesUtilizationInfo"


def serve(*flags: str) -> Any:
    """``l9gpu serve --backend simulated FLAGS``, parsed."""
    args = build_parser().parse_args(["serve", "--backend", "simulated", *flags])
    args.node_name = args.node_name or "n"
    return args


def exported(*flags: str) -> set[str]:
    """The families the registry of ``l9gpu serve FLAGS`` yields on the simulated node."""
    args = build_parser().parse_args(["serve", "--backend", "simulated", *flags])
    backends, attributor = open_sources(args)
    try:
        collector, extra = build_collector(args, backends, attributor)
        collector.collect_once()
        registry = build_registry(lambda: collector.snapshot, enabled_families(args), extra, select_dcgm_fields(args))
        return {family.name for family in registry.collect()}
    finally:
        attributor.close()
        close_backends(backends)


# ---- the collector ------------------------------------------------------------------------------


@pytest.mark.parametrize("flags", [["--process-metrics"], ["--enable-metric", "gpu_process_utilization_ratio"]])
def test_the_flags_that_export_per_process_series_keep_the_read(flags):
    args = build_parser().parse_args(["serve", "--backend", "simulated", *flags])
    args.node_name = "n"
    fake = FakeNvml([FakeGpu(processes=[FakeProcess(pid=9)])])
    backend = NvmlBackend(nvml=fake, gpm=False)
    backend.open()
    collector, _ = build_collector(args, [backend], None)
    assert collector.process_metrics
    collector.collect_once()
    assert len(fake.called(UTIL_CALL)) == 1


def test_without_per_process_series_a_single_owner_gpu_is_not_asked_for_its_samples() -> None:
    fake = FakeNvml([FakeGpu(processes=[FakeProcess(pid=9)])])
    backend = NvmlBackend(nvml=fake, gpm=False)
    backend.open()
    collector, _ = build_collector(serve(), [backend], None)
    assert not collector.process_metrics
    collector.collect_once()
    assert fake.called(UTIL_CALL) == []


def test_the_collector_takes_its_pass_settings_from_the_flags() -> None:
    args = serve("--node-name", "gpu-node-7", "--interval", "2s", "--read-timeout", "3s", "--pod-label", "team")
    collector, extra = build_collector(args, [], None)
    assert (collector.node, collector.interval, collector.read_timeout) == ("gpu-node-7", 2.0, 3.0)
    assert extra == label_schema(["team"])[0] and extra[-3:] == ("label_team", "training_job", "training_rank")
    # `l9gpu snapshot` gives its reads its --timeout
    snapshot = build_parser().parse_args(["snapshot", "--backend", "simulated", "--timeout", "4s"])
    snapshot.node_name = "n"
    assert build_collector(snapshot, [], None)[0].read_timeout == 4.0


def test_the_node_is_named_by_the_flag_else_by_what_the_backend_knows() -> None:
    args = build_parser().parse_args(["serve", "--backend", "simulated"])
    backends, attributor = open_sources(args)
    attributor.close()
    close_backends(backends)
    assert args.node_name == "sim-node-01"  # the simulated node's own name
    named = build_parser().parse_args(["serve", "--backend", "simulated", "--node-name", "mine"])
    backends, attributor = open_sources(named)
    attributor.close()
    close_backends(backends)
    assert named.node_name == "mine"


def test_a_proc_root_that_is_not_a_proc_filesystem_is_a_usage_error(tmp_path) -> None:
    with pytest.raises(UsageError, match=f"--proc-root {tmp_path} is not a proc filesystem"):
        open_sources(serve("--proc-root", str(tmp_path)))


# ---- what is exported ---------------------------------------------------------------------------


def test_the_families_enabled_by_the_flags() -> None:
    assert enabled_families(serve()) == cat.enabled_names()
    process = {spec.name for spec in cat.METRICS if spec.scope == cat.PROCESS}
    assert process and not process & cat.enabled_names()
    assert enabled_families(serve("--process-metrics")) == cat.enabled_names() | process
    assert enabled_families(serve("--enable-metric", "gpu_process_utilization_ratio",
                                  "--disable-metric", "gpu_power_watts")) == (
        cat.enabled_names() | {"gpu_process_utilization_ratio"}) - {"gpu_power_watts"}
    assert enabled_families(serve("--metric-schema", "l9gpu,dcgm")) == cat.enabled_names()


def test_an_unknown_family_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown metric 'gpu_no_such_family'"):
        enabled_families(serve("--enable-metric", "gpu_no_such_family"))


def test_the_dcgm_schema_alone_keeps_only_the_agents_own_families(caplog) -> None:
    own = {spec.name for spec in cat.METRICS if spec.scope == cat.SELF}
    assert enabled_families(serve("--metric-schema", "dcgm")) == own & cat.enabled_names()
    with caplog.at_level(logging.WARNING, logger="l9gpu"):
        enabled_families(serve("--metric-schema", "dcgm", "--process-metrics"))
    assert "--metric-schema dcgm does not export" in caplog.text


def test_the_dcgm_fields_are_served_only_with_the_dcgm_schema() -> None:
    assert select_dcgm_fields(serve()) is None
    default = select_dcgm_fields(serve("--metric-schema", "dcgm"))
    assert default is not None and default.metrics == dcgm.default_selection().metrics
    assert default.hostname_label == dcgm.DEFAULT_HOSTNAME_LABEL
    assert select_dcgm_fields(serve("--metric-schema", "l9gpu,dcgm", "--dcgm-hostname-label", "hostname")
                              ).hostname_label == "hostname"


@pytest.mark.parametrize("flags", [["--collectors", "/etc/dcgm-exporter/default-counters.csv"],
                                   ["--dcgm-hostname-label", "hostname"]])
def test_dcgm_flags_without_the_dcgm_schema_are_a_usage_error(flags) -> None:
    with pytest.raises(UsageError, match=f"{flags[0]} needs --metric-schema dcgm"):
        select_dcgm_fields(serve(*flags))


def test_the_registry_holds_the_families_the_flags_ask_for() -> None:
    runtime = {"process_cpu_seconds", "python_info", "python_gc_objects_collected"}  # prometheus_client's own
    native = exported()
    assert {"gpu_up", "gpu_utilization_ratio", "container_gpu_memory_used_bytes", "l9gpu_collector_success"} <= native
    assert runtime <= native
    assert not {name for name in native if name.startswith("DCGM_FI_")}
    assert not {spec.name for spec in cat.METRICS if spec.scope == cat.PROCESS} & native
    assert "gpu_process_utilization_ratio" in exported("--process-metrics")
    both = exported("--metric-schema", "l9gpu,dcgm")
    assert {"DCGM_FI_DEV_GPU_UTIL", "gpu_utilization_ratio"} <= both and runtime <= both
    dcgm_only = exported("--metric-schema", "dcgm")
    assert "DCGM_FI_DEV_GPU_UTIL" in dcgm_only and "l9gpu_collector_success" in dcgm_only
    assert "gpu_utilization_ratio" not in dcgm_only and runtime <= dcgm_only


# ---- the listener -------------------------------------------------------------------------------


def test_the_listeners_limits_are_the_flags_while_descriptors_allow(monkeypatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    args = serve("--max-connections", "64", "--keepalive-timeout", "30s", "--header-timeout", "5s",
                 "--max-header-bytes", "16384")
    limits, warning = connection_limits(args)
    assert (limits.max_connections, limits.keepalive_timeout, limits.header_timeout, limits.max_header_bytes) == (
        64, 30.0, 5.0, 16384)
    assert warning == ""


def test_an_open_file_limit_too_low_for_max_connections_lowers_it_and_says_why(monkeypatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 1024))
    limits, warning = connection_limits(serve("--max-connections", "100000"))
    assert limits.max_connections < 100000
    assert warning.startswith(f"at most {limits.max_connections} HTTP connections, not --max-connections 100000")
    assert "the open-file limit 1024" in warning and "LimitNOFILE" in warning


def test_a_web_config_is_watched_only_when_given_and_a_bad_one_is_a_usage_error(tmp_path) -> None:
    assert web_config_watcher(None) is None
    bad = tmp_path / "web.yml"
    bad.write_text("tls_server_config: [not, a, mapping\n")
    with pytest.raises(UsageError, match="--web-config"):
        web_config_watcher(str(bad))


# ---- the Node and the backends' lifetime --------------------------------------------------------


def test_the_node_status_writer_follows_node_condition_and_the_kubernetes_api(caplog) -> None:
    writer = build_node_status(serve("--node-condition", "on", "--kubernetes", "on", "--node-taint", "unhealthy",
                                     "--node-taint-key", "example.com/gpu-down"))
    assert isinstance(writer, NodeStatusWriter) and writer.node == "n"
    assert writer.taint is not None and writer.taint.key == "example.com/gpu-down"
    assert build_node_status(serve("--node-condition", "on", "--kubernetes", "off")) is None  # no Node to write
    assert build_node_status(serve("--node-condition", "off", "--kubernetes", "on")) is None
    # a taint without the condition is refused aloud
    with caplog.at_level(logging.WARNING, logger="l9gpu"):
        assert build_node_status(serve("--node-condition", "off", "--kubernetes", "on",
                                       "--node-taint", "unhealthy")) is None
    assert "--node-taint needs --node-condition on and the Kubernetes API" in caplog.text


def test_gpm_status_joins_every_backends() -> None:
    class WithGpm(Backend, GpmStatus):
        name = "gpm"

        def __init__(self, status: Mapping[tuple[int, str], str]):
            self.status = status

        def sample(self, now: float) -> list[DeviceSample]:
            return []

        def gpm_status(self) -> Mapping[tuple[int, str], str]:
            return self.status

    backends = [WithGpm({(0, ""): "active"}), WithGpm({}), WithGpm({(1, "2"): "warming up"})]
    assert gpm_status(backends) == {(0, ""): "active", (1, "2"): "warming up"}


def test_closing_a_backend_that_hangs_gives_up_after_the_timeout(caplog) -> None:
    release = threading.Event()

    class HangsOnClose(Backend):
        name = "stuck"
        call_prefixes = ("hang_",)

        def sample(self, now: float) -> list[DeviceSample]:
            return []

        def hang_in_shutdown(self) -> None:
            release.wait()

        def close(self) -> None:
            self.hang_in_shutdown()

    try:
        with caplog.at_level(logging.WARNING, logger="l9gpu"):
            close_backends_within([HangsOnClose()], 0.2)
        assert "closing the stuck backend did not finish within 0.2s (stuck in hang_in_shutdown)" in caplog.text
    finally:
        release.set()


def test_gpm_asks_only_what_the_exported_families_need() -> None:
    """Graphics activity, the dear GPM metric on an H200, is asked while either of its
    families is exported; with both off the NVML backend asks the other fourteen, with
    every GPM family off none; the DCGM schema keeps them all (its fields pick)."""
    every = set(GPM_RATIO_KEYS) | set(GPM_RATE_KEYS)
    assert gpm_keys(serve()) == every
    assert gpm_keys(serve("--disable-metric", "gpu_graphics_active_ratio")) == every
    off = ("--disable-metric", "gpu_graphics_active_ratio", "--disable-metric", "container_gpu_graphics_active_ratio")
    assert gpm_keys(serve(*off)) == every - {"graphics_active"}
    assert gpm_keys(serve(*off, "--metric-schema", "l9gpu,dcgm")) is None
    all_off = [flag for _, suffix, *_ in cat.GPM_FAMILIES for name in (f"gpu_{suffix}", f"container_gpu_{suffix}")
               for flag in ("--disable-metric", name)]
    assert gpm_keys(serve(*all_off)) == frozenset()


def test_the_nvml_backend_is_opened_with_the_gpm_metrics_of_the_families(monkeypatch) -> None:
    from fakes.pynvml_fake import NVML_GPM_METRIC_GRAPHICS_UTIL, NVML_GPM_METRIC_SM_UTIL, install

    fake = FakeNvml([FakeGpu()])
    clock = [1000.0]
    fake.gpm_clock = lambda: clock[0]
    install(monkeypatch, fake)
    args = build_parser().parse_args(["serve", "--backend", "nvml", "--kubernetes", "off", "--cri-socket", "off",
                                      "--pod-resources-socket", "off", "--gpm-interval", "0",
                                      "--disable-metric", "gpu_graphics_active_ratio",
                                      "--disable-metric", "container_gpu_graphics_active_ratio"])
    backends, attributor = open_sources(args)
    try:
        (backend,) = backends
        backend.sample(clock[0])
        clock[0] += 1.0
        (device,) = backend.sample(clock[0])
    finally:
        close_backends(backends)
        attributor.close()
    (request,) = [call[0] for name, call in fake.calls if name == "nvmlGpmMetricsGet"]
    asked = {entry.metricId for entry in request.metrics[: request.numMetrics]}
    assert NVML_GPM_METRIC_SM_UTIL in asked and NVML_GPM_METRIC_GRAPHICS_UTIL not in asked
    assert "sm_active" in device.gpm and "graphics_active" not in device.gpm
