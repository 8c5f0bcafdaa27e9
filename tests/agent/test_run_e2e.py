"""End to end on a real desktop: a scripted planner that names elements only by description,
the accessibility and OCR grounders finding them on the real screen, the task's effect checked
from outside; and model servers that fail, with the service staying up."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from cubicle.agent.run import run_task
from cubicle.agent.settings import load_settings
from cubicle.agent.steps import StepRecord
from cubicle.agent.store import RunStore
from cubicle.client.sdk import AsyncDesktop
from tests.agent.fake_model import FakeModelServer, Turn
from tests.conftest import Service, create_desktop

HAIKU = "sandbox walls stand tall\nquiet desktops, one per mind\nthe agent clicks save"


def say(thought: str, **action) -> str:
    return json.dumps({"thought": thought, "action": action})


@pytest.fixture(scope="module")
def tall_desktop(api: httpx.Client) -> Iterator[dict]:
    """1280×1024: GTK's Save dialog (1096×856 by default) fits with its buttons on screen."""
    info = create_desktop(api, resolution=[1280, 1024])
    try:
        yield info
    finally:
        api.delete(f"/api/desktops/{info['id']}")


@pytest.fixture
async def remote(service: Service, tall_desktop: dict) -> AsyncIterator[AsyncDesktop]:
    d = await AsyncDesktop.connect(tall_desktop["id"], base_url=service.url, token=service.token)
    yield d
    await d.close()


def _closed_port() -> int:
    """A loopback port nothing listens on: a model endpoint that is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def settings(server: FakeModelServer, grounder: str, **flags):
    return load_settings(
        {
            "base_url": server.url,
            "planner.model": "fake-model",
            "grounder.spec": grounder,
            "retry_backoff_s": 0.05,
        }
        | flags,
        env={},
    )


async def test_a_haiku_is_written_and_saved(
    service: Service,
    api: httpx.Client,
    remote: AsyncDesktop,
    fake_model: FakeModelServer,
):
    fake_model.script([
        say("Open the text editor.", type="launch", app="mousepad"),
        say("The editor has the focus: write the haiku.", type="type", text=HAIKU),
        say("Put the cursor on a word of the poem.", type="click", target="the word 'sandbox'"),
        say("Open the File menu to save.", type="click", target="the File menu"),
        say("Choose Save As.", type="click", target="the Save As menu item"),
        # GTK may build the dialog for ~0.5 s without drawing anything, so the screen can
        # settle before it shows; a planner that sees no dialog yet waits, as this one does.
        say("Let the Save As dialog open.", type="wait", seconds=1),
        say("Name the file; the dialog is in the home folder.", type="type", text="haiku.txt"),
        say("Save it.", type="click", target="the Save button"),
        say("The title shows haiku.txt.", type="done", summary="saved ~/haiku.txt"),
    ])  # fmt: skip
    heard: list[StepRecord] = []
    record = await run_task(
        remote,
        "Open the text editor, write a haiku about sandboxes and save it as ~/haiku.txt",
        settings(fake_model, "a11y,ocr"),
        store=RunStore(service.data_dir),
        on_step=heard.append,
    )

    story = [(step.action_text, step.result, [g.raw for g in step.grounded]) for step in heard]
    assert record.status == "done", story
    assert [step.outcome for step in heard] == ["acted"] * 8 + ["done"]
    saved = (await remote.files.read("~/haiku.txt")).decode()
    assert saved.rstrip("\n") == HAIKU, story
    sources = {step.action_text: step.grounded[0].source for step in heard if step.grounded}
    assert sources == {
        '''click "the word 'sandbox'"''': "ocr",
        'click "the File menu"': "a11y",
        'click "the Save As menu item"': "a11y",
        'click "the Save button"': "a11y",
    }

    # The record, through the service's API.
    detail = await asyncio.to_thread(api.get, f"/api/runs/{record.id}")
    assert detail.status_code == 200, detail.text
    body = detail.json()
    assert body["run"]["status"] == "done" and len(body["steps"]) == 9
    save = body["steps"][7]
    assert save["grounded"][0]["source"] == "a11y" and save["calls"][0]["prompt"]
    image = await asyncio.to_thread(api.get, f"/api/runs/{record.id}/steps/8.png")
    assert image.status_code == 200 and image.headers["content-type"] == "image/png"


@pytest.mark.parametrize(
    ("turns", "flags", "reason"),
    [
        ([Turn.error(500, "CUDA out of memory")] * 4, {}, "answered HTTP 500 on all 2 attempts"),
        ([Turn.hang(10.0)] * 4, {"timeout_s": 0.5}, "did not answer within 0.5 s (2 attempts)"),
        ([Turn.garbage()] * 4, {}, "not a chat completion: '<html>502 Bad Gateway"),
        (["I think I will click the button."] * 6, {}, "unusable 3 times in a row"),
        ([], {"base_url": f"http://127.0.0.1:{_closed_port()}/v1"}, "cannot reach the planner"),
    ],
    ids=["500s", "timeouts", "garbage-body", "unparseable", "endpoint-down"],
)
async def test_a_failing_model_fails_the_run_with_a_clear_reason(
    service: Service,
    api: httpx.Client,
    remote: AsyncDesktop,
    fake_model: FakeModelServer,
    turns: list,
    flags: dict,
    reason: str,
):
    fake_model.script(turns)
    limits = {"max_retries": 1, "limits.max_consecutive_errors": 2}
    record = await run_task(remote, "Save a haiku", settings(fake_model, "a11y", **limits | flags))
    assert record.status == "failed" and record.steps == 2
    assert record.reason is not None and record.reason.startswith("2 steps in a row failed")
    assert reason in record.reason
    assert fake_model.pending == 0
    health = await asyncio.to_thread(api.get, "/healthz")
    assert health.status_code == 200
    assert (await remote.refresh()).status == "ready"
    assert len(await remote.screenshot()) > 1000
