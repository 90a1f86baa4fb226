"""Instructions per steady pass of the agent, counted by valgrind: a figure the load cannot move.

On a shared machine a pass's CPU time moves by a fifth from one run to the next with the
same code (other jobs, the CPU's clock, its caches), more than most changes to a pass.
This counts the instructions instead: the agent as ``l9gpu serve`` builds it on a fake
NVML node (`profile_pass.build`: collector, registry, incident watch, health reads on),
one pass and the watch after it, back to back, the agent's clock one second further each
pass, under ``valgrind --tool=callgrind``. Run
once with ``--warm`` passes and once with ``--warm`` + ``--passes``; the difference over
``--passes`` is one steady pass's instructions (Python's hash seed fixed, so that the
count repeats to within a few hundredths of a percent). It counts instructions, not
time: a cache miss or a thread switch costs nothing here, so read it beside the CPU
figures of `profile_pass.py` and `bench_agent.py`, not instead of them.

Run: ``python benchmarks/pass_instructions.py --node 256 --free`` (about 2.5 minutes per
tree; needs valgrind). ``--tree DIR`` (repeatable) counts another checkout as well, e.g.
``git archive REV | tar -x -C DIR``; each tree is counted with its own code and its own
``benchmarks/profile_pass.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def child(node: str, free: bool, passes: int) -> int:
    """In the tree on ``sys.path``: build the agent on the node and run ``passes`` passes."""
    import gc

    # the tree's benchmarks (on PYTHONPATH), not this script's folder, which Python put first
    if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        del sys.path[0]

    import profile_pass
    from bench_agent import scenario
    from processes import live_processes

    containers, processes = profile_pass.NODES[node]
    with live_processes(processes) as pids, tempfile.TemporaryDirectory() as tmp:
        path = scenario(Path(tmp) / "node.yaml", containers=containers, processes_total=processes, pids=pids)
        (_, attributor), collector, _, watch = profile_pass.build(path, not free, [])
        # The agent's clock moves one 1 s interval per pass, however slowly valgrind runs
        # it: what is read on a slow schedule (energy, PCIe, GPM, health) comes as often per
        # pass as in `serve --interval 1s`, and the count does not depend on the machine.
        clock = [time.monotonic()]
        collector._clock = watch._clock = lambda: clock[0]
        collector.collect_once()
        watch.observe(collector.snapshot)
        gc.collect()
        gc.freeze()
        for _ in range(passes):
            clock[0] += 1.0
            watch.observe(collector.collect_once())
        attributor.close()
        watch.close()
    return 0


def count(tree: Path, node: str, free: bool, passes: int) -> int:
    """Instructions callgrind counts for the whole child run of ``passes`` passes."""
    env = dict(os.environ, PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join([str(tree), str(tree / "benchmarks"), str(tree / "tests")]))
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
               str(Path(__file__).resolve()), "--child", "--node", node, "--passes", str(passes)]
    if free:
        command.append("--free")
    result = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    found = _COLLECTED.search(result.stderr)
    if result.returncode != 0 or found is None:
        tail = "\n".join((result.stderr or result.stdout).splitlines()[-15:])
        raise SystemExit(f"pass_instructions: counting {tree} failed (status {result.returncode}):\n{tail}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", default="256", help="a node of bench_side_by_side.NODES (default: 256)")
    parser.add_argument("--free", action="store_true", help="NVML calls cost nothing (default: H200 call costs)")
    parser.add_argument("--passes", type=int, default=100, help="passes counted (default: 100)")
    parser.add_argument("--warm", type=int, default=20, help="passes of the baseline run (default: 20)")
    parser.add_argument("--tree", type=Path, action="append", default=[],
                        help="another checkout to count as well (repeatable)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        return child(opts.node, opts.free, opts.passes)
    if shutil.which("valgrind") is None:
        print("pass_instructions: valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    if opts.passes < 1 or opts.warm < 0:
        parser.error("--passes must be at least 1 and --warm at least 0")
    trees = [REPO] + [tree.resolve() for tree in opts.tree]
    for tree in trees:
        if not (tree / "benchmarks" / "profile_pass.py").is_file():
            parser.error(f"{tree} has no benchmarks/profile_pass.py to build the agent with")
    costs = "free calls" if opts.free else "H200 call costs (modelled)"
    print(f"node {opts.node}, {costs}: instructions per steady pass (callgrind; {opts.warm + opts.passes} "
          f"passes minus {opts.warm})")
    figures: dict[Path, float] = {}
    for tree in trees:
        started = time.monotonic()
        base = count(tree, opts.node, opts.free, opts.warm)
        more = count(tree, opts.node, opts.free, opts.warm + opts.passes)
        figures[tree] = (more - base) / opts.passes
        name = "this checkout" if tree == REPO else str(tree)
        print(f"  {name:<40} {figures[tree]:>14,.0f}  ({time.monotonic() - started:.0f} s)", flush=True)
    for tree in trees[1:]:
        print(f"  this checkout / {tree}: {figures[REPO] / figures[tree]:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
