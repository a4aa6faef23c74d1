"""Headless Chromium driven through its DevTools protocol (CDP) over a websocket: a page that is
loaded, typed into and clicked as a person would, for the tests that need a real browser's
behaviour (what it sends with a form, which cookies it keeps)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from tests.support.server import stop

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1400,1000",
]  # fmt: skip


class Page:
    """One tab: `call` sends a command and returns its result; events are kept until awaited."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.last_id = 0
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.last_id += 1
        sent = self.last_id
        await self.ws.send(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            message = json.loads(await self.ws.recv())
            if message.get("id") == sent:
                assert "error" not in message, (method, message["error"])
                return dict(message.get("result", {}))
            self.events.append(message)

    async def event(self, name: str, seconds: float = 30) -> dict[str, Any]:
        """The first kept or coming event `name` (and it is used up)."""
        async with asyncio.timeout(seconds):
            while True:
                for i, message in enumerate(self.events):
                    if message.get("method") == name:
                        return dict(self.events.pop(i).get("params", {}))
                self.events.append(json.loads(await self.ws.recv()))

    async def evaluate(self, expression: str) -> Any:
        found = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in found, found
        return found["result"].get("value")

    async def navigate(self, url: str) -> None:
        self.events.clear()
        await self.call("Page.navigate", url=url)
        await self.event("Page.loadEventFired")

    async def click(self, selector: str) -> None:
        """A left click at the element's centre, pressed and released, as a mouse does it."""
        box = await self.evaluate(
            f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        assert box, selector
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    async def click_in_view(self, selector: str) -> None:
        """Scrolled into view first (a panel may lie below the window's first screen), then clicked."""
        found = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (e) e.scrollIntoView({block: 'center'}); return !!e; })()"
        )
        assert found, selector
        await self.click(selector)

    async def submit(self, selector: str) -> None:
        """Click a form's button and wait for the page it loads."""
        await self.click_in_view(selector)
        await self.event("Page.loadEventFired")

    async def sign_in(self, base: str, key: str) -> None:
        """Open the dashboard and sign in through its form, typing the key as a person does."""
        await self.navigate(f"{base}/dashboard")
        await self.click("#apikey")
        await self.type(key)
        await self.submit("button[type=submit]")

    async def type(self, text: str) -> None:
        """Keys typed into the focused element, one character at a time."""
        for char in text:
            await self.call("Input.dispatchKeyEvent", type="keyDown", text=char, key=char)
            await self.call("Input.dispatchKeyEvent", type="keyUp", key=char)

    async def until(self, expression: str, seconds: float = 30) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + seconds
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"never true: {expression}"
            await asyncio.sleep(0.2)


def _launch(chromium: str, profile: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Chromium with a fresh profile and one blank tab; the DevTools port it picked itself."""
    profile.mkdir(parents=True, exist_ok=True)
    log = profile.parent / "chromium.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while not (active.exists() and len(active.read_text().splitlines()) >= 2):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise AssertionError(f"Chromium did not open its DevTools port: {log.read_text()[-3000:]}")
        time.sleep(0.1)
    return process, int(active.read_text().splitlines()[0])


@asynccontextmanager
async def browser_page(chromium: str, profile: Path) -> AsyncIterator[Page]:
    process, port = await asyncio.to_thread(_launch, chromium, profile)
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            targets = (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
        tab = next(t for t in targets if t.get("type") == "page")
        async with connect(tab["webSocketDebuggerUrl"], max_size=None) as ws:
            page = Page(ws)
            await page.call("Page.enable")
            yield page
    finally:
        await asyncio.to_thread(stop, process)
