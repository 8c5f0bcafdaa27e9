"""The viewer in a real Chromium shows the desktop's pointer and what is done on it: the
pointer in the WebRTC picture where the API moves it, a ripple at each click (the agent's
or a person's), captions of typed text, and a toggle that hides it all."""

from __future__ import annotations

import base64
import functools
import io

import numpy as np
import pytest
from PIL import Image
from playwright.sync_api import expect

from tests.conftest import wait_until
from tests.streaming.pointer_pixels import REACH, differs, near, pointer_box, screenshots
from tests.web.test_viewer import decoded_frames, on_page, viewer_url

_WATCH_RIPPLES = """() => {
  window.ripples = [];
  new MutationObserver((changes) => {
    for (const change of changes) for (const node of change.addedNodes) {
      if (!node.classList || !node.classList.contains("ripple")) continue;
      const box = node.querySelector(".dot").getBoundingClientRect();
      window.ripples.push({x: +node.dataset.x, y: +node.dataset.y, who: node.classList[2],
        button: node.dataset.button, count: +node.dataset.count,
        centre: [box.x + box.width / 2, box.y + box.height / 2]});
    }
  }).observe(document.getElementById("overlay"), {childList: true});
}"""

_CROP = """([x, y, r]) => {
  const video = document.getElementById("screen");
  const canvas = Object.assign(document.createElement("canvas"), {width: 2 * r, height: 2 * r});
  canvas.getContext("2d").drawImage(video, x - r, y - r, 2 * r, 2 * r, 0, 0, 2 * r, 2 * r);
  return canvas.toDataURL("image/png");
}"""


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    yield context.new_page()
    context.close()


def open_viewer(page, service, desktop) -> None:
    page.goto(viewer_url(service, desktop))
    expect(page.locator("#transport")).to_have_text("WebRTC", timeout=20_000)


def ripples(page) -> list[dict]:
    return page.evaluate("window.ripples")


def video_near(page, x: int, y: int) -> np.ndarray:
    """The picture the page shows around screen pixel (x, y), as a screen-sized RGB array
    holding only that square (so screen coordinates index it)."""
    url = page.evaluate(_CROP, [x, y, REACH])
    crop = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))
    whole = np.zeros((y + REACH, x + REACH, 3), int)
    whole[y - REACH :, x - REACH :] = crop
    return whole


def shows_pointer(page, x: int, y: int, plain: np.ndarray, box) -> bool:
    return near(differs(video_near(page, x, y), plain, x, y, 150), box, 3)


def test_the_pointer_moves_in_the_picture_as_the_api_moves_it(page, service, api, desktop):
    base = f"/api/desktops/{desktop['id']}"
    open_viewer(page, service, desktop)
    before = decoded_frames(page)
    path = [(400 + 70 * step, 300 + 50 * (step % 3)) for step in range(8)]
    for x, y in path:
        assert api.post(f"{base}/actions", json={"type": "move", "x": x, "y": y}).is_success
        plain, drawn, at = screenshots(api, desktop["id"])
        assert at == (x, y)
        box = pointer_box(plain, drawn, x, y)
        plain = plain[: y + REACH, : x + REACH]
        wait_until(
            functools.partial(shows_pointer, page, x, y, plain, box),
            timeout_s=5,
            what=f"the pointer at {(x, y)} in the WebRTC picture, where the screenshot has it",
        )
    # Frames kept arriving while only the pointer moved: at least one per move.
    assert decoded_frames(page) - before >= len(path)


def test_clicks_show_ripples_typing_a_caption_and_the_toggle_hides_them(
    page, service, api, desktop
):
    base = f"/api/desktops/{desktop['id']}"
    open_viewer(page, service, desktop)
    page.evaluate(_WATCH_RIPPLES)
    expect(page.locator("#overlay-toggle")).to_have_attribute("aria-pressed", "true")

    # The agent (through the API) clicks: a ripple at the click's screen pixel.
    api.post(f"{base}/actions", json={"type": "click", "x": 640, "y": 420, "button": "right"})
    api.post(f"{base}/actions", json={"type": "key", "keys": "Escape"})  # the menu goes
    (ripple,) = wait_until(lambda: ripples(page), what="a ripple in the overlay")
    assert (ripple["x"], ripple["y"], ripple["who"], ripple["button"]) == (
        640,
        420,
        "agent",
        "right",
    )
    x, y = on_page(page, "#screen", 640, 420)
    assert abs(ripple["centre"][0] - x) <= 2 and abs(ripple["centre"][1] - y) <= 2
    expect(page.locator("#captions .caption.agent")).to_contain_text("Agent pressed: Escape")

    # Hidden: nothing shows, and a click made meanwhile leaves no mark behind.
    page.click("#overlay-toggle")
    expect(page.locator("#overlay-toggle")).to_have_attribute("aria-pressed", "false")
    expect(page.locator("#overlay")).to_be_hidden()
    expect(page.locator("#captions")).to_be_hidden()
    api.post(f"{base}/actions", json={"type": "click", "x": 100, "y": 700, "count": 2})
    page.click("#overlay-toggle")
    expect(page.locator("#overlay")).to_be_visible()
    api.post(f"{base}/actions", json={"type": "click", "x": 700, "y": 500, "count": 2})
    wait_until(lambda: len(ripples(page)) == 2, what="the second ripple")
    assert [(r["x"], r["y"], r["count"]) for r in ripples(page)] == [(640, 420, 1), (700, 500, 2)]

    # A person in control clicks in the page: a ripple of their own colour.
    page.click("#take")
    expect(page.locator("#control-state")).to_have_text("You are in control")
    page.mouse.click(*on_page(page, "#screen", 500, 380))
    wait_until(lambda: len(ripples(page)) == 3, what="the person's ripple")
    person = ripples(page)[-1]
    assert (person["x"], person["y"], person["who"]) == (500, 380, "person")
    page.click("#release")
