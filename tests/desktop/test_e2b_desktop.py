"""E2B Desktop's released Python SDK (`e2b-desktop`), unmodified, driving a Cubicle desktop.

The SDK starts an X server and XFCE of its own through `commands.run` and then drives the
screen with xdotool, scrot and xrandr inside the sandbox: here the desktop is drawn
already, so its Xvfb finds display :0 taken and its XFCE session joins the one running.
What it sees and does is checked through Cubicle's own API (windows, the accessibility
tree, the cursor), not through the SDK's word.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from e2b_desktop import Sandbox
from PIL import Image

from tests.conftest import editable_text, wait_until


@pytest.fixture(scope="module")
def desk(e2b_env) -> Iterator[Sandbox]:
    sandbox = Sandbox.create(timeout=300)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_the_screen_is_e2b_desktops_and_screenshots_show_it(desk, api):
    assert desk.get_screen_size() == (1024, 768)
    info = api.get(f"/api/desktops/{desk.sandbox_id}").json()
    assert info["screen"] == {"width": 1024, "height": 768} and info["status"] == "ready"
    shot = Image.open(io.BytesIO(desk.screenshot()))
    assert shot.format == "PNG" and shot.size == (1024, 768)


def test_the_mouse_moves_and_clicks_where_asked(desk, api):
    desk.move_mouse(300, 200)
    assert desk.get_cursor_position() == (300, 200)
    assert api.get(f"/api/desktops/{desk.sandbox_id}/cursor").json() == {"x": 300, "y": 200}
    desk.left_click(120, 90)
    assert api.get(f"/api/desktops/{desk.sandbox_id}/cursor").json() == {"x": 120, "y": 90}
    desk.drag((200, 300), (260, 340))
    assert desk.get_cursor_position() == (260, 340)
    desk.scroll("down", 2)


def test_typing_and_keys_reach_an_app_it_launched(desk, api):
    desk.launch("org.xfce.mousepad")
    window = wait_until(
        lambda: [
            w
            for w in api.get(f"/api/desktops/{desk.sandbox_id}/windows").json()
            if w["app"] == "Mousepad"
        ],
        30,
        what="mousepad, launched by the SDK",
    )[0]
    desk.left_click(window["x"] + window["width"] // 2, window["y"] + window["height"] // 2)
    desk.write("typed by e2b-desktop", chunk_size=50, delay_in_ms=5)
    desk.press("enter")
    desk.press(["ctrl", "a"])
    desk.write("replaced", delay_in_ms=5)
    wait_until(
        lambda: editable_text(api, desk.sandbox_id) == "replaced",
        10,
        what="the text typed, then replaced after ctrl+a",
    )
    ids = desk.get_application_windows("mousepad")
    assert ids and "Mousepad" in desk.get_window_title(ids[0])
    assert desk.get_current_window_id() == ids[0]


def test_the_same_sandbox_is_a_cubicle_desktop(desk, api):
    """What E2B Desktop lacks works on it as on any desktop: the live view, recordings, the
    accessibility tree."""
    base = f"/api/desktops/{desk.sandbox_id}"
    live = api.get(f"{base}/live")
    assert live.status_code == 200 and live.json()["desktop"]["screen"]["width"] == 1024
    started = api.post(f"{base}/recording/start")
    assert started.status_code == 200, started.text
    desk.move_mouse(500, 400)
    stopped = api.post(f"{base}/recording/stop")
    assert stopped.status_code == 200 and stopped.json()["status"] == "finished"
    tree = api.get(f"{base}/a11y", params={"app": "mousepad"}).json()
    assert tree["nodes"]
