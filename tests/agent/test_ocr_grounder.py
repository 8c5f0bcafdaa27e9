"""`OcrGrounder` on a real desktop's screenshots: mousepad's menu labels and a word typed into
its document, checked against the accessibility tree and by clicking where OCR points."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from PIL import Image

from cubicle.agent.grounding.ocr import OcrGrounder, TextLine, find_text
from cubicle.client.sdk import AsyncDesktop
from tests.agent.test_a11y_grounder import SCREEN, inside, node, start_mousepad, wait_for

SENTENCE = "Meet me in Zanzibar tomorrow"
"""Typed into mousepad's document: the target word sits inside a longer line."""


@pytest.fixture(scope="module")
async def mousepad(service) -> AsyncIterator[AsyncDesktop]:
    """mousepad with `SENTENCE` typed on the first line of its document."""
    desktop = await start_mousepad(service)
    try:
        await desktop.write(SENTENCE)
        await desktop.wait_for_settle()
        yield desktop
    finally:
        await desktop.kill()


@pytest.fixture(scope="module")
def grounder() -> OcrGrounder:
    """One grounder for the module: OCR runs once per screenshot."""
    return OcrGrounder()


@pytest.mark.parametrize(("description", "menu"), [("File", "File"), ("the Help menu", "Help")])
async def test_menu_labels_are_read_where_the_menus_are(
    mousepad: AsyncDesktop, grounder: OcrGrounder, description: str, menu: str
):
    result = await grounder.ground(description, await mousepad.screenshot(), SCREEN)

    assert inside(result, await node(mousepad, menu, "menu"))
    assert result is not None and result.source == "ocr"
    assert result.box is not None
    left, top, right, bottom = result.box
    assert left <= result.x < right and top <= result.y < bottom
    assert result.elapsed_ms > 0


async def test_clicking_where_ocr_points_opens_the_menu(
    mousepad: AsyncDesktop, grounder: OcrGrounder
):
    result = await grounder.ground("the Search menu", await mousepad.screenshot(), SCREEN)
    assert result is not None

    await mousepad.left_click(result.x, result.y)
    try:
        opened = await wait_for(
            lambda: _menu_open(mousepad, "Search"), "the Search menu to open after the click"
        )
        assert opened
    finally:
        await mousepad.press("escape")
        await wait_for(lambda: _menu_closed(mousepad, "Search"), "the Search menu to close")


async def _menu_open(desktop: AsyncDesktop, name: str) -> bool:
    menu = await node(desktop, name, "menu")
    return menu is not None and "selected" in menu.states and bool(menu.children)


async def _menu_closed(desktop: AsyncDesktop, name: str) -> bool:
    return not await _menu_open(desktop, name)


async def test_a_word_inside_a_typed_line(mousepad: AsyncDesktop, grounder: OcrGrounder):
    result = await grounder.ground('"Zanzibar"', await mousepad.screenshot(), SCREEN)
    assert result is not None
    assert "Zanzibar" in result.raw

    # Double-clicking a word selects it: copy the selection to see which word is there.
    await mousepad.double_click(result.x, result.y)
    await mousepad.press("ctrl+c")
    assert await wait_for(mousepad.get_clipboard, "the clipboard") == "Zanzibar"
    await mousepad.press("end")


async def test_a_scaled_screenshot_maps_back_to_screen_pixels(mousepad: AsyncDesktop):
    half = await mousepad.screenshot(max_width=SCREEN[0] // 2)
    assert Image.open(io.BytesIO(half)).size == (SCREEN[0] // 2, SCREEN[1] // 2)

    result = await OcrGrounder().ground("Help", half, SCREEN)

    assert inside(result, await node(mousepad, "Help", "menu"))


async def test_text_that_is_not_there_is_none(mousepad: AsyncDesktop, grounder: OcrGrounder):
    screenshot = await mousepad.screenshot()
    assert await grounder.ground("Quasimodo", screenshot, SCREEN) is None
    assert await grounder.ground("the button", screenshot, SCREEN) is None


async def test_a_blank_region_reads_no_text(mousepad: AsyncDesktop, grounder: OcrGrounder):
    screen = Image.open(io.BytesIO(await mousepad.screenshot()))
    blank = screen.crop((700, 300, 1280, 800))  # the empty desktop right of mousepad's window
    assert blank.getcolors() is not None and len(blank.getcolors()) == 1  # one flat colour

    assert await grounder.read(blank, blank.size) == []
    assert await grounder.ground("File", blank, blank.size) is None


def test_ocr_leaves_no_telemetry_behind(tmp_path: Path):
    """onnxruntime ≥ 1.29 keeps a device id under ~/.cache/Microsoft and uploads usage
    events from Linux unless told not to before it starts: the grounder tells it."""
    code = (
        "import asyncio; from PIL import Image; "
        "from cubicle.agent.grounding.ocr import OcrGrounder; "
        "print(asyncio.run(OcrGrounder().read(Image.new('RGB', (64, 40), 'white'), (64, 40))))"
    )
    env = {key: value for key, value in os.environ.items() if key != "ORT_DISABLE_TELEMETRY"}
    ran = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "HOME": str(tmp_path)},
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout.strip() == "[]"
    assert list(tmp_path.iterdir()) == []


def _line(text: str) -> TextLine:
    return TextLine(text, (0, 0, 10 * len(text), 20), 0.99)


def test_labels_run_together_are_found_by_case_changes():
    found = find_text("Search", _line("EditSearchView"))
    assert found is not None
    assert (found.start, found.end, found.similarity) == (4, 10, 1.0)
    assert found.box == (40, 0, 100, 20)


def test_a_label_inside_another_word_does_not_count():
    assert find_text("File", _line("Profile settings")) is None
    assert find_text("OK", _line("Look")) is None


def test_near_misses_and_punctuation():
    misread = find_text("Document", _line("Documnet Help"))
    assert misread is not None and 0.8 <= misread.similarity < 1
    assert find_text("Save As", _line("Save As...")) is not None
    assert find_text("23:49", _line("23∶49")) is not None
    standalone = find_text("Help", _line("Help"))
    inline = find_text("Help", _line("Bookmarks Help"))
    assert standalone is not None and inline is not None and standalone.score > inline.score
