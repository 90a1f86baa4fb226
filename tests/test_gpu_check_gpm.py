"""The GPM section of benchmarks/gpu_check.py, end to end against the fake pynvml.

On a GPU machine a bf16 PyTorch child drives the tensor cores; here a workload object
moves the fake GPU's GPM counters through the same phases (starting, busy, idle, done),
and the section reads them through the agent's own GPM reader, checks and costs them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from fakes.pynvml_fake import (
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_GRAPHICS_UTIL,
    NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
    NVML_GPM_METRIC_SM_UTIL,
    FakeGpu,
    FakeNvml,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


class PhasedWorkload:
    """Moves the fake GPU through the phases, one step per ``phase()`` call (one per tick)."""

    def __init__(self, fake: FakeNvml, busy: dict[int, float], busy_ticks: int = 6, idle_ticks: int = 5):
        self.fake = fake
        self.plan = ["starting"] * 2 + ["busy"] * busy_ticks + ["idle"] * idle_ticks + ["done"]
        self.busy = busy
        self.calls = 0
        self.stopped = False

    def start(self) -> None:
        self.fake.set_gpm(0, {m: 0.0 for m in self.fake.gpus[0].gpm.values})

    def phase(self) -> str:
        phase = self.plan[min(self.calls, len(self.plan) - 1)]
        self.calls += 1
        # what the GPU does until the next tick
        if phase == "starting" and self.calls == 2:
            self.fake.set_gpm(0, self.busy)
        if phase == "busy" and self.plan[min(self.calls, len(self.plan) - 1)] == "idle":
            self.fake.set_gpm(0, {m: 0.0 for m in self.fake.gpus[0].gpm.values})
        return phase

    def stop(self) -> None:
        self.stopped = True


BF16 = {NVML_GPM_METRIC_GRAPHICS_UTIL: 97.0, NVML_GPM_METRIC_SM_UTIL: 92.0, NVML_GPM_METRIC_ANY_TENSOR_UTIL: 78.0,
        NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 78.0}


def test_bf16_then_idle_passes_and_records_the_call_cost(gpu_check):
    fake = FakeNvml(gpus=[FakeGpu()])
    workload = PhasedWorkload(fake, BF16)
    result = gpu_check.gpm_section(fake, 0, workload, deadline_seconds=30, tick=0.02)
    assert result["status"] == "passed", result["checks"]
    names = [c["name"] for c in result["checks"]]
    assert names == ["gpm_busy_tensor_active", "gpm_busy_sm_active", "gpm_bf16_on_hmma_pipe",
                     "gpm_idle_tensor_zero", "gpm_ratios_in_range"]
    busy = [w for w in result["windows"] if w["phase"] == "busy" and w["settled"]]
    idle = [w for w in result["windows"] if w["phase"] == "idle" and w["settled"]]
    assert busy and idle
    assert all(w["tensor_active"] == pytest.approx(0.78, abs=0.01) for w in busy)
    assert all(w["tensor_active"] == 0.0 for w in idle)
    costs = result["costs"]
    assert costs["nvmlGpmSampleGet"]["calls"] == len(result["windows"]) + 1
    assert costs["nvmlGpmMetricsGet"]["calls"] == len(result["windows"])
    assert {"first_ms", "median_ms", "p90_ms"} <= costs["nvmlGpmMetricsGet"].keys()
    assert workload.stopped and fake.shutdown_calls == 1
    assert all(s.freed for s in fake.gpm_samples)
    gpu_check.report_gpm(result)  # prints without error


def test_a_busy_gpu_without_tensor_work_fails_the_tensor_check(gpu_check):
    fake = FakeNvml(gpus=[FakeGpu()])
    spin = {NVML_GPM_METRIC_GRAPHICS_UTIL: 99.0, NVML_GPM_METRIC_SM_UTIL: 95.0}  # a busy-wait kernel
    result = gpu_check.gpm_section(fake, 0, PhasedWorkload(fake, spin), deadline_seconds=30, tick=0.02)
    assert result["status"] == "failed"
    failed = {c["name"] for c in result["checks"] if not c["passed"]}
    assert failed == {"gpm_busy_tensor_active", "gpm_bf16_on_hmma_pipe"}


def test_a_gpu_without_gpm_is_skipped_with_the_reason(gpu_check, capsys):
    fake = FakeNvml(gpus=[FakeGpu(name="NVIDIA A100-SXM4-80GB")])
    workload = PhasedWorkload(fake, BF16)
    result = gpu_check.gpm_section(fake, 0, workload, deadline_seconds=30, tick=0.02)
    assert result["status"] == "skipped"
    assert result["reason"] == "the GPU does not support GPM (Hopper or newer needed)"
    assert workload.calls == 0 and workload.stopped
    gpu_check.report_gpm(result)
    assert "SKIP  gpm: the GPU does not support GPM" in capsys.readouterr().out


def test_without_torch_the_section_says_so(gpu_check, capsys):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    assert gpu_check.main(["--gpm-only"]) == 2
    assert "needs torch" in capsys.readouterr().err


def test_the_health_calls_section_records_the_fakes_answers(gpu_check, capsys):
    fake = FakeNvml(gpus=[FakeGpu()])
    rows = gpu_check.health_calls_section(fake, 0, repeats=5)
    by_call = {row["call"]: row for row in rows}
    assert "nvmlDeviceGetRemappedRows" in by_call and "nvmlDeviceGetPcieReplayCounter" in by_call
    assert any(call.startswith("nvmlDeviceGetViolationStatus(") for call in by_call)
    assert any(call.startswith("nvmlDeviceGetFieldValues(") for call in by_call)
    for row in rows:
        assert row["calls"] == 5 and row["median_wall_us"] >= 0 and row["median_cpu_us"] >= 0
        assert row["supported"] == ("value" in row) and row["supported"] != ("error" in row)
    assert by_call["nvmlDeviceGetMaxPcieLinkWidth"]["supported"]
    assert isinstance(by_call["nvmlDeviceGetMaxPcieLinkWidth"]["value"], int)
    gpu_check.report_health_calls(rows)
    assert "NVML health calls" in capsys.readouterr().out
