"""Shared fixtures: free ports, running the agent as a real subprocess, scraping it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent import AgentProcess  # noqa: E402

try:  # property tests: no per-example time limit, no "too slow" failure on a busy machine
    from hypothesis import HealthCheck, settings

    settings.register_profile("l9gpu", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("l9gpu")
except ImportError:  # hypothesis comes with the test extra; without it those tests skip
    pass

REPO = Path(__file__).resolve().parent.parent


def need_tool(name: str) -> str:
    """Path of a required tool; skip without it, but fail in CI, where `make test` installs it."""
    import shutil

    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (Debian package prometheus; `make test` installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def agent_factory(tmp_path):
    """Start `l9gpu serve` subprocesses; every one is stopped at teardown."""
    started: list[AgentProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, wait_ready: bool = True) -> AgentProcess:
        proc = AgentProcess(list(args), env=env, log_path=tmp_path / f"agent-{len(started)}.log")
        started.append(proc)
        proc.start(wait_ready=wait_ready)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture(scope="session")
def no_agent_url():
    """A loopback URL where no agent answers: a port held bound, never listening, for the
    session, so a connection to it is refused whatever else runs on the machine."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{held.getsockname()[1]}"


@pytest.fixture(autouse=True)
def _no_ambient_l9gpu_env(monkeypatch, no_agent_url):
    """Tests must not pick up L9GPU_* or OTEL_* settings from the machine, nor an agent
    listening on the default port: `l9gpu snapshot` asks ``no_agent_url`` unless told otherwise."""
    from agent import ambient_setting

    for name in list(os.environ):
        if ambient_setting(name):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("L9GPU_INCIDENTS_FROM", no_agent_url)


@pytest.fixture
def cgroups():
    """A throwaway parent cgroup under the cgroup2 mount; everything in it is removed after."""
    from cgroup_helpers import cgroup_tree

    with cgroup_tree() as tree:
        yield tree


@pytest.fixture
def apiserver():
    """A local HTTP server speaking the Kubernetes pod list and watch protocol."""
    from fakes.kubernetes_apiserver import FakeApiServer

    server = FakeApiServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fake_nvml_node(tmp_path, cgroups, apiserver):
    """`fakes.nvml_node.Node`: the agent on a one-GPU NVML fake with real processes in pod
    cgroups, named by the local API server; its agent is stopped after."""
    from fakes.nvml_node import Node

    n = Node(tmp_path, cgroups, apiserver)
    yield n
    if n.agent is not None:
        n.agent.stop()


@pytest.fixture
def sockdir():
    """A short temporary directory for unix sockets (a socket path must fit in 108 bytes;
    pytest's tmp_path may not)."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="l9gpu-sock-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def gpu_check():
    """benchmarks/gpu_check.py as a module (it is a script, not a package's): its sections
    tested on the NVML fake."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).resolve().parent.parent / "benchmarks"
                                                  / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)
