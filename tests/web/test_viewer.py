"""The live viewer in a real Chromium: WebRTC video, take control, input, MJPEG fallback."""

from __future__ import annotations

import io

import av
import pytest
from playwright.sync_api import expect

from cubicle.server.live.webrtc import PLAYOUT_DELAY_URI
from tests.conftest import create_desktop, editable_text, wait_until

WIDTH, HEIGHT = 1280, 800


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    yield context.new_page()
    context.close()


def viewer_url(service, desktop, **query: str) -> str:
    extra = "".join(f"&{key}={value}" for key, value in query.items())
    return f"{service.url}/view/{desktop['id']}?token={service.token}{extra}"


def on_page(page, selector: str, x: int, y: int) -> tuple[float, float]:
    """Where screen pixel (x, y) of the desktop shows in the element (letterboxed to fit)."""
    left, top, width, height = page.eval_on_selector(
        selector,
        "e => { const r = e.getBoundingClientRect(); return [r.x, r.y, r.width, r.height] }",
    )
    scale = min(width / WIDTH, height / HEIGHT)
    left += (width - WIDTH * scale) / 2
    top += (height - HEIGHT * scale) / 2
    return left + (x + 0.5) * scale, top + (y + 0.5) * scale


def decoded_frames(page) -> int:
    return page.eval_on_selector("#screen", "v => v.getVideoPlaybackQuality().totalVideoFrames")


def cursor(api, desktop) -> tuple[int, int]:
    position = api.get(f"/api/desktops/{desktop['id']}/cursor").json()
    return position["x"], position["y"]


def press_as_a_layout_would(page, key: str, code: str) -> None:
    """A key event as a keyboard layout with this character on a key sends it."""
    page.eval_on_selector(
        "#screen",
        """(v, [key, code]) => { for (const type of ["keydown", "keyup"])
             v.dispatchEvent(new KeyboardEvent(type, {key, code, bubbles: true})) }""",
        [key, code],
    )


def test_watch_take_control_click_and_type_over_webrtc(page, service, api, desktop):
    page.goto(viewer_url(service, desktop))
    expect(page.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
    size = page.eval_on_selector("#screen", "v => [v.videoWidth, v.videoHeight]")
    assert size == [WIDTH, HEIGHT]
    # Chromium offered the playout-delay extension and the answer took it (zero delay: no
    # jitter buffer holding frames back).
    assert PLAYOUT_DELAY_URI in page.evaluate("view.pc.remoteDescription.sdp")

    # The picture follows the desktop: an editor opens, frames are decoded.
    before = decoded_frames(page)
    launched = api.post(f"/api/desktops/{desktop['id']}/launch", json={"app": "mousepad"})
    assert launched.status_code == 200
    editor = wait_until(
        lambda: [
            w
            for w in api.get(f"/api/desktops/{desktop['id']}/windows").json()
            if w["app"] == "Mousepad"
        ],
        what="a mousepad window",
    )[0]
    wait_until(lambda: decoded_frames(page) >= before + 3, what="frames decoded in the page")

    page.click("#take")
    expect(page.locator("#control-state")).to_have_text("You are in control")
    expect(page.locator("#release")).to_be_visible()

    # A click in the video lands on the same screen pixel of the desktop.
    x, y = editor["x"] + editor["width"] // 2, editor["y"] + editor["height"] // 2
    page.mouse.click(*on_page(page, "#screen", x, y))
    wait_until(lambda: cursor(api, desktop) == (x, y), what=f"the cursor at {(x, y)}")

    # Keys typed in the page reach the editor: characters, Enter, arrows, Backspace,
    # characters of other layouts, and shortcuts.
    page.keyboard.type("Hello")
    page.keyboard.press("Enter")
    press_as_a_layout_would(page, "é", "Digit2")
    press_as_a_layout_would(page, "✓", "KeyV")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("Backspace")
    wait_until(lambda: editable_text(api, desktop["id"]) == "Hello\n✓", what="the typed text")
    page.keyboard.press("Control+a")
    page.keyboard.type("Z")
    wait_until(lambda: editable_text(api, desktop["id"]) == "Z", what="Ctrl+A, then Z")

    page.click("#release")
    expect(page.locator("#control-state")).to_have_text("View only")
    expect(page.locator("#take")).to_be_visible()


def test_a_closed_tab_hangs_up_at_once(page, service, api, desktop):
    def viewers() -> set[str]:
        live = api.get(f"/api/desktops/{desktop['id']}/live").json()
        return {viewer["id"] for viewer in live["viewers"]}

    before = viewers()
    page.goto(viewer_url(service, desktop))
    expect(page.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
    mine = page.evaluate("view.viewerId")
    assert mine in viewers()
    page.close()  # as a tab is closed; no pc.close() by hand: the page's pagehide does it
    wait_until(lambda: mine not in viewers(), timeout_s=5, what="the viewer to hang up")
    assert viewers() <= before


def test_one_controller_at_a_time(browser, service, desktop):
    pages = []
    for _ in range(2):
        context = browser.new_context(viewport={"width": 1000, "height": 700})
        pages.append(context.new_page())
    try:
        for page in pages:
            page.goto(viewer_url(service, desktop))
            expect(page.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
        first, second = pages
        first.click("#take")
        expect(first.locator("#control-state")).to_have_text("You are in control")
        expect(second.locator("#control-state")).to_have_text("Someone else is in control")
        second.click("#take")
        expect(second.locator("#control-state")).to_have_text("You are in control")
        expect(first.locator("#control-state")).to_have_text("Someone else is in control")
    finally:
        for page in pages:
            page.context.close()


def test_without_webrtc_the_page_falls_back_to_mjpeg(page, service, api, desktop):
    page.add_init_script("window.RTCPeerConnection = undefined;")
    page.goto(viewer_url(service, desktop))
    expect(page.locator("#transport")).to_have_text("MJPEG", timeout=20_000)
    expect(page.locator("#mjpeg")).to_have_js_property("naturalWidth", WIDTH, timeout=10_000)
    assert "no WebRTC" in page.get_attribute("#transport", "title")

    # Control works over the fallback's WebSocket too.
    page.click("#take")
    expect(page.locator("#control-state")).to_have_text("You are in control")
    page.mouse.click(*on_page(page, "#mjpeg", 321, 123))
    wait_until(lambda: cursor(api, desktop) == (321, 123), what="the cursor at (321, 123)")


NO_ROUTE = """
// A network where WebRTC cannot get through: no ICE candidate reaches either side.
const strip = (sdp) =>
  sdp.split("\\r\\n").filter((l) => !l.startsWith("a=candidate")).join("\\r\\n");
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (String(url).endsWith("/webrtc") && init?.body) {
    const offer = JSON.parse(init.body);
    init = { ...init, body: JSON.stringify({ ...offer, sdp: strip(offer.sdp) }) };
  }
  return realFetch(url, init);
};
const setRemote = RTCPeerConnection.prototype.setRemoteDescription;
RTCPeerConnection.prototype.setRemoteDescription = function (d) {
  return setRemote.call(this, { type: d.type, sdp: strip(d.sdp) });
};
"""


def test_when_webrtc_cannot_connect_the_page_falls_back_to_mjpeg(page, service, desktop):
    page.add_init_script(NO_ROUTE)
    page.goto(viewer_url(service, desktop))
    expect(page.locator("#transport")).to_have_text("MJPEG", timeout=30_000)
    expect(page.locator("#mjpeg")).to_have_js_property("naturalWidth", WIDTH, timeout=10_000)
    assert "WebRTC did not work here" in page.get_attribute("#transport", "title")


def test_the_fallback_can_be_asked_for(page, service, desktop):
    page.goto(viewer_url(service, desktop, transport="mjpeg"))
    expect(page.locator("#transport")).to_have_text("MJPEG", timeout=20_000)
    expect(page.locator("#mjpeg")).to_have_js_property("naturalWidth", WIDTH, timeout=10_000)


def test_a_view_only_link_watches_but_cannot_take_control(page, api, desktop):
    link = api.post(f"/api/desktops/{desktop['id']}/share", json={"mode": "view"}).json()
    page.goto(link["url"])
    expect(page.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
    expect(page.locator("#control-state")).to_have_text("View-only link")
    expect(page.locator("#take")).to_be_hidden()
    expect(page.locator("#record-start")).to_be_hidden()
    expect(page.locator("#share")).to_be_hidden()


def test_record_from_the_page_and_download_the_mp4(page, service, api, desktop):
    page.goto(viewer_url(service, desktop))
    expect(page.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
    expect(page.locator("#record-start")).to_be_visible()
    page.click("#record-start")
    expect(page.locator("#record-stop")).to_be_visible()
    actions = [{"type": "move", "x": 10, "y": 10}, {"type": "wait", "ms": 1500}]
    assert api.post(f"/api/desktops/{desktop['id']}/actions", json=actions).status_code == 200
    page.click("#record-stop")
    download = page.locator("#recordings a.download").first
    expect(download).to_be_visible(timeout=10_000)
    video = api.get(download.get_attribute("href"))
    assert video.status_code == 200
    with av.open(io.BytesIO(video.content)) as container:
        stream = container.streams.video[0]
        assert (stream.width, stream.height) == (WIDTH, HEIGHT)
        assert float(stream.duration * stream.time_base) > 1.4
    log = api.get(page.locator("#recordings a.actions").first.get_attribute("href")).json()
    assert [entry["action"]["type"] for entry in log["actions"]] == ["move", "wait"], log


def test_the_page_charts_the_desktops_usage(page, service, desktop):
    page.goto(viewer_url(service, desktop))
    # the service reads each desktop every 5 s; the page asks as often
    expect(page.locator("#usage-now")).to_contain_text("CPU", timeout=20_000)
    expect(page.locator("#usage-now")).to_contain_text("of 2048 MiB")
    assert int(page.locator("#usage-chart").get_attribute("data-samples") or 0) >= 1


def test_a_view_waits_while_its_desktop_is_parked_and_comes_back(page, service, api):
    """Paused without memory, the desktop's programs end and the service hangs up its
    viewers: the page says so, offers to resume, and opens a new view once it runs again;
    a page opened on a paused desktop waits the same way."""
    desktop = create_desktop(api)
    base = f"/api/desktops/{desktop['id']}"
    try:
        page.goto(viewer_url(service, desktop))
        expect(page.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
        wait_until(lambda: decoded_frames(page) > 0, 10, what="video")
        assert api.post(f"{base}/pause", json={"keep_memory": False}).status_code == 200
        expect(page.locator("#status")).to_contain_text("paused", timeout=10_000)
        expect(page.locator("#resume")).to_be_visible()
        page.click("#resume")  # the page's own button: POST …/resume
        expect(page.locator("#resume")).to_be_hidden(timeout=30_000)
        expect(page.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
        wait_until(lambda: decoded_frames(page) > 0, 10, what="video after the resume")
        assert api.get(base).json()["status"] == "ready"
        viewers = api.get(f"{base}/live").json()["viewers"]
        assert len(viewers) == 1  # the new view; the old one was hung up

        assert api.post(f"{base}/pause", json={"keep_memory": False}).status_code == 200
        other = page.context.new_page()
        other.goto(viewer_url(service, desktop))
        expect(other.locator("#status")).to_contain_text("paused", timeout=10_000)
        assert api.post(f"{base}/resume").status_code == 200
        expect(other.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
        wait_until(lambda: decoded_frames(other) > 0, 10, what="video on the second page")
        expect(page.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
    finally:
        api.delete(base)
