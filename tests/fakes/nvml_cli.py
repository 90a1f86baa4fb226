"""`l9gpu` with the NVML fake in place of the driver, for tests that run the agent as a process.

    python tests/fakes/nvml_cli.py PID[,PID...] -- ARGS...

runs ``l9gpu ARGS...`` (e.g. ``snapshot --json --backend nvml ...``) on one fake GPU whose
compute processes are the given host PIDs, holding 1 GiB, 2 GiB, ... of memory in that
order, as NVML reports them (host PIDs, whatever PID namespace the agent is in).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/

from fakes import pynvml_fake  # noqa: E402

GiB = 2**30


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 1:
        sys.stderr.write(__doc__ or "")
        return 2
    pids = [int(p) for p in argv[0].split(",") if p]
    gpu = pynvml_fake.FakeGpu(processes=[pynvml_fake.FakeProcess(pid=pid, used_memory=(i + 1) * GiB)
                                         for i, pid in enumerate(pids)])
    sys.modules["pynvml"] = pynvml_fake.FakeNvml(gpus=[gpu])  # type: ignore[assignment]
    from exporter.app.cli import main as l9gpu

    return l9gpu(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
