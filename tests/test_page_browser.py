"""The agent's page in a real browser (Debian's chromium, headless) on the simulated node.

The agent runs as a subprocess on the demo scenario; chromium loads ``/`` from it. The
screenshots are kept under pytest's temporary directory (printed with ``-s``), to look at.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from html.parser import HTMLParser

import bcrypt
import pytest
import yaml
from agent import REPO, AgentProcess, run_cli
from browser import DevTools, dump_dom, need_chromium, png_size_and_colours, screenshot
from waiting import wait_until

SCENARIO = yaml.safe_load((REPO / "exporter" / "devices" / "simulated" / "scenarios" / "default.yaml").read_text())
PODS = sorted({p["workload"]["pod"] for p in SCENARIO["processes"] if "pod" in p["workload"]}
              | {a["workload"]["pod"] for a in SCENARIO.get("allocations", [])})
AGENT_ARGS = ["--backend", "simulated", "--interval", "250ms", "--pod-label", "team"]


class Dom(HTMLParser):
    """The parts of the page the tests look at: GPU sections, table rows, the attention list."""

    def __init__(self, text: str):
        super().__init__()
        self.gpus: dict[str, str] = {}  # section id -> its text
        self.rows: list[tuple[str, dict[str, str | None], str]] = []  # (section id, tr attrs, text)
        self.attention: list[str] = []
        self.summary = ""
        self.main: dict[str, str | None] = {}
        self._stack: list[tuple[str, dict[str, str | None]]] = []
        self._texts: list[list[str]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag in ("meta", "link", "br", "input", "img"):
            return
        self._stack.append((tag, dict(attrs)))
        self._texts.append([])
        if tag == "main":
            self.main = dict(attrs)

    def handle_endtag(self, tag):
        while self._stack:
            open_tag, attrs = self._stack.pop()
            text = " ".join("".join(self._texts.pop()).split())
            if self._texts:  # inline elements run on, block ones are apart
                self._texts[-1].append(text if open_tag in ("span", "b", "i", "a") else f" {text} ")
            section = next((a.get("id") for t, a in reversed(self._stack) if t == "section"), None)
            if open_tag == "section" and "gpu" in (attrs.get("class") or ""):
                self.gpus[attrs.get("id") or ""] = text
            elif open_tag == "p" and attrs.get("class") == "summary":
                self.summary = text
            elif open_tag == "tr":
                self.rows.append((section or "", attrs, text))
            elif open_tag == "li" and any(t == "ul" and a.get("class") == "attention" for t, a in self._stack):
                self.attention.append(text)
            if open_tag == tag:
                break

    def handle_data(self, data):
        if self._texts:
            self._texts[-1].append(data)


def _seq(agent: AgentProcess) -> int:
    status, _, body = agent.get("/api/v1/snapshot")
    return json.loads(body)["seq"] if status == 200 else 0


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    need_chromium()
    proc = AgentProcess(AGENT_ARGS, log_path=tmp_path_factory.mktemp("agent") / "agent.log")
    proc.start()
    # a few passes: the zombie idle for three, GPM activity known
    wait_until(lambda: _seq(proc) >= 5, what="five passes")
    yield proc
    proc.stop()


def test_dom_holds_every_pod_and_flags_the_zombie(agent, tmp_path):
    result = dump_dom(agent.url + "/", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    dom = Dom(result.stdout)
    assert sorted(dom.gpus) == [f"gpu-{i}" for i in range(8)]
    for pod in PODS:
        assert any(pod in text for _, _, text in dom.rows), f"{pod} is not on the page"
    assert any(s == "gpu-6" and "Slurm job 4242 step 0 rank 0 (bob)" in t for s, _, t in dom.rows)
    assert any(s == "gpu-1" and "unattributed: 1 process" in t and "nvtop-probe" in t for s, _, t in dom.rows)
    zombies = [(s, t) for s, a, t in dom.rows if a.get("data-flag") == "zombie"]
    assert len(zombies) == 1
    section, text = zombies[0]
    assert section == "gpu-6" and "data-science/jupyter-alice-0/notebook" in text
    assert "zombie" in text and "70.0 GiB" in text and " 0% " in f" {text} "
    unused = [(s, t) for s, a, t in dom.rows if a.get("data-flag") == "allocated-unused"]
    assert len(unused) == 1 and unused[0][0] == "gpu-7" and "idle-reservation-0" in unused[0][1]
    # the demo's two degraded GPUs come first (docs/HEALTH.md), then the workloads' flags
    assert [t.split(":")[0] for t in dom.attention] == [
        "GPU 3 is degraded (pcie_downgraded)", "GPU 4 is degraded (row_remap_pending)", "zombie",
        "allocated, unused"]
    assert "inspect hardware" in dom.attention[0] and "reset gpu" in dom.attention[1]
    assert "jupyter-alice-0" in dom.attention[2] and "GPU 6" in dom.attention[2] and "70.0 GiB" in dom.attention[2]
    assert "idle-reservation-0" in dom.attention[3] and "GPU 7" in dom.attention[3]
    assert "degraded · reset gpu" in dom.gpus["gpu-4"] and "healthy" in dom.gpus["gpu-0"]
    assert "NVIDIA H100 80GB HBM3" in dom.gpus["gpu-0"] and "/ 80.0 GiB" in dom.gpus["gpu-0"]
    assert "power" in dom.gpus["gpu-0"] and "°C" in dom.gpus["gpu-0"]
    # each workload once, whatever number of GPUs it uses: the vLLM pod (GPUs 0-1), the trainer
    # (2-5), the three small pods, the Slurm step and the notebook on 6, the reservation on 7
    assert dom.summary.startswith("8 of 8 GPUs up · 8 workloads · memory"), dom.summary


@pytest.mark.parametrize("name,width,height", [("laptop", 1440, 1300), ("phone", 390, 2600)])
def test_screenshot_at_laptop_and_phone_widths(agent, tmp_path, name, width, height):
    path = screenshot(agent.url + "/", tmp_path / f"page-{name}.png", width, height)
    print(f"screenshot: {path}")
    got_width, got_height, distinct_rows = png_size_and_colours(path)
    assert (got_width, got_height) == (width, height)
    assert distinct_rows > 100, "the screenshot is (nearly) blank"


def _stop_agent_later(agent: AgentProcess) -> None:
    agent.stop()


def test_page_refreshes_in_place_fits_a_phone_and_says_when_the_agent_is_gone(tmp_path):
    need_chromium()
    agent = AgentProcess(AGENT_ARGS, log_path=tmp_path / "agent.log")
    agent.start()

    async def body():
        async with DevTools(tmp_path) as browser:
            await browser.open(agent.url + "/")
            first = int(await browser.evaluate("document.querySelector('main').dataset.seq"))
            await browser.evaluate("window.loadedOnce = true")
            # The script swaps in newer snapshots without reloading the page.
            await browser.wait_for(f"Number(document.querySelector('main').dataset.seq) >= {first + 2}")
            assert await browser.evaluate("window.loadedOnce") is True
            assert await browser.evaluate("document.getElementById('live').className") == "ok"
            zombie = await browser.wait_for("document.querySelector('tr.zombie')?.textContent")
            assert "jupyter-alice-0" in zombie
            # Readable on a phone: nothing wider than the screen.
            await browser.call("Emulation.setDeviceMetricsOverride", width=390, height=844, deviceScaleFactor=2,
                               mobile=True)
            await browser.wait_for("window.innerWidth === 390")
            assert await browser.evaluate("document.documentElement.scrollWidth") <= 390
            assert await browser.evaluate(
                "getComputedStyle(document.querySelector('thead')).display") == "none"  # rows stack instead
            # The agent goes away: the page keeps its data and says so.
            await asyncio.get_running_loop().run_in_executor(None, _stop_agent_later, agent)
            await browser.wait_for("document.getElementById('live').className === 'bad'")
            assert "agent unreachable" in await browser.evaluate("document.getElementById('live').textContent")
            assert "jupyter-alice-0" in await browser.evaluate("document.querySelector('main').textContent")

    try:
        asyncio.run(body())
    finally:
        agent.stop()


def _comparable(doc: dict) -> dict:
    """What a pass of the same node shows whoever reads it, and when: identities and steady values."""
    gpus = []
    for g in doc["gpus"]:
        gpus.append({
            "gpu": (g["index"], g["uuid"], g["model"], g["memory_total_bytes"], g["power_limit_watts"], g["up"]),
            "processes": sorted((p["pid"], p["comm"], p["owner"], p["pod_uid"]) for p in g["processes"]),
            "allocations": sorted((a["pod"], a["container"], a["device_id"]) for a in g["allocations"]),
            "workloads": sorted((w["owner"], w["pod_uid"], tuple(w["pids"]), w["allocated"], w["zombie"],
                                 w["allocated_unused"], json.dumps(w["pod_labels"])) for w in g["workloads"]),
            "unattributed": g["unattributed"]["processes"],
        })
    return {"node": doc["node"], "gpus": gpus}


def _shape(value):
    """The keys of every object, recursively (lists by their first element)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items() if k != "gpm"}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return None


def test_api_serves_the_json_snapshot_json_prints_on_the_same_node(agent):
    status, headers, body = agent.get("/api/v1/snapshot")
    assert status == 200 and headers["Content-Type"] == "application/json; charset=utf-8"
    served = json.loads(body)
    printed = run_cli(["snapshot", *AGENT_ARGS, "--json"])
    assert printed.returncode == 0, printed.stderr
    cli = json.loads(printed.stdout)
    assert printed.stdout == json.dumps(cli, indent=2) + "\n"  # indented for people, compact for programs
    assert body.decode() == json.dumps(served, separators=(",", ":")) + "\n"
    assert _shape(served) == _shape(cli)
    assert _comparable(served) == _comparable(cli)
    assert served["seq"] >= 3 and cli["seq"] == 1
    zombie = [w for g in served["gpus"] for w in g["workloads"] if w["zombie"]]
    assert [(w["pod"], w["memory_used_bytes"]) for w in zombie] == [("jupyter-alice-0", 70 * 2**30)]
    assert zombie[0]["idle_seconds"] > 0  # the running agent's idle timer has been counting


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_page_and_api_need_the_web_config_credentials(tmp_path):
    need_chromium()
    config = tmp_path / "web.yml"
    config.write_text(yaml.safe_dump({"basic_auth_users": {
        "oncall": bcrypt.hashpw(b"night shift", bcrypt.gensalt(5)).decode()}}))
    agent = AgentProcess([*AGENT_ARGS, "--web-config", str(config)], log_path=tmp_path / "agent.log")
    agent.start()
    try:
        for path in ("/", "/api/v1/snapshot", "/metrics"):
            status, headers, _ = agent.get(path)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Basic"), path
            assert agent.get(path, _basic("oncall", "wrong"))[0] == 401
            assert agent.get(path, _basic("oncall", "night shift"))[0] == 200
        assert agent.get("/healthz")[0] == 200
        refused = dump_dom(agent.url + "/", tmp_path)
        assert "jupyter-alice-0" not in refused.stdout
        allowed = dump_dom(f"http://oncall:night%20shift@127.0.0.1:{agent.port}/", tmp_path)
        assert all(pod in allowed.stdout for pod in PODS), allowed.stderr[-2000:]

        async def refresh_with_credentials():  # the page's own refreshes carry the credentials too
            async with DevTools(tmp_path) as browser:
                await browser.answer_password_prompts("oncall", "night shift")
                await browser.open(agent.url + "/")
                first = int(await browser.evaluate("document.querySelector('main').dataset.seq"))
                await browser.wait_for(f"Number(document.querySelector('main').dataset.seq) >= {first + 2}")
                assert await browser.evaluate("document.getElementById('live').className") == "ok"
                assert browser.prompts == 1  # asked once, when the page opened; refreshes reuse the answer

        asyncio.run(refresh_with_credentials())
    finally:
        agent.stop()


def test_no_external_assets(agent):
    with urllib.request.urlopen(agent.url + "/", timeout=5) as resp:
        page = resp.read().decode()
    assert "src=" not in page and "<link" not in page and "@import" not in page and "url(" not in page
    assert len(page.encode()) < 64 * 1024


def test_a_gpu_fallen_off_the_bus_is_down_on_metrics_and_the_page(tmp_path):
    """After Xid 79 the simulated driver answers every call about the GPU with GPU_IS_LOST,
    as a real one does: /metrics and the page show it down, with nobody's share on it."""
    need_chromium()
    doc = yaml.safe_load((REPO / "exporter" / "devices" / "simulated" / "scenarios" / "incidents.yaml").read_text())
    doc["xids"] = [{"at": "1s", "gpu": 3, "xid": 79, "text": "GPU has fallen off the bus."}]
    scenario = tmp_path / "lost.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    agent = AgentProcess(["--backend", "simulated", "--scenario", str(scenario), "--kernel-log", "auto",
                          "--interval", "250ms"], log_path=tmp_path / "agent.log")
    agent.start()
    try:
        def gpu_up() -> dict[str, float]:
            return {labels["gpu"]: value for labels, value in agent.samples().get("gpu_up", [])}

        wait_until(lambda: gpu_up().get("3") == 0.0, what="GPU 3 down on /metrics")
        samples = agent.samples()
        assert gpu_up() == {"0": 1.0, "1": 1.0, "2": 1.0, "3": 0.0}
        for family in ("gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_power_watts"):
            assert {labels["gpu"] for labels, _ in samples[family]} == {"0", "1", "2"}, family
        # the three pods on it have no share of a GPU that answers nothing
        assert not [labels for labels, _ in samples["container_gpu_utilization_ratio"] if labels["gpu"] == "3"]
        assert [v for labels, v in samples["gpu_xid_errors_total"] if labels["gpu"] == "3"] == [1.0]
        assert [v for labels, v in samples["l9gpu_backend_errors_total"] if labels["reason"] == "gpu_lost"][0] > 0
        assert [v for labels, v in samples["gpu_health"] if labels["gpu"] == "3" and labels["state"] == "unhealthy"] \
            == [1.0]

        result = dump_dom(agent.url + "/", tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        dom = Dom(result.stdout)
        card = dom.gpus["gpu-3"]
        section = result.stdout[result.stdout.index('id="gpu-3"'):].split("</section>")[0]
        assert '<span class="state">down</span>' in section and "GPU is lost" in card
        assert result.stdout.count('<span class="state">down</span>') == 1
        assert "util" not in card and "%" not in card  # no utilisation, no pods' SM shares
        assert any(item.startswith("GPU 3 is down: GPU is lost") for item in dom.attention), dom.attention
        assert any(item.startswith("GPU 3 is unhealthy (gpu_lost") and "reboot node" in item for item in dom.attention)
        assert dom.summary.startswith("3 of 4 GPUs up"), dom.summary
        # the Incidents panel: "GPU 3" never wraps between its two words
        wait_until(lambda: '<td>GPU&nbsp;3</td>' in dump_dom(agent.url + "/", tmp_path).stdout,
                   what="the Xid 79 incident on the page")
    finally:
        agent.stop()
