"""What a pass asks of NVML, and what that costs on a real driver.

The fake charges each call what it cost on a real H200 (``fakes.pynvml_fake.H200_COSTS``);
here it keeps the bill without spending it, so these tests check the *call plan*
(which calls, how often) deterministically, whatever the machine is doing. The timed
figures are in benchmarks/bench_agent.py and docs/PERFORMANCE.md.
"""

from __future__ import annotations

import collections
import math

import pytest
from fakes.pynvml_fake import (
    DEFAULT_COST,
    H200_COSTS,
    NVML_ERROR_NOT_SUPPORTED,
    FakeGpu,
    FakeMig,
    FakeNvml,
    FakeProcess,
    FakeUtilSample,
)

from exporter.attribution import NullAttributor
from exporter.collect.collector import Collector
from exporter.collect.splits import advance_energy
from exporter.core.model import GPM_RATE_KEYS, GPM_RATIO_KEYS, Workload
from exporter.core.shares import passes_between_reads
from exporter.devices import nvml as nvml_backend
from exporter.devices.nvml import NvmlBackend

GiB = 2**30


def opened(fake: FakeNvml) -> NvmlBackend:
    backend = NvmlBackend(nvml=fake)
    backend.open()
    return backend


def h200(processes: int = 0, base_pid: int = 1000, **kwargs) -> FakeGpu:
    """A GPU that answers like the measured H200: no fan, MIG capable (off)."""
    return FakeGpu(name="NVIDIA H200", memory_total=141 * GiB, unsupported={"nvmlDeviceGetFanSpeed"},
                   mig_capable=True,
                   processes=[FakeProcess(pid=base_pid + i, used_memory=GiB) for i in range(processes)], **kwargs)


def calls_between(fake: FakeNvml, start: int) -> collections.Counter[str]:
    return collections.Counter(name for name, _ in fake.calls[start:])


def test_not_supported_is_asked_once_per_device():
    fake = FakeNvml([h200(), h200()])
    backend = opened(fake)
    for t in range(5):
        devices = backend.sample(float(t))
    assert all(d.fan_speed_ratio is None for d in devices)
    # One NOT_SUPPORTED answer per GPU, then never asked again (0.1-0.3 ms each on an H200).
    assert len(fake.called("nvmlDeviceGetFanSpeed")) == 2


def test_pcie_from_byte_counters_never_the_blocking_throughput_call():
    fake = FakeNvml([h200()])
    backend = opened(fake)
    (first,) = backend.sample(0.0)
    fake.gpus[0].pcie_tx_bytes += 4_000_000
    fake.gpus[0].pcie_rx_bytes += 9_000_000
    counters = []
    for t in range(1, 12):
        (dev,) = backend.sample(float(t))
        counters.append(dev.pcie_tx_bytes_total)
        assert dev.memory_temperature_celsius == 52  # every pass
    # Cumulative counters, read every PCIE_PERIOD (10 s): the last reading in between.
    assert counters[0] == first.pcie_tx_bytes_total
    assert dev.pcie_tx_bytes_total - first.pcie_tx_bytes_total == 4_000_000
    assert dev.pcie_rx_bytes_total - first.pcie_rx_bytes_total == 9_000_000
    assert fake.called("nvmlDeviceGetPcieThroughput") == []  # blocks 20 ms on a real driver
    # One field-values call per pass; the costly counter fields only when due.
    asked = [args[1] for args in fake.called("nvmlDeviceGetFieldValues")]
    assert len(asked) == 12
    assert sum(1 for fields in asked if 197 in fields) == 2


def test_unsupported_pcie_counters_are_absent_and_not_asked_again():
    gpu = h200()
    gpu.unsupported.add("pcie_counters")
    fake = FakeNvml([gpu])
    # Health reads add their fields to the same call (tests/test_nvml_health.py): off here.
    backend = NvmlBackend(nvml=fake, health_interval=None)
    backend.open()
    for t in range(3):
        (dev,) = backend.sample(float(t))
    assert dev.pcie_tx_bytes_total is None and dev.pcie_rx_bytes_total is None
    assert dev.memory_temperature_celsius == 52
    asked = [args[1] for args in fake.called("nvmlDeviceGetFieldValues")]
    assert asked[0] == [82, 197, 198] and asked[-1] == [82]
    backend.sample(30.0)
    assert fake.called("nvmlDeviceGetFieldValues")[-1][1] == [82]  # due again, still not asked


def test_slow_values_are_reread_on_their_schedule():
    fake = FakeNvml([h200()])
    backend = opened(fake)
    seen_limits = []
    for t in range(0, 66):
        if t == 20:
            fake.gpus[0].power_limit_mw = 500_000  # an administrator lowers the limit
            fake.gpus[0].ecc_corrected = 7
        (dev,) = backend.sample(float(t))
        seen_limits.append(dev.power_limit_watts)
    # MIG mode and the power limit every SLOW_PERIOD (30 s), ECC every ECC_PERIOD (10 s).
    assert len(fake.called("nvmlDeviceGetMigMode")) == 3
    assert len(fake.called("nvmlDeviceGetEnforcedPowerLimit")) == 3
    assert len(fake.called("nvmlDeviceGetTotalEccErrors")) == 2 * 7
    # The new limit shows within one period, and the old one was served in between.
    assert seen_limits[19] == 700.0 and seen_limits[20] == 700.0
    assert seen_limits[20 + int(nvml_backend.SLOW_PERIOD)] == 500.0
    assert dev.ecc_errors["corrected"] == 7


def test_rereads_of_several_gpus_are_spread_over_the_period():
    fake = FakeNvml([h200() for _ in range(8)])
    backend = opened(fake)
    per_pass = []
    for t in range(1, 61):
        start = len(fake.calls)
        backend.sample(float(t))
        per_pass.append(calls_between(fake, start)["nvmlDeviceGetTotalEnergyConsumption"])
    assert per_pass[0] == 8  # the first pass reads every counter
    assert max(per_pass[1:]) <= 2  # after it, no pass pays for more than two GPUs' counters


def test_mig_mode_change_makes_the_device_asked_again():
    gpu = h200(processes=1)
    fake = FakeNvml([gpu])
    backend = opened(fake)
    (dev,) = backend.sample(0.0)
    assert dev.utilization == pytest.approx(0.5)
    # MIG on: the parent no longer answers utilisation, MIG devices appear.
    gpu.processes = []
    gpu.mig_devices = [FakeMig(uuid="MIG-aaaa", gpu_instance_id=1)]
    gpu.errors["nvmlDeviceGetUtilizationRates"] = NVML_ERROR_NOT_SUPPORTED
    devices = []
    for t in range(1, 32):
        devices = backend.sample(float(t))
    assert [d.uuid for d in devices[1:]] == ["MIG-aaaa"]
    assert devices[0].utilization is None
    # MIG off again: within a slow period the parent's utilisation is asked and back.
    gpu.mig_devices = []
    del gpu.errors["nvmlDeviceGetUtilizationRates"]
    for t in range(32, 64):
        devices = backend.sample(float(t))
    assert len(devices) == 1 and devices[0].utilization == pytest.approx(0.5)


class _EnergyWorld:
    """A GPU under changing load, as the driver sees it: the energy counter is the exact
    integral of power; ``nvmlDeviceGetPowerUsage`` is the mean over the last second
    (what NVML returns on Ampere and newer)."""

    STEP = 0.01  # seconds

    def __init__(self, fake: FakeNvml):
        self.fake = fake
        self.t = 0.0
        self.energy_j = 5_000_000.0
        self.recent: collections.deque[float] = collections.deque(maxlen=int(1.0 / self.STEP))

    @staticmethod
    def load_watts(t: float) -> float:
        # bursts of a training step every 7 s, an inference wave, and idle stretches
        burst = 690.0 if (t % 7.0) < 2.5 else 0.0
        wave = 120.0 * (1 + math.sin(t / 3.0))
        return 75.0 + burst + wave

    def advance_to(self, t_end: float) -> None:
        while self.t < t_end - 1e-9:
            power = self.load_watts(self.t)
            self.energy_j += power * self.STEP
            self.recent.append(power)
            self.t += self.STEP
        gpu = self.fake.gpus[0]
        gpu.energy_mj = int(self.energy_j * 1000)
        gpu.power_mw = int(sum(self.recent) / len(self.recent) * 1000)


@pytest.mark.parametrize(("interval", "tolerance"), [(1.0, 0.01), (0.5, 0.02), (2.0, 0.02)])
def test_energy_stays_monotonic_and_within_one_percent_of_the_counter(interval, tolerance):
    """At the default 1 s interval each power reading (the mean over the last second)
    covers exactly the time since the last pass, so a minute's energy is within 1% of
    the counter. Other intervals are bounded by the counter reads every 30 s: at 0.5 s
    the readings lag the load by up to half a second, above 1 s they leave gaps that a
    trapezoid fills; under this bursty load both stay within 2%."""
    fake = FakeNvml([h200()])
    world = _EnergyWorld(fake)
    world.advance_to(1.0)
    backend = opened(fake)
    raw = total = None
    totals, driver = [], []
    t = 1.0
    while t <= 92.0:
        world.advance_to(t)
        (dev,) = backend.sample(t)
        raw, total = advance_energy(raw, total, dev, interval)  # what gpu_energy_joules_total exports
        totals.append(total)
        driver.append(world.energy_j)
        t += interval
    assert all(b >= a for a, b in zip(totals, totals[1:])), "gpu_energy_joules_total went backwards"
    # Over every minute-long window, the exported increase is within 1% of the driver's.
    per_minute = int(60 / interval)
    for start in range(0, len(totals) - per_minute, max(1, per_minute // 6)):
        exported = totals[start + per_minute] - totals[start]
        actual = driver[start + per_minute] - driver[start]
        assert exported == pytest.approx(actual, rel=tolerance), f"window starting at pass {start}"
    # ... while the costly counter was read once per ENERGY_COUNTER_PERIOD, not every pass.
    reads = len(fake.called("nvmlDeviceGetTotalEnergyConsumption"))
    assert reads <= 1 + 92 / nvml_backend.ENERGY_COUNTER_PERIOD + 1


def test_energy_counter_reset_passes_through_as_a_reset():
    fake = FakeNvml([h200()])  # 250 W
    backend = opened(fake)
    fake.gpus[0].energy_mj = 9_000_000
    (dev,) = backend.sample(0.0)
    assert dev.energy_joules == pytest.approx(9000.0)
    fake.gpus[0].energy_mj = 1_000  # the driver reloaded: its counter starts again
    readings = []
    for t in range(1, 62):
        fake.gpus[0].energy_mj += 250_000
        (dev,) = backend.sample(float(t))
        readings.append(dev.energy_joules)
    # Integrated power carries on until the next counter read, which sees the restart and
    # reports it as the drop it is (derive adds nothing for a drop), then follows the counter.
    drop = next(i for i, (a, b) in enumerate(zip(readings, readings[1:])) if b < a)
    assert readings[drop + 1] == pytest.approx(1.0 + 250.0 * (drop + 2))
    assert dev.energy_joules == pytest.approx(fake.gpus[0].energy_mj / 1000)


def test_no_power_reading_means_the_counter_every_pass():
    fake = FakeNvml([FakeGpu(unsupported={"nvmlDeviceGetPowerUsage"})])
    backend = opened(fake)
    for t in range(4):
        fake.gpus[0].energy_mj += 250_000
        (dev,) = backend.sample(float(t))
    assert len(fake.called("nvmlDeviceGetTotalEnergyConsumption")) == 4
    assert dev.energy_joules == pytest.approx(fake.gpus[0].energy_mj / 1000)


def _busy_node(gpus: int, processes: int, fake_kwargs: dict) -> FakeNvml:
    return FakeNvml([h200(processes, base_pid=10_000 * (i + 1)) for i in range(gpus)], **fake_kwargs)


def _add_samples(fake: FakeNvml, t: int) -> None:
    for index, gpu in enumerate(fake.gpus):
        fake.add_util_samples(index, [FakeUtilSample(pid=p.pid, timestamp=(t + 1) * 1_000_000, sm=20)
                                      for p in gpu.processes])


def test_graphics_processes_asked_on_a_slow_schedule_while_there_are_none():
    fake = FakeNvml([h200(processes=1)])
    backend = opened(fake)
    for t in range(10):
        backend.sample(float(t))
    assert len(fake.called("nvmlDeviceGetComputeRunningProcesses_v3")) == 10
    assert len(fake.called("nvmlDeviceGetGraphicsRunningProcesses_v3")) == 2
    fake.gpus[0].processes.append(FakeProcess(pid=77, kind="graphics"))
    seen_at = None
    for t in range(10, 20):
        (dev,) = backend.sample(float(t))
        if seen_at is None and 77 in {p.pid for p in dev.processes}:
            seen_at = t
    assert seen_at is not None and seen_at - 10 <= nvml_backend.GRAPHICS_PERIOD
    # With a graphics process present, the list is asked every pass.
    before = len(fake.called("nvmlDeviceGetGraphicsRunningProcesses_v3"))
    backend.sample(20.0)
    assert len(fake.called("nvmlDeviceGetGraphicsRunningProcesses_v3")) == before + 1


class _TwoPodsPerGpu:
    """Owners for `_busy_node`'s processes: on every GPU, half of them in one pod and half
    in another (a time-sliced GPU), so each GPU's SM time has to be split."""

    def __init__(self) -> None:
        self.pods = [Workload(kind="kubernetes", namespace="ml", pod=f"p{i}", container="main", pod_uid=f"u{i}")
                     for i in range(2)]

    def resolve(self, pids, now):  # type: ignore[no-untyped-def]
        return {pid: self.pods[pid % 2] for pid in pids}

    def comm(self, pid):  # type: ignore[no-untyped-def]
        return ""

    def start_time(self, pid):  # type: ignore[no-untyped-def]
        return None

    generation = 0

    def allocations(self, devices):  # type: ignore[no-untyped-def]
        return None

    def statuses(self):  # type: ignore[no-untyped-def]
        return {}

    def info(self):  # type: ignore[no-untyped-def]
        return {}

    def close(self) -> None:
        return None


def _bill_per_gpu(attributor, process_metrics: bool = False, gpm: bool = False,
                  gpm_keys: frozenset[str] | None = None) -> tuple[float, float, FakeNvml]:
    """(wall, CPU) seconds per GPU per steady pass that the driver charges on 8 fake H200s
    with 16 processes each, at 1 s, through the collector (as `l9gpu serve` reads).

    GPM (on by default, a 2.1 ms read every 5 s per GPU) is off unless ``gpm``: its own
    schedule, billed on its own in docs/PERFORMANCE.md."""
    fake = _busy_node(8, 16, {"costs": H200_COSTS, "spend": False})
    backend = NvmlBackend(nvml=fake, gpm=gpm, gpm_keys=gpm_keys)
    backend.open()
    collector = Collector([backend], "n", attributor=attributor, clock=lambda: float(clock[0]),
                          process_metrics=process_metrics)
    clock = [0]
    try:
        _add_samples(fake, 0)
        collector.collect_once()
        wall0, cpu0 = fake.bill
        passes = 120
        for t in range(1, passes + 1):
            clock[0] = t
            _add_samples(fake, t)
            snap = collector.collect_once()
    finally:
        collector.stop()
    assert sum(len(d.processes) for d in snap.devices) == 128 and all(d.up for d in snap.devices)
    return (fake.bill[0] - wall0) / passes / 8, (fake.bill[1] - cpu0) / passes / 8, fake


def test_call_plan_fits_the_per_gpu_budget_on_h200_costs():
    """8 GPUs x 16 processes at 1 s, each GPU time-sliced between two pods: the calls a
    steady pass makes cost, at H200 prices, at most 3 ms of CPU and 5 ms of wall time per
    GPU (the targets of the cost work). The per-process samples of a shared GPU are read
    every `SHARED_READ_PERIOD` seconds (in the pass a second owner appears, the next, then
    each GPU in its own phase): 0.75 ms a GPU and pass at the costs measured on an H200
    (2026-12-04), against 2.22 ms reading them every pass; 0.43 ms more for GPM at its
    default 5 s window."""
    wall, cpu, fake = _bill_per_gpu(_TwoPodsPerGpu())
    every = passes_between_reads(1.0)
    reads = len(fake.called("nvmlDeviceGetProcessesUtilizationInfo"))
    assert 8 * (1 + 120 // every) <= reads <= 8 * (2 + 120 // every + 1), reads
    assert cpu <= 0.8e-3, f"{cpu * 1e3:.2f} ms of CPU per GPU per pass"
    assert wall <= 0.8e-3, f"{wall * 1e3:.2f} ms of wall time per GPU per pass"
    wall, cpu, _ = _bill_per_gpu(_TwoPodsPerGpu(), gpm=True)
    assert cpu <= 1.22e-3 and wall <= 1.22e-3, f"{cpu * 1e3:.2f} ms of CPU per GPU per pass with GPM"


def test_a_gpu_held_by_one_owner_is_not_asked_for_per_process_samples():
    """The same node with every GPU held by one owner (here: nobody attributed, as on a
    node without attribution): no per-process read, 0.36 ms per GPU per pass at the costs
    measured on an H200 (0.79 with GPM). With per-process series on (``--process-metrics``)
    the read is back, and so is the bill (2.22 ms)."""
    wall, cpu, fake = _bill_per_gpu(NullAttributor())
    assert fake.called("nvmlDeviceGetProcessesUtilizationInfo") == []
    assert cpu <= 0.4e-3, f"{cpu * 1e3:.2f} ms of CPU per GPU per pass"
    assert wall <= 0.4e-3, f"{wall * 1e3:.2f} ms of wall time per GPU per pass"
    wall, cpu, _ = _bill_per_gpu(NullAttributor(), gpm=True)
    assert cpu <= 0.83e-3 and wall <= 0.83e-3, f"{cpu * 1e3:.2f} ms of CPU per GPU per pass with GPM"
    wall, cpu, fake = _bill_per_gpu(NullAttributor(), process_metrics=True)
    assert len(fake.called("nvmlDeviceGetProcessesUtilizationInfo")) == 121 * 8
    assert 1.9e-3 < cpu <= 2.3e-3


def test_gpm_without_graphics_activity_costs_next_to_nothing():
    """On an H200 graphics activity was 1.4 ms of a 1.7 ms GPM read, every other metric
    together 0.0025 ms: with its families off (``--disable-metric``), GPM adds 0.05 ms per
    GPU per pass instead of 0.43 at its default 5 s."""
    _, without_gpm, _ = _bill_per_gpu(NullAttributor())
    _, with_gpm, _ = _bill_per_gpu(NullAttributor(), gpm=True)
    keys = frozenset(GPM_RATIO_KEYS + GPM_RATE_KEYS) - {"graphics_active"}
    _, no_graphics, fake = _bill_per_gpu(NullAttributor(), gpm=True, gpm_keys=keys)
    assert fake.called("nvmlGpmMetricsGet")
    assert with_gpm - without_gpm >= 0.4e-3
    assert no_graphics - without_gpm <= 0.06e-3, f"{(no_graphics - without_gpm) * 1e3:.3f} ms per GPU per pass"


def test_snapshot_timings_show_what_each_call_costs(monkeypatch, capsys):
    """`l9gpu snapshot --timings` on a node whose driver charges H200 prices."""
    from fakes.pynvml_fake import install

    from exporter.app.cli import main

    fake = FakeNvml([h200(processes=2, base_pid=999_990)], costs=H200_COSTS)
    fake.add_util_samples(0, [FakeUtilSample(pid=999_990, timestamp=10, sm=30)])
    install(monkeypatch, fake)
    # Per-process series on: every pass reads the per-process samples.
    assert main(["snapshot", "--backend", "nvml", "--interval", "50ms", "--kubernetes", "off",
                 "--cri-socket", "off", "--pod-resources-socket", "off", "--timings", "--process-metrics"]) == 0
    out = capsys.readouterr().out
    first, steady = out.split("first pass: ")[1].split("steady pass: ")
    rows = {line.split()[0]: line.split() for line in steady.splitlines()[2:] if line.startswith("  nvml")}
    # What a steady pass asks, and how often: the GPU's values, its processes and their
    # samples (per-process series on), the XID events and the two GPM samples' metrics.
    assert {name: int(row[1]) for name, row in rows.items()} == {
        "nvmlDeviceGetProcessesUtilizationInfo": 1, "nvmlDeviceGetComputeRunningProcesses_v3": 1,
        "nvmlGpmSampleGet": 1, "nvmlGpmMetricsGet": 1, "nvmlEventSetWait": 1, "nvmlDeviceGetClockInfo": 2,
        "nvmlDeviceGetFieldValues": 1, "nvmlDeviceGetMemoryInfo": 1, "nvmlDeviceGetUtilizationRates": 1,
        "nvmlDeviceGetCurrentClocksEventReasons": 1, "nvmlDeviceGetTemperatureV": 1, "nvmlDeviceGetPowerUsage": 1}
    assert steady.startswith("13 calls, ")
    # Each call's figures are at least what the driver charged for it (1.86 ms for the
    # per-process samples on an H200): a call's wall time cannot come out below its cost,
    # however busy the machine; which call comes out dearest is the scheduler's to decide.
    for name, row in rows.items():
        wall, per_call, slowest = float(row[2]), float(row[4]), float(row[5])
        cost = H200_COSTS.get(name, DEFAULT_COST).wall * 1e3 - 0.0005  # printed to 0.001 ms
        assert per_call >= cost and wall >= cost * int(row[1]) and slowest >= per_call - 0.001, (name, row, cost)
    assert float(rows["nvmlDeviceGetProcessesUtilizationInfo"][4]) >= 1.5
    # Without them, the GPU's two processes have one owner (neither is attributed: their
    # PIDs do not exist here): the call is not made at all.
    assert main(["snapshot", "--backend", "nvml", "--interval", "50ms", "--kubernetes", "off",
                 "--cri-socket", "off", "--pod-resources-socket", "off", "--timings"]) == 0
    quiet = capsys.readouterr().out
    assert "nvmlDeviceGetProcessesUtilizationInfo" not in quiet and "nvmlDeviceGetComputeRunningProcesses" in quiet
    # What the first pass asked once is not asked again: energy counter, fan, MIG mode.
    assert "nvmlDeviceGetTotalEnergyConsumption" in first and "nvmlDeviceGetFanSpeed" in first
    for once in ("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetFanSpeed", "nvmlDeviceGetMigMode",
                 "nvmlDeviceGetPcieThroughput"):
        assert once not in rows


def test_energy_after_a_lost_gpu_comes_back_starts_from_the_counter():
    fake = FakeNvml([h200()])  # 250 W
    backend = opened(fake)
    (dev,) = backend.sample(0.0)
    start = dev.energy_joules
    fake.gpus[0].lost = True
    for t in range(1, 6):
        (dev,) = backend.sample(float(t))
        assert not dev.up and dev.energy_joules is None
    # Back after 5 s, during which it used 1000 J (not the 1250 J its last power reading
    # would suggest): the counter is read at once, nothing is integrated across the gap.
    fake.gpus[0].lost = False
    fake.gpus[0].energy_mj += 1_000_000
    (dev,) = backend.sample(6.0)
    assert dev.up and dev.energy_joules == pytest.approx(start + 1000.0)
