"""The NVML backend's health reads: every signal arrives in DeviceSample.health in the
right units, unsupported reads stay None and are asked once, reads happen every
--health-interval per GPU (staggered), and a lost GPU still carries a health reading."""

from __future__ import annotations

import collections

import pytest
from fakes.pynvml_fake import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_RESET_REQUIRED,
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    NVML_PERF_POLICY_LOW_UTILIZATION,
    NVML_PERF_POLICY_POWER,
    NVML_PERF_POLICY_THERMAL,
    FakeFabric,
    FakeGpu,
    FakeMig,
    FakeNvLink,
    FakeNvml,
)

from exporter.devices.nvml import NvmlBackend
from exporter.health import FabricState, HealthSignals, HealthState, assess

H200 = "NVIDIA H200"


@pytest.fixture
def boot_id(tmp_path):
    path = tmp_path / "boot_id"
    path.write_text("3f1c0a52-1111-2222-3333-444455556666\n")
    return str(path)


def opened(fake: FakeNvml, boot_id: str, **kwargs) -> NvmlBackend:
    backend = NvmlBackend(nvml=fake, gpm=False, boot_id_path=boot_id, **kwargs)
    backend.open()
    return backend


def health_of(backend: NvmlBackend, now: float = 100.0) -> list[HealthSignals | None]:
    return [d.health_signals for d in backend.sample(now) if not d.gpu_instance]


def counts(fake: FakeNvml, start: int = 0) -> collections.Counter[str]:
    return collections.Counter(name for name, _ in fake.calls[start:])


def test_every_signal_arrives_with_its_units(boot_id):
    gpu = FakeGpu(name=H200, remapped_rows=(3, 1, 1, 0),
                  remap_histogram={"max": 600, "high": 30, "partial": 8, "low": 0, "none": 2},
                  ecc_corrected=7, ecc_uncorrected=1, ecc_volatile_corrected=4, ecc_volatile_uncorrected=0,
                  sram_threshold_exceeded=1, pcie_generation=4, pcie_generation_max=5, pcie_width=8,
                  pcie_width_max=16, pcie_replays=12,
                  nvlinks=[FakeNvLink(replay=5, recovery=1, crc_flit=2, crc_data=3), FakeNvLink(up=False)],
                  violation_ns={NVML_PERF_POLICY_POWER: 2_500_000_000, NVML_PERF_POLICY_THERMAL: 1_000_000},
                  recovery_action=1, fabric=FakeFabric(health_mask=0x1))
    fake = FakeNvml([gpu])
    backend = opened(fake, boot_id)
    (h,) = health_of(backend)
    assert h is not None
    assert (h.row_remap.correctable, h.row_remap.uncorrectable, h.row_remap.pending, h.row_remap.failure,
            h.row_remap.banks_no_spare) == (3, 1, True, False, 2)
    assert h.retired_pages is None  # Hopper remaps rows; retired pages are not asked
    assert "nvmlDeviceGetRetiredPages_v2" not in counts(fake)
    assert (h.ecc.volatile_corrected, h.ecc.volatile_uncorrected, h.ecc.aggregate_corrected,
            h.ecc.aggregate_uncorrected, h.ecc.sram_threshold_exceeded) == (4, 0, 7, 1, True)
    assert (h.pcie.generation, h.pcie.generation_max, h.pcie.width, h.pcie.width_max, h.pcie.replays) == (
        4, 5, 8, 16, 12)
    assert [(link.link, link.up, link.replay, link.recovery, link.crc_flit, link.crc_data) for link in h.nvlinks] == [
        (0, True, 5, 1, 2, 3), (1, False, 0, 0, 0, 0)]
    assert h.violations.power == pytest.approx(2.5)  # ns -> s
    assert h.violations.thermal == pytest.approx(0.001)
    assert h.violations.reliability == 0.0
    assert h.recovery_action == 1
    assert h.persistence_mode is True
    assert h.fabric.state == FabricState.COMPLETED and h.fabric.status_ok is True and h.fabric.degraded is True
    assert h.boot_id == "3f1c0a52-1111-2222-3333-444455556666"
    assert h.energy_mj == gpu.energy_mj
    assert (h.gpu_lost, h.reset_required) == (False, False)
    # The policy reads each signal as it came, in its unit: every problem of this GPU is a reason.
    _, verdict = assess(HealthState(), 100.0, h)
    assert verdict.state == "unhealthy" and verdict.action == "contact_support"
    assert set(verdict.reason_names) == {"fabric_unhealthy", "nvlink_down", "recovery_action", "row_remap_no_spare",
                                         "row_remap_pending", "sram_threshold"}
    assert verdict.problems == ()


def test_unsupported_reads_stay_none_and_are_asked_once(boot_id):
    # A MIG-mode H100: remapped rows NOT_SUPPORTED; no fabric health; a driver without the
    # recovery-action field; a PCIe card (no NVLink); SRAM status NOT_SUPPORTED.
    mig = FakeGpu(mig_devices=[FakeMig(uuid="MIG-aaaa", gpu_instance_id=1)], recovery_action=None,
                  sram_threshold_exceeded=None)
    h100 = FakeGpu(fabric=FakeFabric(health=False), nvlinks=[FakeNvLink()] * 18)
    fake = FakeNvml([mig, h100])
    backend = opened(fake, boot_id, health_interval=0.0)
    first = health_of(backend, 1.0)
    start = len(fake.calls)
    second = health_of(backend, 2.0)
    for h in (first, second):
        assert h[0].row_remap is None and h[0].retired_pages is None  # MIG: no remap, no retired pages
        assert h[0].recovery_action is None and h[0].fabric is None and h[0].nvlinks == ()
        assert h[0].ecc.sram_threshold_exceeded is None
        assert h[1].fabric == h[1].fabric.__class__(state=FabricState.COMPLETED, status_ok=True, degraded=None)
        assert len(h[1].nvlinks) == 18
    again = counts(fake, start)
    asked_mig = [args for name, args in fake.calls[start:] if args and getattr(args[0], "index", None) == 0
                 and getattr(args[0], "mig", None) is None]
    names_mig = {name for name, args in fake.calls[start:] if args and getattr(args[0], "index", None) == 0}
    assert asked_mig
    for name in ("nvmlDeviceGetRemappedRows", "nvmlDeviceGetSramEccErrorStatus", "nvmlDeviceGetNvLinkState",
                 "nvmlDeviceGetGpuFabricInfo"):
        assert name not in names_mig, name
    # The field-values call no longer carries the recovery-action field on GPU 0.
    assert all(230 not in args[1] for name, args in fake.calls[start:]
               if name == "nvmlDeviceGetFieldValues" and args[0].index == 0)
    # H100: the versioned fabric call answered NOT_SUPPORTED once; the plain one is used.
    assert again["nvmlDeviceGetGpuFabricInfoV"] == 0 and again["nvmlDeviceGetGpuFabricInfo"] == 1
    assert again["nvmlDeviceGetMaxPcieLinkWidth"] == 0  # the maximum is read once
    assert again["nvmlDeviceGetNvLinkState"] == 18  # links found on the first read: no probing past them


def test_recovery_action_constant_missing_from_binding_is_never_asked(boot_id):
    fake = FakeNvml([FakeGpu()], missing={"NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"})
    backend = opened(fake, boot_id)
    (h,) = health_of(backend)
    assert h.recovery_action is None
    assert all(230 not in args[1] for args in fake.called("nvmlDeviceGetFieldValues"))


def test_pre_ampere_gpu_reports_retired_pages(boot_id):
    v100 = FakeGpu(name="Tesla V100-SXM2-32GB", remapped_rows=None, retired_pending=1,
                   retired_pages={NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: 3,
                                  NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: 1})
    backend = opened(FakeNvml([v100]), boot_id)
    (h,) = health_of(backend)
    assert h.row_remap is None
    assert (h.retired_pages.single_bit, h.retired_pages.double_bit, h.retired_pages.pending) == (3, 1, True)


def test_garbage_values_pass_through_for_the_policy_to_reject(boot_id):
    gpu = FakeGpu(pcie_width=0, pcie_generation=99)
    backend = opened(FakeNvml([gpu]), boot_id)
    (h,) = health_of(backend)
    assert (h.pcie.width, h.pcie.generation) == (0, 99)  # exporter.health.checks logs and ignores them
    # The policy gets them as data: it names each bad field once and does not call the
    # link narrowed or downgraded on the strength of them.
    state, verdict = assess(HealthState(), 100.0, h, utilization=1.0)
    assert verdict.state == "healthy" and verdict.reasons == ()
    assert any("pcie.width" in line for line in verdict.problems)
    assert any("pcie.generation" in line for line in verdict.problems)
    _, again = assess(state, 130.0, h, utilization=1.0)
    assert again.state == "healthy" and again.problems == ()


def test_health_is_read_every_interval_staggered(boot_id):
    fake = FakeNvml([FakeGpu() for _ in range(4)])
    backend = opened(fake, boot_id, health_interval=30.0)
    read_at: dict[int, list[float]] = collections.defaultdict(list)
    for step in range(0, 121):  # a pass a second for two minutes (an injected clock)
        now = 1000.0 + step
        for d in backend.sample(now):
            if d.health_signals is not None:
                read_at[d.index].append(now)
    for index in range(4):
        times = read_at[index]
        assert times[0] == 1000.0
        assert [b - a for a, b in zip(times, times[1:])][1:] == [30.0] * (len(times) - 2)
        assert times[1] - times[0] == pytest.approx(30.0 * (index + 1) / 4, abs=1.0)
    # Not every GPU reads its health in the same pass after the first.
    later = [set(i for i in range(4) if t in read_at[i]) for t in range(1001, 1121)]
    assert max(len(s) for s in later) == 1
    assert fake.called("nvmlDeviceGetRemappedRows").__len__() == sum(len(v) for v in read_at.values())


def test_health_off_reads_nothing(boot_id):
    fake = FakeNvml([FakeGpu()])
    backend = opened(fake, boot_id, health_interval=None)
    assert health_of(backend) == [None]
    assert not fake.called("nvmlDeviceGetRemappedRows")


@pytest.mark.parametrize(("code", "lost", "reset"), [(NVML_ERROR_GPU_IS_LOST, True, False),
                                                      (NVML_ERROR_RESET_REQUIRED, False, True)])
def test_a_down_gpu_carries_lost_or_reset_required(boot_id, code, lost, reset):
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    backend = opened(fake, boot_id, health_interval=0.0)  # health read every pass
    backend.sample(1.0)
    fake.gpus[1].errors["nvmlDeviceGetMemoryInfo"] = code
    down = [d for d in backend.sample(2.0) if d.index == 1][0]
    assert not down.up
    assert (down.health_signals.gpu_lost, down.health_signals.reset_required) == (lost, reset)
    # A health read that meets a lost GPU takes it down the same way.
    fake.gpus[1].errors.clear()
    fake.gpus[0].errors["nvmlDeviceGetRemappedRows"] = NVML_ERROR_GPU_IS_LOST
    gpu0 = [d for d in backend.sample(3.0) if d.index == 0][0]
    assert not gpu0.up and gpu0.health_signals.gpu_lost


def test_health_interval_flag_parses_and_rejects_bad_values(monkeypatch, capsys):
    from exporter.app.cli import UsageError, build_parser
    from exporter.devices import options_from

    def parse(*argv: str):
        return options_from(build_parser().parse_args(["serve", *argv]))

    assert {name: o["health_interval"] for name, o in parse("--health-interval", "10s").items()
            if name != "simulated"} == {"nvml": 10.0, "amd": 10.0, "gaudi": 10.0}
    assert parse("--health-interval", "off")["amd"]["health_interval"] is None
    assert parse()["gaudi"]["health_interval"] == 30.0
    monkeypatch.setenv("L9GPU_HEALTH_INTERVAL", "1m")
    assert parse()["nvml"]["health_interval"] == 60.0
    monkeypatch.delenv("L9GPU_HEALTH_INTERVAL")
    with pytest.raises(UsageError) as bad:  # printed as one line, exit 2
        parse("--health-interval", "soon")
    assert "--health-interval" in str(bad.value) and "\n" not in str(bad.value)
    monkeypatch.setenv("L9GPU_HEALTH_INTERVAL", "-5s")
    with pytest.raises((SystemExit, UsageError)):
        parse()


def test_violation_times_come_from_the_field_values_where_the_driver_has_them(boot_id):
    """The six violation times ride in the pass's one field-values call (on an H200 a
    sixth of the cost of six ViolationStatus calls); a driver without those fields is asked
    ViolationStatus per policy, and the times come out the same either way."""
    violations = {NVML_PERF_POLICY_POWER: 2_500_000_000, NVML_PERF_POLICY_THERMAL: 1_000_000,
                  NVML_PERF_POLICY_LOW_UTILIZATION: 18_078_487_552}
    with_fields = FakeNvml([FakeGpu(name=H200, violation_ns=dict(violations))])
    without = FakeNvml([FakeGpu(name=H200, violation_ns=dict(violations), unsupported={"perf_policy_fields"})])
    read = {}
    for label, fake in (("fields", with_fields), ("calls", without)):
        (h,) = health_of(opened(fake, boot_id))
        read[label] = h.violations
    assert read["fields"] == read["calls"]
    assert read["fields"].power == pytest.approx(2.5) and read["fields"].thermal == pytest.approx(0.001)
    assert read["fields"].low_utilization == pytest.approx(18.078487552) and read["fields"].reliability == 0.0
    assert "nvmlDeviceGetViolationStatus" not in counts(with_fields)
    assert counts(without)["nvmlDeviceGetViolationStatus"] == 6
    asked = [set(args[1]) for name, args in with_fields.calls if name == "nvmlDeviceGetFieldValues"]
    assert any(set(range(74, 80)) <= fields for fields in asked)


def test_a_gpu_without_violation_counters_reports_none(boot_id):
    fake = FakeNvml([FakeGpu(name=H200, unsupported={"nvmlDeviceGetViolationStatus"})])
    (h,) = health_of(opened(fake, boot_id))
    assert h.violations is None
