"""The HTTP listener under connection floods, on real sockets against the real agent.

The agent runs as a subprocess, most often with its open-file limit held low (soft and
hard, so it cannot raise it), on an NVML fake whose GPU processes are real child
processes in real Kubernetes-shaped cgroups, named by a local API server
(tests/fakes/nvml_node.py, tests/fakes/kubernetes_apiserver.py). tests/flood.py holds the
silent, half-sent and header-bloated connections.
"""

from __future__ import annotations

import http.client
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent import REPO, AgentProcess, parse_metrics, pick
from cgroup_helpers import cgroup2_unwritable
from fakes.nvml_node import GiB, Node
from flood import Flood
from waiting import PATIENCE, wait_until

from exporter.web.descriptors import SPARE_DESCRIPTORS, connection_budget
from exporter.web.limits import ConnectionLimits

needs_cgroups = pytest.mark.skipif(bool(cgroup2_unwritable()), reason=cgroup2_unwritable() or "ok")


def rss_peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def node(fake_nvml_node):
    return fake_nvml_node


def scrape(agent: AgentProcess) -> dict:
    return parse_metrics(agent.scrape())


def _rejections(agent: AgentProcess, reason: str) -> float:
    """``l9gpu_http_rejections_total{reason}`` as /metrics serves it now (a pass's rendering)."""
    (value,) = pick(scrape(agent), "l9gpu_http_rejections_total", reason=reason)
    return value


# ---------------------------------------------------------------- the cap


def test_the_cap_keeps_descriptors_for_attribution() -> None:
    assert connection_budget(512, 1024, in_use=40, reserved=256) == 512
    assert connection_budget(512, 512, in_use=40, reserved=128) == 512 - 40 - 128 - SPARE_DESCRIPTORS
    assert connection_budget(512, 64, in_use=40, reserved=16) == 8  # never below a few
    import resource

    assert connection_budget(512, resource.RLIM_INFINITY, in_use=40, reserved=2048) == 512


@needs_cgroups
def test_a_flood_of_idle_connections_leaves_room_for_scrapes_and_attribution(node: Node) -> None:
    """Under an open-file limit of 512, more idle connections than the limit allows: the
    agent caps its connections below what attribution needs, closes the oldest idle ones
    to admit new ones, keeps answering scrapes, and a GPU process that starts meanwhile is
    attributed to its pod. The log says so in a few lines, without tracebacks."""
    node.add_gpu_process("before-flood")
    agent = node.start(open_files=512)
    wait_until(lambda: node.pod_memory("before-flood") == [1 * GiB], what="the first pod attributed")
    log = agent.log()
    cap = int(re.search(r"at most (\d+) HTTP connections, not --max-connections 512", log).group(1))
    assert cap < 512 - 128  # room kept for 512 // 4 pidfds and /proc files
    with Flood("127.0.0.1", agent.port, idle=600) as flood:
        wait_until(lambda: flood.pending() == 0 and flood.stats.closed_by_server >= 600 - cap,
                   what="the oldest idle connections closed to admit new ones")
        node.add_gpu_process("during-flood", gib=2)
        wait_until(lambda: node.pod_memory("during-flood") == [2 * GiB], what="the new GPU process attributed")
        for _ in range(5):
            metrics = scrape(agent)
            assert pick(metrics, "l9gpu_unattributed_processes") == [0.0]
            assert pick(metrics, "container_gpu_memory_used_bytes", pod="before-flood") == [1 * GiB]
        assert flood.stats.connect_failures == 0
        wait_until(lambda: _rejections(agent, "connection_limit_evicted") >= 600 - cap, what="the evictions counted")
    log = agent.log()
    assert "Traceback" not in log and "out of system resource" not in log
    limit_lines = [line for line in log.splitlines() if "connection limit" in line]
    assert 1 <= len(limit_lines) <= 6, limit_lines  # once per 10 s at most, with a count


@needs_cgroups
def test_unfinished_requests_with_huge_headers_are_refused_and_memory_stays_bounded(node: Node) -> None:
    """200 connections each sending ~960 KB of header fields, never the blank line that
    ends them: each is answered 431 once past --max-header-bytes and closed, so the agent
    holds no more than a little per connection (it grew by 560 MiB for 400 of them)."""
    node.add_gpu_process("steady")
    agent = node.start()
    wait_until(lambda: node.pod_memory("steady") == [1 * GiB], what="the pod attributed")
    before = rss_peak_mib(agent.proc.pid)
    with Flood("127.0.0.1", agent.port, heavy=200, header_bytes=960_000) as flood:
        wait_until(lambda: flood.stats.closed_by_server == 200, what="every bloated request refused and closed")
        assert scrape(agent)  # scrapes go on
    assert flood.stats.statuses == {"HTTP/1.1 431 Request Header Fields Too Large": 200}, flood.stats.summary
    wait_until(lambda: _rejections(agent, "header_too_large") == 200, what="the 431s counted")
    assert rss_peak_mib(agent.proc.pid) - before < 40, "the unfinished requests were held in memory"


def test_half_sent_and_silent_connections_are_closed_at_the_header_deadline(agent_factory) -> None:
    """A request line with one header and then nothing (slowloris), or nothing at all:
    answered 408 and closed once --header-timeout has passed, never before."""
    agent = agent_factory("--backend", "simulated", "--header-timeout", "1s")
    head = b"GET /metrics HTTP/1.1\r\nHost: l9gpu\r\n"
    with Flood("127.0.0.1", agent.port, idle=20, heavy=20, head=head) as flood:
        wait_until(lambda: flood.stats.closed_by_server == 40, what="every unfinished connection closed")
    assert flood.stats.statuses == {"HTTP/1.1 408 Request Timeout": 40}, flood.stats.summary
    assert min(flood.stats.lifetimes) >= 1.0
    assert agent.get("/healthz")[0] == 200
    wait_until(lambda: _rejections(agent, "header_timeout") == 40, what="the 408s counted")


def test_idle_keepalive_connections_close_after_the_timeout(agent_factory) -> None:
    """A keep-alive connection that answered a scrape and then stays silent is closed by
    the agent after --keepalive-timeout (an hour by aiohttp's default)."""
    agent = agent_factory("--backend", "simulated", "--keepalive-timeout", "1s")
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=PATIENCE)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Connection", "keep-alive").lower() != "close"
        resp.read()
        # The agent's idle timer starts once it has sent the answer: after this request went
        # out, before the client has read the answer. Time the wait from the request.
        asked = time.monotonic()
        conn.request("GET", "/healthz")  # the same connection, kept alive
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b"ok\n"
        conn.sock.settimeout(PATIENCE)
        assert conn.sock.recv(1) == b""  # the agent closed it
        assert time.monotonic() - asked >= 1.0
    finally:
        conn.close()


def test_request_lines_fields_and_header_counts_are_limited(agent_factory) -> None:
    """Besides the total, a request line or one header field over 8190 bytes, or more than
    100 header fields, is answered 400 (aiohttp's parser limits) and the agent goes on."""
    agent = agent_factory("--backend", "simulated")
    for request in (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
                    b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n"):
        with socket.create_connection(("127.0.0.1", agent.port), timeout=PATIENCE) as sock:
            sock.sendall(request)
            answer = sock.recv(4096)
        assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:200]
    assert agent.get("/healthz")[0] == 200


def test_the_soft_open_file_limit_is_raised_to_the_hard_limit(tmp_path) -> None:
    """As systemd starts the shipped unit (soft limit 1024, hard its LimitNOFILE, here at
    most the test's own hard limit): the agent raises the soft limit to the hard one, says
    so, and has no reason to lower --max-connections."""
    import resource

    unit = (REPO / "deploy" / "systemd" / "l9gpu.service").read_text()
    unit_hard = int(re.search(r"^LimitNOFILE=(\d+)$", unit, re.M).group(1))
    assert unit_hard >= 65536
    hard = min(unit_hard, resource.getrlimit(resource.RLIMIT_NOFILE)[1])  # raising it needs CAP_SYS_RESOURCE
    if hard < 2048:
        pytest.skip(f"the test's own hard open-file limit ({hard}) is too low to tell")
    agent = AgentProcess(["--backend", "simulated"], open_files=(1024, hard), log_path=tmp_path / "agent.log")
    try:
        agent.start()
        log = agent.log()
        assert f"open-file limit raised from 1024 to {hard} (hard limit {hard})" in log
        assert "at most 512 connections" in log and "not --max-connections" not in log
        limits = Path(f"/proc/{agent.proc.pid}/limits").read_text()
        assert re.search(rf"Max open files\s+{hard}\s+{hard}", limits), limits
    finally:
        agent.stop()


def test_limits_flags_are_validated_with_one_clear_line() -> None:
    from agent import run_cli

    for flag, value, message in (("--max-connections", "0", "at least 1 is needed"),
                                 ("--max-connections", "many", "not a whole number of connections"),
                                 ("--keepalive-timeout", "-1s", ""), ("--header-timeout", "soon", ""),
                                 ("--max-header-bytes", "100", "too small")):
        result = run_cli(["serve", "--backend", "simulated", "--listen", "127.0.0.1:0", flag, value])
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and flag in lines[0] and message in lines[0], result.stderr
    with pytest.raises(ValueError, match="max_header_bytes"):
        ConnectionLimits(max_header_bytes=10)


# ---------------------------------------------------------------- accept errors

_LISTENER = r"""
import asyncio, resource, sys, time
from aiohttp import web
from exporter.output.counts import Rejections
from exporter.web.descriptors import descriptors_in_use
from exporter.web.limits import ConnectionLimits
from exporter.web.logs import install_accept_error_log
from exporter.web.site import GuardedSite
from exporter.app.logs import setup_logging

setup_logging("info", "text")
seconds, interval = float(sys.argv[1]), float(sys.argv[2])

async def main():
    app = web.Application()
    runner = web.AppRunner(app, handle_signals=False, **ConnectionLimits().handler_kwargs())
    await runner.setup()
    # no cap to speak of: the open-file limit is what runs out
    site = GuardedSite(runner, "127.0.0.1", 0, ConnectionLimits(max_connections=100000, header_timeout=600))
    rejections = Rejections()
    install_accept_error_log(asyncio.get_running_loop(), site.guard.describe, interval=interval, rejections=rejections)
    await site.start()
    limit = descriptors_in_use() + 10
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    print(site.port, flush=True)
    await asyncio.sleep(seconds)
    await runner.cleanup()
    print("accept_failed", rejections.value("accept_failed"), flush=True)

asyncio.run(main())
"""


def test_accept_errors_are_logged_once_per_interval_with_a_count(tmp_path) -> None:
    """A listener out of descriptors (its open-file limit a few above what it has open):
    asyncio fails every accept and logged a traceback for each, thousands a second; the
    agent's handler logs one line per interval with the count and the connections open."""
    seconds, interval = 4.0, 1.0
    proc = subprocess.Popen([sys.executable, "-c", _LISTENER, str(seconds), str(interval)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    try:
        port = int(proc.stdout.readline())
        socks = []
        for _ in range(40):
            sock = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE)  # the kernel's backlog takes it
            socks.append(sock)
        out, err = proc.communicate(timeout=PATIENCE + seconds)
    finally:
        proc.kill()
        for sock in socks:
            sock.close()
    lines = [line for line in err.splitlines() if "cannot accept connections" in line]
    assert "Traceback" not in err and "out of system resource" not in err, err[-2000:]
    assert 1 <= len(lines) <= seconds / interval + 2, lines
    assert "Too many open files" in lines[0] and "connections open of at most 100000" in lines[0]
    assert any(re.search(r"\((\d+) times in the last \d+s\)", line) for line in lines[1:]), lines
    # every failed accept is counted (l9gpu_http_rejections_total{reason="accept_failed"}),
    # those said in the log and those after its last line
    said = 1 + sum(int(n) for n in re.findall(r"\((\d+) times in the last \d+s\)", "\n".join(lines[1:])))
    assert int(re.search(r"accept_failed (\d+)", out).group(1)) >= said > len(lines)
