"""The agent loop on a real desktop with a scripted planner: records, caps, history,
errors fed back, cancellation, and a planner that grounds itself."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from cubicle.agent import actions as p
from cubicle.agent._model import ChatModel
from cubicle.agent.grounding.a11y import A11yGrounder
from cubicle.agent.loop import Agent
from cubicle.agent.planner import ChatPlanner
from cubicle.agent.settings import RunLimits
from cubicle.agent.steps import StepRecord
from cubicle.agent.store import RunStore
from cubicle.agent.uitars import UiTarsPlanner
from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol.errors import InvalidRequest
from tests.agent.fake_model import FakeModelServer, Turn
from tests.conftest import Service, create_desktop

FAST = RunLimits(settle_quiet_ms=100, settle_timeout_ms=2_000)


def say(thought: str = "", **action) -> str:
    return json.dumps({"thought": thought, "action": action})


@pytest.fixture
async def remote(service: Service, desktop: dict) -> AsyncIterator[AsyncDesktop]:
    """The module's desktop through the SDK."""
    d = await AsyncDesktop.connect(desktop["id"], base_url=service.url, token=service.token)
    yield d
    await d.close()


@pytest.fixture
async def planner(fake_model: FakeModelServer) -> AsyncIterator[ChatPlanner]:
    model = ChatModel("fake-model", fake_model.url, retry_backoff_s=0.01, max_retries=1)
    yield ChatPlanner(model)
    await model.aclose()


async def test_a_run_is_recorded_step_by_step(
    remote: AsyncDesktop, planner: ChatPlanner, fake_model: FakeModelServer, tmp_path: Path
):
    fake_model.script([
        say("Start the editor.", type="launch", app="mousepad"),
        say("Open the File menu.", type="click", target="the File menu"),
        say("Close it again.", type="key", keys="Escape"),
        say("Nothing else to do.", type="done", summary="looked at the File menu"),
    ])  # fmt: skip
    heard: list[StepRecord] = []
    store = RunStore(tmp_path)
    agent = Agent(
        remote,
        planner,
        A11yGrounder(remote),
        limits=FAST.model_copy(update={"history_screenshots": 1}),
        store=store,
        on_step=heard.append,
        grounder_name="a11y",
    )
    record = await agent.run("Open and close the File menu of the text editor")

    assert (record.status, record.reason, record.steps) == ("done", "looked at the File menu", 4)
    assert record.id == agent.run_id and record.finished_at is not None
    assert [step.index for step in heard] == [1, 2, 3, 4]
    launch, click, escape, done = heard
    assert launch.outcome == "acted" and launch.result.endswith("Mousepad' shows it")
    assert click.action == p.Click(type="click", target="the File menu")
    (point,) = click.grounded
    assert point.source == "a11y" and point.box is not None
    left, top, right, bottom = point.box
    assert left <= point.x <= right and top <= point.y <= bottom
    assert click.result == f'ok: click "the File menu" at ({point.x}, {point.y})'
    assert click.settled is True
    timings = click.timings
    assert timings.observe_ms > 0 and timings.ground_ms > 0 and timings.settle_ms > 0
    assert timings.total_ms >= timings.model_ms > 0
    assert 0 < timings.overhead_ms < timings.total_ms
    assert escape.action == p.PressKey(keys="Escape") and escape.grounded == ()
    assert done.outcome == "done" and done.timings.act_ms == 0

    detail = await store.get_run(record.id)
    assert detail.run == record and detail.steps == heard
    assert (await store.list_runs())[0] == record
    shot = Image.open(store.step_image(record.id, 2)).convert("RGB")
    assert shot.size == (1280, 800)
    assert shot.getpixel((point.x + 14, point.y)) == (255, 0, 64)  # the ring around the point
    assert json.loads(click.calls[0].answer)["thought"] == "Open the File menu."
    # History: all text, but only the last screenshot besides the current one.
    last = fake_model.requests[3]
    assert len(last.image_sizes) == 2
    assert "Open the File menu." in last.text and "Start the editor." in last.text
    assert f"What happened at step 2: {click.result}" in last.text


async def test_the_step_cap(remote: AsyncDesktop, planner: ChatPlanner, fake_model):
    fake_model.script([say(type="wait", seconds=0.1)] * 3)
    limits = FAST.model_copy(update={"max_steps": 3})
    agent = Agent(remote, planner, A11yGrounder(remote), limits=limits, a11y_text=True)
    record = await agent.run("wait")
    assert record.status == "failed" and record.steps == 3
    assert record.reason == "reached the limit of 3 steps before the task was done"
    seen = fake_model.requests[0].text
    assert "Its accessibility tree (role 'name'):" in seen
    assert "toggle button 'Applications'" in seen  # the XFCE panel's menu button


async def test_commands_when_the_run_allows_them(remote: AsyncDesktop, fake_model: FakeModelServer):
    fake_model.script([
        say(type="exec", command="printf 'from the agent' > ~/agent-note.txt; echo written"),
        say(type="open", target="~/agent-note.txt"),
        say(type="done", summary="wrote and opened the note"),
    ])  # fmt: skip
    heard: list[StepRecord] = []
    async with ChatModel("fake-model", fake_model.url) as model:
        planner = ChatPlanner(model, allow_exec=True)
        agent = Agent(remote, planner, A11yGrounder(remote), limits=FAST, on_step=heard.append)
        record = await agent.run("write a note and open it")
    assert record.status == "done", [step.error for step in heard]
    written, opened, _ = heard
    assert written.result.startswith("ok: exec ") and "exit code 0" in written.result
    assert "written" in written.result
    assert re.search(r"window '.*agent-note\.txt.*' shows it$", opened.result), opened.result
    assert await remote.files.read("~/agent-note.txt") == b"from the agent"
    assert '"type": "exec"' in fake_model.requests[0].text


async def test_errors_in_a_row_end_the_run_and_each_is_fed_back(
    remote: AsyncDesktop, planner: ChatPlanner, fake_model: FakeModelServer
):
    fake_model.script([
        say(type="click", target="a purple unicorn"),
        say(type="wait", seconds=0.1),
        say(type="key", keys="ctrl+nosuchkey"),
        say(type="click", target="the purple unicorn button"),
        say(type="wait", seconds=0.1),
    ])  # fmt: skip
    limits = FAST.model_copy(update={"max_consecutive_errors": 2})
    heard: list[StepRecord] = []
    agent = Agent(remote, planner, A11yGrounder(remote), limits=limits, on_step=heard.append)
    record = await agent.run("find the unicorn")
    assert [step.outcome for step in heard] == ["error", "acted", "error", "error"]
    assert heard[0].error == "could not find 'a purple unicorn' on the screen"
    assert "nosuchkey" in (heard[2].error or "")
    assert record.status == "failed"
    assert record.reason == f"2 steps in a row failed; the last: {heard[3].error}"
    assert fake_model.pending == 1
    second = fake_model.requests[1].text
    assert "What happened at step 1: error: could not find 'a purple unicorn'" in second


async def test_the_time_cap(remote: AsyncDesktop, fake_model: FakeModelServer):
    fake_model.script([say(type="wait", seconds=0.1), Turn.hang(30.0)])
    model = ChatModel("fake-model", fake_model.url, timeout_s=60)
    limits = FAST.model_copy(update={"max_wall_s": 2.0})
    started = time.monotonic()
    async with model:
        record = await Agent(remote, ChatPlanner(model), A11yGrounder(remote), limits=limits).run(
            "wait forever"
        )
    assert time.monotonic() - started < 5
    assert record.status == "failed" and record.reason == "ran out of time: the run may take 2 s"
    assert record.steps == 1


async def test_cancelling_stops_at_once_and_leaves_the_desktop_alone(
    service: Service, remote: AsyncDesktop, planner: ChatPlanner, fake_model, tmp_path: Path
):
    fake_model.script([say(type="launch", app="mousepad"), Turn.hang(60.0)])
    store = RunStore(tmp_path)
    agent = Agent(remote, planner, A11yGrounder(remote), limits=FAST, store=store)
    running = asyncio.create_task(agent.run("start the editor, then think for a long time"))
    await asyncio.to_thread(fake_model.wait_for_requests, 2, 30.0)
    windows_before = await remote.get_windows()
    started = time.monotonic()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert time.monotonic() - started < 1.0

    detail = await store.get_run(agent.run_id)
    assert detail.run.status == "cancelled" and detail.run.steps == 1
    assert detail.run.reason == "cancelled during step 2; the desktop was left as it was"
    assert [w.id for w in await remote.get_windows()] == [w.id for w in windows_before]
    assert (await remote.refresh()).status == "ready"
    assert len(fake_model.requests) == 2


async def test_a_planner_that_grounds_itself_needs_no_grounder(
    remote: AsyncDesktop, fake_model: FakeModelServer
):
    fake_model.script([
        "Thought: Click the empty desktop.\nAction: click(start_box='(500,500)')",
        "Thought: That is all.\nAction: finished(content='clicked')",
    ])  # fmt: skip
    heard: list[StepRecord] = []
    async with ChatModel("ui-tars-7b", fake_model.url) as model:
        planner = UiTarsPlanner(model, family="ui-tars")
        record = await Agent(remote, planner, limits=FAST, on_step=heard.append).run("click")
    assert record.status == "done" and record.reason == "clicked" and record.grounder is None
    (point,) = heard[0].grounded
    assert (point.x, point.y, point.source) == (640, 400, "planner")
    assert await remote.get_cursor_position() == (640, 400)
    assert fake_model.requests[0].image_sizes == [(1280, 800)]


async def test_a_gone_desktop_ends_the_run_at_once(
    service: Service, api: httpx.Client, planner: ChatPlanner, fake_model: FakeModelServer
):
    info = create_desktop(api)
    d = await AsyncDesktop.connect(info["id"], base_url=service.url, token=service.token)
    try:
        await asyncio.to_thread(api.delete, f"/api/desktops/{info['id']}")
        fake_model.script([say(type="wait", seconds=0.1)])
        record = await Agent(d, planner, A11yGrounder(d), limits=FAST).run("anything")
    finally:
        await d.close()
    assert record.status == "failed" and record.steps == 0
    assert info["id"] in (record.reason or "")
    assert fake_model.requests == []


async def test_a_describing_planner_needs_a_grounder(remote: AsyncDesktop, planner: ChatPlanner):
    with pytest.raises(InvalidRequest, match="give the agent a grounder"):
        Agent(remote, planner)
