"""GPM (SM, tensor-core, DRAM activity) through the NVIDIA backend, against the fake pynvml.

The fake keeps each GPU's GPM counters as integrals over its own clock, so a value is
the average between two samples, as on real hardware; the tests move that clock.
"""

from __future__ import annotations

import logging

import pytest
from fakes.pynvml_fake import (
    NVML_ERROR_UNKNOWN,
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_GRAPHICS_UTIL,
    NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
    NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
    NVML_GPM_METRIC_SM_UTIL,
    FakeGpm,
    FakeGpu,
    FakeMig,
    FakeNvml,
)

from exporter.core.model import GPM_RATE_KEYS, GPM_RATIO_KEYS
from exporter.devices.nvml import NvmlBackend
from exporter.devices.nvml import gpm as gpm_module

MiB = 2**20


class Clock:
    """The fake's GPM clock and the collector's ``now``, moved by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def opened(fake: FakeNvml, clock: Clock, interval: float = 0.0) -> NvmlBackend:
    fake.gpm_clock = clock
    backend = NvmlBackend(nvml=fake, gpm_interval=interval)
    backend.open()
    return backend


def one(samples, index=0, gpu_instance=""):  # type: ignore[no-untyped-def]
    (match,) = [s for s in samples if s.index == index and s.gpu_instance == gpu_instance]
    return match


def test_gpm_values_are_ratios_and_bytes_per_second_between_two_samples():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu()])
    backend = opened(fake, clock)
    first = one(backend.sample(clock()))
    assert dict(first.gpm) == {}  # one sample: nothing to average yet
    assert first.utilization == 0.5  # the rest of the device is read as usual
    clock.t += 1.0
    gpm = one(backend.sample(clock())).gpm
    # the H200 figures of a bf16 job at ~60% duty cycle, percent -> 0-1
    assert gpm["graphics_active"] == pytest.approx(0.586)
    assert gpm["sm_active"] == pytest.approx(0.546)
    assert gpm["sm_occupancy"] == pytest.approx(0.081)
    assert gpm["tensor_active"] == pytest.approx(0.53)
    assert gpm["tensor_hmma_active"] == pytest.approx(0.53)
    assert gpm["tensor_imma_active"] == 0.0 and gpm["tensor_dfma_active"] == 0.0
    assert gpm["dram_active"] == pytest.approx(0.112)
    assert gpm["fp32_active"] == pytest.approx(0.025)
    # MiB/s -> bytes/s
    assert gpm["pcie_tx_bytes_per_second"] == pytest.approx(100 * MiB)
    assert gpm["pcie_rx_bytes_per_second"] == pytest.approx(250 * MiB)
    # NVLink answers NOT_SUPPORTED in its entry on this card: absent, never 0
    assert "nvlink_tx_bytes_per_second" not in gpm and "nvlink_rx_bytes_per_second" not in gpm
    assert set(gpm) <= set(GPM_RATIO_KEYS) | set(GPM_RATE_KEYS)
    assert all(0.0 <= gpm[k] <= 1.0 for k in GPM_RATIO_KEYS if k in gpm)
    assert backend.gpm_status() == {(0, ""): gpm_module.ACTIVE}


def test_gpm_averages_over_the_window_and_follows_the_load():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu()])
    fake.gpus[0].gpm.values[NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] = 2048.0
    fake.gpus[0].gpm.values[NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC] = 1024.0
    backend = opened(fake, clock)
    backend.sample(clock())
    fake.set_gpm(0, {NVML_GPM_METRIC_ANY_TENSOR_UTIL: 80.0, NVML_GPM_METRIC_SM_UTIL: 90.0})
    clock.t += 1.0
    fake.set_gpm(0, {NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0, NVML_GPM_METRIC_SM_UTIL: 90.0})  # stops tensor work
    clock.t += 1.0
    gpm = one(backend.sample(clock())).gpm
    assert gpm["tensor_active"] == pytest.approx(0.40)  # 80% for half the window
    assert gpm["sm_active"] == pytest.approx(0.90)
    assert gpm["nvlink_tx_bytes_per_second"] == pytest.approx(2 * 2**30)
    assert gpm["nvlink_rx_bytes_per_second"] == pytest.approx(2**30)
    clock.t += 2.0
    gpm = one(backend.sample(clock())).gpm
    assert gpm["tensor_active"] == 0.0 and gpm["sm_active"] == pytest.approx(0.90)


def test_at_most_one_metrics_call_per_gpu_per_pass_and_a_slower_cadence_holds_the_last_window():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu()])
    backend = opened(fake, clock, interval=5.0)
    held = []
    for _ in range(11):  # passes every second for 10 s
        calls_before = len(fake.called("nvmlGpmMetricsGet"))
        held.append(one(backend.sample(clock())).gpm.get("tensor_active"))
        assert len(fake.called("nvmlGpmMetricsGet")) - calls_before <= 2  # two GPUs
        clock.t += 1.0
        if len(held) == 7:
            fake.set_gpm(0, {NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0})
    # samples at t=0, 5 and 10: two windows per GPU, values held between them
    assert len(fake.called("nvmlGpmSampleGet")) == 3 * 2
    assert len(fake.called("nvmlGpmMetricsGet")) == 2 * 2
    assert held[:5] == [None] * 5
    assert held[5:10] == [pytest.approx(0.53)] * 5
    # window 5-10 s: 53% for 2 s (until the change after the 7th pass), then 0% for 3 s
    assert held[10] == pytest.approx(0.53 * 2 / 5)
    assert len(fake.called("nvmlGpmSampleAlloc")) == 4  # two buffers per GPU, reused


def test_every_pass_by_default_interval_zero_means_each_pass_has_its_window():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu()])
    backend = opened(fake, clock, interval=0.0)
    for _ in range(4):
        backend.sample(clock())
        clock.t += 0.5
    assert len(fake.called("nvmlGpmSampleGet")) == 4 and len(fake.called("nvmlGpmMetricsGet")) == 3
    assert NvmlBackend().__dict__["_gpm_interval"] == gpm_module.DEFAULT_INTERVAL_SECONDS


def test_pre_hopper_gpu_has_no_gpm_and_the_reason_is_logged_once(caplog):
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu(name="NVIDIA A100-SXM4-80GB"), FakeGpu(name="NVIDIA A100-SXM4-80GB"), FakeGpu()])
    backend = opened(fake, clock)
    with caplog.at_level(logging.INFO, logger="exporter.devices.nvml.gpm"):
        for _ in range(3):
            samples = backend.sample(clock())
            clock.t += 1.0
    assert dict(one(samples, 0).gpm) == {} and dict(one(samples, 1).gpm) == {}
    assert one(samples, 0).power_watts == 250.0  # nothing else changes
    assert one(samples, 2).gpm["tensor_active"] == pytest.approx(0.53)  # the H100 next to them has it
    reason = "the GPU does not support GPM (Hopper or newer needed)"
    logs = [r.getMessage() for r in caplog.records if "GPM" in r.getMessage()]
    assert logs == [f"no GPM metrics (SM, tensor-core, DRAM activity) on GPU 0, 1: {reason}"]
    assert backend.gpm_status() == {(0, ""): f"unsupported: {reason}", (1, ""): f"unsupported: {reason}",
                                    (2, ""): gpm_module.ACTIVE}
    # support is asked once per GPU; unsupported GPUs are never sampled
    assert len(fake.called("nvmlGpmQueryDeviceSupport")) == 3
    assert {args[0].index for args in fake.called("nvmlGpmSampleGet")} == {2}


def test_driver_without_gpm_and_binding_without_gpm():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu(unsupported={"nvmlGpmQueryDeviceSupport"})])
    backend = opened(fake, clock)
    backend.sample(clock())
    assert backend.gpm_status()[(0, "")] == (
        "unsupported: the driver does not offer GPM (nvmlGpmQueryDeviceSupport not supported)")

    old = FakeNvml(gpus=[FakeGpu()], missing={"nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet",
                                             "nvmlGpmMetricsGet", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree"})
    backend = opened(old, clock)
    clock.t += 1.0
    assert dict(one(backend.sample(clock())).gpm) == {}
    clock.t += 1.0
    assert dict(one(backend.sample(clock())).gpm) == {}
    assert "upgrade nvidia-ml-py" in backend.gpm_status()[(0, "")]
    assert one(backend.sample(clock())).up


def test_supported_gpu_whose_sampling_is_refused_stops_asking():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu(unsupported={"nvmlGpmSampleGet"})])
    backend = opened(fake, clock)
    for _ in range(3):
        assert dict(one(backend.sample(clock())).gpm) == {}
        clock.t += 1.0
    assert len(fake.called("nvmlGpmSampleGet")) == 1
    assert backend.gpm_status()[(0, "")] == "unsupported: nvmlGpmSampleGet is not supported on this device"
    assert all(s.freed for s in fake.gpm_samples)


def test_a_failing_sample_keeps_the_last_window_and_counts_an_error():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu()])
    backend = opened(fake, clock)
    backend.sample(clock())
    clock.t += 1.0
    assert one(backend.sample(clock())).gpm["sm_active"] == pytest.approx(0.546)
    fake.gpus[0].errors["nvmlGpmSampleGet"] = NVML_ERROR_UNKNOWN
    clock.t += 1.0
    dev = one(backend.sample(clock()))
    assert dev.up and dev.gpm["sm_active"] == pytest.approx(0.546)
    assert backend.errors()["gpm_error"] == 1
    del fake.gpus[0].errors["nvmlGpmSampleGet"]
    fake.set_gpm(0, {NVML_GPM_METRIC_SM_UTIL: 10.0})
    clock.t += 1.0
    # the window spans from the last good sample: 1 s at 54.6%, 1 s at 10%
    assert one(backend.sample(clock())).gpm["sm_active"] == pytest.approx(0.323)


def test_mig_instances_have_their_own_gpm_and_the_parent_none():
    clock = Clock()
    migs = [FakeMig(uuid="MIG-aaaa", gpu_instance_id=1, gpm=FakeGpm(values={NVML_GPM_METRIC_ANY_TENSOR_UTIL: 70.0})),
            FakeMig(uuid="MIG-bbbb", gpu_instance_id=2, gpm=FakeGpm(values={NVML_GPM_METRIC_ANY_TENSOR_UTIL: 5.0,
                                                                              NVML_GPM_METRIC_SM_UTIL: 40.0}))]
    fake = FakeNvml(gpus=[FakeGpu(mig_devices=migs)])
    backend = opened(fake, clock)
    backend.sample(clock())
    clock.t += 2.0
    samples = backend.sample(clock())
    assert dict(one(samples, 0, "").gpm) == {}
    assert dict(one(samples, 0, "1").gpm) == {"tensor_active": pytest.approx(0.70)}
    assert dict(one(samples, 0, "2").gpm) == {"tensor_active": pytest.approx(0.05), "sm_active": pytest.approx(0.40)}
    # nvmlGpmMigSampleGet takes the parent GPU's handle and the GPU instance id
    assert {(args[0].mig, args[1]) for args in fake.called("nvmlGpmMigSampleGet")} == {(None, 1), (None, 2)}
    assert fake.called("nvmlGpmSampleGet") == []
    # an instance destroyed (MIG reconfigured): its buffers are freed
    fake.gpus[0].mig_devices.pop()
    clock.t += 1.0
    samples = backend.sample(clock())
    assert [s.gpu_instance for s in samples] == ["", "1"]
    assert sum(s.freed for s in fake.gpm_samples) == 2
    backend.close()
    assert all(s.freed for s in fake.gpm_samples)


def test_lost_gpu_is_reported_down_and_starts_over_when_back():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu()])
    backend = opened(fake, clock)
    backend.sample(clock())
    clock.t += 1.0
    backend.sample(clock())
    fake.gpus[1].lost = True
    clock.t += 1.0
    samples = backend.sample(clock())
    assert not one(samples, 1).up and dict(one(samples, 1).gpm) == {}
    assert one(samples, 0).gpm["tensor_active"] == pytest.approx(0.53)  # the other GPU carries on
    assert sum(s.freed for s in fake.gpm_samples) == 2  # the lost GPU's buffers
    fake.gpus[1].lost = False
    clock.t += 1.0
    assert dict(one(backend.sample(clock()), 1).gpm) == {}  # a fresh first sample
    clock.t += 1.0
    assert one(backend.sample(clock()), 1).gpm["tensor_active"] == pytest.approx(0.53)


def test_lost_during_gpm_sampling_takes_the_device_down():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu()])
    backend = opened(fake, clock)
    backend.sample(clock())
    fake.gpus[0].errors["nvmlGpmSampleGet"] = 15  # NVML_ERROR_GPU_IS_LOST
    clock.t += 1.0
    dev = one(backend.sample(clock()))
    assert not dev.up and "lost" in dev.error
    assert backend.errors()["gpu_lost"] == 1


def test_close_frees_every_buffer_and_gpm_can_be_turned_off():
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu()])
    backend = opened(fake, clock)
    backend.sample(clock())
    clock.t += 1.0
    backend.sample(clock())
    assert len(fake.gpm_samples) == 4 and not any(s.freed for s in fake.gpm_samples)
    backend.close()
    assert all(s.freed for s in fake.gpm_samples)
    assert fake.shutdown_calls == 1

    off = FakeNvml(gpus=[FakeGpu()])
    off.gpm_clock = clock
    backend = NvmlBackend(nvml=off, gpm=False)
    backend.open()
    backend.sample(clock())
    clock.t += 1.0
    assert dict(one(backend.sample(clock())).gpm) == {}
    assert not [name for name, _ in off.calls if name.startswith("nvmlGpm")]
    assert backend.gpm_status() == {}


def test_only_the_metrics_of_exported_families_are_asked():
    """``gpm_keys``: the metrics of the enabled families; graphics activity, the dear one on
    an H200 (1.4 ms of 1.7 per read), is not asked once its families are off, and the
    other values are as before. No key at all: GPM is not read."""
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu()])
    fake.gpm_clock = clock
    keys = frozenset(GPM_RATIO_KEYS + GPM_RATE_KEYS) - {"graphics_active"}
    backend = NvmlBackend(nvml=fake, gpm_interval=0.0, gpm_keys=keys)
    backend.open()
    backend.sample(clock())
    clock.t += 1.0
    gpm = one(backend.sample(clock())).gpm
    assert "graphics_active" not in gpm
    assert gpm["sm_active"] == pytest.approx(0.546) and gpm["tensor_active"] == pytest.approx(0.53)
    assert gpm["pcie_rx_bytes_per_second"] == pytest.approx(250 * MiB)
    (request,) = [args[0] for name, args in fake.calls if name == "nvmlGpmMetricsGet"]
    asked = [entry.metricId for entry in request.metrics[: request.numMetrics]]
    assert len(asked) == 14 and NVML_GPM_METRIC_GRAPHICS_UTIL not in asked
    backend.close()

    none = FakeNvml(gpus=[FakeGpu()])
    none.gpm_clock = clock
    backend = NvmlBackend(nvml=none, gpm_interval=0.0, gpm_keys=frozenset())
    backend.open()
    backend.sample(clock())
    clock.t += 1.0
    assert dict(one(backend.sample(clock())).gpm) == {}
    assert not [name for name, _ in none.calls if name.startswith("nvmlGpm")]
    backend.close()


def test_fake_gpm_shapes_match_the_installed_binding():
    pynvml = pytest.importorskip("pynvml")
    from fakes import pynvml_fake as fake_pynvml

    for struct in ("c_nvmlGpmSupport_t", "c_nvmlGpmMetric_t", "c_nvmlGpmMetricsGet_t", "c_metricInfo_t"):
        real = [name for name, *_ in getattr(pynvml, struct)._fields_]
        assert list(getattr(fake_pynvml, struct)._fields_) == real, struct
    assert len(pynvml.c_nvmlGpmMetricsGet_t().metrics) == len(fake_pynvml.c_nvmlGpmMetricsGet_t().metrics)
    for key, constant, value, _ in gpm_module.METRICS:
        assert getattr(pynvml, constant) == value, (key, constant)
    assert NVML_GPM_METRIC_HMMA_TENSOR_UTIL == pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL


# ---- l9gpu snapshot ---------------------------------------------------------------------------


def test_snapshot_shows_gpm_activity_and_why_a_gpu_has_none(monkeypatch, capsys):
    import json

    from fakes.pynvml_fake import install

    from exporter.app import cli, snapshot_cmd

    fake = install(monkeypatch, FakeNvml(gpus=[FakeGpu(), FakeGpu(name="NVIDIA A100-SXM4-80GB")]))
    monkeypatch.setattr(snapshot_cmd, "SNAPSHOT_GPM_WINDOW", 0.05)
    assert cli.main(["snapshot", "--backend", "nvml", "--kubernetes", "off"]) == 0
    out = capsys.readouterr().out.splitlines()
    gpu0 = out.index([line for line in out if line.startswith("0 ")][0])
    assert out[gpu0 + 1] == "       gpm: graphics 59%  sm 55%  occupancy 8%  tensor 53%  dram 11%"
    gpu1 = out.index([line for line in out if line.startswith("1 ")][0])
    assert out[gpu1 + 1] == ("       gpm: not available (the GPU does not support GPM (Hopper or newer needed))")
    assert len(fake.called("nvmlGpmMetricsGet")) == 1  # two passes, one window, on the H100 only

    assert cli.main(["snapshot", "--backend", "nvml", "--kubernetes", "off", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    h100, a100 = doc["gpus"]
    assert h100["gpm_status"] == "active" and h100["gpm"]["tensor_active"] == pytest.approx(0.53)
    assert a100["gpm"] == {} and a100["gpm_status"].startswith("unsupported: the GPU does not support GPM")

    calls = len(fake.calls)
    assert cli.main(["snapshot", "--backend", "nvml", "--kubernetes", "off", "--gpm-interval", "off"]) == 0
    assert "gpm:" not in capsys.readouterr().out
    assert not [name for name, _ in fake.calls[calls:] if name.startswith("nvmlGpm")]


def test_gpm_interval_flag_rejects_a_bad_value(capsys):
    from exporter.app import cli

    assert cli.main(["snapshot", "--backend", "simulated", "--gpm-interval", "soon"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gpm-interval" in err[0] and "invalid duration 'soon'" in err[0]
