"""The HTML report in a real browser: headless Chromium (Debian's `chromium`) over the DevTools protocol.

Three checks on the page built from the fixture runs of tests/test_report.py: it loads with no
console error or uncaught exception, every <img> decodes (img.decode() resolves and naturalWidth
> 0), and a screenshot is not blank (more than one colour). A control page with a broken image
and a console.error shows the harness sees both.

Outside CI the test skips when chromium is absent (`make browser` installs it); with CI set it
fails instead. The protocol is spoken directly with websocket-client: Chromium writes its port
to <user-data-dir>/DevToolsActivePort (--remote-debugging-port=0), the page's socket comes from
/json/list, and each command is one JSON message answered by id.

References: Chrome DevTools Protocol, https://chromedevtools.github.io/devtools-protocol/
(Page.navigate, Page.loadEventFired, Runtime.consoleAPICalled, Runtime.exceptionThrown,
Log.entryAdded, Runtime.evaluate, Page.captureScreenshot).
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_report import MODULE, _module, make_results  # tests/ is on sys.path (pytest's rootdir-relative import)

from llmlab.tools.report import write_report

IN_CI = bool(os.environ.get("CI"))
TIMEOUT = 60  # seconds: a cold Chromium start on a loaded 2-core machine takes ~5-10 s


def _need(what: str, hint: str) -> None:
    msg = f"{what} ({hint})"
    if IN_CI:
        pytest.fail(f"CI is set: the browser test must run, but {msg}")
    pytest.skip(msg)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium and one page, driven over the DevTools protocol."""

    def __init__(self, exe: str, profile: Path):
        import websocket

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--no-default-browser-check", "--hide-scrollbars", "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--user-data-dir={profile}", "--window-size=1280,1600", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + TIMEOUT
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                tail = self.proc.stderr.read().decode(errors="replace")[-800:]
                raise RuntimeError(f"chromium exited {self.proc.returncode}: {tail}")
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        page = None
        while page is None and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                page = next((t for t in json.load(r) if t.get("type") == "page"), None)
            time.sleep(0.1 if page is None else 0)
        if page is None:
            raise TimeoutError("chromium has no page target")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=TIMEOUT, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=1280, height=1600, deviceScaleFactor=1, mobile=False)

    def send(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, event: str) -> dict:
        deadline = time.monotonic() + TIMEOUT
        seen = len(self.events)
        while True:
            for msg in self.events[seen:]:
                if msg.get("method") == event:
                    return msg
            seen = len(self.events)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {event} within {TIMEOUT} s")
            self.events.append(json.loads(self.ws.recv()))

    def open(self, url: str) -> dict:
        """Load url; return what a reader's browser would tell: errors, images, a screenshot."""
        self.events.clear()
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        images = self.eval(
            "Promise.all(Array.from(document.images).map(i => i.decode().then(() => true, () => false)"
            ".then(ok => ({ok: ok && i.naturalWidth > 0, w: i.naturalWidth, alt: i.alt}))))"
        )
        self.eval("new Promise(r => setTimeout(r, 200))")  # let late console messages arrive
        shot = base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"])
        return {"errors": self.errors(), "images": images, "screenshot": shot}

    def eval(self, expression: str):
        r = self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:60]}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def errors(self) -> list[str]:
        out = []
        for m in self.events:
            p = m.get("params", {})
            if m.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                out.append("console." + p["type"] + ": " + args)
            elif m.get("method") == "Runtime.exceptionThrown":
                out.append("exception: " + str(p.get("exceptionDetails", {}).get("text", "")))
            elif m.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + str(p["entry"].get("text", "")) + " " + str(p["entry"].get("url", "")))
        return out

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    exe = chromium_path()
    if exe is None:
        _need("chromium is not installed", "`make browser` installs Debian's chromium")
    try:
        import websocket  # noqa: F401
    except ImportError:
        _need("websocket-client is not installed", "pip install -e '.[dev]'")
    b = Browser(exe, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


def one_colour(png: bytes) -> bool:
    from PIL import Image

    return Image.open(io.BytesIO(png)).convert("RGB").getcolors(maxcolors=1) is not None


@pytest.fixture(scope="module")
def page_in_chromium(browser, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, MODULE, _module())  # the fixture lab of tests/test_report.py
        root = make_results(tmp_path_factory.mktemp("results"), broken=True)
        path, n_runs, _ = write_report(root)
    assert n_runs == 2
    return browser.open(path.resolve().as_uri())


def test_report_loads_in_chromium_without_console_errors(page_in_chromium):
    assert page_in_chromium["errors"] == []


def test_every_image_in_the_report_decodes(page_in_chromium):
    images = page_in_chromium["images"]
    assert len(images) == 6  # 2 runs x (2 view charts + 1 figure)
    assert [i for i in images if not i["ok"]] == []
    assert min(i["w"] for i in images) > 200


def test_report_screenshot_is_not_blank(page_in_chromium):
    from PIL import Image

    shot = page_in_chromium["screenshot"]
    assert Image.open(io.BytesIO(shot)).size == (1280, 1600)
    assert not one_colour(shot)


def test_the_harness_sees_a_broken_image_a_console_error_and_a_blank_page(browser, tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
                   '<img alt="broken" src="data:image/png;base64,iVBORw0KGgoAAAA=">'
                   '<script>console.error("boom")</script></body></html>')
    got = browser.open(bad.as_uri())
    assert [i["ok"] for i in got["images"]] == [False]
    assert any("boom" in e for e in got["errors"])
    assert not one_colour(got["screenshot"])  # the broken-image icon and its alt text
    empty = tmp_path / "empty.html"
    empty.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body></body></html>')
    got = browser.open(empty.as_uri())
    assert got["errors"] == [] and got["images"] == []
    assert one_colour(got["screenshot"])  # a blank page is one colour
