"""Headless Chromium driven over the DevTools protocol: open a page, wait until it shows something, screenshot it.

One browser serves a test: it starts once (the first start on a cold machine builds
Chromium's font cache and may take a while), and a page is read as a person reads it,
its rendered text, polled until it shows what the test waits for. A wait that ends
without it fails with the text the page did show.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import websocket

BROWSER_START = 180.0
"""Seconds Chromium may take to start: the first start on a machine sets up its profile and font cache."""


class Browser:
    """Chromium with one page, controlled through the DevTools protocol."""

    def __init__(self, chromium: Path) -> None:
        self._profile = Path(tempfile.mkdtemp(prefix="ferry-chromium-"))
        self._log = self._profile / "chromium.log"
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                [
                    str(chromium), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--remote-debugging-port=0", "--remote-allow-origins=*",
                    f"--user-data-dir={self._profile}", "--window-size=1400,900", "about:blank",
                ],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self._calls = 0
        self._socket = websocket.create_connection(self._page_socket(), timeout=60)

    def _page_socket(self) -> str:
        """The page's DevTools socket, once Chromium has written its port and opened the page."""
        port_file = self._profile / "DevToolsActivePort"
        deadline = time.monotonic() + BROWSER_START
        while True:
            if self._process.poll() is not None:
                raise AssertionError(f"Chromium exited ({self._process.returncode}):\n{self._chromium_log()}")
            if port_file.exists() and port_file.read_text().strip():
                port = port_file.read_text().split()[0]
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
                    pages = [t for t in json.load(response) if t["type"] == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            if time.monotonic() > deadline:
                raise AssertionError(f"Chromium did not start within {BROWSER_START:.0f}s:\n{self._chromium_log()}")
            time.sleep(0.5)

    def _chromium_log(self) -> str:
        return self._log.read_text(errors="replace")[-3000:] if self._log.exists() else "(no output)"

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Sends one DevTools command and returns its result (events in between are skipped)."""
        self._calls += 1
        self._socket.send(json.dumps({"id": self._calls, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == self._calls:
                if "error" in message:
                    raise AssertionError(f"DevTools {method} failed: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def text(self) -> str:
        """The page's text as rendered (what a person reads), empty while there is no body yet."""
        evaluated = self.call(
            "Runtime.evaluate", expression="document.body ? document.body.innerText : ''", returnByValue=True
        )
        return str(evaluated.get("result", {}).get("value", ""))

    def wait_for(self, what: str, shows: Callable[[str], bool], within: float) -> str:
        """Polls the page's text until `shows` accepts it; returns that text, or fails with what the page showed."""
        deadline = time.monotonic() + within
        while True:
            text = self.text()
            if shows(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"the page did not show {what} within {within:.0f}s; it showed:\n{text[-3000:]}")
            time.sleep(0.5)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self._socket.close()
        self._process.terminate()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        deadline = time.monotonic() + 10
        while self._profile.exists():  # Chromium's helpers may still write into it for a moment
            shutil.rmtree(self._profile, ignore_errors=True)
            if time.monotonic() > deadline:
                break  # left in the temporary folder, as before; not worth failing a test for
            time.sleep(0.1)

    def __enter__(self) -> Browser:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
