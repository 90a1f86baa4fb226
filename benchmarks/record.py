"""Run one benchmark and keep its raw output under benchmarks/results/, for docs to cite.

    python benchmarks/record.py NAME -- python benchmarks/bench_gpm.py --passes 60

writes ``benchmarks/results/<UTC date>-NAME.txt``: a header (the command, the time, the
commit, the machine's CPUs and load average before the run), everything the command
printed (stdout and stderr, as it came), and its exit status. The output is also shown
as it runs. Exits with the command's status.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        # what runs, not what describes it: changes to docs/ and *.md do not count
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":!docs", ":!*.md"], capture_output=True, text=True).stdout.strip()
        return out + (" (with uncommitted changes to code)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs" + (f" ({model})" if model else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the results file's name after the date, e.g. bench_gpm")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command line")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    now = datetime.datetime.now(datetime.timezone.utc)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{now:%Y-%m-%d}-{args.name}.txt"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    header = (f"# command: {shlex.join(command)}\n"
              f"# date: {now:%Y-%m-%dT%H:%M:%SZ}; commit {_commit()}; host: {_cpu()}; load average before: {load}\n")
    with path.open("w") as out:
        out.write(header)
        out.flush()
        sys.stdout.write(header)
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            sys.stdout.write(line)
        status = proc.wait()
        out.write(f"# exit: {status}\n")
    print(f"# kept in {path.relative_to(REPO)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
