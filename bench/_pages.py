"""The two viewer pages in headless Chromium, each reading the marker off what it shows.

Ours: the service's viewer page (`/view/{id}?token=…`), which plays WebRTC in a `<video>`;
bytes are the page's `getStats()` inbound-rtp payload and header bytes. Theirs: noVNC's
`vnc.html` through websockify, which paints a `<canvas>`; bytes are the payloads of the
messages its WebSocket receives, counted by a wrapper installed before noVNC loads.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Literal

from playwright.sync_api import Browser, Page
from playwright.sync_api import Error as PlaywrightError

from bench._marker import SAMPLER_JS, MarkerReading, sampler_config
from bench._novnc import VncStack
from bench._service import Service
from tests.conftest import CHROMIUM_ARGS as TEST_CHROMIUM_ARGS

Kind = Literal["ours", "novnc"]
KINDS: tuple[Kind, ...] = ("ours", "novnc")

CHROMIUM_ARGS = [
    *TEST_CHROMIUM_ARGS,
    "--use-fake-ui-for-media-stream",
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]
VIEWPORT = {"width": 1280, "height": 900}
SELECTORS: dict[Kind, str] = {"ours": "#screen", "novnc": "#noVNC_container canvas"}

_COUNT_WEBSOCKET_BYTES = """
// A WebSocket that counts what it receives. noVNC checks the socket's own prototype for
// the methods it needs, so this returns real WebSocket objects rather than a subclass.
window.__wsBytes = 0;
const RealWebSocket = window.WebSocket;
function CountingWebSocket(...args) {
  const socket = new RealWebSocket(...args);
  socket.addEventListener("message", (event) => {
    const data = event.data;
    window.__wsBytes += data.byteLength ?? data.size ?? data.length ?? 0;
  });
  return socket;
}
CountingWebSocket.prototype = RealWebSocket.prototype;
for (const name of ["CONNECTING", "OPEN", "CLOSING", "CLOSED"]) {
  CountingWebSocket[name] = RealWebSocket[name];
}
window.WebSocket = CountingWebSocket;
"""
_BYTES_JS: dict[Kind, str] = {
    "ours": """async () => {
      let n = 0;
      (await view.pc.getStats()).forEach((e) => {
        if (e.type === "inbound-rtp" && e.kind === "video")
          n += (e.bytesReceived ?? 0) + (e.headerBytesReceived ?? 0);
      });
      return n;
    }""",
    "novnc": "async () => window.__wsBytes",
}
_RECEIVER_JS = """async () => {
  let out = {};
  (await view.pc.getStats()).forEach((e) => {
    if (e.type === "inbound-rtp" && e.kind === "video") out = e;
  });
  return out;
}"""
RECEIVER_TOTALS = (
    "jitterBufferDelay", "jitterBufferTargetDelay", "jitterBufferMinimumDelay",
    "jitterBufferEmittedCount", "totalDecodeTime", "totalProcessingDelay", "framesDecoded",
    "framesDropped", "freezeCount", "nackCount", "pliCount",
)  # fmt: skip
"""The cumulative figures of Chromium's inbound-rtp video stats that `receiver()` keeps."""
_READ_JS = """() => {
  const s = window.__marker;
  return [s.latencies.length, s.changes, s.presented, s.reads, s.invalid];
}"""


@dataclass
class ViewerPage:
    kind: Kind
    page: Page

    def reading(self) -> MarkerReading:
        counts = self.page.evaluate(_READ_JS)
        nbytes = self.page.evaluate(_BYTES_JS[self.kind])
        return MarkerReading(time.monotonic(), *counts, bytes=int(nbytes))

    def latencies_ms(self, start: MarkerReading, end: MarkerReading) -> list[float]:
        """The latency samples taken between two readings, milliseconds."""
        return self.page.evaluate(
            "([a, b]) => window.__marker.latencies.slice(a, b)",
            [start.latencies_ms, end.latencies_ms],
        )

    def latency_stages_ms(
        self, start: MarkerReading, end: MarkerReading
    ) -> list[tuple[float, float] | None]:
        """For each latency sample between two readings, drawn → (frame received, frame
        presented) in milliseconds; None where the page had no video frame metadata."""
        return self.page.evaluate(
            "([a, b]) => window.__marker.stages.slice(a, b)",
            [start.latencies_ms, end.latencies_ms],
        )

    def receiver(self) -> dict[str, float]:
        """Chromium's WebRTC receiver totals (ours only), see `RECEIVER_TOTALS`."""
        stats = self.page.evaluate(_RECEIVER_JS)
        return {name: stats.get(name, 0) for name in RECEIVER_TOTALS}

    def wait_for_samples(self, count: int, timeout_s: float) -> None:
        """Until the page holds `count` latency samples (or the timeout: fewer is a result)."""
        deadline = time.monotonic() + timeout_s
        while self.reading().latencies_ms < count and time.monotonic() < deadline:
            time.sleep(0.25)

    def close(self) -> None:
        """Hang up as a page that leaves does (ours: `RTCPeerConnection.close()`), then go.

        (Closing the browser context alone sends no DTLS close: the service would keep
        streaming to the dead peer until ICE consent fails, about 30 s.)"""
        if self.kind == "ours":
            with contextlib.suppress(PlaywrightError):
                self.page.evaluate("() => view.pc && view.pc.close()")
        self.page.context.close()


def _install_sampler(page: Page, kind: Kind, marker: bool, timeout_s: float = 20) -> None:
    """Start reading the marker; with `marker`, wait until the page sees it change."""
    page.evaluate(SAMPLER_JS, sampler_config(SELECTORS[kind]))
    if marker:
        _until(page, "window.__marker.changes >= 3", timeout_s)


def _until(page: Page, expression: str, timeout_s: float) -> None:
    """Poll `expression` in the page until it is true. (Playwright's `wait_for_function`
    compiles its predicate with eval inside the page, which our pages' CSP refuses; an
    evaluation from outside is not subject to it.)"""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page never got to {expression!r} in {timeout_s:.0f} s")
        time.sleep(0.05)


def open_ours(
    browser: Browser, service: Service, desktop_id: str, *, marker: bool = True
) -> ViewerPage:
    """Our viewer page on the desktop, playing WebRTC and reading the marker."""
    token = service.client.headers["authorization"].split()[1]
    page = browser.new_context(viewport=VIEWPORT).new_page()
    try:
        page.goto(f"{service.url}/view/{desktop_id}?token={token}&transport=webrtc")
        _until(page, "document.getElementById('transport').textContent === 'WebRTC'", 30)
        _install_sampler(page, "ours", marker)
    except BaseException:
        page.context.close()
        raise
    return ViewerPage("ours", page)


def open_novnc(browser: Browser, stack: VncStack, *, marker: bool = True) -> ViewerPage:
    """noVNC's page on x11vnc through websockify, reading the marker off its canvas."""
    page = browser.new_context(viewport=VIEWPORT).new_page()
    try:
        page.add_init_script(_COUNT_WEBSOCKET_BYTES)
        page.goto(stack.page_url)
        _until(page, f"document.querySelector('{SELECTORS['novnc']}')?.width === 1280", 30)
        _install_sampler(page, "novnc", marker)
    except BaseException:
        page.context.close()
        raise
    return ViewerPage("novnc", page)


def open_page(
    kind: Kind,
    browser: Browser,
    service: Service,
    desktop_id: str,
    stack: VncStack,
    *,
    marker: bool = True,
) -> ViewerPage:
    """The `kind` page, showing the desktop; with `marker`, once it reads the marker."""
    if kind == "ours":
        return open_ours(browser, service, desktop_id, marker=marker)
    return open_novnc(browser, stack, marker=marker)
