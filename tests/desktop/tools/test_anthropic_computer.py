"""Claude's computer tool on a real 1920×1080 desktop: every action of both tool versions,
its input built with the `anthropic` package's own types, checked by what a real window
received and by the API (pointer, typed text, keys, scrolled view)."""

from __future__ import annotations

import base64
import io
import itertools
import time

import pytest
from anthropic.types.beta import (
    BetaComputerCursorPositionInput,
    BetaComputerDoubleClickInput,
    BetaComputerHoldKeyInput,
    BetaComputerKeyInput,
    BetaComputerLeftClickDragInput,
    BetaComputerLeftClickInput,
    BetaComputerLeftMouseDownInput,
    BetaComputerLeftMouseUpInput,
    BetaComputerMiddleClickInput,
    BetaComputerMouseMoveInput,
    BetaComputerRightClickInput,
    BetaComputerScreenshotInput,
    BetaComputerScrollInput,
    BetaComputerTripleClickInput,
    BetaComputerTypeInput,
    BetaComputerWaitInput,
    BetaComputerZoomInput,
    BetaToolComputerUse20250124Param,
    BetaToolComputerUse20251124Param,
    BetaToolResultBlockParam,
    BetaToolUseBlock,
)
from PIL import Image
from pydantic import BaseModel, TypeAdapter

from cubicle.tools import AnthropicComputer
from tests.desktop.tools.conftest import SCREEN
from tests.desktop.tools.probe import keys, presses, scrolls, typed

_ids = itertools.count()
RESULT = TypeAdapter(BetaToolResultBlockParam)


def use(action: str, model: BaseModel) -> BetaToolUseBlock:
    """The tool_use block Claude sends for `action` with `model`'s fields."""
    tool_input = {"action": action, **model.model_dump(exclude_none=True)}
    return BetaToolUseBlock(
        id=f"toolu_{next(_ids)}", name="computer", type="tool_use", input=tool_input
    )


def image_of(result: dict) -> Image.Image:
    block = next(b for b in result["content"] if b["type"] == "image")
    assert block["source"]["media_type"] == "image/png"
    return Image.open(io.BytesIO(base64.b64decode(block["source"]["data"])))


def close(point: tuple[int, int], target: tuple[int, int], slack: int = 2) -> bool:
    return abs(point[0] - target[0]) <= slack and abs(point[1] - target[1]) <= slack


@pytest.mark.parametrize("version", ["computer_20250124", "computer_20251124"])
def test_the_tool_definition_states_anthropics_recommended_size(big_desktop, version):
    computer = AnthropicComputer(big_desktop, version=version)
    param = computer.tool_param()
    schema = (
        BetaToolComputerUse20251124Param
        if version.endswith("1124")
        else BetaToolComputerUse20250124Param
    )
    TypeAdapter(schema).validate_python(param)
    width, height = param["display_width_px"], param["display_height_px"]
    assert (width, height) == (1429, 804)  # ≤ 1568 on the long side, ≤ 1.15 megapixels
    assert width * height <= 1_150_000 and abs(width / height - SCREEN[0] / SCREEN[1]) < 0.01
    assert param.get("enable_zoom", False) is (version == "computer_20251124")
    assert computer.beta_flag == {"computer_20250124": "computer-use-2025-01-24"}.get(
        version, "computer-use-2025-11-24"
    )


@pytest.mark.parametrize("version", ["computer_20250124", "computer_20251124"])
async def test_every_action_acts_on_the_desktop(big_desktop, focused_probe, version):
    probe, computer = focused_probe, AnthropicComputer(big_desktop, version=version)
    frame = computer.frame
    px, py, pw, ph = probe.area

    def frame_point(x: int, y: int) -> list[int]:
        """Where Claude reads screen pixel (x, y) off the screenshot it was sent."""
        return [round(x * frame.width / SCREEN[0]), round(y * frame.height / SCREEN[1])]

    async def run(action: str, model: BaseModel) -> dict:
        result = await computer.tool_result(use(action, model))
        RESULT.validate_python(result)
        assert not result.get("is_error"), result
        return result

    shot = image_of(await run("screenshot", BetaComputerScreenshotInput()))
    assert shot.size == frame.size

    target = (px + pw // 3, py + ph // 2)
    await run("mouse_move", BetaComputerMouseMoveInput(coordinate=frame_point(*target)))
    assert close(await big_desktop.get_cursor_position(), target)
    position = await run("cursor_position", BetaComputerCursorPositionInput())
    x, y = frame_point(*await big_desktop.get_cursor_position())
    assert position["content"] == [{"type": "text", "text": f"X={x},Y={y}"}]

    clicks = [
        ("left_click", BetaComputerLeftClickInput, 1, 1),
        ("right_click", BetaComputerRightClickInput, 3, 1),
        ("middle_click", BetaComputerMiddleClickInput, 2, 1),
        ("double_click", BetaComputerDoubleClickInput, 1, 2),
        ("triple_click", BetaComputerTripleClickInput, 1, 3),
    ]
    for index, (action, model, button, count) in enumerate(clicks):
        target = (px + 100 + 150 * index, py + ph // 2 + 7 * index)
        mark = await probe.mark()
        result = await run(action, model(coordinate=frame_point(*target), text="shift"))
        assert image_of(result).size == frame.size
        got = await probe.wait_for(lambda e, n=count: len(presses(e)) >= n and presses(e), mark)
        assert [p["button"] for p in got] == [button] * count, action
        assert all(close((p["x"], p["y"]), target) and p["mods"] == ["shift"] for p in got), (
            [(p["x"], p["y"], p["mods"]) for p in got],
            target,
        )

    mark = await probe.mark()
    await run("left_mouse_down", BetaComputerLeftMouseDownInput())
    await run("left_mouse_up", BetaComputerLeftMouseUpInput())
    events = await probe.wait_for(lambda e: [x for x in e if x["e"] == "release"] and e, mark)
    assert [e["e"] for e in events if e["e"] in ("press", "release")] == ["press", "release"]

    start, end = (px + 200, py + 200), (px + 600, py + 300)
    mark = await probe.mark()
    drag = BetaComputerLeftClickDragInput(
        start_coordinate=frame_point(*start), coordinate=frame_point(*end), text="ctrl"
    )
    await run("left_click_drag", drag)
    events = await probe.wait_for(lambda e: [x for x in e if x["e"] == "release"] and e, mark)
    press, release = presses(events)[0], next(e for e in events if e["e"] == "release")
    assert close((press["x"], press["y"]), start) and close((release["x"], release["y"]), end)
    assert press["mods"] == ["ctrl"] and release["mods"] == ["ctrl"]
    assert any(e["e"] == "motion" and 1 in e["buttons"] for e in events)  # dragged, held

    async def view() -> dict:
        seen = scrolls(await probe.events())
        return seen[-1] if seen else {"view_x": 0, "view_y": 0}

    for direction, amount, axis, sign in [("down", 3, "view_y", 1), ("left", 2, "view_x", -1)]:
        before = await view()
        mark = await probe.mark()
        modifier = "shift" if direction == "down" else None
        scroll = BetaComputerScrollInput(
            coordinate=frame_point(px + 300, py + 300),
            scroll_direction=direction,
            scroll_amount=amount,
            text=modifier,
        )
        await run("scroll", scroll)
        done = await probe.wait_for(lambda e, n=amount: len(scrolls(e)) >= n and scrolls(e), mark)
        assert [s["direction"] for s in done] == [direction] * amount
        assert done[-1][axis] == before[axis] + sign * amount  # the view scrolled that far
        assert all(s["mods"] == ([modifier] if modifier else []) for s in done)

    mark = await probe.mark()
    await run("type", BetaComputerTypeInput(text="héllo ✓ Ω"))
    await probe.wait_for(lambda e: typed(e) == "héllo ✓ Ω", mark)
    mark = await probe.mark()
    await run("key", BetaComputerKeyInput(text="ctrl+a"))
    await run("key", BetaComputerKeyInput(text="Return", repeat=2))
    await probe.wait_for(lambda e: keys(e).count(("Return", [])) == 2, mark)
    assert ("a", ["ctrl"]) in keys(await probe.since(mark))

    mark = await probe.mark()
    started = time.monotonic()
    await run("hold_key", BetaComputerHoldKeyInput(text="shift", duration=1))
    assert time.monotonic() - started >= 1.0
    events = await probe.wait_for(lambda e: [x for x in e if x["e"] == "key_up"] and e, mark)
    down = next(e for e in events if e["e"] == "key" and e["keysym"] == "Shift_L")
    up = next(e for e in events if e["e"] == "key_up" and e["keysym"] == "Shift_L")
    assert up["t"] - down["t"] >= 0.9

    started = time.monotonic()
    waited = await run("wait", BetaComputerWaitInput(duration=1))
    assert time.monotonic() - started >= 1.0 and image_of(waited).size == frame.size

    zoom = use("zoom", BetaComputerZoomInput(region=[0, 0, 400, 200]))
    zoomed = await computer.tool_result(zoom)
    if version == "computer_20250124":
        assert zoomed["is_error"] and "unknown action 'zoom'" in zoomed["content"][0]["text"]
    else:
        image = image_of(zoomed)  # 400×200 of the frame is 537×269 screen pixels, enlarged
        assert image.width == frame.width and abs(image.height - frame.width / 2) <= 2


async def test_bad_input_comes_back_as_an_error_result_with_the_apis_message(big_desktop):
    computer = AnthropicComputer(big_desktop)
    off = await computer.tool_result(
        use("left_click", BetaComputerLeftClickInput(coordinate=[1500, 10]))
    )
    assert off["is_error"] is True
    message = off["content"][0]["text"]
    assert "1429×804 screenshot of the 1920×1080 screen" in message
    assert "is off the 1920×1080 screen" in message  # the service's own words
    bad_key = await computer.tool_result(use("key", BetaComputerKeyInput(text="ctrl+nope")))
    assert bad_key["is_error"] and "unknown key 'nope'" in bad_key["content"][0]["text"]
    unknown = await computer.tool_result(
        {"id": "toolu_x", "type": "tool_use", "name": "computer", "input": {"action": "fly"}}
    )
    assert unknown["is_error"] and "unknown action 'fly'" in unknown["content"][0]["text"]
    assert (await big_desktop.get_screen_size()) == SCREEN  # the desktop still answers
