"""The AMD backend against a stand-in amdsmi with the real interface and units."""

from __future__ import annotations

import os
import sys

import pytest
from fakes.amdsmi_fake import (
    NA,
    AmdSmiLibraryException,
    AmdSmiRetCode,
    FakeAmdSmi,
    FakeGpu,
    FakeProcess,
)

from exporter.devices.amd import backend as amd
from exporter.devices.amd.backend import AmdBackend
from exporter.devices.base import Backend, BackendUnavailable

GiB = 2**30


def opened(lib: FakeAmdSmi) -> AmdBackend:
    backend = AmdBackend(amdsmi=lib)
    backend.open()
    return backend


def test_implements_backend_protocol():
    backend = AmdBackend(amdsmi=FakeAmdSmi())
    assert isinstance(backend, Backend)
    assert backend.name == "amd"


def test_device_values_in_base_units():
    lib = FakeAmdSmi([FakeGpu()])
    (dev,) = opened(lib).sample(100.0)
    assert dev.up and dev.vendor == "amd"
    assert dev.index == 0
    assert dev.uuid == "a4ff740f-0000-1000-80ea-3fe8d9b2e51c"
    assert dev.pci_bus_id == "0000:c1:00.0"
    assert dev.model == "AMD Instinct MI300X"
    assert dev.serial == "0x5F1B2C3D4E5F6A7B"
    assert dev.driver_version == "6.8.5"
    assert dev.utilization == pytest.approx(0.42)
    assert dev.memory_utilization == pytest.approx(0.17)
    assert dev.memory_used_bytes == 3 * GiB
    assert dev.memory_total_bytes == 192 * GiB
    assert dev.power_watts == 350.0
    assert dev.power_limit_watts == 750.0
    assert dev.energy_joules == pytest.approx(1_000_000 * 15.3 / 1e6)
    assert dev.temperature_celsius == 61.0  # junction, MI300 has no edge sensor
    assert dev.memory_temperature_celsius == 48.0
    assert dev.sm_clock_hertz == 2100e6
    assert dev.memory_clock_hertz == 1300e6
    assert dict(dev.ecc_errors) == {"corrected": 3, "uncorrected": 0}
    assert lib.initialised


def test_older_library_shapes():
    """vram_usage in MiB, average socket power, µW limit, `power` energy key, cur_clk."""
    gpu = FakeGpu(memory_usage_api=False, current_socket_power=NA, average_socket_power=212,
                  power_limit_microwatts=True, power_limit_watts=300, energy_key="power",
                  clock_key="cur_clk", temperatures={"EDGE": 55, "JUNCTION": NA, "VRAM": NA})
    (dev,) = opened(FakeAmdSmi([gpu])).sample(1.0)
    assert dev.memory_used_bytes == 3 * GiB
    assert dev.memory_total_bytes == 192 * GiB
    assert dev.power_watts == 212.0
    assert dev.power_limit_watts == 300.0
    assert dev.energy_joules == pytest.approx(15.3)
    assert dev.sm_clock_hertz == 2100e6
    assert dev.temperature_celsius == 55.0  # falls back to edge
    assert dev.memory_temperature_celsius is None


def test_na_values_are_omitted_not_zero():
    gpu = FakeGpu(gfx_activity=NA, umc_activity=NA, current_socket_power=NA, average_socket_power=NA,
                  power_limit_watts=NA, energy_ticks=NA, gfx_mhz=NA, mem_mhz=0xFFFFFFFF,
                  correctable=NA, uncorrectable=NA, temperatures={})
    (dev,) = opened(FakeAmdSmi([gpu])).sample(1.0)
    assert dev.up
    for attr in ("utilization", "memory_utilization", "power_watts", "power_limit_watts",
                 "energy_joules", "sm_clock_hertz", "memory_clock_hertz", "temperature_celsius",
                 "memory_temperature_celsius"):
        assert getattr(dev, attr) is None, attr
    assert dict(dev.ecc_errors) == {}
    assert dev.memory_used_bytes == 3 * GiB


def test_unsupported_reads_are_not_errors():
    gpu = FakeGpu(correctable=AmdSmiLibraryException(AmdSmiRetCode.ERR_NOT_SUPPORTED))
    backend = opened(FakeAmdSmi([gpu]))
    (dev,) = backend.sample(1.0)
    assert dev.up and dict(dev.ecc_errors) == {}
    assert backend.errors() == {}


def test_a_read_the_device_answered_not_supported_is_not_asked_again():
    """As NVML's wrapper does: the EDGE sensor a card lacks and its ECC count are asked on
    the first pass only, per device (the second GPU, which has them, is asked every pass)."""
    unsupported = AmdSmiLibraryException(AmdSmiRetCode.ERR_NOT_SUPPORTED)
    lacking = FakeGpu(temperatures={"EDGE": NA, "JUNCTION": NA, "VRAM": 48}, correctable=unsupported)
    full = FakeGpu(uuid="a4ff740f-0001-1000-80ea-3fe8d9b2e51c", bdf="0000:c2:00.0",
                   temperatures={"EDGE": 55, "JUNCTION": NA, "VRAM": 48})
    lib = FakeAmdSmi([lacking, full])
    backend = AmdBackend(amdsmi=lib, health_interval=None)  # the pass's reads only
    backend.open()
    for t in (1.0, 2.0, 3.0):
        devices = backend.sample(t)
    assert [d.temperature_celsius for d in devices] == [None, 55.0]
    assert [dict(d.ecc_errors) for d in devices] == [{}, {"corrected": 3, "uncorrected": 0}]
    # the first pass asks both GPUs JUNCTION (also as HOTSPOT), EDGE and VRAM; then only what
    # they answered: VRAM on both, EDGE on the second
    assert lib.calls["amdsmi_get_temp_metric"] == 2 * 4 + 2 * (2 + 1)
    assert lib.calls["amdsmi_get_gpu_total_ecc_count"] == 1 + 3
    assert backend.errors() == {}


@pytest.mark.parametrize("api", ["dicts", "handles"])
def test_processes_both_api_generations(api):
    procs = [FakeProcess(pid=4242, vram_bytes=5 * GiB, gfx_ns=10_000_000_000),
             FakeProcess(pid=4343, vram_bytes=GiB, gfx_ns=0)]
    lib = FakeAmdSmi([FakeGpu(processes=procs)], process_api=api)
    backend = opened(lib)
    (dev,) = backend.sample(100.0)
    by_pid = {p.pid: p for p in dev.processes}
    assert set(by_pid) == {4242, 4343}
    assert by_pid[4242].used_memory_bytes == 5 * GiB
    assert by_pid[4242].sm_utilization is None  # first sight: no interval yet

    procs[0].gfx_ns += 1_500_000_000  # 1.5 s of GFX time in 2 s of wall time
    procs[1].gfx_ns += 9_000_000_000  # more than the interval: clipped to 1
    (dev,) = backend.sample(102.0)
    by_pid = {p.pid: p for p in dev.processes}
    assert by_pid[4242].sm_utilization == pytest.approx(0.75)
    assert by_pid[4343].sm_utilization == 1.0


def test_process_counter_reset_gives_none_not_negative():
    proc = FakeProcess(pid=7, vram_bytes=GiB, gfx_ns=5_000_000_000)
    backend = opened(FakeAmdSmi([FakeGpu(processes=[proc])]))
    backend.sample(10.0)
    proc.gfx_ns = 1_000  # PID reused by a new process
    (dev,) = backend.sample(11.0)
    assert dev.processes[0].sm_utilization is None
    proc.gfx_ns += 500_000_000
    (dev,) = backend.sample(12.0)
    assert dev.processes[0].sm_utilization == pytest.approx(0.5)


def test_agent_own_pid_is_not_a_gpu_process():
    procs = [FakeProcess(pid=os.getpid()), FakeProcess(pid=99, vram_bytes=GiB)]
    (dev,) = opened(FakeAmdSmi([FakeGpu(processes=procs)])).sample(1.0)
    assert [p.pid for p in dev.processes] == [99]


def test_one_lost_gpu_does_not_hide_the_others():
    good = FakeGpu(uuid="good", bdf="0000:01:00.0")
    bad = FakeGpu(uuid="bad", bdf="0000:02:00.0")
    backend = opened(FakeAmdSmi([good, bad]))
    bad.lost = True
    first, second = backend.sample(1.0)
    assert first.up and first.uuid == "good" and first.power_watts == 350.0
    assert not second.up and second.uuid == "bad" and second.pci_bus_id == "0000:02:00.0"
    assert "6" in second.error or "DRM" in second.error
    assert backend.errors()["gpu_lost"] == 1
    bad.lost = False
    assert all(d.up for d in backend.sample(2.0))


def test_process_list_failure_keeps_device_values():
    gpu = FakeGpu(process_list_error=AmdSmiLibraryException(AmdSmiRetCode.ERR_NO_PERM))
    backend = opened(FakeAmdSmi([gpu]))
    (dev,) = backend.sample(1.0)
    assert dev.up and dev.processes == () and dev.power_watts == 350.0
    assert backend.errors()["read_error"] == 1


def test_init_failure_is_unavailable():
    with pytest.raises(BackendUnavailable, match="amdgpu driver"):
        opened(FakeAmdSmi(init_error=AmdSmiRetCode.INIT_ERROR))


def test_no_gpus_is_unavailable():
    lib = FakeAmdSmi([])
    with pytest.raises(BackendUnavailable, match="no AMD GPUs"):
        opened(lib)
    assert lib.shut_down


def test_missing_package_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi -> ImportError
    with pytest.raises(BackendUnavailable, match="amdsmi"):
        AmdBackend().open()


def test_imports_amdsmi_when_not_injected(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi())
    backend = AmdBackend()
    backend.open()
    assert backend.sample(1.0)[0].up
    backend.close()


def test_close_shuts_down():
    lib = FakeAmdSmi()
    backend = opened(lib)
    backend.close()
    assert lib.shut_down


@pytest.mark.parametrize("value, expected", [
    (42, 42.0), ("N/A", None), (0xFFFF, None), (0xFFFFFFFFFFFFFFFF, None), (True, None),
    ("12.5", 12.5), (None, None), ([], None),
])
def test_number(value, expected):
    assert amd.number(value) == expected


def test_unit_helpers():
    assert amd.power_limit_watts(300_000_000) == 300.0
    assert amd.power_limit_watts(300) == 300.0
    assert amd.celsius(61_000) == 61.0
    assert amd.ratio_from_percent(140) == 1.0
    assert amd.energy_joules({"energy_accumulator": 2, "power": 1, "counter_resolution": 1e6}) == 2.0
