"""The Python SDK, blocking and asyncio, against the running service."""

from __future__ import annotations

import io
import time

import pytest
from PIL import Image

from cubicle import (
    AsyncDesktop,
    AuthError,
    Desktop,
    DesktopNotFound,
    Move,
    NotFound,
    OffScreen,
    RecordingInfo,
    ServiceClient,
    ServiceUnreachable,
    ShareLink,
    UnknownKey,
    WindowNotFound,
    list_desktops,
)
from cubicle.guest.a11y import find
from cubicle.server.launcher import free_port


def _wait_for(fetch, what: str, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (value := fetch()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def test_blocking_sdk_drives_a_desktop(service):
    with Desktop.create(base_url=service.url, token=service.token) as d:
        assert d.get_screen_size() == (1280, 800)
        d.move_mouse(100, 200)
        assert d.get_cursor_position() == (100, 200)
        d.launch("mousepad")
        editor = _wait_for(lambda: d.get_application_windows("mousepad"), "mousepad")[0]
        d.left_click(editor.x + 100, editor.y + 150)
        d.write("sdk ✓")
        d.press(["ctrl", "a"])
        d.press("ctrl+c")  # input is in the X server's hands on return, not yet the app's
        _wait_for(lambda: d.get_clipboard() == "sdk ✓", "the copied text on the clipboard")
        assert d.wait_for_settle(quiet_ms=200)
        shot = Image.open(io.BytesIO(d.screenshot("jpeg", max_width=640)))
        assert shot.size == (640, 400)
        assert d.commands.run("echo $HOME").stdout == "/home/user\n"
        d.files.write("~/from-sdk.txt", "bytes ✓")
        assert d.files.read("~/from-sdk.txt") == "bytes ✓".encode()
        assert "from-sdk.txt" in [f.name for f in d.files.list("~")]
        with pytest.raises(OffScreen):
            d.left_click(5000, 5000)
        with pytest.raises(UnknownKey):
            d.press("ctrl+nope")
        desktop_id = d.id
    with pytest.raises(DesktopNotFound):
        Desktop.connect(desktop_id, base_url=service.url, token=service.token)


def test_a_click_on_a_menu_opens_it(service):
    """Find mousepad's Search menu in the accessibility tree, click it, see its items."""
    with Desktop.create(base_url=service.url, token=service.token) as d:
        d.launch("mousepad")
        _wait_for(lambda: d.get_application_windows("mousepad"), "mousepad")
        menu = _wait_for(
            lambda: find(d.accessibility_tree("mousepad"), name="Search", role="menu"),
            "the Search menu in the accessibility tree",
        )[0]
        x, y = menu.x + menu.width // 2, menu.y + menu.height // 2
        d.left_click(x, y)
        assert d.get_cursor_position() == (x, y)
        items = _wait_for(
            lambda: find(
                d.accessibility_tree("mousepad"), name="Find and Replace", role="menu item"
            ),
            "the Search menu's items to show",
        )
        assert items[0].y >= menu.y + menu.height  # the open menu hangs below its title
        opened = find(d.accessibility_tree("mousepad"), name="Search", role="menu")[0]
        assert "selected" in opened.states


async def test_async_sdk_drives_a_desktop(service):
    async with await AsyncDesktop.create(base_url=service.url, token=service.token) as d:
        listed = await list_desktops(base_url=service.url, token=service.token)
        assert d.id in [info.id for info in listed]
        await d.double_click(640, 400)
        assert await d.get_cursor_position() == (640, 400)
        await d.scroll("down", 3, x=640, y=400)
        result = await d.commands.run(["printf", "%s", "argv ✓"])
        assert result.stdout == "argv ✓" and result.exit_code == 0
        png = await d.screenshot()
        assert png.startswith(b"\x89PNG")
        await d.set_timeout(900)
        assert (await d.refresh()).timeout_s == 900


async def test_the_sdk_answers_in_its_own_types_and_errors(service):
    async with await AsyncDesktop.create(base_url=service.url, token=service.token) as d:
        await d.set_clipboard("typed ✓")
        assert await d.get_clipboard() == "typed ✓"
        link = await d.share("control", ttl_s=120)
        assert isinstance(link, ShareLink) and link.mode == "control"
        assert link.url.startswith(f"{service.url}/view/{d.id}?token=")
        started = await d.start_recording()
        assert isinstance(started, RecordingInfo) and started.status == "recording"
        await d.move_mouse(300, 300)
        stopped = await d.stop_recording()
        assert stopped.id == started.id and stopped.status == "finished"
        assert [r.id for r in await d.recordings()] == [started.id]
        log = await d.recording_actions(started.id)
        assert [entry.action for entry in log.actions] == [Move(x=300, y=300)]
        assert (await d.recording_video(started.id))[4:8] == b"ftyp"
        with pytest.raises(WindowNotFound, match="no window 12345"):
            await d.get_window_title(12345)


def test_the_service_client_reaches_other_routes_with_the_same_errors(service):
    with ServiceClient(base_url=service.url, token=service.token) as client:
        page = client.request("GET", "/api/tasks", params={"limit": 5})
        assert page["limit"] == 5 and len(page["items"]) <= min(5, page["total"])
        with pytest.raises(NotFound) as missing:  # a code of the board's, unknown to the SDK
            client.request("GET", "/api/tasks/999999")
        assert missing.value.code == "task_not_found" and "no task 999999" in str(missing.value)
    with ServiceClient(base_url=service.url, token="wrong") as client, pytest.raises(AuthError):
        client.request("GET", "/api/tasks")


async def test_an_unreachable_service_is_a_cubicle_error_that_says_what_to_do():
    with pytest.raises(ServiceUnreachable, match=r"is it running\? Start it"):
        await AsyncDesktop.create(base_url=f"http://127.0.0.1:{free_port()}", token="t")
    with pytest.raises(ServiceUnreachable):
        await list_desktops(base_url=f"http://127.0.0.1:{free_port()}", token="t")


def test_a_screenshot_says_how_its_pixels_map_to_the_screen(service):
    with Desktop.create(base_url=service.url, token=service.token) as d:
        d.move_mouse(300, 220)
        half = d.screenshot_with_info("jpeg", max_width=640, cursor=True)
        assert half.format == "jpeg"
        assert Image.open(io.BytesIO(half.data)).size == (640, 400)
        info = half.info
        assert (info.screen_width, info.screen_height) == d.get_screen_size()
        assert (info.image_width, info.image_height) == (640, 400)
        assert info.scale == pytest.approx(2.0)
        assert info.cursor == (300, 220)
        whole = d.screenshot_with_info()
        assert whole.info.scale == pytest.approx(1.0) and whole.info.cursor is None
        assert Image.open(io.BytesIO(whole.data)).size == d.get_screen_size()
