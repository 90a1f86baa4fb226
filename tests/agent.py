"""Run the real agent as a subprocess on a free loopback port and scrape it."""

from __future__ import annotations

import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterable, Sequence

from prometheus_client.parser import text_string_to_metric_families
from waiting import PATIENCE

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] from a text exposition."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def pick(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> list[float]:
    """Values of ``name`` whose labels include ``labels``."""
    return [v for lab, v in samples.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]


def ambient_setting(name: str) -> bool:
    """An environment variable of the machine that would configure the agent under test
    (``L9GPU_*``, ``OTEL_*``, ``NODE_NAME``): tests must not pick these up."""
    return name.startswith(("L9GPU_", "OTEL_")) or name == "NODE_NAME"


class AgentProcess:
    """`python -m exporter serve ...` with stdout/stderr to a log file.

    ``scheme``, ``ssl_context`` and ``headers`` (e.g. Authorization) apply to the
    readiness poll and to `get`, for an agent behind a --web-config. ``launcher`` replaces
    ``-m exporter`` (e.g. a script that installs a fake first); ``open_files`` sets the
    agent's open-file limit (RLIMIT_NOFILE): one number holds soft and hard there, so it
    cannot raise it; a (soft, hard) pair sets both.
    """

    def __init__(self, args: list[str], env: dict[str, str] | None = None, log_path: Path | None = None,
                 scheme: str = "http", ssl_context: ssl.SSLContext | None = None,
                 headers: dict[str, str] | None = None, launcher: Sequence[str] = ("-m", "exporter"),
                 open_files: int | tuple[int, int] | None = None):
        self.port = free_port()
        self.args = args
        self.launcher = list(launcher)
        self.open_files = open_files
        self.scheme = scheme
        self.ssl_context = ssl_context
        self.headers = dict(headers or {})
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = str(REPO) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env.update(env or {})
        self.log_path = log_path or Path(f"/tmp/l9gpu-agent-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self, wait_ready: bool = True, timeout: float = PATIENCE) -> None:
        cmd = [sys.executable, *self.launcher, "serve", "--listen", f"127.0.0.1:{self.port}", *self.args]
        self._log = open(self.log_path, "wb")
        limit = self.open_files

        def hold_open_files() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, limit if isinstance(limit, tuple) else (limit, limit))

        self.proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=hold_open_files if limit is not None else None)
        if wait_ready:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = PATIENCE) -> None:
        """Poll /readyz until it answers 200 (the agent has published a snapshot)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.log()}")
            try:
                request = urllib.request.Request(self.url + "/readyz", headers=self.headers)
                with urllib.request.urlopen(request, timeout=5, context=self.ssl_context) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"agent not ready after {timeout}s:\n{self.log()}")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, headers={**self.headers, **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=PATIENCE / 2, context=self.ssl_context) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def scrape(self) -> str:
        status, _, body = self.get("/metrics")
        assert status == 200, body
        return body.decode()

    def samples(self):  # type: ignore[no-untyped-def]
        return parse_metrics(self.scrape())

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def run_cli(args: Iterable[str], env: dict[str, str] | None = None,
            timeout: float = PATIENCE) -> subprocess.CompletedProcess:
    """Run `python -m exporter ARGS` to completion."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "exporter", *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
