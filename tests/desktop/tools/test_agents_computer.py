"""The OpenAI Agents SDK's `ComputerTool` driving `CubicleComputer` through a scripted
Responses run: the SDK as users run it, only the model is a local server."""

from __future__ import annotations

import asyncio

from agents import Agent, ComputerTool, OpenAIResponsesModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

from cubicle import Desktop
from cubicle.tools import BlockingCubicleComputer, CubicleComputer
from tests.agent.fake_vendors import computer_call, response_text
from tests.desktop.tools.conftest import SCREEN
from tests.desktop.tools.probe import keys, presses, typed


async def test_computer_tool_drives_the_desktop_in_an_agent_run(
    big_desktop, focused_probe, fake_vendor
):
    set_tracing_disabled(True)  # the traces would go to OpenAI
    probe = focused_probe
    px, py, pw, ph = probe.area
    target = (px + pw // 2, py + ph // 2)
    click = {"type": "click", "button": "left", "x": target[0], "y": target[1], "keys": ["CTRL"]}
    typing = [{"type": "type", "text": "agents ✓"}, {"type": "keypress", "keys": ["ENTER"]}]
    acting = computer_call([click, *typing])
    fake_vendor.script("responses", [acting, response_text("Typed it.")])
    client = AsyncOpenAI(base_url=fake_vendor.url + "/v1", api_key="k")
    model = OpenAIResponsesModel(model="gpt-5.4", openai_client=client)
    agent = Agent(name="operator", model=model, tools=[ComputerTool(CubicleComputer(big_desktop))])
    mark = await probe.mark()
    result = await Runner.run(agent, "Type a greeting and press Enter.", max_turns=4)
    assert result.final_output == "Typed it."
    events = await probe.wait_for(lambda e: ("Return", []) in keys(e) and e, mark)
    pressed = presses(events)[0]
    assert (pressed["x"], pressed["y"], pressed["mods"]) == (*target, ["ctrl"])
    assert typed(events).startswith("agents ✓")
    first, second = fake_vendor.requests("responses")
    assert {"type": "computer"} in first.body["tools"]
    outputs = [item for item in second.body["input"] if item.get("type") == "computer_call_output"]
    assert [output["call_id"] for output in outputs] == [acting["output"][0]["call_id"]]
    assert [image.size for image in second.images()] == [SCREEN]


async def test_the_blocking_computer_is_the_same_mapping(service, big_desktop):
    desktop = await asyncio.to_thread(
        Desktop.connect, big_desktop.id, base_url=service.url, token=service.token
    )
    computer = BlockingCubicleComputer(desktop, max_size=(960, 960))
    assert computer.dimensions == (960, 540) and computer.environment == "ubuntu"
    await asyncio.to_thread(computer.move, 480, 270)
    x, y = await big_desktop.get_cursor_position()
    assert abs(x - 960) <= 2 and abs(y - 540) <= 2
    shot = await asyncio.to_thread(computer.screenshot)
    assert shot.startswith("iVBOR")  # base64 of a PNG
