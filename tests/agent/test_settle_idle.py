"""The agent's settle ends early once the desktop is idle, and still the screenshot after each
action shows what the action did: every menu a click opened is in the next screenshot the
planner gets, every Escape's closing too. Real desktop, real agent; the model is scripted."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator

import numpy as np
import pytest
from PIL import Image

from cubicle import AsyncDesktop
from cubicle.agent._model import ChatModel
from cubicle.agent.grounding.a11y import A11yGrounder
from cubicle.agent.loop import Agent
from cubicle.agent.planner import ChatPlanner
from cubicle.agent.settings import RunLimits
from tests.agent.fake_model import FakeModelServer
from tests.conftest import Service

MENUS = ("the File menu", "the Edit menu", "the Help menu")
MENU_AREA = (0, 70, 420, 420)
"""Where mousepad's menus drop down (left, top, right, bottom), below its menu bar."""


def say(thought: str, **action) -> str:
    return json.dumps({"thought": thought, "action": action})


@pytest.fixture
async def desktop(service: Service) -> AsyncIterator[AsyncDesktop]:
    d = await AsyncDesktop.create(base_url=service.url, token=service.token)
    yield d
    await d.kill()


def _area(png_or_jpeg_image: Image.Image) -> np.ndarray:
    return np.asarray(png_or_jpeg_image.convert("L").crop(MENU_AREA), dtype=np.int16)


async def test_each_screenshot_after_an_early_settle_shows_the_action_done(
    desktop: AsyncDesktop, fake_model: FakeModelServer
):
    limits = RunLimits()
    assert limits.settle_idle_ms is not None and limits.settle_idle_ms < limits.settle_quiet_ms
    turns = [say("Start the editor.", type="launch", app="mousepad")]
    for menu in MENUS * 2:
        turns += [
            say("Open it.", type="click", target=menu),
            say("Close.", type="key", keys="Escape"),
        ]
    fake_model.script([*turns, say("Seen them all.", type="done", summary="menus")])
    model = ChatModel("fake-model", fake_model.url, timeout_s=30)
    try:
        agent = Agent(desktop, ChatPlanner(model), A11yGrounder(desktop), limits=limits)
        record = await agent.run("Open each menu of the text editor and close it again")
    finally:
        await model.aclose()
    assert record.status == "done", record.reason

    # Request n carries the screenshot taken after action n-1 settled.
    shots = [Image.open(io.BytesIO(_png(r))) for r in fake_model.requests]
    assert len(shots) == len(turns) + 1
    closed = _area(shots[1])  # the editor, no menu open
    for n in range(1, len(turns)):
        after = _area(shots[n + 1])
        changed = float(np.mean(np.abs(after - closed) > 40))
        if turns[n].find('"click"') >= 0:
            assert changed > 0.005, f"no menu in the screenshot after step {n + 1}"
        else:
            assert changed < 0.001, f"a menu still shows after Escape, step {n + 1}"


def _png(request) -> bytes:
    (image,) = request.images()[-1:]
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()
