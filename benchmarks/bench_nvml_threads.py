"""Would reading GPUs concurrently shorten a pass? Sequential vs one thread per GPU.

8 fake H200s with 16 processes each, every NVML call charged its H200 cost
(``fakes.pynvml_fake.H200_COSTS``: CPU burnt with the GIL released, as a ctypes call into the
driver releases it). Times 60 passes of the NVML backend's per-GPU reads, sequentially
(as the agent reads) and with a pool of 8 threads, and prints the median wall and CPU
time of each. Run: ``python benchmarks/bench_nvml_threads.py``; the figures and the
decision are in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from fakes import pynvml_fake as F  # noqa: E402

from exporter.devices.nvml import NvmlBackend  # noqa: E402

GPUS, PROCESSES, PASSES = 8, 16, 60


def main() -> int:
    gpus = []
    for g in range(GPUS):
        pids = [1000 * (g + 1) + i for i in range(PROCESSES)]
        gpus.append(F.FakeGpu(name="NVIDIA H200", unsupported={"nvmlDeviceGetFanSpeed"}, mig_capable=True,
                              processes=[F.FakeProcess(pid=p) for p in pids], live_sm={p: 10 for p in pids}))
    fake = F.FakeNvml(gpus, costs=F.H200_COSTS)
    fake.record_calls = False
    backend = NvmlBackend(nvml=fake)
    backend.open()
    backend.sample(0.0)
    nvml = backend._nvml
    results: dict[str, tuple[list[float], list[float]]] = {"sequential": ([], []), f"{GPUS} threads": ([], [])}
    with ThreadPoolExecutor(GPUS) as pool:
        for i in range(1, PASSES + 1):
            for name, now in (("sequential", float(i)), (f"{GPUS} threads", i + 0.5)):
                wall, cpu = time.perf_counter(), time.process_time()
                if name == "sequential":
                    for g in range(GPUS):
                        backend._sample_gpu(nvml, g, now)
                else:
                    list(pool.map(lambda g, now=now: backend._sample_gpu(nvml, g, now), range(GPUS)))
                results[name][0].append(time.perf_counter() - wall)
                results[name][1].append(time.process_time() - cpu)
    backend.close()
    for name, (walls, cpus) in results.items():
        print(f"{name:<12} pass wall median {statistics.median(walls) * 1e3:6.1f} ms, "
              f"CPU median {statistics.median(cpus) * 1e3:6.1f} ms (n={len(walls)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
