"""The GPM section of benchmarks/gpu_check.py, end to end against the fake pynvml.

On a GPU machine a bf16 PyTorch child drives the tensor cores; here a workload object
moves the fake GPU's GPM counters through the same phases (starting, busy, idle, done),
and the section reads them through the agent's own GPM reader, checks and costs them.
The per-process samples section is driven by a child that only says when it started and
a driver answering as an averaging driver or a last-period one would.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes.pynvml_fake import (
    NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    NVML_GPM_METRIC_GRAPHICS_UTIL,
    NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
    NVML_GPM_METRIC_SM_UTIL,
    FakeGpu,
    FakeNvml,
)


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


# ---- the per-process samples section ----------------------------------------------------

class DutyDriver:
    """Per-process samples of a child that computes for ``period`` s and idles as long,
    answered the way a driver could: one sample per process averaging every moment newer
    than the timestamp asked for (``averaging``, what an H200 did), or one covering only
    its last sampling period."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpu_check, start: float, period: float, averaging: bool):
        self.gpu_check, self.start, self.period, self.averaging = gpu_check, start, period, averaging

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetProcessUtilization(self, handle: int, since: int) -> list[object]:
        now = time.time()
        if self.averaging:
            begin = since / 1e6 if since else self.start
            share = self.gpu_check.busy_fraction(self.start, self.period, max(begin, self.start), now)
        else:
            share = 1.0 if int((now - self.start) / self.period) % 2 == 0 else 0.0
        return [SimpleNamespace(pid=pid, timeStamp=int(now * 1e6), smUtil=round(100 * share), memUtil=0)
                for pid in _duty_children()]


def _duty_children() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"duty-child-marker" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _semantics(gpu_check, averaging: bool) -> dict:
    start = time.time() + 0.3
    child = [sys.executable, "-c",
             "import json, os, sys, time; "
             f"print(json.dumps({{'event': 'busy', 'pid': os.getpid(), 'start': {start!r}}}), flush=True); "
             "time.sleep(6)", "duty-child-marker"]
    driver = DutyDriver(gpu_check, start, period=0.2, averaging=averaging)
    return gpu_check.sample_semantics(driver, 0, sys.executable, period=0.2, seconds=4.0, window=1.0,
                                      tick=0.05, startup_timeout=60, child=child)


def test_a_driver_that_averages_since_the_timestamp_asked_matches_the_busy_share(gpu_check):
    result = _semantics(gpu_check, averaging=True)
    assert result["status"] == "measured"
    assert result["most_kept_per_process"] == 1
    assert len(result["window_reads"]) >= 2
    assert all(w["samples"] == 1 for w in result["window_reads"])
    assert result["window_median_error_points"] < 10


def test_a_driver_that_keeps_only_its_last_period_misses_the_busy_share(gpu_check):
    result = _semantics(gpu_check, averaging=False)
    assert result["status"] == "measured"
    assert result["samples_between_10_and_90"] == 0
    assert result["window_median_error_points"] > 25


def test_the_busy_share_of_a_window_follows_the_duty_cycle(gpu_check):
    assert gpu_check.busy_fraction(100.0, 1.0, 100.0, 101.0) == pytest.approx(1.0)
    assert gpu_check.busy_fraction(100.0, 1.0, 101.0, 102.0) == pytest.approx(0.0)
    assert gpu_check.busy_fraction(100.0, 1.0, 100.5, 102.5) == pytest.approx(0.5)
    assert gpu_check.busy_fraction(100.0, 1.0, 100.0, 105.0) == pytest.approx(0.6)


def test_the_metrics_get_cost_is_timed_by_the_metrics_asked(gpu_check, capsys):
    fake = FakeNvml(gpus=[FakeGpu()])
    result = gpu_check.gpm_metric_costs(fake, 0, repeats=3)
    assert result["status"] == "measured"
    rows = {row["metrics"]: row for row in result["rows"]}
    assert rows["all"]["count"] == 15 and rows["without nvlink"]["count"] == 13 and rows["ratios"]["count"] == 11
    assert rows["sm_active"]["count"] == 1 and all(row["cpu_ms"] >= 0 for row in rows.values())
    assert len(fake.called("nvmlGpmMetricsGet")) == 3 * (4 + 15) + 6 * 10
    assert [len(step["cpu_ms_per_call"]) for step in result["timeline"]] == [10] * 6
    assert all(s.freed for s in fake.gpm_samples) and fake.shutdown_calls == 1


def test_the_steady_passes_are_timed_call_by_call(gpu_check):
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu()])
    result = gpu_check.steady_pass_costs(fake, passes=3, interval=0.01)
    rows = {row["call"]: row for row in result["calls"]}
    assert result["passes"] == 3 and result["median_pass_cpu_ms"] >= 0
    assert rows["nvmlDeviceGetMemoryInfo"]["passes"] == 3
    assert "nvmlDeviceGetUUID" not in rows  # asked in the first pass only
    assert fake.shutdown_calls == 1
