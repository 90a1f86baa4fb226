"""The page's "stale" line counts from the snapshot's own time, as the agent sees it.

The agent tells the snapshot's age in every answer of ``/`` and ``/api/v1/snapshot``
(``Server-Timing: age;dur=<ms>``, by its own clock), and the page adds the time since that
answer by the browser's monotonic clock: a page opened on a snapshot 23 s old says so at
once, whatever the browser's clock says. The browser is Debian's chromium, headless,
against the page served on loopback by the real aiohttp app.
"""

from __future__ import annotations

import asyncio
import re
import time

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from browser import DevTools, need_chromium

from exporter.core.model import DeviceSample, Snapshot
from exporter.web.app import make_app
from exporter.web.page import SnapshotPages, server_timing

AGE = 23.0  # seconds: how old the snapshot is when the page opens


def _snapshot(seq: int, age: float) -> Snapshot:
    return Snapshot(seq=seq, node="gpu-node", timestamp=time.time() - age,
                    devices=(DeviceSample(index=0, uuid="GPU-a", model="H100", utilization=0.5),))


def _age_ms(header: str) -> float:
    match = re.fullmatch(r'age;desc="snapshot age";dur=(\d+)', header)
    assert match, header
    return float(match.group(1))


def test_every_answer_tells_the_snapshots_age_by_the_agents_clock() -> None:
    holder = [_snapshot(1, AGE)]
    app = make_app(None, lambda: holder[0], lambda: True, "gpu-node")

    async def run() -> None:
        async with TestClient(TestServer(app)) as client:
            for path in ("/", "/api/v1/snapshot"):
                first = await client.get(path)
                assert first.status == 200
                assert AGE * 1000 <= _age_ms(first.headers["Server-Timing"]) < (AGE + 5) * 1000
                # A poll of the same snapshot: 304, and an age that has grown.
                await asyncio.sleep(0.05)
                again = await client.get(path, headers={"If-None-Match": first.headers["ETag"]})
                assert again.status == 304
                assert _age_ms(again.headers["Server-Timing"]) > _age_ms(first.headers["Server-Timing"])

    asyncio.run(run())
    assert server_timing(100.0, now=112.3456) == 'age;desc="snapshot age";dur=12346'
    assert server_timing(100.0, now=99.0) == 'age;desc="snapshot age";dur=0'  # never negative


def test_the_page_says_how_old_the_snapshot_is_not_how_long_it_has_been_open(tmp_path) -> None:
    need_chromium()
    holder = [_snapshot(1, AGE)]
    pages = SnapshotPages(lambda: holder[0], "gpu-node", interval=0.5)
    app = make_app(None, lambda: holder[0], lambda: True, "gpu-node", pages=pages)

    async def body() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with DevTools(tmp_path) as browser:
                # The browser's clock an hour behind the agent's: it must not matter.
                await browser.call("Page.addScriptToEvaluateOnNewDocument", source=(
                    "(function () { var now = Date.now.bind(Date); Date.now = function () {"
                    " return now() - 3600 * 1000; }; })();"))
                opened = time.monotonic()
                await browser.open(f"http://127.0.0.1:{port}/")
                text = await browser.wait_for(
                    "document.getElementById('live').className === 'warn'"
                    " && document.getElementById('live').textContent")
                shown = int(re.search(r"no new pass for (\d+) s", text).group(1))  # type: ignore[union-attr]
                assert AGE - 1 <= shown <= AGE + (time.monotonic() - opened) + 2, text
                # It grows as the page polls and gets 304s for the same snapshot.
                await browser.wait_for(
                    f"/no new pass for (\\d+) s/.exec(document.getElementById('live').textContent)[1] > {shown + 1}")
                # A new pass: live again.
                holder[0] = _snapshot(2, 0.0)
                await browser.wait_for("document.getElementById('live').className === 'ok'")
                assert await browser.evaluate("document.querySelector('main').dataset.seq") == "2"
        finally:
            await runner.cleanup()

    asyncio.run(body())
