"""The stall section of benchmarks/gpu_check.py, end to end against the fake pynvml.

On a GPU machine a PyTorch child spins a kernel that does no work (``torch.cuda._sleep``),
then multiplies bf16 matrices, then idles holding its memory; here a workload object moves
the fake GPU (utilisation, power, GPM) through the same phases on a fake clock, and the
section reads it through the agent's own NVML backend and stall tracker.
"""

from __future__ import annotations

import pytest
from fakes.pynvml_fake import (
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_DRAM_BW_UTIL,
    NVML_GPM_METRIC_GRAPHICS_UTIL,
    NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    NVML_GPM_METRIC_PCIE_TX_PER_SEC,
    FakeGpu,
    FakeNvml,
    FakeProcess,
)

STALL_AFTER = 20.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


# (utilisation %, power W, GPM in NVML's units) of each phase, as an H200 would read it
SPIN = (100, 150, {NVML_GPM_METRIC_GRAPHICS_UTIL: 100.0, NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0,
                   NVML_GPM_METRIC_DRAM_BW_UTIL: 0.3, NVML_GPM_METRIC_PCIE_TX_PER_SEC: 0.01,
                   NVML_GPM_METRIC_PCIE_RX_PER_SEC: 0.01})
MATMUL = (100, 640, {NVML_GPM_METRIC_GRAPHICS_UTIL: 99.0, NVML_GPM_METRIC_ANY_TENSOR_UTIL: 75.0,
                     NVML_GPM_METRIC_DRAM_BW_UTIL: 22.0, NVML_GPM_METRIC_PCIE_TX_PER_SEC: 0.01,
                     NVML_GPM_METRIC_PCIE_RX_PER_SEC: 0.01})
IDLE = (0, 110, {NVML_GPM_METRIC_GRAPHICS_UTIL: 0.0, NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.0,
                 NVML_GPM_METRIC_DRAM_BW_UTIL: 0.0, NVML_GPM_METRIC_PCIE_TX_PER_SEC: 0.0,
                 NVML_GPM_METRIC_PCIE_RX_PER_SEC: 0.0})


class PhasedStallWorkload:
    """Moves the fake GPU through the child's phases, ``seconds`` each on the fake clock."""

    def __init__(self, fake: FakeNvml, clock: Clock, seconds: float, spin=SPIN):
        self.fake, self.clock, self.seconds = fake, clock, seconds
        self.plan = [("spin", spin), ("matmul", MATMUL), ("idle", IDLE)]
        self.started: float | None = None
        self.current = "starting"
        self.stopped = False

    def start(self) -> None:
        self.started = self.clock()
        self.fake.gpus[0].processes.append(FakeProcess(pid=4242, used_memory=2 * 2**30))

    def phase(self) -> str:
        assert self.started is not None
        index = int((self.clock() - self.started) // self.seconds)
        name = self.plan[index][0] if index < len(self.plan) else "done"
        if name != self.current and index < len(self.plan):
            util, watts, gpm = self.plan[index][1]
            gpu = self.fake.gpus[0]
            gpu.utilization_gpu, gpu.utilization_memory, gpu.power_mw = util, 0, watts * 1000
            self.fake.set_gpm(0, gpm)
        self.current = name
        return name

    def stop(self) -> None:
        self.stopped = True


def _run(gpu_check, spin=SPIN, name="NVIDIA H200"):
    clock = Clock()
    fake = FakeNvml(gpus=[FakeGpu(name=name, utilization_gpu=0, power_mw=100_000)])
    fake.gpm_clock = clock
    workload = PhasedStallWorkload(fake, clock, seconds=40.0, spin=spin)
    result = gpu_check.gpu_check_stall.stall_section(fake, 0, workload, STALL_AFTER, deadline_seconds=300,
                                                     tick=1.0, clock=clock, sleep=clock.sleep)
    return result, workload


def test_the_spinning_kernel_is_stalled_after_stall_after_and_matmul_and_idle_are_not(gpu_check, capsys):
    result, workload = _run(gpu_check)
    assert result["status"] == "passed", result["checks"]
    assert [c["name"] for c in result["checks"]] == [
        "stall_spin_is_stalled", "stall_matmul_not_stalled", "stall_idle_not_stalled", "stall_ends_when_it_computes"]
    [stall] = result["stalls"]
    assert stall["phase"] == "spin" and stall["ended_in"] == "matmul" and stall["end_reason"] == "computes again"
    spin = result["phases"]["spin"]
    assert spin["utilization"] == 1.0 and spin["tensor_active"] == 0.0 and spin["power_ratio"] == pytest.approx(150 / 700, abs=1e-4)
    assert result["phases"]["matmul"]["matched"] == 0 and result["phases"]["idle"]["matched"] == 0
    assert workload.stopped
    gpu_check.gpu_check_stall.report_stall(result)
    assert "PASS  stall_spin_is_stalled" in capsys.readouterr().out


def test_a_spin_that_draws_compute_power_fails_the_stall_check(gpu_check):
    hot_spin = (100, 600, SPIN[2])  # a spin loop that burns power like compute would not be a wedge's
    result, _ = _run(gpu_check, spin=hot_spin)
    assert result["status"] == "failed"
    assert {c["name"] for c in result["checks"] if not c["passed"]} == {"stall_spin_is_stalled",
                                                                        "stall_ends_when_it_computes"}


def test_without_gpm_the_stall_is_judged_on_what_remains(gpu_check):
    result, _ = _run(gpu_check, name="NVIDIA A100-SXM4-80GB")  # no GPM before Hopper
    assert result["status"] == "passed", result["checks"]
    assert any("no GPM" in a for a in result["stalls"][0]["absent"])
    assert result["phases"]["spin"]["tensor_active"] is None
