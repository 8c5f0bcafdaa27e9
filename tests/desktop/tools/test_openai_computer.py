"""OpenAI's computer tool on a real desktop: every action, as a batch built with the `openai`
package's own types, checked by what a real window received and through the API; and
Cubicle's own actions as JSON Schema functions."""

from __future__ import annotations

import base64
import io
import time

import pytest
from openai.types.responses.computer_action import (
    Click,
    DoubleClick,
    Drag,
    DragPath,
    Keypress,
    Move,
    Screenshot,
    Scroll,
    Type,
    Wait,
)
from openai.types.responses.response_computer_tool_call import (
    PendingSafetyCheck,
    ResponseComputerToolCall,
)
from openai.types.responses.response_input_item_param import ComputerCallOutput
from PIL import Image
from pydantic import TypeAdapter

from cubicle import InvalidRequest, OffScreen
from cubicle.tools import CubicleFunctions, OpenAIComputer, function_tools
from tests.desktop.tools.conftest import SCREEN
from tests.desktop.tools.probe import keys, presses, scrolls, typed

OUTPUT = TypeAdapter(ComputerCallOutput)


def call(*actions, checks=()) -> ResponseComputerToolCall:
    return ResponseComputerToolCall(
        id="cu_1",
        call_id="call_1",
        type="computer_call",
        status="completed",
        actions=list(actions),
        pending_safety_checks=list(checks),
    )


def screenshot_of(output: dict) -> Image.Image:
    url = output["output"]["image_url"]
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2])))


def close(point, target, slack: int = 2) -> bool:
    return abs(point[0] - target[0]) <= slack and abs(point[1] - target[1]) <= slack


async def test_every_action_in_batches_acts_on_the_desktop(big_desktop, focused_probe):
    probe, computer = focused_probe, OpenAIComputer(big_desktop)
    px, py, _, _ = probe.area
    assert computer.tool_param() == {"type": "computer"}

    buttons = {"left": 1, "right": 3, "wheel": 2, "back": 8, "forward": 9}
    for index, (button, number) in enumerate(buttons.items()):
        target = (px + 100 + 120 * index, py + 300)
        mark = await probe.mark()
        clicked = Click(type="click", button=button, x=target[0], y=target[1])
        output = await computer.call_output(call(clicked, Screenshot(type="screenshot")))
        OUTPUT.validate_python(output)
        assert output["call_id"] == "call_1" and screenshot_of(output).size == SCREEN
        got = await probe.wait_for(presses, mark)
        assert [(p["button"], p["x"], p["y"]) for p in got] == [(number, *target)]

    mark = await probe.mark()
    double = DoubleClick(type="double_click", x=px + 800, y=py + 300, keys=["SHIFT"])
    await computer(call(double, Type(type="type", text="after")))
    got = await probe.wait_for(lambda e: len(presses(e)) >= 2 and typed(e) == "after" and e, mark)
    assert [(p["button"], p["x"], p["y"], p["mods"]) for p in presses(got)] == [
        (1, px + 800, py + 300, ["shift"])
    ] * 2

    mark = await probe.mark()
    path = [DragPath(x=px + 200, y=py + 200), DragPath(x=px + 400, y=py + 260)]
    path.append(DragPath(x=px + 600, y=py + 220))
    await computer(call(Drag(type="drag", path=path, keys=["CTRL"])))
    events = await probe.wait_for(lambda e: [x for x in e if x["e"] == "release"] and e, mark)
    release = next(e for e in events if e["e"] == "release")
    assert close((release["x"], release["y"]), (px + 600, py + 220)) and release["mods"] == ["ctrl"]
    assert any(
        e["e"] == "motion" and 1 in e["buttons"] and close((e["x"], e["y"]), (px + 400, py + 260))
        for e in events
    )

    await computer(call(Move(type="move", x=px + 321, y=py + 123)))
    assert await big_desktop.get_cursor_position() == (px + 321, py + 123)

    seen = scrolls(await probe.events())
    view = seen[-1] if seen else {"view_x": 0, "view_y": 0}
    mark = await probe.mark()
    scroll = Scroll(type="scroll", x=px + 500, y=py + 500, scroll_x=-100, scroll_y=300)
    await computer(call(scroll))
    done = await probe.wait_for(lambda e: len(scrolls(e)) >= 4 and scrolls(e), mark)
    assert done[-1]["view_y"] == view["view_y"] + 3 and done[-1]["view_x"] == view["view_x"] - 1

    mark = await probe.mark()
    typing = [
        Type(type="type", text="naïve ✓"),
        Keypress(type="keypress", keys=["CTRL", "A"]),
    ]
    typing.append(Keypress(type="keypress", keys=["ENTER"]))
    await computer(call(*typing))
    events = await probe.wait_for(lambda e: ("Return", []) in keys(e) and e, mark)
    assert typed(events).startswith("naïve ✓") and ("a", ["ctrl"]) in keys(events)

    started = time.monotonic()
    await computer(call(Wait(type="wait")))
    assert time.monotonic() - started >= 1.0


async def test_a_smaller_frame_scales_points_and_errors_keep_the_apis_words(big_desktop):
    computer = OpenAIComputer(big_desktop, max_size=(1280, 1280))
    assert computer.frame.size == (1280, 720)
    assert computer.tool_param(preview=True)["display_width"] == 1280
    await computer(call(Move(type="move", x=640, y=360)))
    assert close(await big_desktop.get_cursor_position(), (960, 540))
    with pytest.raises(OffScreen, match=r"1280×720 screenshot.*off the 1920×1080 screen"):
        await computer(call(Click(type="click", button="left", x=1300, y=10)))
    checks = [PendingSafetyCheck(id="sc_1", code="malicious_instructions", message="Careful")]
    with pytest.raises(InvalidRequest, match="Careful"):
        await computer.call_output(call(Screenshot(type="screenshot"), checks=checks))
    output = await computer.call_output(
        call(Screenshot(type="screenshot"), checks=checks), acknowledge_safety_checks=True
    )
    OUTPUT.validate_python(output)
    assert output["acknowledged_safety_checks"][0]["id"] == "sc_1"
    assert screenshot_of(output).size == (1280, 720)


async def test_cubicle_functions_are_json_schema_and_run(big_desktop):
    chat, responses, claude = (
        function_tools("openai"),
        function_tools("responses"),
        function_tools("anthropic"),
    )
    names = [t["function"]["name"] for t in chat]
    assert names == [t["name"] for t in responses] == [t["name"] for t in claude]
    assert {
        "click",
        "move",
        "drag",
        "scroll",
        "type",
        "key",
        "key_down",
        "wait_for_settle",
        "screenshot",
    } <= set(names)
    click = next(t["function"] for t in chat if t["function"]["name"] == "click")
    assert click["parameters"]["properties"]["button"]["enum"] == [
        "left",
        "right",
        "middle",
        "back",
        "forward",
    ]
    assert "type" not in click["parameters"]["properties"]
    functions = CubicleFunctions(big_desktop, max_size=(960, 960))
    result = await functions.call("move", '{"x": 480, "y": 270}')
    assert '"type":"move"' in result.text
    assert close(await big_desktop.get_cursor_position(), (960, 540))
    shot = await functions.call("screenshot", {})
    assert Image.open(io.BytesIO(shot.image)).size == (960, 540)
    with pytest.raises(InvalidRequest, match="count"):
        await functions.call("click", {"x": 1, "y": 1, "count": 9})
    with pytest.raises(InvalidRequest, match="unknown function 'fly'"):
        await functions.call("fly", {})
