"""Small helpers the benchmarks share: a free loopback port, a process's CPU time,
live processes to stand for a node's GPU processes.

Standard library only, so ``benchmarks/gpu_check.py`` can use them on a GPU machine that
has nothing but the project's requirements and torch.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


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


def read_events(stream: Any, out: queue.Queue[tuple[float, dict[str, Any]]]) -> None:
    """A child's events, one JSON object with an ``event`` key a line, each with when it
    arrived (``time.monotonic()``); other lines are skipped."""
    for line in stream:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and "event" in event:
            out.put((time.monotonic(), event))


class ChildWorkload:
    """A GPU workload as a child process on one GPU (``command``), whose phases arrive as
    `read_events` lines; `phase` is the last one, or "failed" if it ended before "done"."""

    def __init__(self, command: list[str], device: int):
        self._command = command
        self._env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(device))
        self._events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self._phase = "starting"
        self.events: dict[str, dict[str, Any]] = {}
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self._command, env=self._env, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=read_events, args=(self.proc.stdout, self._events), daemon=True).start()

    def phase(self) -> str:
        while not self._events.empty():
            _, event = self._events.get()
            self.events[event["event"]] = event
            self._phase = event["event"]
        if self.proc is not None and self.proc.poll() is not None and self._phase != "done":
            self._phase = "failed"
        return self._phase

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
