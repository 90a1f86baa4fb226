"""The DCGM schema (exporter/output/dcgm/fields.py): counters files, names, units and labels, which
series carry workload labels, and agreement with the l9gpu schema on the same snapshot."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from agent import parse_metrics, run_cli
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from exporter.core.labels import device_label_values, workload_id_values
from exporter.core.model import DeviceSample, ProcessSample, Snapshot, Workload, WorkloadUsage, frozen_mapping
from exporter.output import catalogue as cat
from exporter.output.dcgm import fields as dcgm
from exporter.output.dcgm.render import DcgmRenderer
from exporter.output.encode import for_openmetrics
from exporter.output.render import families

DATA = Path(__file__).resolve().parent / "data"
UPSTREAM_COUNTERS = DATA / "dcgm-exporter-default-counters.csv"
# the newest release's (its default set since 4.3.1-4.4.0; help texts of commented-out lines aside)
NEWEST_COUNTERS = DATA / "dcgm-exporter-4.5.3-4.8.2-default-counters.csv"
MIB = 2**20


class _Families:
    def __init__(self, metrics):  # type: ignore[no-untyped-def]
        self._metrics = list(metrics)

    def collect(self):  # type: ignore[no-untyped-def]
        return self._metrics


def dcgm_text(snapshot: Snapshot, selection: dcgm.Selection | None = None,
              renderer: DcgmRenderer | None = None) -> str:
    renderer = renderer or DcgmRenderer(selection or dcgm.default_selection())
    return generate_latest(_Families(renderer.families(snapshot))).decode()


def dcgm_samples(snapshot: Snapshot, **kwargs):  # type: ignore[no-untyped-def]
    """Series name -> [(labels, value)]. (prometheus_client's parser reads a counter's series
    as ``<name>_total``; DCGM's counters have no such suffix, see the exposition test.)"""
    return {name.removesuffix("_total"): series for name, series in parse_metrics(dcgm_text(snapshot, **kwargs)).items()}


def _device(index: int = 0, **overrides) -> DeviceSample:  # type: ignore[no-untyped-def]
    values = dict(index=index, uuid=f"GPU-0000000{index}", model="NVIDIA H100 80GB HBM3", vendor="nvidia",
                  driver_version="550.54.15", pci_bus_id=f"00000000:1{index}:00.0", serial=f"1652{index}",
                  utilization=0.5, memory_utilization=0.25, memory_used_bytes=10 * 2**30,
                  memory_total_bytes=80 * 2**30, temperature_celsius=50.0, power_watts=300.0,
                  sm_clock_hertz=1980e6, memory_clock_hertz=2619e6)
    values.update(overrides)
    return DeviceSample(**values)  # type: ignore[arg-type]


def _usage(device: DeviceSample, namespace: str = "", pod: str = "", container: str = "", pod_uid: str = "",
           slurm: str = "", memory: int | None = 2**30, util: float | None = 0.25, energy: float | None = 10.0,
           present: bool = True) -> WorkloadUsage:
    workload = Workload(kind="slurm" if slurm and not pod else "kubernetes", namespace=namespace, pod=pod,
                        container=container, pod_uid=pod_uid, slurm_job_id=slurm)
    labels = device_label_values("node-a", device) + workload_id_values(workload)
    return WorkloadUsage(device.key, workload, labels, memory, util, 1, 0.0, 1.0, 1.0, energy, present)


# ---- counters files ---------------------------------------------------------------------

def test_dcgm_exporters_own_default_counters_file_is_read():
    """dcgm-exporter's etc/default-counters.csv as shipped: every line is taken; what l9gpu
    cannot read is named, the rest is served in the file's order with the file's type and help."""
    selection = dcgm.select(dcgm.read_counters(str(UPSTREAM_COUNTERS)))
    assert [f.name for f, _, _ in selection.metrics] == [
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE"]
    assert {name for name, _ in selection.skipped} == {
        "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS"}
    types = {f.name: (kind, help_text) for f, kind, help_text in selection.metrics}
    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == ("counter", "Total energy consumption since boot (in mJ).")
    assert types["DCGM_FI_DEV_FB_USED"] == ("gauge", "Framebuffer memory used (in MiB).")
    line = dcgm.describe_skipped(selection, "counters.csv")
    assert line is not None and "\n" not in line
    assert line.startswith("counters.csv: skipping 4 field(s) l9gpu cannot provide: ")
    assert "DCGM_FI_DEV_ENC_UTIL (encoder utilisation is not read)" in line


def test_the_newest_releases_default_counters_file_is_read():
    """dcgm-exporter 4.5.3-4.8.2's etc/default-counters.csv: PCIe as DCGM_FI_PROF_*_BYTES
    rates instead of the DEV_*_THROUGHPUT counters, the DCP fields its dashboard reads, and
    DCGM_FI_DEV_FB_RESERVED, which l9gpu cannot provide."""
    selection = dcgm.select(dcgm.read_counters(str(NEWEST_COUNTERS)))
    assert [f.name for f, _, _ in selection.metrics] == [
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"]
    assert [f.name for f in selection.labels] == ["DCGM_FI_DRIVER_VERSION"]
    assert {name for name, _ in selection.skipped} == {
        "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS"}
    types = {f.name: kind for f, kind, _ in selection.metrics}
    assert types["DCGM_FI_PROF_PCIE_TX_BYTES"] == "gauge" and types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"


def test_the_default_counters_contain_dcgm_exporters_and_every_prof_field():
    default = {line.name for line in dcgm.parse_counters(dcgm.DEFAULT_COUNTERS, "default")}
    for path in (UPSTREAM_COUNTERS, NEWEST_COUNTERS):
        served = {f.name for f, _, _ in dcgm.select(dcgm.read_counters(str(path))).metrics}
        assert served <= default, path
    upstream = {line.name for line in dcgm.read_counters(str(UPSTREAM_COUNTERS))}
    assert upstream <= default
    prof = {f.name for f in dcgm.FIELDS if f.name.startswith("DCGM_FI_PROF_")}
    assert len(prof) == 15 and prof <= default
    assert "DCGM_FI_DRIVER_VERSION" in default


@pytest.mark.parametrize("content, line, message", [
    ("DCGM_FI_DEV_GPU_TEMP, gauge\n", 1, "expected 3 comma-separated fields (DCGM field, type, help), got 2"),
    ("# c\n\nDCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature, in C.\n", 3, "got 4"),
    ("DCGM_FI_DEV_GPU_TEMP, gaug, GPU temperature (in C).\n", 1,
     "unknown type 'gaug' for DCGM_FI_DEV_GPU_TEMP (use gauge, counter or label)"),
    ("DCGM FI DEV, gauge, x\n", 1, "'DCGM FI DEV' is not a DCGM field name"),
    ("DCGM_FI_DEV_GPU_TEMP, gauge, a\nDCGM_FI_DEV_FB_USED, gauge, b\nDCGM_FI_DEV_GPU_TEMP, gauge, c\n", 3,
     "DCGM_FI_DEV_GPU_TEMP is listed twice (first on line 1)"),
    ('DCGM_FI_DEV_GPU_TEMP, gauge, "unterminated\n', 1, "not a CSV line"),
])
def test_a_bad_line_is_an_error_naming_file_and_line(content, line, message):
    with pytest.raises(dcgm.CountersError) as caught:
        dcgm.parse_counters(content, "my.csv")
    assert str(caught.value).startswith(f"my.csv:{line}: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_quoted_help_may_hold_commas_and_comments_may_hold_anything():
    lines = dcgm.parse_counters('# a, b, c, d\n  # indented comment\nDCGM_FI_DEV_FB_USED, gauge, "used, in MiB"\n',
                                "f.csv")
    assert lines == [dcgm.CounterLine("DCGM_FI_DEV_FB_USED", "gauge", "used, in MiB", 3)]


def test_a_file_without_fields_is_an_error():
    with pytest.raises(dcgm.CountersError, match=r"^empty.csv: no fields"):
        dcgm.parse_counters("# only comments\n\n", "empty.csv")


def test_types_l9gpu_does_not_serve_are_skipped_with_a_reason():
    selection = dcgm.select(dcgm.parse_counters(
        "DCGM_FI_DEV_GPU_TEMP, histogram, t\nDCGM_FI_DEV_FB_USED, label, u\nDCGM_FI_DRIVER_VERSION, gauge, v\n"
        "DCGM_FI_DEV_SERIAL, label, s\nDCGM_FI_DEV_NOT_A_THING, gauge, x\n", "f.csv"))
    assert not selection.metrics
    assert [f.name for f in selection.labels] == ["DCGM_FI_DEV_SERIAL"]
    assert dict(selection.skipped) == {
        "DCGM_FI_DEV_GPU_TEMP": "type histogram is not served (use gauge or counter)",
        "DCGM_FI_DEV_FB_USED": "served as type gauge, not label",
        "DCGM_FI_DRIVER_VERSION": "served as type label, not gauge",
        "DCGM_FI_DEV_NOT_A_THING": "not a field l9gpu reads",
    }


def test_parse_schemas():
    assert dcgm.parse_schemas("dcgm") == ("dcgm",)
    assert dcgm.parse_schemas(" l9gpu , DCGM,l9gpu") == ("l9gpu", "dcgm")
    for bad in ("", "prometheus", "l9gpu,nvidia"):
        with pytest.raises(ValueError, match="use l9gpu, dcgm or l9gpu,dcgm"):
            dcgm.parse_schemas(bad)


# ---- the command line ----------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--metric-schema", "nvidia"], "unknown metric schema 'nvidia'; use l9gpu, dcgm or l9gpu,dcgm"),
    (["--collectors", "x.csv"], "--collectors needs --metric-schema dcgm (or l9gpu,dcgm)"),
    (["--dcgm-hostname-label", "hostname"], "--dcgm-hostname-label needs --metric-schema dcgm (or l9gpu,dcgm)"),
    (["--metric-schema", "dcgm", "--dcgm-hostname-label", "HOSTNAME"],
     "argument --dcgm-hostname-label: invalid choice: 'HOSTNAME' (choose from 'Hostname', 'hostname', 'none')"),
    (["--metric-schema", "dcgm", "--collectors", "/nonexistent/counters.csv"],
     "--collectors /nonexistent/counters.csv: cannot read: No such file or directory"),
])
def test_bad_schema_flags_exit_2_with_one_line(args, message):
    result = run_cli(["serve", "--backend", "simulated", "--listen", "127.0.0.1:0", *args])
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert message in result.stderr


def test_a_bad_counters_line_exits_2_naming_file_and_line(tmp_path):
    path = tmp_path / "counters.csv"
    path.write_text("# DCGM FIELD, Prometheus metric type, help message\n"
                    "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                    "DCGM_FI_DEV_FB_USED gauge Framebuffer memory used (in MiB).\n")
    result = run_cli(["serve", "--backend", "simulated", "--metric-schema", "dcgm", "--collectors", str(path)])
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"l9gpu: --collectors {path}:3: expected 3 comma-separated fields (DCGM field, type, help), got 1: "
        "'DCGM_FI_DEV_FB_USED gauge Framebuffer memory used (in MiB).'")


def test_the_environment_sets_the_schema(tmp_path):
    result = run_cli(["serve", "--backend", "simulated"], env={"L9GPU_METRIC_SCHEMA": "dcgm,bogus"})
    assert result.returncode == 2
    assert "L9GPU_METRIC_SCHEMA: unknown metric schema 'bogus'" in result.stderr


def test_a_counters_file_chooses_the_fields_and_names_the_rest_once(agent_factory, tmp_path):
    path = tmp_path / "counters.csv"
    path.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                    "DCGM_FI_DEV_ENC_UTIL, gauge, Encoder utilization (in %).\n"
                    "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n"
                    "DCGM_FI_DEV_NO_SUCH_FIELD, gauge, Typo.\n")
    agent = agent_factory("--backend", "simulated", "--metric-schema", "dcgm", "--collectors", str(path),
                          "--process-metrics")
    samples = agent.samples()
    assert {name for name in samples if name.startswith("DCGM_")} == {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED"}
    assert not any(name.startswith(("gpu_", "container_")) for name in samples)
    assert samples["l9gpu_build_info"], "the agent's own health families stay in the DCGM-only schema"
    # no driver version label: the file does not ask for DCGM_FI_DRIVER_VERSION
    assert all("DCGM_FI_DRIVER_VERSION" not in labels for labels, _ in samples["DCGM_FI_DEV_GPU_TEMP"])
    agent.scrape()
    log = agent.log()
    warnings = [line for line in log.splitlines() if "cannot provide" in line]
    assert len(warnings) == 1, log
    assert "DCGM_FI_DEV_ENC_UTIL (encoder utilisation is not read)" in warnings[0]
    assert "DCGM_FI_DEV_NO_SUCH_FIELD (not a field l9gpu reads)" in warnings[0]
    assert str(path) in warnings[0] and "WARNING" in warnings[0]
    assert "--process-metrics and --enable-metric name l9gpu families, which --metric-schema dcgm does not export" \
        in log


@pytest.mark.parametrize(("flags", "env", "label"), [
    ((), {}, "Hostname"),  # dcgm-exporter up to 4.5.3-4.8.2, Grafana dashboard 12239
    (("--dcgm-hostname-label", "hostname"), {}, "hostname"),  # dcgm-exporter after May 2026
    ((), {"L9GPU_DCGM_HOSTNAME_LABEL": "hostname"}, "hostname"),
    (("--dcgm-hostname-label", "none"), {}, None),  # dcgm-exporter's --no-hostname
])
def test_the_node_label_is_named_as_the_replaced_release_names_it(flags, env, label, agent_factory):
    agent = agent_factory("--backend", "simulated", "--metric-schema", "l9gpu,dcgm", *flags, env=env)
    samples = agent.samples()
    assert any("pod" in labels for labels, _ in samples["DCGM_FI_DEV_FB_USED"]), "workload series are checked too"
    # (prometheus_client's parser reads a counter's series as <name>_total)
    for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"):
        for labels, _ in samples[name]:  # device and workload series alike
            node_labels = {k: v for k, v in labels.items() if k.lower() == "hostname"}
            assert node_labels == ({label: "sim-node-01"} if label else {}), (name, labels)
    # the l9gpu schema keeps its own `node`
    assert all(labels["node"] == "sim-node-01" for labels, _ in samples["gpu_up"])


def test_a_counters_file_with_nothing_servable_is_an_error(tmp_path):
    path = tmp_path / "counters.csv"
    path.write_text("DCGM_FI_DEV_ENC_UTIL, gauge, Encoder utilization (in %).\n")
    result = run_cli(["serve", "--backend", "simulated", "--metric-schema", "dcgm", "--collectors", str(path)])
    assert result.returncode == 2
    assert f"--collectors {path}: none of its fields can be served" in result.stderr


# ---- rendering ----------------------------------------------------------------------------

def test_units_and_labels_of_a_device():
    device = _device(fan_speed_ratio=0.4, memory_temperature_celsius=60.0, power_limit_watts=700.0,
                     pcie_tx_bytes_total=10 * 1024, pcie_rx_bytes_total=3 * 1024,
                     ecc_errors=frozen_mapping({"corrected": 3, "uncorrected": 1}),
                     throttle_reasons=frozen_mapping({"gpu_idle": False, "sw_power_cap": True, "hw_slowdown": True}),
                     gpm=frozen_mapping({"graphics_active": 0.5, "tensor_active": 0.25,
                                         "pcie_tx_bytes_per_second": 1e9}))
    snap = Snapshot(seq=1, node="node-a", timestamp=0.0, devices=(device,),
                    device_energy_joules=frozen_mapping({device.key: 1234.5}))
    everything = dcgm.select(dcgm.parse_counters("\n".join(f"{f.name}, {f.type}, h" for f in dcgm.FIELDS), "all"))
    samples = dcgm_samples(snap, selection=everything)
    labels = {"gpu": "0", "UUID": "GPU-00000000", "pci_bus_id": "00000000:10:00.0", "device": "nvidia0",
              "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "node-a", "DCGM_FI_DRIVER_VERSION": "550.54.15",
              "DCGM_FI_DEV_SERIAL": "16520"}
    values = {}
    for name, series in samples.items():
        ((got, value),) = series
        assert got == labels, name
        values[name] = value
    assert values == {
        "DCGM_FI_DEV_SM_CLOCK": 1980.0, "DCGM_FI_DEV_MEM_CLOCK": 2619.0, "DCGM_FI_DEV_MEMORY_TEMP": 60.0,
        "DCGM_FI_DEV_GPU_TEMP": 50.0, "DCGM_FI_DEV_POWER_USAGE": 300.0, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 700.0,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 1234500.0, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": 10.0,
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": 3.0, "DCGM_FI_DEV_GPU_UTIL": 50.0, "DCGM_FI_DEV_MEM_COPY_UTIL": 25.0,
        "DCGM_FI_DEV_XID_ERRORS": 0.0, "DCGM_FI_DEV_FB_FREE": 70 * 1024.0, "DCGM_FI_DEV_FB_USED": 10 * 1024.0,
        "DCGM_FI_DEV_FB_TOTAL": 80 * 1024.0, "DCGM_FI_DEV_FAN_SPEED": 40.0, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 3.0,
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 1.0, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0x4 | 0x8,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x4 | 0x8, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.25, "DCGM_FI_PROF_PCIE_TX_BYTES": 1e9,
    }, "every field the device does not report (here most GPM keys) is absent, never 0"


def test_counters_keep_dcgms_names_in_both_exposition_formats():
    device = _device()
    snap = Snapshot(seq=1, node="n", timestamp=0.0, devices=(device,),
                    device_energy_joules=frozen_mapping({device.key: 2.0}))
    metrics = DcgmRenderer(dcgm.default_selection()).families(snap)
    text = generate_latest(_Families(metrics)).decode()
    assert "# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).\n" in text
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{" in text
    assert "_total" not in text
    # OpenMetrics 1.0 forbids a counter without _total: as /metrics serves it, typed unknown
    openmetrics = generate_openmetrics(_Families(for_openmetrics(metrics))).decode()
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in openmetrics
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge\nDCGM_FI_DEV_GPU_TEMP{" in openmetrics
    assert "_total" not in openmetrics


def test_workload_series_only_on_fields_with_an_honest_share():
    device = _device(processes=(ProcessSample(1, 2**30, 0.3), ProcessSample(2, 3 * 2**30, 0.1)),
                     gpm=frozen_mapping({"graphics_active": 0.6, "tensor_active": 0.5}))
    a = _usage(device, "ns", "pod-a", "main", "uid-a", memory=2**30, util=0.3, energy=5.0)
    b = _usage(device, "", "", "", "", slurm="4242", memory=3 * 2**30, util=0.1, energy=7.0)
    snap = Snapshot(seq=1, node="node-a", timestamp=0.0, devices=(device,), workloads=(a, b),
                    device_energy_joules=frozen_mapping({device.key: 100.0}))
    samples = dcgm_samples(snap)
    with_workload = {name for name, series in samples.items()
                     if any("pod" in labels or "hpc_job" in labels for labels, _ in series)}
    assert with_workload == {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                             "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}
    for name, series in samples.items():
        devices = [labels for labels, _ in series if "pod" not in labels and "hpc_job" not in labels]
        assert len(devices) == 1, f"{name}: one device series per GPU"

    def value(name: str, **labels: str) -> float:
        (found,) = [v for lab, v in samples[name] if all(lab.get(k) == w for k, w in labels.items())
                    and set(lab) & {"pod", "hpc_job"} == set(labels) & {"pod", "hpc_job"}]
        return found

    assert value("DCGM_FI_DEV_FB_USED", pod="pod-a") == 1024.0
    assert value("DCGM_FI_DEV_FB_USED", hpc_job="4242") == 3072.0
    assert value("DCGM_FI_DEV_GPU_UTIL", pod="pod-a") == pytest.approx(30.0)
    assert value("DCGM_FI_DEV_GPU_UTIL", hpc_job="4242") == pytest.approx(10.0)
    assert value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", pod="pod-a") == pytest.approx(0.45)
    assert value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", hpc_job="4242") == pytest.approx(0.15)
    assert value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", pod="pod-a") == 5000.0
    pod_labels = next(lab for lab, _ in samples["DCGM_FI_DEV_FB_USED"] if lab.get("pod") == "pod-a")
    assert {k: pod_labels[k] for k in ("namespace", "pod", "container", "gpu", "UUID")} == {
        "namespace": "ns", "pod": "pod-a", "container": "main", "gpu": "0", "UUID": "GPU-00000000"}
    assert "pod_uid" not in pod_labels and "hpc_job" not in pod_labels


def test_gone_workloads_keep_counters_only_and_a_replaced_pod_never_duplicates_a_series():
    device = _device()
    old = _usage(device, "ns", "web-0", "main", "uid-old", energy=50.0, present=False)
    new = _usage(device, "ns", "web-0", "main", "uid-new", energy=1.0)
    gone = _usage(device, "ns", "batch-1", "main", "uid-b", energy=9.0, present=False)
    by_uid_only = _usage(device, "", "", "", "uid-x", energy=3.0)
    snap = Snapshot(seq=1, node="n", timestamp=0.0, devices=(device,), workloads=(old, new, gone, by_uid_only),
                    device_energy_joules=frozen_mapping({device.key: 100.0}))
    samples = dcgm_samples(snap)
    energy = {lab.get("pod", ""): v for lab, v in samples["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]}
    assert energy == {"": 100000.0, "web-0": 1000.0, "batch-1": 9000.0}
    assert {lab.get("pod", "") for lab, _ in samples["DCGM_FI_DEV_FB_USED"]} == {"", "web-0"}


def test_mig_instances_carry_the_gpu_instance_and_the_parent_uuid():
    parent = _device(0, uuid="GPU-parent")
    mig = _device(0, uuid="MIG-child", gpu_instance="3", memory_used_bytes=2**30, memory_total_bytes=10 * 2**30,
                  temperature_celsius=None, power_watts=None, sm_clock_hertz=None, memory_clock_hertz=None)
    snap = Snapshot(seq=1, node="n", timestamp=0.0, devices=(parent, mig))
    samples = dcgm_samples(snap)
    fb = {lab.get("GPU_I_ID", ""): (lab["UUID"], v) for lab, v in samples["DCGM_FI_DEV_FB_USED"]}
    assert fb == {"": ("GPU-parent", 10 * 1024.0), "3": ("GPU-parent", 1024.0)}
    assert [lab.get("GPU_I_ID") for lab, _ in samples["DCGM_FI_DEV_GPU_TEMP"]] == [None]
    assert len(samples["DCGM_FI_DEV_XID_ERRORS"]) == 1, "XIDs belong to the whole GPU"


def test_only_nvidia_devices_get_dcgm_series():
    snap = Snapshot(seq=1, node="n", timestamp=0.0, devices=(
        _device(0), _device(1, vendor="amd", model="AMD Instinct MI300X"), _device(2, vendor="gaudi"),
        _device(3, up=False, error="GPU is lost")))
    samples = dcgm_samples(snap)
    assert {lab["gpu"] for series in samples.values() for lab, _ in series} == {"0"}


def test_xid_errors_holds_the_latest_code():
    renderer = DcgmRenderer(dcgm.default_selection())

    def last(seq: int, counts: dict[str, int]) -> float:
        snap = Snapshot(seq=seq, node="n", timestamp=0.0, devices=(_device(xid_errors=frozen_mapping(counts)),))
        (value,) = [v for _, v in dcgm_samples(snap, renderer=renderer)["DCGM_FI_DEV_XID_ERRORS"]]
        return value

    assert last(1, {}) == 0.0
    assert last(2, {"79": 1}) == 79.0
    assert last(3, {"79": 1, "48": 2}) == 48.0
    assert last(3, {"79": 1, "48": 2}) == 48.0, "rendering the same snapshot again changes nothing"
    assert last(4, {"79": 1, "48": 2}) == 48.0
    assert last(5, {"79": 2, "48": 2}) == 79.0
    assert last(6, {"79": 2, "48": 3, "13": 1}) == 48.0, "two new codes in one pass: the higher one"


# ---- agreement with the l9gpu schema on the simulated node ---------------------------------

# DCGM field -> (l9gpu family, factor from l9gpu's unit to DCGM's)
SAME_VALUES = {
    "DCGM_FI_DEV_SM_CLOCK": ("gpu_sm_clock_hertz", 1e-6),
    "DCGM_FI_DEV_MEM_CLOCK": ("gpu_memory_clock_hertz", 1e-6),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gpu_memory_temperature_celsius", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temperature_celsius", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("gpu_power_watts", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("gpu_energy_joules_total", 1000.0),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_utilization_ratio", 100.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gpu_memory_utilization_ratio", 100.0),
    "DCGM_FI_DEV_FB_USED": ("gpu_memory_used_bytes", 1.0 / MIB),
}
SAME_WORKLOAD_VALUES = {
    "DCGM_FI_DEV_FB_USED": ("container_gpu_memory_used_bytes", 1.0 / MIB),
    "DCGM_FI_DEV_GPU_UTIL": ("container_gpu_utilization_ratio", 100.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("container_gpu_energy_joules_total", 1000.0),
}


@pytest.fixture(scope="module")
def simulated_snapshot() -> Snapshot:
    from exporter.app.cli import build_parser
    from exporter.app.wiring import build_collector, open_sources
    from exporter.devices import close_backends

    args = build_parser().parse_args(["snapshot", "--backend", "simulated"])
    backends, attributor = open_sources(args)
    try:
        collector, _ = build_collector(args, backends, attributor)
        collector.collect_once()
        time.sleep(0.05)  # GPM values need two samples some time apart
        return collector.collect_once()
    finally:
        attributor.close()
        close_backends(backends)


def _l9gpu(snapshot: Snapshot):  # type: ignore[no-untyped-def]
    """The l9gpu schema whole (``--detail``): per link and type, every state, the zeros; the DCGM
    fields are read from these rows whatever the default's shape."""
    return parse_metrics(generate_latest(_Families(families(
        snapshot, cat.enabled_names(detail=True), detailed=cat.detailed_names(detail=True)))).decode())


def test_values_agree_with_the_l9gpu_schema(simulated_snapshot):
    ours, theirs = _l9gpu(simulated_snapshot), dcgm_samples(simulated_snapshot)
    for name, (family, factor) in SAME_VALUES.items():
        native = {lab["gpu"]: v * factor for lab, v in ours[family]}
        converted = {lab["gpu"]: v for lab, v in theirs[name] if "pod" not in lab and "hpc_job" not in lab}
        assert len(native) == 8 and converted == pytest.approx(native, rel=1e-12), name
    free = {lab["gpu"]: v for lab, v in theirs["DCGM_FI_DEV_FB_FREE"]}
    for lab, total in ours["gpu_memory_total_bytes"]:
        used = next(v for other, v in ours["gpu_memory_used_bytes"] if other["gpu"] == lab["gpu"])
        assert free[lab["gpu"]] * MIB == total - used
    for name, (family, factor) in SAME_WORKLOAD_VALUES.items():
        native = {(lab["gpu"], lab["pod"] or lab["slurm_job_id"]): v * factor for lab, v in ours[family]}
        converted = {(lab["gpu"], lab.get("pod") or lab["hpc_job"]): v for lab, v in theirs[name]
                     if "pod" in lab or "hpc_job" in lab}
        assert len(native) >= 9 and converted == pytest.approx(native, rel=1e-12), name


def test_the_time_shared_gpu_shows_each_pods_own_share(simulated_snapshot):
    samples = dcgm_samples(simulated_snapshot)
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"):
        on_gpu6 = [(lab, v) for lab, v in samples[name] if lab["gpu"] == "6"]
        device = [v for lab, v in on_gpu6 if "pod" not in lab and "hpc_job" not in lab]
        parts = {lab.get("pod") or lab["hpc_job"]: v for lab, v in on_gpu6 if "pod" in lab or "hpc_job" in lab}
        assert set(parts) == {"jupyter-alice-0", "embedder-7c9f5-abcde", "reranker-5b8d4-fghij",
                              "ocr-worker-66f7d-klmno", "4242"}, name
        assert len(set(parts.values())) >= 4, f"{name}: copies of one value instead of each pod's share: {parts}"
        if name == "DCGM_FI_DEV_FB_USED":
            # the rest of the device's memory is the driver's reserve (512 MiB in the scenario)
            assert sum(parts.values()) + 512 == pytest.approx(device[0])
        else:
            assert sum(parts.values()) == pytest.approx(device[0])


def test_the_migration_guide_shows_the_field_tables():
    text = (Path(__file__).resolve().parent.parent / "docs" / "MIGRATING-FROM-DCGM.md").read_text()
    hint = "paste the tables `python -m exporter.output.dcgm.fields` prints into docs/MIGRATING-FROM-DCGM.md"
    assert dcgm.markdown_table() in text, hint
    assert dcgm.markdown_not_provided() in text, hint


def test_the_catalogues_dcgm_equivalents_hold(simulated_snapshot):
    """docs/METRICS.md names a DCGM equivalent and factor for l9gpu families: where the
    DCGM schema serves that field, the factor turns the l9gpu value into the served one."""
    ours, theirs = _l9gpu(simulated_snapshot), dcgm_samples(simulated_snapshot)
    checked = []
    for spec in cat.METRICS:
        name, factor = spec.dcgm
        if name not in theirs or spec.scope not in (cat.DEVICE, cat.WORKLOAD) or spec.name not in ours:
            continue
        if spec.scope == cat.DEVICE and spec.labels != cat.DEVICE_LABELS:
            continue  # a label per type or reason (ECC, throttling): a different shape in DCGM
        workload = spec.scope == cat.WORKLOAD
        native = {(lab["gpu"], lab["pod"] or lab["slurm_job_id"] if workload else ""): v * factor
                  for lab, v in ours[spec.name]}
        served = {(lab["gpu"], lab.get("pod") or lab.get("hpc_job") or ""): v for lab, v in theirs[name]
                  if workload == ("pod" in lab or "hpc_job" in lab)}
        assert served == pytest.approx(native, rel=1e-9), (spec.name, name)
        checked.append(spec.name)
    assert len(checked) >= 12, checked


def test_the_fields_a_catalogue_row_declares_are_its_series_times_their_factor(simulated_snapshot):
    """A DCGM field a family's row declares (`MetricSpec.dcgm_fields`: remapped rows, PCIe
    replays, NVLink errors, violation times) is, on each GPU, the sum of the family's series
    its labels pick, times its factor: what docs/MIGRATING-FROM-DCGM.md says it is."""
    everything = dcgm.select([dcgm.CounterLine(f.name, f.type, "", n) for n, f in enumerate(dcgm.FIELDS)])
    ours, theirs = _l9gpu(simulated_snapshot), dcgm_samples(simulated_snapshot, selection=everything)
    checked = []
    for spec in cat.METRICS:
        for alias in spec.dcgm_fields:
            native: dict[tuple[str, str], float] = {}
            for lab, value in ours.get(spec.name, []):
                if all(lab[label] == want for label, want in alias.where):
                    gpu = (lab["gpu"], lab["gpu_instance"])
                    native[gpu] = native.get(gpu, 0.0) + value * alias.factor
            served = {(lab["gpu"], lab.get("GPU_I_ID", "")): value for lab, value in theirs.get(alias.name, [])}
            assert served == pytest.approx(native, rel=1e-12), alias.name
            checked += [alias.name] if served else []
    assert len(checked) == sum(len(spec.dcgm_fields) for spec in cat.METRICS), checked  # each with a value here
