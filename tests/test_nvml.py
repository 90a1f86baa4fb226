"""The NVIDIA backend against a fake pynvml with the real binding's shapes and units."""

from __future__ import annotations

import builtins
import logging
import sys

import pytest
from fakes.pynvml_fake import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    FakeGpu,
    FakeMig,
    FakeNvml,
    FakeProcess,
    FakeUtilSample,
    NVMLError,
    install,
)

from exporter.devices.base import Backend, BackendUnavailable
from exporter.devices.nvml import THROTTLE_REASONS, NvmlBackend, decode_throttle_reasons

GiB = 2**30
MiB = 2**20


def opened(fake: FakeNvml) -> NvmlBackend:
    backend = NvmlBackend(nvml=fake)
    backend.open()
    return backend


def by_index(samples, index, gpu_instance=""):  # type: ignore[no-untyped-def]
    (match,) = [s for s in samples if s.index == index and s.gpu_instance == gpu_instance]
    return match


# ---- the fake itself mirrors the real binding --------------------------------------------


def test_fake_matches_installed_pynvml_codes_and_constants():
    pynvml = pytest.importorskip("pynvml")
    from fakes import pynvml_fake as fake_pynvml

    for name in dir(fake_pynvml):
        value = getattr(fake_pynvml, name)
        if name.startswith(("NVML_", "nvml")) and isinstance(value, int):
            assert getattr(pynvml, name) == value, name
        if name.startswith("NVMLError_"):
            assert getattr(pynvml, name)().value == value().value, name
    for name in fake_pynvml.function_names():
        assert hasattr(pynvml, name), f"the fake invents {name}"
    # The error class picks the subclass from the code, as pynvml's does.
    assert type(NVMLError(3)).__name__ == type(pynvml.NVMLError(3)).__name__ == "NVMLError_NotSupported"


def test_throttle_bits_match_installed_pynvml():
    pynvml = pytest.importorskip("pynvml")
    names = {
        "gpu_idle": "GpuIdle",
        "applications_clocks_setting": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap",
        "hw_slowdown": "HwSlowdown",
        "sync_boost": "SyncBoost",
        "sw_thermal_slowdown": "SwThermalSlowdown",
        "hw_thermal_slowdown": "HwThermalSlowdown",
        "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
        "display_clock_setting": "DisplayClockSetting",
    }
    for reason, bit in THROTTLE_REASONS:
        assert getattr(pynvml, "nvmlClocksEventReason" + names[reason]) == bit, reason
        assert getattr(pynvml, "nvmlClocksThrottleReason" + names[reason]) == bit, reason


# ---- device values ------------------------------------------------------------------------


def test_implements_backend_protocol():
    backend = NvmlBackend(nvml=FakeNvml([FakeGpu()]))
    assert isinstance(backend, Backend)
    assert backend.name == "nvml"


def test_values_converted_to_base_units():
    fake = FakeNvml(
        [
            FakeGpu(
                power_mw=287_500,
                power_limit_mw=700_000,
                energy_mj=5_000_250,
                sm_clock_mhz=1980,
                mem_clock_mhz=2619,
                pcie_rx_bytes=3 * 10**12,
                pcie_tx_bytes=10**12 + 5,
                fan_percent=45,
                utilization_gpu=73,
                utilization_memory=12,
                temperature=61,
                memory_temperature=70,
                memory_total=80 * GiB,
                memory_used=20 * GiB,
            )
        ],
        driver_version="550.54.15",
    )
    (dev,) = opened(fake).sample(1.0)
    assert dev.up and dev.vendor == "nvidia"
    assert dev.model == "NVIDIA H100 80GB HBM3"
    assert dev.uuid.startswith("GPU-")
    assert dev.driver_version == "550.54.15"
    assert dev.pci_bus_id == "00000000:17:00.0"
    assert dev.serial == "1650923000000"
    assert dev.power_watts == pytest.approx(287.5)  # milliwatts -> watts
    assert dev.power_limit_watts == pytest.approx(700.0)
    assert dev.energy_joules == pytest.approx(5000.25)  # millijoules -> joules
    assert dev.sm_clock_hertz == pytest.approx(1.98e9)  # MHz -> Hz
    assert dev.memory_clock_hertz == pytest.approx(2.619e9)
    assert dev.pcie_rx_bytes_total == 3 * 10**12  # cumulative bytes, exact
    assert dev.pcie_tx_bytes_total == 10**12 + 5
    assert dev.fan_speed_ratio == pytest.approx(0.45)  # percent -> ratio
    assert dev.utilization == pytest.approx(0.73)
    assert dev.memory_utilization == pytest.approx(0.12)
    assert dev.temperature_celsius == 61
    assert dev.memory_temperature_celsius == 70
    assert dev.memory_total_bytes == 80 * GiB
    # Memory info version 2: "used" without the driver's reserved memory.
    assert dev.memory_used_bytes == 20 * GiB
    assert dict(dev.ecc_errors) == {"corrected": 2, "uncorrected": 0}


def test_legacy_binding_bytes_are_decoded():
    fake = FakeNvml([FakeGpu(name="Tesla V100-SXM2-16GB")], legacy_bytes=True, driver_version="470.82.01")
    (dev,) = opened(fake).sample(1.0)
    assert dev.model == "Tesla V100-SXM2-16GB"
    assert dev.driver_version == "470.82.01"
    assert isinstance(dev.uuid, str) and dev.uuid.startswith("GPU-")


def test_not_supported_values_are_omitted_not_zero():
    unsupported = {
        "nvmlDeviceGetFanSpeed",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    }
    unsupported.add("pcie_counters")  # field values PCIE_COUNT_TX/RX_BYTES answer NOT_SUPPORTED
    fake = FakeNvml([FakeGpu(unsupported=unsupported, memory_temperature=None)])
    backend = opened(fake)
    (dev,) = backend.sample(1.0)
    assert dev.up
    assert dev.fan_speed_ratio is None  # passive card
    assert dev.power_watts is None
    assert dev.energy_joules is None
    assert dev.pcie_rx_bytes_total is None and dev.pcie_tx_bytes_total is None
    assert dev.memory_temperature_celsius is None
    assert dict(dev.ecc_errors) == {}
    assert dict(dev.throttle_reasons) == {}
    # Values the card has are still there.
    assert dev.temperature_celsius == 45 and dev.sm_clock_hertz is not None
    # "Not supported" is normal, not an error.
    assert backend.errors() == {}


def test_missing_functions_are_tolerated_and_logged_once(caplog):
    missing = {
        "nvmlDeviceGetTemperatureV",  # older binding: falls back to nvmlDeviceGetTemperature
        "nvmlDeviceGetCurrentClocksEventReasons",  # falls back to the Throttle name
        "nvmlDeviceGetTotalEnergyConsumption",  # pre-Volta: no energy counter
        "nvmlDeviceGetFieldValues",
        "nvmlMemory_v2",  # binding without memory info version 2
    }
    fake = FakeNvml([FakeGpu(clock_reasons=0x4)], missing=missing)
    backend = opened(fake)
    with caplog.at_level(logging.INFO, logger="exporter.devices.nvml"):
        (dev,) = backend.sample(1.0)
        backend.sample(2.0)
    assert dev.up
    assert dev.temperature_celsius == 45
    assert dev.throttle_reasons["sw_power_cap"] is True
    assert dev.energy_joules is None
    assert dev.memory_temperature_celsius is None
    # Version 1 memory info counts reserved memory as used.
    assert dev.memory_used_bytes == 10 * GiB + 512 * MiB
    energy_logs = [r for r in caplog.records if "nvmlDeviceGetTotalEnergyConsumption" in r.getMessage()]
    assert len(energy_logs) == 1


def test_function_not_found_in_driver_is_not_available():
    # The binding has the function but the driver's library lacks the symbol.
    fake = FakeNvml([FakeGpu(errors={"nvmlDeviceGetTotalEnergyConsumption": 13})])
    backend = opened(fake)
    (dev,) = backend.sample(1.0)
    assert dev.up and dev.energy_joules is None
    assert backend.errors() == {}


def test_unexpected_error_on_optional_query_keeps_device_up():
    fake = FakeNvml([FakeGpu(errors={"nvmlDeviceGetFanSpeed": NVML_ERROR_NO_PERMISSION})])
    backend = opened(fake)
    (dev,) = backend.sample(1.0)
    assert dev.up and dev.fan_speed_ratio is None and dev.power_watts == 250.0
    assert backend.errors() == {"query_error": 1}


def test_throttle_bits_decoded():
    fake = FakeNvml([FakeGpu(clock_reasons=0x4 | 0x40)])
    (dev,) = opened(fake).sample(1.0)
    reasons = dict(dev.throttle_reasons)
    assert reasons.pop("sw_power_cap") is True
    assert reasons.pop("hw_thermal_slowdown") is True
    assert set(reasons) == {name for name, _ in THROTTLE_REASONS} - {"sw_power_cap", "hw_thermal_slowdown"}
    assert not any(reasons.values())


def test_decode_all_bits():
    assert all(decode_throttle_reasons(0x1FF).values())
    assert not any(decode_throttle_reasons(0).values())
    assert decode_throttle_reasons(0x100) == {name: name == "display_clock_setting" for name, _ in THROTTLE_REASONS}


def test_throttle_falls_back_to_older_function_name():
    fake = FakeNvml([FakeGpu(clock_reasons=0x8)], missing={"nvmlDeviceGetCurrentClocksEventReasons"})
    (dev,) = opened(fake).sample(1.0)
    assert dev.throttle_reasons["hw_slowdown"] is True
    assert fake.called("nvmlDeviceGetCurrentClocksThrottleReasons")


# ---- processes ----------------------------------------------------------------------------


def test_processes_with_memory_compute_and_graphics_deduplicated():
    fake = FakeNvml(
        [
            FakeGpu(
                processes=[
                    FakeProcess(pid=4242, used_memory=3 * GiB),
                    FakeProcess(pid=5151, used_memory=None),  # driver cannot tell
                    FakeProcess(pid=6000, used_memory=256 * MiB, kind="graphics"),
                    FakeProcess(pid=4242, used_memory=3 * GiB, kind="graphics"),  # both kinds
                ]
            )
        ]
    )
    (dev,) = opened(fake).sample(1.0)
    procs = {p.pid: p for p in dev.processes}
    assert sorted(procs) == [4242, 5151, 6000]
    assert procs[4242].used_memory_bytes == 3 * GiB and procs[4242].kind == "compute"
    assert procs[5151].used_memory_bytes is None  # unknown, not 0
    assert procs[6000].used_memory_bytes == 256 * MiB and procs[6000].kind == "graphics"


def test_process_list_falls_back_v3_v2_plain():
    gpu = FakeGpu(processes=[FakeProcess(pid=77, used_memory=GiB)])
    fake = FakeNvml([gpu], missing={"nvmlDeviceGetComputeRunningProcesses_v3"})
    (dev,) = opened(fake).sample(1.0)
    assert [p.pid for p in dev.processes] == [77]
    assert fake.called("nvmlDeviceGetComputeRunningProcesses_v2")

    fake = FakeNvml(
        [FakeGpu(processes=[FakeProcess(pid=77, used_memory=GiB)])],
        missing={"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"},
    )
    (dev,) = opened(fake).sample(1.0)
    assert [p.pid for p in dev.processes] == [77]
    assert fake.called("nvmlDeviceGetComputeRunningProcesses")

    # The binding has _v3 but the driver lacks the symbol: FUNCTION_NOT_FOUND -> _v2.
    gpu = FakeGpu(processes=[FakeProcess(pid=78)], errors={"nvmlDeviceGetComputeRunningProcesses_v3": 13})
    fake = FakeNvml([gpu])
    (dev,) = opened(fake).sample(1.0)
    assert [p.pid for p in dev.processes] == [78]


def test_process_memory_not_available_sentinel_from_old_bindings():
    fake = FakeNvml([FakeGpu(processes=[FakeProcess(pid=9, used_memory=2**64 - 1)])])
    (dev,) = opened(fake).sample(1.0)
    assert dev.processes[0].used_memory_bytes is None


@pytest.mark.parametrize("function", ["nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"])
def test_per_process_utilisation_aggregated_over_interval(function):
    # The cheaper nvmlDeviceGetProcessesUtilizationInfo where the binding and driver have
    # it; nvmlDeviceGetProcessUtilization otherwise. Same timestamps, same rule.
    missing = {"nvmlDeviceGetProcessesUtilizationInfo"} if function == "nvmlDeviceGetProcessUtilization" else set()
    fake = FakeNvml(
        [FakeGpu(processes=[FakeProcess(pid=100, used_memory=GiB), FakeProcess(pid=200, used_memory=GiB)])],
        missing=missing,
    )
    backend = opened(fake)
    t0 = 1_700_000_000_000_000  # microseconds, like the driver's CPU timestamps
    fake.add_util_samples(
        0,
        [
            FakeUtilSample(pid=100, timestamp=t0 + 100_000, sm=80, mem=30),
            FakeUtilSample(pid=100, timestamp=t0 + 300_000, sm=60, mem=10),
            FakeUtilSample(pid=200, timestamp=t0 + 200_000, sm=10, mem=5),
        ],
    )
    (dev,) = backend.sample(1.0)
    procs = {p.pid: p for p in dev.processes}
    assert procs[100].sm_utilization == pytest.approx(0.70)  # mean of 80 and 60 percent
    assert procs[100].memory_utilization == pytest.approx(0.20)
    assert procs[200].sm_utilization == pytest.approx(0.10)
    assert fake.called(function)[-1][1] == 0  # first pass: everything buffered
    assert len(fake.called("nvmlDeviceGetProcessUtilization")) == (1 if missing else 0)

    # Second pass: only the new samples count, and lastSeenTimeStamp has advanced.
    fake.add_util_samples(0, [FakeUtilSample(pid=200, timestamp=t0 + 1_300_000, sm=90, mem=40)])
    (dev,) = backend.sample(2.0)
    assert fake.called(function)[-1][1] == t0 + 300_000
    procs = {p.pid: p for p in dev.processes}
    assert procs[200].sm_utilization == pytest.approx(0.90)
    assert procs[200].memory_utilization == pytest.approx(0.40)
    assert procs[100].sm_utilization == 0.0  # no sample in this interval: idle

    # Third pass: nothing new (NVML answers NOT_FOUND): every process is idle, not unknown.
    (dev,) = backend.sample(3.0)
    assert fake.called(function)[-1][1] == t0 + 1_300_000
    assert [p.sm_utilization for p in dev.processes] == [0.0, 0.0]


def test_per_process_utilisation_unknown_when_not_supported():
    both = {"nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo"}
    fake = FakeNvml([FakeGpu(processes=[FakeProcess(pid=100)], unsupported=both)])
    backend = opened(fake)
    (dev,) = backend.sample(1.0)
    assert dev.processes[0].sm_utilization is None
    assert dev.processes[0].memory_utilization is None
    # NOT_SUPPORTED is remembered: later passes do not ask again.
    backend.sample(2.0)
    assert len(fake.called("nvmlDeviceGetProcessUtilization")) == 1
    assert len(fake.called("nvmlDeviceGetProcessesUtilizationInfo")) == 1

    fake = FakeNvml([FakeGpu(processes=[FakeProcess(pid=100)])], missing=both)
    (dev,) = opened(fake).sample(1.0)
    assert dev.processes[0].sm_utilization is None


def test_older_utilisation_call_when_the_driver_lacks_the_newer():
    fake = FakeNvml([FakeGpu(processes=[FakeProcess(pid=100)],
                             errors={"nvmlDeviceGetProcessesUtilizationInfo": NVML_ERROR_FUNCTION_NOT_FOUND})])
    fake.add_util_samples(0, [FakeUtilSample(pid=100, timestamp=10, sm=40)])
    backend = opened(fake)
    (dev,) = backend.sample(1.0)
    assert dev.processes[0].sm_utilization == pytest.approx(0.40)
    backend.sample(2.0)
    assert len(fake.called("nvmlDeviceGetProcessesUtilizationInfo")) == 1  # not asked again
    assert len(fake.called("nvmlDeviceGetProcessUtilization")) == 2


def test_success_with_zero_samples_quirk_is_idle():
    # pynvml raises NVMLError(NVML_SUCCESS) when the driver's sizing call finds no samples.
    fake = FakeNvml([FakeGpu(processes=[FakeProcess(pid=100)], errors={"nvmlDeviceGetProcessesUtilizationInfo": 0})])
    backend = opened(fake)
    (dev,) = backend.sample(1.0)
    assert dev.processes[0].sm_utilization == 0.0
    assert backend.errors() == {}


def test_no_per_process_call_on_a_gpu_without_processes():
    fake = FakeNvml([FakeGpu()])
    backend = opened(fake)
    fake.add_util_samples(0, [FakeUtilSample(pid=1, timestamp=500, sm=99)])
    backend.sample(1.0)
    backend.sample(2.0)
    assert fake.called("nvmlDeviceGetProcessesUtilizationInfo") == []  # costs ~1.5 ms: not asked
    assert fake.called("nvmlDeviceGetProcessUtilization") == []
    # A process appears: the samples since the last one read are its interval.
    fake.gpus[0].processes.append(FakeProcess(pid=1))
    (dev,) = backend.sample(3.0)
    assert dev.processes[0].sm_utilization == pytest.approx(0.99)
    fake.add_util_samples(0, [FakeUtilSample(pid=1, timestamp=900, sm=20)])
    (dev,) = backend.sample(4.0)
    assert dev.processes[0].sm_utilization == pytest.approx(0.20)
    assert fake.called("nvmlDeviceGetProcessesUtilizationInfo")[-1][1] == 500


# ---- XIDs ---------------------------------------------------------------------------------


def test_xid_events_counted_per_gpu_and_code_across_samples():
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    backend = opened(fake)
    fake.queue_xid(1, 79)
    fake.queue_xid(1, 79)
    fake.queue_xid(0, 48)
    samples = backend.sample(1.0)
    assert dict(by_index(samples, 1).xid_errors) == {"79": 2}
    assert dict(by_index(samples, 0).xid_errors) == {"48": 1}
    # Drained with a zero timeout until NVML_ERROR_TIMEOUT.
    assert all(args[1] == 0 for args in fake.called("nvmlEventSetWait"))

    samples = backend.sample(2.0)  # no new events: the counts persist
    assert dict(by_index(samples, 1).xid_errors) == {"79": 2}
    fake.queue_xid(1, 94)
    samples = backend.sample(3.0)
    assert dict(by_index(samples, 1).xid_errors) == {"79": 2, "94": 1}


def test_xid_not_supported_on_a_device():
    fake = FakeNvml([FakeGpu(xid_supported=False), FakeGpu()])
    backend = opened(fake)
    fake.queue_xid(1, 31)
    samples = backend.sample(1.0)
    assert dict(by_index(samples, 0).xid_errors) == {}
    assert dict(by_index(samples, 1).xid_errors) == {"31": 1}


def test_event_set_freed_and_nvml_shut_down_on_close():
    fake = FakeNvml([FakeGpu()])
    backend = opened(fake)
    backend.close()
    assert fake.event_sets and fake.event_sets[0].freed
    assert fake.shutdown_calls == 1
    backend.close()  # idempotent
    assert fake.shutdown_calls == 1


# ---- MIG ----------------------------------------------------------------------------------


def test_mig_devices_enumerated_with_gpu_instance():
    migs = [
        FakeMig(uuid="MIG-aaaa", gpu_instance_id=1, memory_total=40 * GiB, memory_used=8 * GiB,
                processes=[FakeProcess(pid=11, used_memory=7 * GiB)]),
        FakeMig(uuid="MIG-bbbb", gpu_instance_id=2, memory_total=20 * GiB, memory_used=0),
    ]
    fake = FakeNvml(
        [
            FakeGpu(processes=[FakeProcess(pid=5)]),
            FakeGpu(mig_devices=migs, processes=[FakeProcess(pid=11, used_memory=7 * GiB)],
                    unsupported={"nvmlDeviceGetUtilizationRates"}),
        ]
    )
    backend = opened(fake)
    fake.add_util_samples(1, [FakeUtilSample(pid=11, timestamp=10, sm=50)])
    samples = backend.sample(1.0)
    assert [(s.index, s.gpu_instance) for s in samples] == [(0, ""), (1, ""), (1, "1"), (1, "2")]

    parent = by_index(samples, 1)
    assert parent.up and parent.power_watts == 250.0  # whole-board values stay on the parent
    assert parent.processes == ()  # processes belong to the instances, counted once
    assert parent.utilization is None

    first = by_index(samples, 1, "1")
    assert first.uuid == "MIG-aaaa" and first.model == parent.model and first.vendor == "nvidia"
    assert first.memory_total_bytes == 40 * GiB and first.memory_used_bytes == 8 * GiB
    assert [(p.pid, p.used_memory_bytes) for p in first.processes] == [(11, 7 * GiB)]
    assert first.processes[0].sm_utilization is None  # not available on MIG
    assert first.utilization is None and first.power_watts is None
    assert first.key != parent.key

    second = by_index(samples, 1, "2")
    assert second.uuid == "MIG-bbbb" and second.processes == ()

    # A MIG-capable GPU with MIG disabled is a plain GPU.
    assert by_index(samples, 0).processes[0].pid == 5


def test_mig_instances_are_their_slices_of_the_gpu_read_once():
    """A 3g and a 1g instance of a 7-slice GPU: 3/7 and 1/7 of its time, the parent the 3/7
    in no instance; the attributes are asked once per instance, not every pass."""
    migs = [FakeMig(uuid="MIG-3g", gpu_instance_id=1, memory_total=40 * GiB, slices=3),
            FakeMig(uuid="MIG-1g", gpu_instance_id=2, memory_total=10 * GiB, slices=1)]
    fake = FakeNvml([FakeGpu(), FakeGpu(mig_devices=migs)])
    backend = opened(fake)
    for now in (1.0, 2.0, 3.0):
        samples = backend.sample(now)
    assert by_index(samples, 0).capacity == 1.0
    assert by_index(samples, 1).capacity == pytest.approx(3 / 7)
    assert by_index(samples, 1, "1").capacity == pytest.approx(3 / 7)
    assert by_index(samples, 1, "2").capacity == pytest.approx(1 / 7)
    assert sum(s.capacity for s in samples if s.index == 1) == pytest.approx(1.0)
    assert len(fake.called("nvmlDeviceGetAttributes")) + len(fake.called("nvmlDeviceGetAttributes_v2")) == 2


def test_mig_capacity_falls_back_to_the_memory_share_where_the_driver_has_no_attributes():
    migs = [FakeMig(uuid="MIG-x", gpu_instance_id=1, memory_total=20 * GiB)]
    fake = FakeNvml([FakeGpu(mig_devices=migs, unsupported={"nvmlDeviceGetAttributes",
                                                             "nvmlDeviceGetAttributes_v2"})])
    samples = opened(fake).sample(1.0)
    assert by_index(samples, 0, "1").capacity == pytest.approx(20 / 80)
    assert by_index(samples, 0).capacity == pytest.approx(60 / 80)


# ---- failures -----------------------------------------------------------------------------


def test_lost_gpu_is_down_and_others_carry_on():
    fake = FakeNvml([FakeGpu(), FakeGpu(), FakeGpu()])
    backend = opened(fake)
    first = backend.sample(1.0)
    assert all(s.up for s in first)
    lost_uuid = by_index(first, 1).uuid

    fake.gpus[1].lost = True
    samples = backend.sample(2.0)
    lost = by_index(samples, 1)
    assert not lost.up
    assert lost.error == "GPU is lost"  # NVML's text says it: said once
    assert lost.uuid == lost_uuid  # same identity, so its series line up
    assert lost.power_watts is None and lost.memory_used_bytes is None and lost.processes == ()
    assert by_index(samples, 0).up and by_index(samples, 2).up
    assert by_index(samples, 2).power_watts == 250.0
    assert backend.errors() == {"gpu_lost": 1}

    backend.sample(3.0)
    assert backend.errors() == {"gpu_lost": 2}
    fake.gpus[1].lost = False  # back after a reset: a fresh handle is taken
    assert by_index(backend.sample(4.0), 1).up


def test_lost_at_first_sight_still_reports_index():
    gpu = FakeGpu()
    gpu.lost = True
    fake = FakeNvml([FakeGpu(), gpu])
    samples = opened(fake).sample(1.0)
    assert [s.up for s in samples] == [True, False]
    assert by_index(samples, 1).key  # a stable key even without a UUID


def test_unexpected_error_on_core_query_marks_device_down():
    fake = FakeNvml([FakeGpu(errors={"nvmlDeviceGetUtilizationRates": 999}), FakeGpu()])
    backend = opened(fake)
    samples = backend.sample(1.0)
    assert not by_index(samples, 0).up and "999" in by_index(samples, 0).error
    assert by_index(samples, 1).up
    assert backend.errors() == {"device_error": 1}


def test_library_missing_is_backend_unavailable():
    with pytest.raises(BackendUnavailable, match="libnvidia-ml.so.1"):
        opened(FakeNvml([FakeGpu()], init_error=NVML_ERROR_LIBRARY_NOT_FOUND))
    with pytest.raises(BackendUnavailable, match="driver is not loaded"):
        opened(FakeNvml([FakeGpu()], init_error=NVML_ERROR_DRIVER_NOT_LOADED))


def test_no_gpu_is_backend_unavailable():
    fake = FakeNvml([])
    with pytest.raises(BackendUnavailable, match="no NVIDIA GPU"):
        opened(fake)
    assert fake.shutdown_calls == 1


def test_binding_not_installed_is_backend_unavailable(monkeypatch):
    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):  # type: ignore[no-untyped-def]
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(BackendUnavailable, match="nvidia-ml-py"):
        NvmlBackend().open()


def test_default_imports_pynvml(monkeypatch):
    fake = install(monkeypatch, FakeNvml([FakeGpu()]))
    backend = NvmlBackend()
    backend.open()
    assert backend.sample(1.0)[0].up
    assert fake.init_calls == 1


def test_open_backends_by_name(monkeypatch):
    from exporter.devices import open_backends

    install(monkeypatch, FakeNvml([FakeGpu(), FakeGpu()]))
    [backend] = open_backends("nvml", {})
    assert backend.name == "nvml"
    assert len(backend.sample(1.0)) == 2


# ---- end to end through rendering (when the renderer is present) ---------------------------


def test_renders_to_prometheus_text(monkeypatch):
    render = pytest.importorskip("exporter.output.render")
    model = pytest.importorskip("exporter.core.model")
    fake = FakeNvml([FakeGpu(processes=[FakeProcess(pid=4242, used_memory=3 * GiB)], clock_reasons=0x4)])
    backend = opened(fake)
    fake.queue_xid(0, 79)
    devices = tuple(backend.sample(1.0))
    snapshot = model.Snapshot(seq=1, node="node-a", timestamp=1.0, devices=devices)
    text = _render_text(render, snapshot)
    if text is None:
        pytest.skip("exporter.output.render has no text entry point yet")
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(text)}
    power = families["gpu_power_watts"].samples[0]
    assert power.value == pytest.approx(250.0)
    assert power.labels["node"] == "node-a" and power.labels["gpu"] == "0"
    assert power.labels["uuid"] == devices[0].uuid and power.labels["gpu_instance"] == ""
    xid = [s for s in families["gpu_xid_errors"].samples if s.name.endswith("_total")]
    assert xid and xid[0].labels["xid"] == "79" and xid[0].value == 1


def _render_text(render, snapshot):  # type: ignore[no-untyped-def]
    """Best effort: the renderer's API is owned elsewhere; skip when it does not fit."""
    for name in ("render_text", "to_text", "exposition"):
        fn = getattr(render, name, None)
        if callable(fn):
            try:
                out = fn(snapshot)
            except TypeError:
                continue
            return out.decode() if isinstance(out, bytes) else out
    collector_cls = getattr(render, "SnapshotCollector", None)
    if collector_cls is None:
        return None
    from prometheus_client import CollectorRegistry, generate_latest

    try:
        registry = CollectorRegistry()
        registry.register(collector_cls(lambda: snapshot))
    except TypeError:
        return None
    return generate_latest(registry).decode()


def test_real_ctypes_handles_map_back_by_address():
    # Event data carries a new pointer object to the device: equal address, not identity.
    ctypes = pytest.importorskip("ctypes")
    pynvml = pytest.importorskip("pynvml")
    from exporter.devices.nvml.libnvml import handle_key

    device = pynvml.struct_c_nvmlDevice_t()
    registered = ctypes.pointer(device)
    event = pynvml.c_nvmlEventData_t()
    event.device = ctypes.cast(ctypes.addressof(device), pynvml.c_nvmlDevice_t)
    assert event.device is not registered
    assert handle_key(event.device) == handle_key(registered)


def test_processes_with_the_last_passes_shares_are_the_last_passes_tuple():
    """The stages after the read take an unchanged tuple for unchanged processes."""
    from exporter.devices.nvml.processes import processes_with_shares

    entries = [(1, 10, "compute"), (2, 20, "compute")]
    first = processes_with_shares(entries, {1: (0.5, 0.1)})
    assert processes_with_shares(entries, {1: (0.5, 0.1)}, first) is first
    changed = processes_with_shares(entries, {1: (0.6, 0.1)}, first)
    assert changed is not first and changed[1] is first[1] and changed[0].sm_utilization == 0.6
