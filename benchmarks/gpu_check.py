"""Real-GPU check of the NVIDIA backend: does l9gpu see a PyTorch job the way it really is?

On a machine with an NVIDIA GPU, its driver, and PyTorch built with CUDA, run from the
repository root::

    python benchmarks/gpu_check.py                 # 4 GiB, 40 s busy, 20 s idle on GPU 0
    python benchmarks/gpu_check.py --gib 8 --device 1 --busy-seconds 60

It starts the agent (``python -m exporter serve --backend nvml --interval 1s
--process-metrics`` on a free loopback port, with ``PYTHONPATH`` set to this checkout),
waits for ``/readyz``, then runs a PyTorch child that allocates ``--gib`` GiB on the GPU,
multiplies matrices for ``--busy-seconds`` and then sits idle, still holding its memory,
for ``--idle-seconds``. ``/metrics`` is scraped about once a second throughout. The
checks: the child's PID is listed in ``gpu_process_memory_used_bytes`` with the memory it
really holds (within a few percent of the device-memory growth NVML saw when it started,
and between ``torch.cuda.memory_reserved()`` and that plus a CUDA context), its
``gpu_process_utilization_ratio`` is well above 0 while busy and 0 while idle,
``gpu_power_watts`` stays between 20 and 1500 W, and ``gpu_energy_joules_total`` rises
in step with the power. It prints a table per phase and PASS/FAIL per check, exits 1 if
any check fails (2 when it cannot run at all), and, when ``$OUT`` is set, writes
``gpu_check.json`` (checks, numbers, timeline), the raw scrapes and the agent's log there.

Cost, measured on the same run: while the workload runs, the median wall and CPU time of
each NVML call the agent could make (``measure_call_costs``: the table in docs/PERFORMANCE.md), and
``l9gpu snapshot --timings`` (what a first and a steady pass of the agent cost). Where
nvitop-exporter is installed (``pip install nvitop-exporter``) it runs beside the agent on
the same GPU, scraped just as often, and both processes' CPU per second over the workload
window are printed side by side.

A second, separate section checks GPM (Hopper and newer; skipped with the reason where the
GPU has none): a child multiplies bf16 matrices for ``--gpm-busy-seconds`` and then idles
for ``--gpm-idle-seconds`` while this process reads the GPU's GPM metrics once per
``--gpm-tick`` through the agent's own reader. Tensor and SM activity must be clearly up
while busy (with the tensor work on the HMMA pipe) and tensor activity ~0 while idle; the
cost of each ``nvmlGpmSampleGet`` and ``nvmlGpmMetricsGet`` call is recorded (first,
median, p90). ``--gpm-only`` runs just this section, ``--no-gpm`` skips it; its report goes
to ``$OUT/gpu_check_gpm.json``.

A last section (``--samples-only`` runs it alone, ``--no-samples`` skips it) finds out what
the one per-process sample the driver returns covers: a child alternates ``--duty-period``
seconds of matmuls with as many idle while this process reads the child's sample every
``--samples-tick`` s and, every ``--samples-window`` s, the sample newer than the timestamp
seen a window before. A driver that averages since the timestamp asked for answers about
the child's busy share of the window; one that keeps only its last sampling period answers
0 or 100. Its report goes to ``$OUT/gpu_check_samples.json``.

A stall section (``--stall-only`` runs it alone, ``--no-stall`` skips it;
``benchmarks/gpu_check_stall.py``) checks the stall signature of docs/TRAINING.md: a kernel
spinning with no work (``torch.cuda._sleep``) must be called stalled after ``--stall-after``,
bf16 matmuls and an idle GPU must not; ``$OUT/gpu_check_stall.json``.

Two cost readings end the run, each also alone: ``--gpm-metric-costs-only`` times
``nvmlGpmMetricsGet`` by the metrics asked (the agent's list, subsets, each metric alone;
``$OUT/gpu_check_gpm_costs.json``), ``--pass-costs-only`` the NVML calls of ``--passes``
of the agent's own steady passes 1 s apart, call by call (``$OUT/gpu_check_pass_costs.json``):
the figures of the NVML fake's cost model.

NVML reports host PIDs: run this on the host, or in a container that shares the host's
PID namespace, and preferably on an otherwise idle GPU (other processes allocating memory
during the run disturb the memory comparison). ``--device`` is the NVML index; the child
sees that GPU as ``cuda:0`` (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, ``CUDA_VISIBLE_DEVICES``).
It needs only the project's own requirements and torch.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
# The GPM and health sections read through the agent's own code.
sys.path[:0] = [str(REPO_ROOT / "benchmarks"), str(REPO_ROOT)]

import gpu_check_stall  # noqa: E402
from processes import ChildWorkload, cpu_seconds, free_port, read_events  # noqa: E402

GiB = 2**30

# Thresholds. NVML samples per-process utilisation every ~1/6 s and the agent averages
# over its interval, so give each phase a few seconds to settle before judging it.
SETTLE_SECONDS = 4.0
BUSY_MIN_RATIO = 0.5  # median per-process SM share while multiplying matrices
IDLE_MAX_RATIO = 0.05  # no idle scrape above this ...
IDLE_ZERO_FRACTION = 0.8  # ... and most of them exactly 0
MEMORY_TOLERANCE = 0.03  # process memory vs. the device-memory growth NVML saw
MEMORY_SLACK_BYTES = 64 * 2**20
CONTEXT_ALLOWANCE_BYTES = 2 * GiB  # CUDA context + cuBLAS beyond torch's reserved pool
POWER_RANGE_W = (20.0, 1500.0)
ENERGY_POWER_TOLERANCE = 0.35  # energy delta vs. integral of the sampled power


# ---- the PyTorch child ---------------------------------------------------------------------


def _emit(event: str, **values: Any) -> None:
    print(json.dumps({"event": event, **values}), flush=True)


def multiply_for(seconds: float, a: Any, b: Any, c: Any) -> int:
    """Multiply ``a`` by ``b`` into ``c`` (torch tensors) back to back for ``seconds``;
    returns how many multiplications ran."""
    import torch  # type: ignore[import-not-found,unused-ignore]

    end = time.monotonic() + seconds
    multiplies = 0
    while time.monotonic() < end:
        for _ in range(8):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        multiplies += 8
    return multiplies


def run_workload(gib: float, busy_seconds: float, idle_seconds: float, nvml_index: int) -> int:
    """The child: allocate, compute, idle; report each step as a JSON line on stdout."""
    import pynvml  # type: ignore[import-untyped,unused-ignore]
    import torch  # type: ignore[import-not-found,unused-ignore]

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index)
    used_before = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    nvml_uuid = pynvml.nvmlDeviceGetUUID(handle)
    nvml_uuid = nvml_uuid.decode() if isinstance(nvml_uuid, bytes) else str(nvml_uuid)

    device = torch.device("cuda:0")
    props = torch.cuda.get_device_properties(device)
    torch_uuid = str(getattr(props, "uuid", "") or "")
    hold = torch.ones(int(gib * GiB) // 4, dtype=torch.float32, device=device)
    n = 8192
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    c = torch.empty(n, n, device=device)
    torch.matmul(a, b, out=c)  # load cuBLAS and its workspace before measuring
    torch.cuda.synchronize()
    used_after = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    _emit(
        "busy",
        pid=os.getpid(),
        requested_bytes=hold.numel() * hold.element_size(),
        allocated_bytes=int(torch.cuda.memory_allocated(device)),
        reserved_bytes=int(torch.cuda.memory_reserved(device)),
        nvml_used_growth_bytes=used_after - used_before,
        nvml_uuid=nvml_uuid,
        torch_uuid=torch_uuid,
        device_name=props.name,
    )
    multiplies = multiply_for(busy_seconds, a, b, c)
    _emit(
        "idle",
        multiplies=multiplies,
        tflops=round(2 * n**3 * multiplies / busy_seconds / 1e12, 1),
        reserved_bytes=int(torch.cuda.memory_reserved(device)),
        nvml_used_growth_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) - used_before,
    )
    time.sleep(idle_seconds)  # hold the memory, run nothing
    _emit("done", checksum=float(hold[:16].sum().item()))
    del hold, a, b, c
    pynvml.nvmlShutdown()
    return 0


# ---- the agent -----------------------------------------------------------------------------


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


class Agent:
    """``python -m exporter serve --backend nvml`` from this checkout, as a subprocess."""

    def __init__(self, python: str, port: int, log_path: Path):
        self.base = f"http://127.0.0.1:{port}"
        self.command = [
            python, "-m", "exporter", "serve", "--backend", "nvml", "--listen", f"127.0.0.1:{port}",
            "--interval", "1s", "--process-metrics",
        ]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.command, cwd=REPO_ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> str | None:
        """None when /readyz answers 200, else why not."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"the agent exited with status {self.proc.returncode}"
            try:
                status, body = http_get(self.base + "/readyz", timeout=2.0)
                if status == 200:
                    return None
                last = f"{status} {body.strip()}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.25)
        return f"/readyz not ready after {timeout:.0f} s ({last})"

    def log_tail(self, lines: int = 30) -> str:
        if not self._log.closed:
            self._log.flush()
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# ---- cost: per NVML call, per pass, and beside nvitop-exporter ------------------------------


def measure_call_costs(device: int, repeats: int = 30) -> list[dict[str, Any]]:
    """Median wall and CPU milliseconds of each NVML call on GPU ``device``.

    The calls the agent makes or avoids, so the table in docs/PERFORMANCE.md can be checked on any
    driver. NOT_SUPPORTED calls are timed too (they still cost); the blocking PCIe
    throughput call is timed only a few times.
    """
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(device)
        calls: list[tuple[str, Any, int]] = [
            ("nvmlDeviceGetPcieThroughput (tx)", lambda: pynvml.nvmlDeviceGetPcieThroughput(
                h, pynvml.NVML_PCIE_UTIL_TX_BYTES), 5),
            ("nvmlDeviceGetTotalEnergyConsumption", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h), repeats),
            ("nvmlDeviceGetProcessUtilization", lambda: pynvml.nvmlDeviceGetProcessUtilization(h, 0), repeats),
            ("nvmlDeviceGetProcessesUtilizationInfo",
             lambda: pynvml.nvmlDeviceGetProcessesUtilizationInfo(h, 0), repeats),
            ("nvmlDeviceGetFieldValues (PCIe tx/rx bytes)",
             lambda: pynvml.nvmlDeviceGetFieldValues(h, [197, 198]), repeats),
            ("nvmlDeviceGetFieldValues (memory temp, PCIe tx/rx bytes)",
             lambda: pynvml.nvmlDeviceGetFieldValues(h, [82, 197, 198]), repeats),
            ("nvmlDeviceGetMigMode", lambda: pynvml.nvmlDeviceGetMigMode(h), repeats),
            ("nvmlDeviceGetFanSpeed", lambda: pynvml.nvmlDeviceGetFanSpeed(h), repeats),
            ("nvmlDeviceGetComputeRunningProcesses", lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h),
             repeats),
            ("nvmlDeviceGetGraphicsRunningProcesses", lambda: pynvml.nvmlDeviceGetGraphicsRunningProcesses(h),
             repeats),
            ("nvmlDeviceGetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(h), repeats),
            ("nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(h), repeats),
            ("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(h), repeats),
            ("nvmlDeviceGetTemperature", lambda: pynvml.nvmlDeviceGetTemperature(h, 0), repeats),
            ("nvmlDeviceGetClockInfo (SM)", lambda: pynvml.nvmlDeviceGetClockInfo(h, 1), repeats),
            ("nvmlDeviceGetCurrentClocksEventReasons",
             lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h), repeats),
            ("nvmlDeviceGetTotalEccErrors", lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 1), repeats),
        ]
        rows = []
        for name, call, n in calls:
            walls, cpus, outcome = [], [], "ok"
            for _ in range(n):
                wall, cpu = time.perf_counter(), time.thread_time()
                try:
                    call()
                except pynvml.NVMLError as exc:
                    outcome = str(exc)
                except Exception as exc:  # noqa: BLE001 - a binding without the function
                    outcome = f"{type(exc).__name__}: {exc}"
                    break
                walls.append(time.perf_counter() - wall)
                cpus.append(time.thread_time() - cpu)
            rows.append({"call": name, "calls": len(walls), "outcome": outcome,
                         "wall_ms": _round(statistics.median(walls) * 1e3 if walls else None),
                         "cpu_ms": _round(statistics.median(cpus) * 1e3 if cpus else None)})
        return rows
    finally:
        pynvml.nvmlShutdown()


def process_samples_reader(nvml: Any, handle: Any) -> Callable[[int], list[Any]]:
    """The GPU's per-process samples newer than a timestamp (microseconds), asked as the
    agent asks them: ``nvmlDeviceGetProcessesUtilizationInfo`` where the binding has it,
    else ``nvmlDeviceGetProcessUtilization``; none where the driver answers an error
    (NOT_FOUND: no sample that new)."""
    read = getattr(nvml, "nvmlDeviceGetProcessesUtilizationInfo", None) or nvml.nvmlDeviceGetProcessUtilization

    def samples(since: int) -> list[Any]:
        try:
            return list(read(handle, since))
        except nvml.NVMLError:
            return []

    return samples


def process_sample_buffer(device: int, windows: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0)
                          ) -> list[dict[str, Any]]:
    """How many per-process utilisation samples the driver keeps: for each window, the
    samples ``nvmlDeviceGetProcessesUtilizationInfo`` (else ``GetProcessUtilization``)
    returns when asked for those newer than a timestamp taken that long before, while a
    process computes. The agent reads a shared GPU's samples every few seconds
    (`exporter.core.shares.SHARED_READ_PERIOD`). An H200 returned one sample per process
    in every window; what that one sample covers is the per-process samples section's
    question (`sample_semantics`: on the H200, the average since the timestamp asked for).

    Per window: the samples, the distinct timestamps, the most samples of one process, the
    span of their timestamps and the median step between them (seconds). A last row
    (``window_s`` ``"all"``) asks for every sample newer than timestamp 0: the buffer's depth.
    """
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    pynvml.nvmlInit()
    try:
        samples = process_samples_reader(pynvml, pynvml.nvmlDeviceGetHandleByIndex(device))

        def row(window: float | str, got: list[Any]) -> dict[str, Any]:
            stamps = sorted({int(s.timeStamp) for s in got})
            per_pid: dict[int, int] = {}
            for sample in got:
                per_pid[int(sample.pid)] = per_pid.get(int(sample.pid), 0) + 1
            steps = [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:])]
            return {"window_s": window, "samples": len(got), "timestamps": len(stamps),
                    "most_per_process": max(per_pid.values(), default=0),
                    "span_s": _round((stamps[-1] - stamps[0]) / 1e6 if len(stamps) > 1 else 0.0),
                    "median_step_s": _round(statistics.median(steps)) if steps else None}

        rows = []
        for window in windows:
            latest = max((int(s.timeStamp) for s in samples(0)), default=0)
            time.sleep(window)
            rows.append(row(window, samples(latest)))
        rows.append(row("all", samples(0)))
        return rows
    finally:
        pynvml.nvmlShutdown()


def write_report(name: str, data: Any) -> None:
    """``data`` as JSON to ``$OUT/name``, where ``$OUT`` is set."""
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / name).write_text(json.dumps(data, indent=2))


def print_call_costs(rows: list[dict[str, Any]]) -> None:
    print(f"{'NVML call (median)':<58}{'wall ms':>9}{'CPU ms':>9}  outcome")
    for row in rows:
        wall = "-" if row["wall_ms"] is None else f"{row['wall_ms']:.3f}"
        cpu = "-" if row["cpu_ms"] is None else f"{row['cpu_ms']:.3f}"
        print(f"{row['call']:<58}{wall:>9}{cpu:>9}  {row['outcome']}")


def agent_pass_timings(python: str, device: int) -> dict[str, Any]:
    """``l9gpu snapshot --backend nvml --timings --json``: a first and a steady pass, as
    `l9gpu serve` reads a GPU held by one process (no per-process samples), and again with
    ``--process-metrics`` (per-process samples every pass)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    out: dict[str, Any] = {}
    for suffix, extra in (("", []), (" (--process-metrics)", ["--process-metrics"])):
        result = subprocess.run([python, "-m", "exporter", "snapshot", "--backend", "nvml", "--timings", "--json",
                                 "--log-level", "warning", *extra], cwd=REPO_ROOT, env=env, capture_output=True,
                                text=True, timeout=120)
        if result.returncode != 0:
            out["error" + suffix] = result.stderr[-500:]
            continue
        timings = json.loads(result.stdout).get("timings", {})
        for title, calls in timings.items():
            out[title + suffix] = {
                "calls": sum(c["calls"] for c in calls.values()),
                "wall_ms": _round(sum(c["wall_seconds"] for c in calls.values()) * 1e3),
                "cpu_ms": _round(sum(c["cpu_seconds"] for c in calls.values()) * 1e3),
                "per_call": calls,
            }
    return out


class UtilComparison:
    """The GPU's utilisation and its processes' SM samples, read side by side each second.

    Two readings of the same activity: on a GPU held by one owner the agent reports the
    first as the owner's SM share instead of asking for the second (docs/ATTRIBUTION.md).
    This records both, so a run on a GPU shows how close they are.
    """

    def __init__(self, device: int):
        self.rows: list[dict[str, Any]] = []
        try:
            import pynvml  # type: ignore[import-untyped,unused-ignore]

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device)
        except Exception as exc:  # noqa: BLE001 - the comparison is optional
            self._nvml = None
            self.error = str(exc)
        self._since = 0

    def sample(self, t: float, phase: str, pid: int | None) -> None:
        if self._nvml is None:
            return
        nvml = self._nvml
        try:
            device = float(nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(self._handle, self._since)
            except nvml.NVMLError:
                samples = []  # NOT_FOUND: no new sample, all idle
            mine = [s for s in samples if pid is None or int(s.pid) == pid]
            self._since = max([self._since] + [int(s.timeStamp) for s in samples])
            total = sum(float(s.smUtil) for s in mine)
            self.rows.append({"t": _round(t, 2), "phase": phase, "device_percent": device,
                              "process_sm_percent": total, "samples": len(mine)})
        except Exception as exc:  # noqa: BLE001
            self.rows.append({"t": _round(t, 2), "phase": phase, "error": str(exc)})

    def summary(self) -> dict[str, Any]:
        """Per phase: median device and process figures and the median absolute difference."""
        out: dict[str, Any] = {}
        for phase in ("busy", "idle"):
            rows = [r for r in self.rows if r.get("phase") == phase and "device_percent" in r]
            if not rows:
                continue
            out[phase] = {
                "seconds": len(rows),
                "device_percent_median": statistics.median(r["device_percent"] for r in rows),
                "process_sm_percent_median": statistics.median(r["process_sm_percent"] for r in rows),
                "abs_difference_median": statistics.median(abs(r["device_percent"] - r["process_sm_percent"])
                                                           for r in rows),
                "abs_difference_max": max(abs(r["device_percent"] - r["process_sm_percent"]) for r in rows),
            }
        return out


class Peer:
    """nvitop-exporter on the same GPU, scraped as often as the agent (None if absent)."""

    def __init__(self, python: str, log_path: Path):
        import importlib.util

        self.proc: subprocess.Popen[bytes] | None = None
        self.base = ""
        if importlib.util.find_spec("nvitop_exporter") is None:
            return
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([python, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1",
                                      "--port", str(port), "--interval", "1.0"], stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def scrape(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                http_get(self.base + "/metrics", timeout=5.0)
            except OSError:
                pass

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            self._log.close()


# ---- scrapes -------------------------------------------------------------------------------


@dataclass
class Scrape:
    """One /metrics scrape reduced to the numbers the checks need."""

    t: float  # seconds since the workload started
    phase: str
    pid_memory_bytes: float | None = None
    pid_utilization: float | None = None
    gpu: str = ""
    uuid: str = ""
    gpu_up: float | None = None
    gpu_utilization: float | None = None
    gpu_memory_used_bytes: float | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    pids_seen: list[int] = field(default_factory=list)
    error: str = ""


def parse_scrape(text: str, pid: int | None, device_index: int, t: float, phase: str) -> Scrape:
    """Pick the child's per-process series and its GPU's device series out of a scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    scrape = Scrape(t=t, phase=phase)
    seen = set()
    for name, attr in (("gpu_process_memory_used_bytes", "pid_memory_bytes"),
                       ("gpu_process_utilization_ratio", "pid_utilization")):
        for sample in samples.get(name, []):
            if sample.labels.get("pid", "").isdigit():
                seen.add(int(sample.labels["pid"]))
            if pid is not None and sample.labels.get("pid") == str(pid):
                setattr(scrape, attr, float(sample.value))
                scrape.gpu, scrape.uuid = sample.labels.get("gpu", ""), sample.labels.get("uuid", "")
    scrape.pids_seen = sorted(seen)

    def device_value(name: str) -> float | None:
        for sample in samples.get(name, []):
            labels = sample.labels
            if labels.get("gpu_instance", "") != "":
                continue
            if (scrape.uuid and labels.get("uuid") == scrape.uuid) or (
                not scrape.uuid and labels.get("gpu") == str(device_index)
            ):
                return float(sample.value)
        return None

    scrape.gpu_up = device_value("gpu_up")
    scrape.gpu_utilization = device_value("gpu_utilization_ratio")
    scrape.gpu_memory_used_bytes = device_value("gpu_memory_used_bytes")
    scrape.power_watts = device_value("gpu_power_watts")
    scrape.energy_joules = device_value("gpu_energy_joules_total")
    return scrape


# ---- checks --------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


def _settled(scrapes: list[Scrape], phase: str, phase_start: float | None) -> list[Scrape]:
    if phase_start is None:
        return []
    return [s for s in scrapes if s.phase == phase and s.t >= phase_start + SETTLE_SECONDS]


def _values(scrapes: list[Scrape], attr: str) -> list[float]:
    return [getattr(s, attr) for s in scrapes if getattr(s, attr) is not None]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def evaluate(scrapes: list[Scrape], events: dict[str, dict[str, Any]], pid: int | None) -> list[Check]:
    """All checks, from the scrapes and the child's own report."""
    checks: list[Check] = []
    busy_info = events.get("busy", {})
    busy_t, idle_t = busy_info.get("t"), events.get("idle", {}).get("t")
    holding = [s for s in scrapes if s.phase in ("busy", "idle") and busy_t is not None
               and s.t >= busy_t + SETTLE_SECONDS / 2]
    busy = _settled(scrapes, "busy", busy_t)
    idle = _settled(scrapes, "idle", idle_t)

    listed = [s for s in holding if s.pid_memory_bytes is not None]
    seen = sorted({p for s in scrapes for p in s.pids_seen})
    detail = f"pid {pid} in {len(listed)}/{len(holding)} scrapes while it held memory"
    if not listed:
        detail += f"; PIDs seen: {seen or 'none'} (is the agent in another PID namespace?)"
    checks.append(Check("pid_listed", bool(holding) and len(listed) >= 0.8 * len(holding), detail))

    pid_memory = _median(_values(holding, "pid_memory_bytes"))
    growth = busy_info.get("nvml_used_growth_bytes")
    reserved = busy_info.get("reserved_bytes")
    requested = busy_info.get("requested_bytes")
    if pid_memory is None or growth is None or reserved is None:
        checks.append(Check("pid_memory_matches_nvml_growth", False, "no process memory or no child report"))
        checks.append(Check("pid_memory_vs_torch_reserved", False, "no process memory or no child report"))
    else:
        off = abs(pid_memory - growth)
        checks.append(Check(
            "pid_memory_matches_nvml_growth",
            off <= MEMORY_TOLERANCE * growth + MEMORY_SLACK_BYTES,
            f"exported {pid_memory / GiB:.3f} GiB, device memory grew {growth / GiB:.3f} GiB when it started "
            f"({off / max(growth, 1) * 100:.1f}% apart, allowed {MEMORY_TOLERANCE * 100:.0f}%)",
        ))
        checks.append(Check(
            "pid_memory_vs_torch_reserved",
            reserved <= pid_memory <= reserved + CONTEXT_ALLOWANCE_BYTES and pid_memory >= (requested or 0),
            f"exported {pid_memory / GiB:.3f} GiB; torch reserved {reserved / GiB:.3f} GiB "
            f"(requested {(requested or 0) / GiB:.3f} GiB), "
            f"so CUDA context ≈ {(pid_memory - reserved) / 2**20:.0f} MiB",
        ))

    busy_util = _values(busy, "pid_utilization")
    median_busy = _median(busy_util)
    checks.append(Check(
        "pid_utilization_busy",
        median_busy is not None and median_busy >= BUSY_MIN_RATIO,
        f"median {median_busy if median_busy is None else round(median_busy, 3)} over {len(busy_util)} "
        f"settled busy scrapes (need ≥ {BUSY_MIN_RATIO})",
    ))
    idle_util = _values(idle, "pid_utilization")
    zeros = sum(1 for v in idle_util if v == 0.0)
    checks.append(Check(
        "pid_utilization_idle",
        bool(idle_util) and max(idle_util) <= IDLE_MAX_RATIO and zeros >= IDLE_ZERO_FRACTION * len(idle_util),
        f"{zeros}/{len(idle_util)} settled idle scrapes at 0, max {max(idle_util) if idle_util else None}",
    ))

    gpu_busy = _median(_values(busy, "gpu_utilization"))
    checks.append(Check(
        "gpu_utilization_busy",
        gpu_busy is not None and gpu_busy >= BUSY_MIN_RATIO,
        f"median device utilisation {gpu_busy} while busy",
    ))

    power = _values(scrapes, "power_watts")
    low, high = POWER_RANGE_W
    checks.append(Check(
        "power_plausible",
        bool(power) and all(low <= p <= high for p in power),
        f"{len(power)} readings, {min(power):.1f}-{max(power):.1f} W" if power else "no gpu_power_watts",
    ))

    energy = [(s.t, s.energy_joules, s.power_watts) for s in scrapes if s.energy_joules is not None]
    if len(energy) < 2:
        checks.append(Check("energy_rises", False, "fewer than two gpu_energy_joules_total readings"))
    else:
        steps = [(energy[i - 1], energy[i]) for i in range(1, len(energy))]
        rises = all(b[1] >= a[1] for a, b in steps) and energy[-1][1] > energy[0][1]
        delta = energy[-1][1] - energy[0][1]
        # Trapezoidal integral of the sampled power over the same span.
        integral = sum((b[0] - a[0]) * ((a[2] or 0.0) + (b[2] or 0.0)) / 2 for a, b in steps)
        checks.append(Check(
            "energy_rises",
            rises and (integral <= 0 or abs(delta - integral) <= ENERGY_POWER_TOLERANCE * integral),
            f"+{delta:.0f} J over {energy[-1][0] - energy[0][0]:.0f} s, never decreasing: {rises}; "
            f"integral of sampled power {integral:.0f} J",
        ))

    up = _values(scrapes, "gpu_up")
    checks.append(Check("gpu_up", bool(up) and all(v == 1.0 for v in up), f"{len(up)} readings of gpu_up"))
    return checks


def phase_table(scrapes: list[Scrape]) -> list[dict[str, Any]]:
    rows = []
    for phase in ("before", "allocating", "busy", "idle", "done"):
        group = [s for s in scrapes if s.phase == phase]
        if not group:
            continue
        energies = _values(group, "energy_joules")
        memory = _median(_values(group, "pid_memory_bytes"))
        rows.append({
            "phase": phase,
            "scrapes": len(group),
            "pid_memory_gib": None if memory is None else round(memory / GiB, 3),
            "pid_util": _round(_median(_values(group, "pid_utilization"))),
            "gpu_util": _round(_median(_values(group, "gpu_utilization"))),
            "power_w": _round(_median(_values(group, "power_watts")), 1),
            "energy_j": _round(energies[-1] - energies[0] if len(energies) > 1 else None, 1),
        })
    return rows


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ("phase", "scrapes", "pid mem GiB", "pid util", "gpu util", "power W", "energy J (Δ)")
    keys = ("phase", "scrapes", "pid_memory_gib", "pid_util", "gpu_util", "power_w", "energy_j")
    print("  ".join(f"{h:>13}" for h in header))
    for row in rows:
        print("  ".join(f"{'-' if row[k] is None else row[k]!s:>13}" for k in keys))


# ---- the run -------------------------------------------------------------------------------


def run_check(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        print("gpu_check: PyTorch is not installed (pip install torch); cannot run the workload", file=sys.stderr)
        return 2
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    work = out_dir or Path(os.environ.get("TMPDIR", "/tmp")) / f"l9gpu-gpu-check-{os.getpid()}"
    (work / "scrapes").mkdir(parents=True, exist_ok=True)

    port = free_port()
    agent = Agent(args.python, port, work / "agent.log")
    peer = Peer(args.python, work / "nvitop-exporter.log")
    cost: dict[str, Any] = {}
    comparison = UtilComparison(args.device)
    cost_thread: threading.Thread | None = None
    cpu_start: dict[str, float | None] = {}
    child: subprocess.Popen[str] | None = None
    scrapes: list[Scrape] = []
    events: dict[str, dict[str, Any]] = {}
    child_stderr = ""
    try:
        why = agent.wait_ready(args.startup_timeout)
        if why is not None:
            print(f"gpu_check: the agent did not become ready: {why}\n{agent.log_tail()}", file=sys.stderr)
            return 2
        print(f"agent ready on {agent.base} ({' '.join(agent.command)})")

        env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(args.device))
        t0 = time.monotonic()
        _, text = http_get(agent.base + "/metrics")
        (work / "scrapes" / "000-before.txt").write_text(text)
        scrapes.append(parse_scrape(text, None, args.device, 0.0, "before"))
        child = subprocess.Popen(
            [args.python, str(Path(__file__).resolve()), "--workload-child", "--gib", str(args.gib),
             "--busy-seconds", str(args.busy_seconds), "--idle-seconds", str(args.idle_seconds),
             "--device", str(args.device)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        print(f"workload pid {child.pid}: {args.gib} GiB, {args.busy_seconds:.0f} s busy, "
              f"{args.idle_seconds:.0f} s idle")
        window_start = time.monotonic()
        cpu_start = {"l9gpu": cpu_seconds(agent.proc.pid),
                     "nvitop-exporter": cpu_seconds(peer.proc.pid) if peer.proc is not None else None}
        event_queue: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        threading.Thread(target=read_events, args=(child.stdout, event_queue), daemon=True).start()
        stderr_lines: list[str] = []
        threading.Thread(target=lambda: stderr_lines.extend(child.stderr or []), daemon=True).start()

        phase = "allocating"
        deadline = t0 + args.busy_seconds + args.idle_seconds + args.startup_timeout + 60
        number = 0
        next_scrape = time.monotonic()
        while time.monotonic() < deadline:
            while not event_queue.empty():
                when, event = event_queue.get()
                event["t"] = when - t0
                events[event["event"]] = event
                phase = event["event"]
                print(f"  t={event['t']:5.1f}s  workload: {phase}")
                if phase == "busy" and cost_thread is None:
                    def measure() -> None:
                        time.sleep(SETTLE_SECONDS)
                        # first, while the workload is surely busy (18.5 s)
                        cost["process_sample_buffer"] = process_sample_buffer(args.device)
                        cost["nvml_calls"] = measure_call_costs(args.device)
                        cost["agent_passes"] = agent_pass_timings(args.python, args.device)

                    cost_thread = threading.Thread(target=measure, daemon=True)
                    cost_thread.start()
            if phase == "done" or child.poll() is not None and event_queue.empty():
                break
            number += 1
            now = time.monotonic()
            comparison.sample(now - t0, phase, child.pid)
            peer.scrape()
            try:
                _, text = http_get(agent.base + "/metrics")
                (work / "scrapes" / f"{number:03d}-{phase}.txt").write_text(text)
                scrapes.append(parse_scrape(text, child.pid, args.device, now - t0, phase))
            except (OSError, ValueError) as exc:
                scrapes.append(Scrape(t=now - t0, phase=phase, error=str(exc)))
            next_scrape += 1.0
            time.sleep(max(0.0, next_scrape - time.monotonic()))
        window = time.monotonic() - window_start
        for name, pid in (("l9gpu", agent.proc.pid), ("nvitop-exporter", peer.proc.pid if peer.proc else None)):
            before, after = cpu_start.get(name), cpu_seconds(pid) if pid else None
            if before is not None and after is not None:
                cost.setdefault("cpu_ms_per_second", {})[name] = _round((after - before) / window * 1e3, 2)
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
        if cost_thread is not None:
            cost_thread.join(timeout=120)
        child_stderr = "".join(stderr_lines)[-4000:]
        if child.returncode not in (0, None) or "done" not in events:
            print(f"gpu_check: the workload failed (status {child.returncode}):\n{child_stderr}", file=sys.stderr)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
        agent.stop()
        peer.stop()

    pid = child.pid if child is not None else None
    checks = evaluate(scrapes, events, pid)
    if "done" not in events:
        checks.append(Check("workload_completed", False, f"the workload stopped early: {child_stderr[-300:]}"))
    rows = phase_table(scrapes)
    print()
    print_table(rows)
    print()
    if cost.get("nvml_calls"):
        print_call_costs(cost["nvml_calls"])
        print()
    for row in cost.get("process_sample_buffer", []):
        since = "all kept (newer than 0)" if row["window_s"] == "all" else f"newer than {row['window_s']} s ago"
        print(f"per-process samples {since}: {row['samples']} ({row['timestamps']} timestamps over "
              f"{row['span_s']} s, median step {row['median_step_s']} s, at most {row['most_per_process']} "
              f"for one process)")
    for title, summary in cost.get("agent_passes", {}).items():
        if isinstance(summary, dict):
            print(f"l9gpu {title}: {summary.get('calls')} NVML calls, {summary.get('wall_ms')} ms wall, "
                  f"{summary.get('cpu_ms')} ms CPU")
    util_summary = comparison.summary()
    for phase, figures in util_summary.items():
        print(f"{phase}: GPU utilisation {figures['device_percent_median']:.0f}% against the process's SM samples "
              f"{figures['process_sm_percent_median']:.0f}% (median per second; difference median "
              f"{figures['abs_difference_median']:.0f}, max {figures['abs_difference_max']:.0f} points)")
    cpu = cost.get("cpu_ms_per_second", {})
    if cpu:
        peer_text = (f"nvitop-exporter {cpu['nvitop-exporter']} ms" if "nvitop-exporter" in cpu
                     else "nvitop-exporter not installed (pip install nvitop-exporter)")
        print(f"CPU per second over the workload window, both scraped every second: l9gpu {cpu.get('l9gpu')} ms, "
              f"{peer_text}")
    print()
    for check in checks:
        print(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}")
    passed = all(c.passed for c in checks)
    report = {
        "passed": passed,
        "checks": [asdict(c) for c in checks],
        "phases": rows,
        "workload": events,
        "workload_pid": pid,
        "agent_command": agent.command,
        "scrapes": [asdict(s) for s in scrapes],
        "cost": cost,
        "util_vs_process_samples": {"summary": util_summary, "per_second": comparison.rows},
        "thresholds": {
            "busy_min_ratio": BUSY_MIN_RATIO, "idle_max_ratio": IDLE_MAX_RATIO,
            "memory_tolerance": MEMORY_TOLERANCE, "context_allowance_bytes": CONTEXT_ALLOWANCE_BYTES,
            "power_range_w": POWER_RANGE_W, "settle_seconds": SETTLE_SECONDS,
        },
    }
    (work / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(f"\n{'PASS' if passed else 'FAIL'}; details in {work}")
    return 0 if passed else 1


# ---- GPM: SM and tensor-core activity against a known workload ------------------------------
#
# A separate section (its own child, its own report): a child multiplies bf16 matrices for
# --gpm-busy-seconds (tensor cores, HMMA pipe), then sits idle for --gpm-idle-seconds. This
# process reads the GPU's GPM metrics through the agent's own `GpmReader` once per --gpm-tick,
# timing every GPM call of the binding. Checks: tensor and SM activity clearly up while busy,
# tensor activity ~0 while idle, the bf16 work on the HMMA pipe, ratios within 0-1; the cost
# of nvmlGpmSampleGet and nvmlGpmMetricsGet (first call, median, p90) is recorded.

GPM_BUSY_MIN_TENSOR = 0.2  # median tensor-active ratio while multiplying bf16 matrices
GPM_BUSY_MIN_SM = 0.2  # median SM-active ratio while busy
GPM_IDLE_MAX_TENSOR = 0.02  # no idle window above this
GPM_HMMA_SHARE = 0.8  # bf16 tensor work shows on the HMMA pipe: median HMMA >= this x median any-tensor


def bf16_operands(n: int) -> tuple[Any, Any, Any]:
    """Two random n x n bf16 matrices and a product buffer on cuda:0, multiplied once (warm)."""
    import torch  # type: ignore[import-not-found,unused-ignore]

    device = torch.device("cuda:0")
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    return a, b, c


def run_bf16_workload(busy_seconds: float, idle_seconds: float) -> int:
    """The GPM child: bf16 matmuls (tensor cores), then idle; events as JSON lines on stdout."""
    n = 8192
    a, b, c = bf16_operands(n)
    _emit("busy", pid=os.getpid())
    multiplies = multiply_for(busy_seconds, a, b, c)
    _emit("idle", multiplies=multiplies, tflops=round(2 * n**3 * multiplies / busy_seconds / 1e12, 1))
    time.sleep(idle_seconds)
    _emit("done")
    return 0


class ChildBf16Workload(ChildWorkload):
    """The bf16 child as a subprocess on one GPU; `phase` follows its events."""

    def __init__(self, python: str, device: int, busy_seconds: float, idle_seconds: float):
        super().__init__([python, str(Path(__file__).resolve()), "--gpm-workload-child",
                          "--gpm-busy-seconds", str(busy_seconds), "--gpm-idle-seconds", str(idle_seconds)], device)


class _TimedNvml:
    """The pynvml module with every ``nvmlGpm*`` call timed (seconds, in call order)."""

    def __init__(self, module: Any):
        self._module = module
        self.timings: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not (name.startswith("nvmlGpm") and callable(value)):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.timings.setdefault(name, []).append(time.perf_counter() - started)

        return timed


def _cost_ms(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"calls": 0}
    rest = sorted(samples[1:]) or samples
    return {"calls": len(samples), "first_ms": round(samples[0] * 1e3, 3),
            "median_ms": round(statistics.median(rest) * 1e3, 3),
            "p90_ms": round(rest[min(len(rest) - 1, int(0.9 * len(rest)))] * 1e3, 3)}


def gpm_section(nvml_module: Any, device: int, workload: Any, deadline_seconds: float, tick: float = 1.0,
                settle_windows: int = 1) -> dict[str, Any]:
    """Read GPM once per ``tick`` while ``workload`` goes busy -> idle -> done; check and cost it.

    Args:
        nvml_module: ``pynvml`` (or the tests' fake with the same API), not yet initialised.
        device: NVML index of the GPU the workload runs on.
        workload: has ``start()``, ``phase()`` ("starting", "busy", "idle", "done", "failed")
            and ``stop()``.
        deadline_seconds: give up after this long.
        tick: seconds between two GPM samples.
        settle_windows: windows skipped after each phase change (the window spans both).

    Returns:
        ``{"status": "passed"|"failed"|"skipped", "reason", "checks", "windows", "costs"}``.
    """
    from exporter.devices.nvml.gpm import GpmReader
    from exporter.devices.nvml.libnvml import NA, Nvml

    timed = _TimedNvml(nvml_module)
    nvml = Nvml(timed)
    nvml_module.nvmlInit()
    reader = GpmReader(nvml, interval=0.0, na=NA)
    windows: list[dict[str, Any]] = []
    try:
        handle = nvml_module.nvmlDeviceGetHandleByIndex(device)
        reader.begin_pass(time.monotonic())
        reader.read(handle, device)
        reader.end_pass()
        status = reader.status().get((device, ""), "")
        if status.startswith("unsupported: "):
            return {"status": "skipped", "reason": status[len("unsupported: "):], "checks": [], "windows": [],
                    "costs": {}}
        workload.start()
        started = time.monotonic()
        previous_phase = workload.phase()
        same_since = 0
        while time.monotonic() - started < deadline_seconds:
            time.sleep(tick)
            phase = workload.phase()
            reader.begin_pass(time.monotonic())
            values = dict(reader.read(handle, device))
            reader.end_pass()
            same_since = same_since + 1 if phase == previous_phase else 0
            windows.append({"t": round(time.monotonic() - started, 3), "phase": phase,
                            "settled": same_since >= settle_windows, **{k: round(v, 4) for k, v in values.items()}})
            previous_phase = phase
            if phase in ("done", "failed"):
                break
    finally:
        workload.stop()
        reader.close()
        nvml_module.nvmlShutdown()

    def settled(phase: str, key: str) -> list[float]:
        return [w[key] for w in windows if w["phase"] == phase and w["settled"] and key in w]

    checks: list[Check] = []
    busy_tensor, busy_sm, busy_hmma = (settled("busy", k) for k in ("tensor_active", "sm_active", "tensor_hmma_active"))
    idle_tensor = settled("idle", "tensor_active")
    med = _median(busy_tensor)
    checks.append(Check("gpm_busy_tensor_active", med is not None and med >= GPM_BUSY_MIN_TENSOR,
                        f"median tensor_active while multiplying bf16 matrices {med} (>= {GPM_BUSY_MIN_TENSOR}, "
                        f"{len(busy_tensor)} windows)"))
    med_sm = _median(busy_sm)
    checks.append(Check("gpm_busy_sm_active", med_sm is not None and med_sm >= GPM_BUSY_MIN_SM,
                        f"median sm_active while busy {med_sm} (>= {GPM_BUSY_MIN_SM})"))
    med_hmma = _median(busy_hmma)
    checks.append(Check("gpm_bf16_on_hmma_pipe",
                        med is not None and med_hmma is not None and med_hmma > 0
                        and med_hmma >= GPM_HMMA_SHARE * med,
                        f"median tensor_hmma_active {med_hmma} vs tensor_active {med} (>= {GPM_HMMA_SHARE}x)"))
    worst = max(idle_tensor) if idle_tensor else None
    checks.append(Check("gpm_idle_tensor_zero", worst is not None and worst <= GPM_IDLE_MAX_TENSOR,
                        f"max tensor_active while idle {worst} (<= {GPM_IDLE_MAX_TENSOR}, {len(idle_tensor)} windows)"))
    ratios = [w[k] for w in windows for k in ("graphics_active", "sm_active", "sm_occupancy", "tensor_active",
                                                 "dram_active") if k in w]
    checks.append(Check("gpm_ratios_in_range", bool(ratios) and all(0.0 <= r <= 1.0 for r in ratios),
                        f"{len(ratios)} activity values, all within 0-1"))
    if windows and windows[-1]["phase"] != "done":
        checks.append(Check("gpm_workload_completed", False, f"the workload ended as {windows[-1]['phase']!r}"))
    costs = {name: _cost_ms(samples) for name, samples in sorted(timed.timings.items())}
    return {"status": "passed" if all(c.passed for c in checks) else "failed", "reason": "",
            "checks": [asdict(c) for c in checks], "windows": windows, "costs": costs}


def gpm_metric_costs(nvml: Any, device: int, repeats: int = 30) -> dict[str, Any]:
    """What ``nvmlGpmMetricsGet`` costs by the metrics asked: the agent's whole list
    (`exporter.devices.nvml.gpm.METRICS`), it without the NVLink rates, the activity
    ratios alone, all but graphics activity, and each metric alone, over the same two samples 0.2 s apart; with
    each metric's answer code in the whole list. Median CPU per call over ``repeats``."""
    from exporter.devices.nvml.gpm import METRICS

    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(device)
        if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            return {"status": "skipped", "reason": "no GPM on this GPU"}
        first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
        try:
            nvml.nvmlGpmSampleGet(handle, first)
            time.sleep(0.2)
            nvml.nvmlGpmSampleGet(handle, second)
            ids = {key: int(getattr(nvml, constant, default)) for key, constant, default, _ in METRICS}

            def timed(keys: list[str]) -> tuple[float, list[int]]:
                cpus: list[float] = []
                codes: list[int] = []
                for _ in range(repeats):
                    cpu, codes = timed_once(keys)
                    cpus.append(cpu)
                return statistics.median(cpus), codes

            def timed_once(keys: list[str]) -> tuple[float, list[int]]:
                request = nvml.c_nvmlGpmMetricsGet_t()
                request.version = getattr(nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
                request.numMetrics = len(keys)
                request.sample1, request.sample2 = first, second
                for i, key in enumerate(keys):
                    request.metrics[i].metricId = ids[key]
                start = time.thread_time()
                result = nvml.nvmlGpmMetricsGet(request)
                cpu = time.thread_time() - start
                return cpu * 1e3, [int(result.metrics[i].nvmlReturn) for i in range(len(keys))]

            every = list(ids)
            sets = {"all": every, "without nvlink": [k for k in every if not k.startswith("nvlink")],
                    "ratios": [k for k in every if not k.endswith("_per_second")],
                    "without graphics_active": [k for k in every if k != "graphics_active"]}
            rows = []
            for label, keys in [*sets.items(), *((key, [key]) for key in every)]:
                cpu_ms, codes = timed(keys)
                rows.append({"metrics": label, "count": len(keys), "cpu_ms": _round(cpu_ms, 4),
                             "failed": [k for k, c in zip(keys, codes) if c != 0]})
            # When the cost falls: a fresh pair of samples, its metrics asked at once or
            # after a wait, call by call (the agent asks once per pair, right after the second).
            timeline = []
            for label, keys, wait in (("all, at once", every, 0.0), ("all, 1 s later", every, 1.0),
                                      ("sm_active, at once", ["sm_active"], 0.0),
                                      ("without graphics, at once", [k for k in every if k != "graphics_active"], 0.0),
                                      ("all, 0.2 s later", every, 0.2), ("all, at once again", every, 0.0)):
                nvml.nvmlGpmSampleGet(handle, first)
                time.sleep(0.2)
                nvml.nvmlGpmSampleGet(handle, second)
                time.sleep(wait)
                calls = []
                for _ in range(10):
                    cpu_ms, _codes = timed_once(keys)
                    calls.append(_round(cpu_ms, 4))
                timeline.append({"what": label, "wait_s": wait, "cpu_ms_per_call": calls})
            return {"status": "measured", "rows": rows, "timeline": timeline}
        finally:
            nvml.nvmlGpmSampleFree(first)
            nvml.nvmlGpmSampleFree(second)
    finally:
        nvml.nvmlShutdown()


def steady_pass_costs(nvml: Any, passes: int = 30, interval: float = 1.0) -> dict[str, Any]:
    """The agent's NVML backend in this process, a pass every ``interval`` s as ``l9gpu
    serve`` makes them: per call, the median CPU of one call over the steady passes that
    made it (the calls a pass makes once each run colder than back to back), and the
    median CPU of a whole pass's calls. Health and GPM on, on their own schedules."""
    from exporter.devices.nvml import NvmlBackend

    backend = NvmlBackend(nvml=nvml)
    backend.open()
    try:
        backend.enable_timings()
        backend.sample(time.monotonic())
        backend.timings(reset=True)
        per_call: dict[str, list[float]] = {}
        totals: list[float] = []
        next_pass = time.monotonic() + interval
        for _ in range(passes):
            time.sleep(max(0.0, next_pass - time.monotonic()))
            next_pass += interval
            backend.sample(time.monotonic())
            timings = backend.timings(reset=True)
            totals.append(sum(t.cpu_seconds for t in timings.values()) * 1e3)
            for name, t in timings.items():
                per_call.setdefault(name, []).append(t.cpu_seconds / max(1, t.calls) * 1e3)
        ordered = sorted(per_call.items(), key=lambda item: -statistics.median(item[1]) * len(item[1]))
        rows = [{"call": name, "passes": len(values), "median_cpu_ms": _round(statistics.median(values), 4),
                 "max_cpu_ms": _round(max(values), 4)} for name, values in ordered]
        return {"passes": passes, "median_pass_cpu_ms": _round(statistics.median(totals), 3), "calls": rows}
    finally:
        backend.close()


def run_pass_costs(args: argparse.Namespace) -> int:
    """The steady-pass cost reading: 0, or 1 when the NVML backend cannot open."""
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    from exporter.devices.base import BackendUnavailable

    try:
        result = steady_pass_costs(pynvml, passes=args.passes)
    except (pynvml.NVMLError, BackendUnavailable) as exc:
        print(f"FAIL  pass costs: {exc}")
        return 1
    print(f"\nthe agent's steady passes, 1 s apart: {result['passes']} passes, median "
          f"{result['median_pass_cpu_ms']} ms of CPU in NVML calls a pass")
    for row in result["calls"]:
        print(f"  {row['call']:<46} in {row['passes']:>3} passes  median {row['median_cpu_ms']:>8.4f} ms  "
              f"max {row['max_cpu_ms']:>8.4f} ms")
    write_report("gpu_check_pass_costs.json", result)
    return 0


def run_gpm_metric_costs(args: argparse.Namespace) -> int:
    """The GPM metric-cost reading: 0, or 1 when NVML refuses it."""
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    try:
        result = gpm_metric_costs(pynvml, args.device)
    except pynvml.NVMLError as exc:
        print(f"FAIL  gpm metric costs: {exc}")
        return 1
    print("\nnvmlGpmMetricsGet by the metrics asked (median CPU per call)")
    for row in result.get("rows", []):
        failed = f"  failed: {', '.join(row['failed'])}" if row["failed"] else ""
        print(f"  {row['metrics']:<30}{row['count']:>3} metrics {row['cpu_ms']:>9.4f} ms{failed}")
    for step in result.get("timeline", []):
        print(f"  fresh samples, {step['what']:<22} ms per call: {step['cpu_ms_per_call']}")
    if result["status"] != "measured":
        print(f"SKIP  gpm metric costs: {result['reason']}")
    write_report("gpu_check_gpm_costs.json", result)
    return 0


def run_gpm_check(args: argparse.Namespace) -> int:
    """The GPM section on a real GPU: 0 passed or skipped (no GPM here), 1 failed, 2 cannot run."""
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("pynvml") is None:
        print("gpu_check: the GPM section needs torch and nvidia-ml-py", file=sys.stderr)
        return 2
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    workload = ChildBf16Workload(args.python, args.device, args.gpm_busy_seconds, args.gpm_idle_seconds)
    print(f"\nGPM: bf16 matmuls for {args.gpm_busy_seconds:.0f} s, then idle for {args.gpm_idle_seconds:.0f} s, "
          f"GPM read every {args.gpm_tick:g} s on GPU {args.device}")
    result = gpm_section(pynvml, args.device, workload,
                         args.gpm_busy_seconds + args.gpm_idle_seconds + args.startup_timeout + 30, tick=args.gpm_tick)
    result["workload"] = workload.events
    report_gpm(result)
    write_report("gpu_check_gpm.json", result)
    return 1 if result["status"] == "failed" else 0


def report_gpm(result: dict[str, Any]) -> None:
    """Print the GPM section: per-phase medians, the per-call cost, PASS/FAIL per check."""
    if result["status"] == "skipped":
        print(f"SKIP  gpm: {result['reason']}")
        return
    keys = ("graphics_active", "sm_active", "sm_occupancy", "tensor_active", "tensor_hmma_active", "dram_active")
    print("  ".join(f"{h:>13}" for h in ("phase", "windows") + keys))
    for phase in ("busy", "idle"):
        rows = [w for w in result["windows"] if w["phase"] == phase and w["settled"]]
        cells = [_median([w[k] for w in rows if k in w]) for k in keys]
        print("  ".join(f"{v!s:>13}" for v in (phase, len(rows), *[None if c is None else round(c, 3)
                                                                    for c in cells])))
    for name, cost in result["costs"].items():
        print(f"  {name}: {cost}")
    for check in result["checks"]:
        print(f"{'PASS' if check['passed'] else 'FAIL'}  {check['name']}: {check['detail']}")


# ---- per-process samples: how many the driver keeps, and what the one it returns covers ----
def run_duty_workload(period: float, seconds: float) -> int:
    """The samples child: bf16 matmuls for ``period`` s, idle for ``period`` s, over and over."""
    import torch  # type: ignore[import-not-found,unused-ignore]

    a, b, c = bf16_operands(4096)
    start = time.time()
    _emit("busy", pid=os.getpid(), start=start)
    while (now := time.time()) < start + seconds:
        if int((now - start) / period) % 2 == 0:
            for _ in range(8):
                torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
        else:
            time.sleep(0.005)
    _emit("done")
    return 0


def busy_fraction(start: float, period: float, t0: float, t1: float, step: float = 0.01) -> float:
    """The share of [t0, t1] (epoch seconds) the duty child spends multiplying."""
    ticks = max(1, int((t1 - t0) / step))
    busy = sum(1 for i in range(ticks) if int((t0 + (i + 0.5) * step - start) / period) % 2 == 0)
    return busy / ticks


def sample_semantics(nvml: Any, device: int, python: str, period: float, seconds: float,
                     window: float, tick: float, startup_timeout: float,
                     child: list[str] | None = None) -> dict[str, Any]:
    """While a child alternates ``period`` s of matmuls with ``period`` s idle: every ``tick``
    s the per-process samples newer than 0 (all the driver keeps) and newer than the last one
    seen (as the agent asks pass by pass); every ``window`` s those newer than the timestamp
    seen a window before (as a read every few seconds asks). A sample that averages over the
    time since the timestamp asked for gives about the child's busy share of the window; one
    that covers only the driver's last sampling period gives about 0 or 100. ``child`` replaces
    the PyTorch duty child (it must print the same ``busy`` event: pid and start)."""
    command = child or [python, str(Path(__file__).resolve()), "--duty-workload-child",
                        "--duty-period", str(period), "--duty-seconds", str(seconds)]
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(device))
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
    threading.Thread(target=read_events, args=(proc.stdout, events), daemon=True).start()
    nvml.nvmlInit()
    try:
        try:
            _, started = events.get(timeout=startup_timeout)
        except queue.Empty:
            return {"status": "failed", "reason": f"the duty child did not start within {startup_timeout:g} s"}
        pid, start = int(started["pid"]), float(started["start"])
        samples = process_samples_reader(nvml, nvml.nvmlDeviceGetHandleByIndex(device))

        def mine(since: int) -> list[Any]:
            return [s for s in samples(since) if int(s.pid) == pid]

        def latest() -> int:
            return max((int(s.timeStamp) for s in mine(0)), default=0)

        all_reads: list[dict[str, Any]] = []
        pass_reads: list[dict[str, Any]] = []
        windows: list[dict[str, Any]] = []
        last_seen = mark_seen = latest()
        mark_t = time.time()
        end = start + seconds - 0.5
        while time.time() < end and proc.poll() is None:
            now = time.time()
            kept = mine(0)
            all_reads.append({"t": round(now - start, 3), "samples": len(kept),
                              "stamps": [int(s.timeStamp) for s in kept], "sm": [int(s.smUtil) for s in kept]})
            new = mine(last_seen)
            if new:
                last_seen = max(int(s.timeStamp) for s in new)
            pass_reads.append({"t": round(now - start, 3), "samples": len(new), "sm": [int(s.smUtil) for s in new]})
            if now - mark_t >= window:
                got = mine(mark_seen)
                windows.append({"t": round(now - start, 3), "span_s": round(now - mark_t, 3), "samples": len(got),
                                "sm": [int(s.smUtil) for s in got],
                                "busy_share": round(busy_fraction(start, period, mark_t, now), 3)})
                mark_seen, mark_t = latest(), now
            time.sleep(tick)
        stamps = sorted({st for r in all_reads for st in r["stamps"]})
        steps = [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:])]
        distinct = {}
        for r in all_reads:
            for st, sm in zip(r["stamps"], r["sm"]):
                distinct[st] = sm
        between = sum(1 for sm in distinct.values() if 10 < sm < 90)
        window_errors = [abs(w["sm"][-1] - 100 * w["busy_share"]) for w in windows if w["sm"]]
        return {
            "status": "measured", "pid": pid, "period_s": period, "window_s": window, "tick_s": tick,
            "most_kept_per_process": max((r["samples"] for r in all_reads), default=0),
            "distinct_samples": len(distinct),
            "median_step_s": _round(statistics.median(steps)) if steps else None,
            "samples_between_10_and_90": between,
            "pass_reads_with_a_sample": sum(1 for r in pass_reads if r["samples"]),
            "pass_reads": len(pass_reads),
            "window_reads": windows,
            "window_median_error_points": _round(statistics.median(window_errors), 1) if window_errors else None,
            "all_reads": all_reads,
        }
    finally:
        nvml.nvmlShutdown()
        proc.wait(timeout=seconds + startup_timeout)


def run_sample_semantics(args: argparse.Namespace) -> int:
    """The per-process samples section: a measurement, not a check (0, or 2 when it cannot run)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("pynvml") is None:
        print("gpu_check: the per-process samples section needs torch and nvidia-ml-py", file=sys.stderr)
        return 2
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    print(f"\nper-process samples: {args.duty_period:g} s of matmuls, {args.duty_period:g} s idle, for "
          f"{args.duty_seconds:g} s; read every {args.samples_tick:g} s and every {args.samples_window:g} s")
    result = sample_semantics(pynvml, args.device, args.python, args.duty_period, args.duty_seconds,
                              args.samples_window, args.samples_tick, args.startup_timeout)
    if result["status"] != "measured":
        print(f"FAIL  samples: {result['reason']}")
        return 1
    print(f"  kept per process: at most {result['most_kept_per_process']}; {result['distinct_samples']} distinct "
          f"samples, median step {result['median_step_s']} s; {result['samples_between_10_and_90']} of them "
          f"between 10 and 90")
    print(f"  pass-by-pass reads (newer than the last seen): {result['pass_reads_with_a_sample']} of "
          f"{result['pass_reads']} returned a sample")
    for w in result["window_reads"]:
        print(f"  window read at t={w['t']:6.1f} s over {w['span_s']:.1f} s: sm {w['sm']} "
              f"against a busy share of {100 * w['busy_share']:.0f}%")
    print(f"  window reads' median distance from the busy share: {result['window_median_error_points']} points")
    write_report("gpu_check_samples.json", result)
    return 0


# ---- health calls: what the driver answers to every NVML call the health reads make --------
# (exporter/devices/nvml/health.py): supported or the NVML error name, the values, and the
# median wall and CPU cost per call over --health-repeats calls.
def _health_calls(nvml: Any, handle: Any) -> list[tuple[str, Any]]:
    """(label, zero-argument call) for every health read, as exporter.devices.nvml.health asks it."""
    def const(name: str, default: int) -> int:
        value = getattr(nvml, name, default)
        return value if isinstance(value, int) else default

    calls: list[tuple[str, Any]] = []
    for name in ("nvmlDeviceGetRemappedRows", "nvmlDeviceGetRowRemapperHistogram",
                 "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetCurrPcieLinkGeneration",
                 "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                 "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetPersistenceMode"):
        calls.append((name, lambda n=name: getattr(nvml, n)(handle)))
    for cause, default in (("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
                           ("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)):
        calls.append((f"nvmlDeviceGetRetiredPages_v2({cause})",
                      lambda c=const(cause, default): nvml.nvmlDeviceGetRetiredPages_v2(handle, c)))
    for policy, default in (("NVML_PERF_POLICY_POWER", 0), ("NVML_PERF_POLICY_THERMAL", 1),
                            ("NVML_PERF_POLICY_SYNC_BOOST", 2), ("NVML_PERF_POLICY_BOARD_LIMIT", 3),
                            ("NVML_PERF_POLICY_LOW_UTILIZATION", 4), ("NVML_PERF_POLICY_RELIABILITY", 5)):
        calls.append((f"nvmlDeviceGetViolationStatus({policy})",
                      lambda p=const(policy, default): nvml.nvmlDeviceGetViolationStatus(handle, p)))
    calls.append(("nvmlDeviceGetNvLinkState(0)", lambda: nvml.nvmlDeviceGetNvLinkState(handle, 0)))
    for counter, default in (("NVML_NVLINK_ERROR_DL_REPLAY", 0), ("NVML_NVLINK_ERROR_DL_RECOVERY", 1),
                             ("NVML_NVLINK_ERROR_DL_CRC_FLIT", 2), ("NVML_NVLINK_ERROR_DL_CRC_DATA", 3)):
        calls.append((f"nvmlDeviceGetNvLinkErrorCounter(0, {counter})",
                      lambda c=const(counter, default): nvml.nvmlDeviceGetNvLinkErrorCounter(handle, 0, c)))
    fields = [("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", 3), ("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 4)]
    if isinstance(getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None), int):
        fields.append(("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION))
    ids = [const(name, default) for name, default in fields]
    calls.append((f"nvmlDeviceGetFieldValues({', '.join(n for n, _ in fields)})",
                  lambda: [(v.nvmlReturn, v.value.ullVal) for v in nvml.nvmlDeviceGetFieldValues(handle, ids)]))
    # The violation times again, as the field values' perf-policy counters: the same six
    # policies in one call, alone and beside the memory temperature a pass already asks.
    policies = [const(f"NVML_FI_DEV_PERF_POLICY_{name}", default) for name, default in (
        ("POWER", 74), ("THERMAL", 75), ("SYNC_BOOST", 76), ("BOARD_LIMIT", 77), ("LOW_UTILIZATION", 78),
        ("RELIABILITY", 79))]
    memory_temp = const("NVML_FI_DEV_MEMORY_TEMP", 82)
    for label, asked in (("NVML_FI_DEV_PERF_POLICY_POWER..RELIABILITY", policies),
                         ("NVML_FI_DEV_MEMORY_TEMP", [memory_temp]),
                         ("NVML_FI_DEV_MEMORY_TEMP, PERF_POLICY_POWER..RELIABILITY", [memory_temp, *policies])):
        calls.append((f"nvmlDeviceGetFieldValues({label})",
                      lambda ids=asked: [(v.nvmlReturn, v.valueType, v.value.ullVal)
                                         for v in nvml.nvmlDeviceGetFieldValues(handle, ids)]))
    for name, struct_name, version_name in (
            ("nvmlDeviceGetSramEccErrorStatus", "c_nvmlEccSramErrorStatus_v1_t", "nvmlEccSramErrorStatus_v1"),
            ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t", "nvmlGpuFabricInfo_v2")):
        calls.append((name, functools.partial(_struct_call, nvml, handle, name, struct_name, version_name)))
    return calls


def _struct_call(nvml: Any, handle: Any, name: str, struct_name: str, version_name: str) -> Any:
    struct_type = getattr(nvml, struct_name, None)
    if struct_type is None or not hasattr(nvml, name):
        raise AttributeError(f"the binding has no {name} or {struct_name}")
    info = struct_type()
    version = getattr(nvml, version_name, None)
    if isinstance(version, int):
        info.version = version
    getattr(nvml, name)(handle, ctypes.byref(info) if isinstance(info, ctypes.Structure) else info)
    return {field: getattr(info, field) for field, *_ in getattr(info, "_fields_", ()) if field != "version"}


def _plain(value: Any) -> Any:
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    fields = getattr(value, "_fields_", None)
    if fields:
        return {name: _plain(getattr(value, name)) for name, *_ in fields}
    return repr(value)[:200]


def _nvml_error_name(nvml: Any, exc: BaseException) -> str:
    code = getattr(exc, "value", None)
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == code:
            return name
    return f"{type(exc).__name__}: {exc}"[:120]


def health_calls_section(nvml: Any, device: int, repeats: int = 50) -> list[dict[str, Any]]:
    """Every NVML health call once for its answer, then ``repeats`` times for its cost."""
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(device)
        rows = []
        for label, call in _health_calls(nvml, handle):
            row: dict[str, Any] = {"call": label}
            try:
                row.update(supported=True, value=_plain(call()))
            except Exception as exc:  # noqa: BLE001 - the answer is what is recorded
                row.update(supported=False, error=_nvml_error_name(nvml, exc))
            walls, cpus = [], []
            for _ in range(repeats):
                wall, cpu = time.perf_counter(), time.thread_time()
                try:
                    call()
                except Exception:  # noqa: BLE001 - an unsupported call costs too
                    pass
                cpus.append(time.thread_time() - cpu)
                walls.append(time.perf_counter() - wall)
            row.update(calls=repeats, median_wall_us=round(statistics.median(walls) * 1e6, 2),
                       median_cpu_us=round(statistics.median(cpus) * 1e6, 2))
            rows.append(row)
        return rows
    finally:
        nvml.nvmlShutdown()


def report_health_calls(rows: list[dict[str, Any]]) -> None:
    print("\nNVML health calls (answer; median wall / CPU per call)")
    for row in rows:
        answer = json.dumps(row["value"])[:70] if row["supported"] else row["error"]
        print(f"  {row['call'][:72]:<72} {row['median_wall_us']:>9.1f} us {row['median_cpu_us']:>9.1f} us  {answer}")


def run_health_calls(args: argparse.Namespace) -> int:
    """The health-calls section on a real GPU: 0 recorded, 2 cannot run (no nvidia-ml-py)."""
    import importlib.util

    if importlib.util.find_spec("pynvml") is None:
        print("gpu_check: the health-calls section needs nvidia-ml-py", file=sys.stderr)
        return 2
    import pynvml  # type: ignore[import-untyped,unused-ignore]

    rows = health_calls_section(pynvml, args.device, args.health_repeats)
    report_health_calls(rows)
    write_report("gpu_check_health.json", rows)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Check l9gpu's NVIDIA backend against a real PyTorch workload on a real GPU "
                    "(per-process memory and utilisation, power, energy). Writes details to $OUT if set.",
    )
    parser.add_argument("--gib", type=float, default=4.0, help="GiB the workload allocates (default: 4)")
    parser.add_argument("--busy-seconds", type=float, default=40.0, help="matrix-multiply phase (default: 40)")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="idle phase holding memory (default: 20)")
    parser.add_argument("--device", type=int, default=0, help="NVML index of the GPU to load (default: 0)")
    parser.add_argument("--startup-timeout", type=float, default=60.0,
                        help="seconds to wait for the agent and for CUDA start-up (default: 60)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the agent and the workload")
    parser.add_argument("--workload-child", action="store_true", help=argparse.SUPPRESS)
    gpm = parser.add_argument_group("GPM section (Hopper and newer; skipped where the GPU has no GPM)")
    gpm.add_argument("--no-gpm", action="store_true", help="skip the GPM section")
    gpm.add_argument("--gpm-only", action="store_true", help="run only the GPM section")
    gpm.add_argument("--gpm-busy-seconds", type=float, default=15.0, help="bf16 matmul phase (default: 15)")
    gpm.add_argument("--gpm-idle-seconds", type=float, default=10.0, help="idle phase (default: 10)")
    gpm.add_argument("--gpm-tick", type=float, default=1.0, help="seconds between GPM samples (default: 1)")
    parser.add_argument("--pass-costs-only", action="store_true",
                        help="only time the NVML calls of the agent's steady passes, 1 s apart")
    parser.add_argument("--passes", type=int, default=30, help="steady passes timed (default: 30)")
    gpm.add_argument("--gpm-metric-costs-only", action="store_true",
                     help="only time nvmlGpmMetricsGet by the metrics asked")
    gpm.add_argument("--gpm-workload-child", action="store_true", help=argparse.SUPPRESS)
    samples = parser.add_argument_group("per-process samples (what one nvmlDeviceGetProcessUtilization sample covers)")
    samples.add_argument("--no-samples", action="store_true", help="skip the per-process samples section")
    samples.add_argument("--samples-only", action="store_true", help="run only the per-process samples section")
    samples.add_argument("--duty-period", type=float, default=1.0,
                         help="seconds of matmuls, then as many idle, over and over (default: 1)")
    samples.add_argument("--duty-seconds", type=float, default=30.0, help="how long the duty child runs (default: 30)")
    samples.add_argument("--samples-window", type=float, default=5.0,
                         help="seconds between the slow reads (default: 5)")
    samples.add_argument("--samples-tick", type=float, default=0.2,
                         help="seconds between the fast reads (default: 0.2)")
    samples.add_argument("--duty-workload-child", action="store_true", help=argparse.SUPPRESS)
    health = parser.add_argument_group("health calls (what the driver answers to each NVML health read)")
    health.add_argument("--no-health-calls", action="store_true", help="skip the health-calls section")
    health.add_argument("--health-calls-only", action="store_true", help="run only the health-calls section")
    health.add_argument("--health-repeats", type=int, default=50, help="calls per health call timed (default: 50)")
    gpu_check_stall.add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.workload_child:
        return run_workload(args.gib, args.busy_seconds, args.idle_seconds, args.device)
    if args.gpm_workload_child:
        return run_bf16_workload(args.gpm_busy_seconds, args.gpm_idle_seconds)
    if args.duty_workload_child:
        return run_duty_workload(args.duty_period, args.duty_seconds)
    if args.stall_workload_child:
        return gpu_check_stall.run_stall_workload(args.stall_phase_seconds, args.stall_gib)
    if args.stall_only:
        return gpu_check_stall.run_stall_check(args, Path(__file__).resolve(), write_report)
    if args.health_calls_only:
        return run_health_calls(args)
    if args.samples_only:
        return run_sample_semantics(args)
    if args.gpm_metric_costs_only:
        return run_gpm_metric_costs(args)
    if args.pass_costs_only:
        return run_pass_costs(args)
    status = 0 if args.gpm_only else run_check(args)
    if not args.no_gpm and status != 2:
        status = max(status, run_gpm_check(args))
    if not args.no_health_calls and not args.gpm_only and status != 2:
        status = max(status, run_health_calls(args))
    if not args.no_samples and not args.gpm_only and status != 2:
        status = max(status, run_sample_semantics(args))
    if not args.no_stall and not args.gpm_only and status != 2:
        status = max(status, gpu_check_stall.run_stall_check(args, Path(__file__).resolve(), write_report))
    if not args.no_gpm and status != 2:
        status = max(status, run_gpm_metric_costs(args))
    if not args.gpm_only and status != 2:
        status = max(status, run_pass_costs(args))
    return status


if __name__ == "__main__":
    sys.exit(main())
