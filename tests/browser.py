"""Debian's chromium, headless, against an agent on loopback.

`dump_dom` and `screenshot` run chromium's own ``--dump-dom`` and ``--screenshot``; `DevTools`
drives a running chromium over the DevTools protocol (a websocket, spoken with aiohttp)
to watch a page change over time. Each run gets a fresh profile directory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from waiting import PATIENCE

#: Flags for a quiet, self-contained headless run: no sandbox (tests run as root), no GPU,
#: no first-run UI, and nothing that calls out to the network on its own.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio")


def need_chromium() -> str:
    """Path of Debian's chromium; skip without it, but fail in CI, where `make test` installs it."""
    path = shutil.which("chromium")
    if path is None:
        message = "chromium is not installed (Debian package chromium; `make test` installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def _run(args: list[str], workdir: Path, timeout: float = 90.0) -> subprocess.CompletedProcess:
    profile = tempfile.mkdtemp(prefix="chromium-", dir=workdir)
    try:
        return subprocess.run([need_chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def dump_dom(url: str, workdir: Path) -> subprocess.CompletedProcess:
    """``chromium --dump-dom URL``: the DOM after the page loaded, on stdout."""
    return _run(["--dump-dom", url], workdir)


def screenshot(url: str, path: Path, width: int, height: int) -> Path:
    """``chromium --screenshot`` of ``url`` in a ``width`` x ``height`` window, as a PNG at ``path``."""
    result = _run([f"--window-size={width},{height}", f"--screenshot={path}", url], path.parent)
    assert path.exists(), f"no screenshot: {result.stderr[-2000:]}"
    return path


def png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """(width, height, number of distinct pixel rows) of an 8-bit RGB/RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, channels = 8, b"", 0, 0, 4
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8, depth
            channels = {2: 3, 6: 4}[colour]
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + width * channels
    rows = {raw[i * stride + 1:(i + 1) * stride] for i in range(height)}
    return width, height, len(rows)


class DevTools:
    """A headless chromium with its DevTools endpoint on a loopback port.

    Use as an async context manager; `open` loads a URL in the page, `evaluate` runs a
    JavaScript expression there and returns its value, `wait_for` polls one until it is
    truthy.
    """

    def __init__(self, workdir: Path, width: int = 1280, height: int = 900):
        self.workdir = workdir
        self.size = (width, height)
        self._ids = itertools.count(1)
        self.proc: subprocess.Popen | None = None

    async def __aenter__(self) -> DevTools:
        self.profile = tempfile.mkdtemp(prefix="chromium-", dir=self.workdir)
        self._log = open(Path(self.profile).with_suffix(".log"), "wb")
        self.proc = subprocess.Popen(
            [need_chromium(), *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--window-size={self.size[0]},{self.size[1]}", "about:blank"],
            stdout=self._log, stderr=subprocess.STDOUT)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("chromium did not open its DevTools port")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            pages = [t for t in await resp.json(content_type=None) if t.get("type") == "page"]
        self.ws = await self.session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        self._pending: dict[int, asyncio.Future] = {}
        self._credentials: tuple[str, str] | None = None
        self.prompts = 0  # HTTP authentication prompts the browser showed
        self._tasks: set[asyncio.Task] = set()
        self._reader = asyncio.create_task(self._read())
        await self.call("Page.enable")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._reader.cancel()
        await self.ws.close()
        await self.session.close()
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    async def _read(self) -> None:
        async for message in self.ws:
            data = json.loads(message.data)
            future = self._pending.pop(data.get("id"), None) if "id" in data else None
            if future is not None and not future.done():
                future.set_result(data)
            elif data.get("method") == "Fetch.authRequired":
                # What a person does at the browser's password prompt.
                self.prompts += 1
                params = data["params"]
                if self._credentials is None:
                    answer = {"response": "CancelAuth"}
                else:
                    answer = {"response": "ProvideCredentials", "username": self._credentials[0],
                              "password": self._credentials[1]}
                self._spawn(self.call("Fetch.continueWithAuth", requestId=params["requestId"],
                                      authChallengeResponse=answer))
            elif data.get("method") == "Fetch.requestPaused":
                self._spawn(self.call("Fetch.continueRequest", requestId=data["params"]["requestId"]))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)  # keep a reference until it is done
        task.add_done_callback(self._tasks.discard)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result."""
        ident = next(self._ids)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        await self.ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        message = await asyncio.wait_for(future, 60)
        if "error" in message:
            raise RuntimeError(f"{method}: {message['error']}")
        return message.get("result", {})

    async def answer_password_prompts(self, user: str, password: str) -> None:
        """From now on, answer the browser's HTTP authentication prompts with these credentials."""
        self._credentials = (user, password)
        await self.call("Fetch.enable", handleAuthRequests=True, patterns=[{"urlPattern": "*"}])

    async def open(self, url: str) -> None:
        """Navigate to ``url`` and wait until its document has loaded."""
        await self.call("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    async def evaluate(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = PATIENCE) -> Any:
        """Poll ``expression`` until it is truthy; its value (fails after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"still false after {timeout}s: {expression}")
            await asyncio.sleep(0.1)
