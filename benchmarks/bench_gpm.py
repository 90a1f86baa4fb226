"""What GPM adds to a collection pass: the NVIDIA backend on the fake NVML with H200 call costs.

    python benchmarks/bench_gpm.py [--gpus 8] [--passes 60]

Eight fake H200s, one process each, every NVML call charged what it cost on a real H200
(`fakes.pynvml_fake.H200_COSTS`: CPU burnt with the GIL released), passes one simulated second
apart. Prints the backend's CPU per pass with GPM off, at the default --gpm-interval (5 s)
and with a GPM window every pass.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def measure(gpus: int, passes: int, **options: object) -> list[float]:
    from fakes import pynvml_fake as F

    from exporter.devices.nvml import NvmlBackend

    fake = F.FakeNvml(gpus=[F.FakeGpu(name="NVIDIA H200", unsupported={"nvmlDeviceGetFanSpeed"},
                                      processes=[F.FakeProcess(pid=1000 + i)]) for i in range(gpus)],
                      costs=F.H200_COSTS)
    backend = NvmlBackend(nvml=fake, **options)  # type: ignore[arg-type]
    backend.open()
    cpu, now = [], 100.0
    try:
        for _ in range(passes):
            started = time.thread_time()
            backend.sample(now)
            cpu.append(time.thread_time() - started)
            now += 1.0
    finally:
        backend.close()
    return cpu[min(10, passes // 4):]  # past the first passes' one-off reads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--passes", type=int, default=60)
    args = parser.parse_args(argv)
    print(f"{args.gpus} fake H200s with H200 call costs, {args.passes} passes 1 s apart: backend CPU per pass")
    for label, options in (("GPM off", {"gpm": False}), ("--gpm-interval 5s", {"gpm_interval": 5.0}),
                           ("--gpm-interval 0", {"gpm_interval": 0.0})):
        cpu = measure(args.gpus, args.passes, **options)
        print(f"  {label:<20} median {statistics.median(cpu) * 1e3:6.2f} ms   mean {statistics.mean(cpu) * 1e3:6.2f} ms"
              f"   mean per GPU {statistics.mean(cpu) * 1e3 / args.gpus:5.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
