"""AMD health reads (ECC per block and total, bad pages, PCIe, XGMI) against the amdsmi stand-in."""

from __future__ import annotations

from fakes.amdsmi_fake import (
    NA,
    AmdSmiLibraryException,
    AmdSmiMemoryPageStatus,
    AmdSmiRetCode,
    AmdSmiXgmiStatus,
    FakeAmdSmi,
    FakeGpu,
)

from exporter.devices.amd.backend import AmdBackend
from exporter.health.signals import Ecc, EccBlock, Pcie, RetiredPages


def opened(lib: FakeAmdSmi, interval: float | None = 30.0, tmp_path=None) -> AmdBackend:
    boot = None
    if tmp_path is not None:
        boot = tmp_path / "boot_id"
        boot.write_text("5c1f0e0e-aaaa-bbbb-cccc-000000000001\n")
    backend = AmdBackend(amdsmi=lib, health_interval=interval,
                         **({"boot_id_path": str(boot)} if boot is not None else {}))
    backend.open()
    return backend


def test_health_values_arrive_in_the_sample(tmp_path):
    gpu = FakeGpu(bad_pages=[FakeAmdSmi.bad_page(0), FakeAmdSmi.bad_page(1, AmdSmiMemoryPageStatus.PENDING)],
                  xgmi_status=AmdSmiXgmiStatus.ERROR)
    lib = FakeAmdSmi([gpu])
    (dev,) = opened(lib, tmp_path=tmp_path).sample(100.0)
    health = dev.health_signals
    assert health is not None
    assert health.ecc == Ecc(aggregate_corrected=3, aggregate_uncorrected=0, deferred=1, blocks=(
        EccBlock("umc", 3, 0, 1), EccBlock("sdma", 0, 0, 0), EccBlock("gfx", 0, 0, 0), EccBlock("mmhub", 0, 0, 0)))
    assert health.retired_pages == RetiredPages(double_bit=2, pending=True)
    assert health.pcie == Pcie(generation=5, generation_max=5, width=16, width_max=16, replays=2)
    assert health.xgmi_status == AmdSmiXgmiStatus.ERROR
    assert health.boot_id == "5c1f0e0e-aaaa-bbbb-cccc-000000000001"
    assert health.energy_mj == int(dev.energy_joules * 1000)
    # AMD has none of these.
    assert health.violations is None and health.recovery_action is None and health.fabric is None
    assert health.row_remap is None and health.nvlinks == ()


def test_degraded_link_and_no_bad_pages():
    pcie = {"pcie_static": {"max_pcie_width": 16, "max_pcie_speed": 32000},
            "pcie_metric": {"pcie_width": 8, "pcie_speed": 16000, "pcie_replay_count": NA}}
    lib = FakeAmdSmi([FakeGpu(pcie=pcie)])
    (dev,) = opened(lib).sample(100.0)
    assert dev.health_signals.pcie == Pcie(generation=4, generation_max=5, width=8, width_max=16, replays=None)
    assert dev.health_signals.retired_pages == RetiredPages(double_bit=0, pending=False)


def test_unsupported_reads_are_none_and_asked_once():
    unsupported = AmdSmiLibraryException(AmdSmiRetCode.ERR_NOT_SUPPORTED)
    gpu = FakeGpu(ecc_blocks={"UMC": (1, 0, 0)}, bad_pages=unsupported, pcie=unsupported, xgmi_status=unsupported)
    lib = FakeAmdSmi([gpu])
    backend = opened(lib, interval=0.0)
    for now in (100.0, 101.0, 102.0):
        (dev,) = backend.sample(now)
        assert dev.up
        assert dev.health_signals is not None
        assert dev.health_signals.pcie is None and dev.health_signals.retired_pages is None and dev.health_signals.xgmi_status is None
        assert dev.health_signals.ecc.blocks == (EccBlock("umc", 1, 0, 0),)
    for name in ("amdsmi_get_pcie_info", "amdsmi_gpu_xgmi_error_status", "amdsmi_get_gpu_bad_page_info",
                 "amdsmi_get_gpu_ecc_count:SDMA", "amdsmi_get_gpu_ecc_count:GFX"):
        assert lib.calls[name] == 1, name
    assert lib.calls["amdsmi_get_gpu_ecc_count:UMC"] == 3


def test_older_library_without_the_calls():
    lacks = ("amdsmi_get_gpu_ecc_count", "amdsmi_get_gpu_bad_page_info", "amdsmi_get_pcie_info",
             "amdsmi_gpu_xgmi_error_status", "amdsmi_get_gpu_memory_reserved_pages")
    lib = FakeAmdSmi([FakeGpu()], library_lacks=lacks)
    (dev,) = opened(lib).sample(100.0)
    assert dev.up
    assert dev.health_signals.ecc == Ecc(aggregate_corrected=3, aggregate_uncorrected=0, deferred=1)
    assert dev.health_signals.pcie is None and dev.health_signals.retired_pages is None and dev.health_signals.xgmi_status is None


def test_read_only_every_health_interval():
    lib = FakeAmdSmi([FakeGpu(), FakeGpu(uuid="b", bdf="0000:c2:00.0")])
    backend = opened(lib, interval=30.0)
    read = {0: [], 1: []}
    for now in (100.0, 105.0, 114.0, 116.0, 129.0, 131.0, 146.0):
        for dev in backend.sample(now):
            if dev.health_signals is not None:
                read[dev.index].append(now)
    # Both on the first pass; GPU 0 first due half an interval later, GPU 1 a whole one.
    assert read == {0: [100.0, 116.0, 146.0], 1: [100.0, 131.0]}
    assert lib.calls["amdsmi_get_pcie_info"] == 5


def test_health_off_asks_nothing():
    lib = FakeAmdSmi([FakeGpu()])
    backend = opened(lib, interval=None)
    for now in (100.0, 200.0):
        (dev,) = backend.sample(now)
        assert dev.up and dev.health_signals is None
    assert "amdsmi_get_pcie_info" not in lib.calls
    assert not any(name.startswith("amdsmi_get_gpu_ecc_count") for name in lib.calls)


def test_garbage_is_passed_on_without_a_crash():
    pcie = {"pcie_static": "garbage", "pcie_metric": {"pcie_width": -4, "pcie_speed": "fast",
                                                       "pcie_replay_count": -1}}
    gpu = FakeGpu(ecc_blocks={"UMC": (-5, "N/A", 2**70)}, bad_pages="not a list", pcie=pcie, xgmi_status=77,
                  correctable="lots")
    lib = FakeAmdSmi([gpu])
    (dev,) = opened(lib).sample(100.0)
    assert dev.up
    health = dev.health_signals
    assert health.ecc.blocks == (EccBlock("umc", -5, None, 2**70),)
    assert health.ecc.aggregate_corrected is None
    assert health.pcie == Pcie(width=-4, replays=-1)
    assert health.retired_pages is None
    assert health.xgmi_status == 77


def test_a_failing_health_call_is_asked_again():
    gpu = FakeGpu(pcie=AmdSmiLibraryException(AmdSmiRetCode.API_FAILED))
    lib = FakeAmdSmi([gpu])
    backend = opened(lib, interval=0.0)
    (dev,) = backend.sample(100.0)
    assert dev.up and dev.health_signals.pcie is None
    gpu.pcie = {"pcie_static": {"max_pcie_width": 16, "max_pcie_speed": 32000},
                "pcie_metric": {"pcie_width": 16, "pcie_speed": 32000, "pcie_replay_count": 0}}
    (dev,) = backend.sample(101.0)
    assert dev.health_signals.pcie == Pcie(generation=5, generation_max=5, width=16, width_max=16, replays=0)
