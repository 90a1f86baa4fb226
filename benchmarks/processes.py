"""Small helpers the benchmarks share: a free loopback port, a process's CPU time,
live processes to stand for a node's GPU processes.

Standard library only, so ``benchmarks/gpu_check.py`` can use them on a GPU machine that
has nothing but the project's requirements and torch.
"""

from __future__ import annotations

import os
import socket
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (all its threads), in seconds; None
    once the process is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def live_processes(count: int) -> Iterator[list[int]]:
    """The PIDs of ``count`` sleeping processes, killed on leaving the block: a node's GPU
    processes, real enough for the agent to check them as it does on a real node."""
    children = [subprocess.Popen(["sleep", "3600"]) for _ in range(count)]
    try:
        yield [child.pid for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()
