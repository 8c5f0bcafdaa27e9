"""The `anthropic` and `openai-computer` planners complete board tasks against scripted
servers speaking the Messages and Responses APIs, through the real `anthropic` and
`openai` clients, on real 1920×1080 desktops; and `cubicle run --planner` takes them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest

from cubicle import A11yTree, AsyncDesktop
from cubicle.agent.claude import ClaudePlanner
from cubicle.agent.errors import ModelError
from cubicle.agent.openai_computer import OpenAIComputerPlanner
from cubicle.guest.a11y import find
from tests.agent.board_api import FINISHED, add, set_board, wait_status
from tests.agent.fake_vendors import (
    FakeVendorServer,
    claude_text,
    claude_tool_use,
    computer_call,
    response_text,
)
from tests.conftest import Service, wait_until


def use_profile(board: httpx.Client, name: str, server: FakeVendorServer, kind: str) -> None:
    base_url = server.url if kind == "anthropic" else server.url + "/v1"
    profile = {"base_url": base_url, "api_key": "k", "planner_model": f"{kind}-fake"}
    response = board.put(f"/api/board/profiles/{name}", json=profile | {"planner_kind": kind})
    assert response.status_code == 200, response.text
    assert response.json()["ready"] is True, response.json()


def editor_text(board: httpx.Client, desktop_id: str) -> str:
    tree = board.get(f"/api/desktops/{desktop_id}/a11y", params={"app": "mousepad"})
    texts = find(A11yTree.model_validate(tree.json()), role="text")
    return texts[0].text or "" if texts else ""


def run_on_board(board: httpx.Client, profile: str, text: str) -> dict:
    set_board(board, concurrency=1, keep_desktop_s=120, resolution=[1920, 1080], record=False)
    task = add(board, text, profile=profile, start="mousepad")
    return wait_status(board, task["id"], *FINISHED, timeout_s=90)


def test_the_anthropic_planner_completes_a_board_task(board, fake_vendor):
    use_profile(board, "claude", fake_vendor, "anthropic")
    fake_vendor.script(
        "messages",
        [
            claude_tool_use({"action": "zoom", "region": [0, 0, 714, 402]}, text="Let me look."),
            claude_tool_use({"action": "mouse_move", "coordinate": [714, 402]}),
            claude_tool_use({"action": "type", "text": "from claude ✓"}),
            claude_text("Typed the line."),
        ],
    )
    task = run_on_board(board, "claude", "Write 'from claude ✓' in the editor")
    try:
        assert task["status"] == "done", task["result"]
        assert task["result"] == "Typed the line."
        steps = board.get(f"/api/tasks/{task['id']}/steps").json()
        actions = [s["action"] for s in steps]
        assert actions[0] == "computer mouse_move coordinate=[714, 402]", actions
        assert actions[1] == "computer type text='from claude ✓'"
        assert (steps[0]["x"], steps[0]["y"]) == (960, 540)  # 1429×804 frame → screen
        assert editor_text(board, task["desktop_id"]) == "from claude ✓"
        cursor = board.get(f"/api/desktops/{task['desktop_id']}/cursor").json()
        assert abs(cursor["x"] - 960) <= 2 and abs(cursor["y"] - 540) <= 2

        requests = fake_vendor.requests("messages")
        assert len(requests) == 4
        first = requests[0]
        assert first.headers["anthropic-beta"] == "computer-use-2025-11-24"
        tool = first.body["tools"][0]
        assert (tool["type"], tool["display_width_px"], tool["display_height_px"]) == (
            "computer_20251124",
            1429,
            804,
        )
        assert [image.size for image in first.images()] == [(1429, 804)]
        zoomed = requests[1].body["messages"][-1]["content"][-1]  # answered in the same step
        assert zoomed["type"] == "tool_result" and zoomed["content"][0]["type"] == "image"
        assert requests[1].images()[-1].size == (1429, 804)  # the region, enlarged
        last = requests[3].body["messages"][-1]["content"][-1]
        assert last["type"] == "tool_result" and "is_error" not in last
    finally:
        board.delete(f"/api/desktops/{task['desktop_id']}")


def test_the_openai_computer_planner_completes_a_board_task(board, fake_vendor):
    use_profile(board, "operator", fake_vendor, "openai-computer")
    fake_vendor.script(
        "responses",
        [
            computer_call([{"type": "screenshot"}]),
            computer_call(
                [
                    {"type": "type", "text": "from openai"},
                    {"type": "keypress", "keys": ["ENTER"]},
                    {"type": "type", "text": "second line"},
                ]
            ),
            response_text("Both lines are written."),
        ],
    )
    task = run_on_board(board, "operator", "Write two lines in the editor")
    try:
        assert task["status"] == "done", task["result"]
        assert task["result"] == "Both lines are written."
        steps = board.get(f"/api/tasks/{task['id']}/steps").json()
        assert len(steps) == 2 and steps[0]["action"].startswith("computer type text='from openai'")
        assert editor_text(board, task["desktop_id"]) == "from openai\nsecond line"
        first, second, third = fake_vendor.requests("responses")
        assert first.body["tools"] == [{"type": "computer"}]
        assert [image.size for image in first.images()] == [(1920, 1080)]
        assert second.body["previous_response_id"] and second.body["input"][0]["type"] == (
            "computer_call_output"
        )
        outputs = [item for item in third.body["input"] if item["type"] == "computer_call_output"]
        assert len(outputs) == 1 and third.images()[0].size == (1920, 1080)
    finally:
        board.delete(f"/api/desktops/{task['desktop_id']}")


@pytest.mark.parametrize("kind", ["anthropic", "openai-computer"])
def test_cubicle_run_takes_the_tool_planners(service: Service, fake_vendor, kind):
    if kind == "anthropic":
        fake_vendor.script("messages", [claude_text("Nothing to do.")])
        url = fake_vendor.url
    else:
        fake_vendor.script("responses", [response_text("Nothing to do.")])
        url = fake_vendor.url + "/v1"
    env = os.environ | {"CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token}
    argv = [sys.executable, "-m", "cubicle.cli", "run", "Look at the screen", "--planner", kind]
    argv += ["--model", "fake", "--model-url", url, "--api-key", "k"]
    argv += ["--data-dir", str(service.data_dir)]
    ran = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"planner {kind}:fake, grounder none" in ran.stdout
    assert "done: Nothing to do." in ran.stdout
    wait_until(lambda: fake_vendor.pending == 0, 5, what="the scripted answer used")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("planner", "suffix", "name"),
    [(ClaudePlanner, "", "Anthropic"), (OpenAIComputerPlanner, "/v1", "OpenAI")],
)
async def test_a_vendor_failure_reads_the_same_whichever_vendor(
    service: Service, fake_vendor, planner, suffix, name
):
    """Both vendors' errors go through one mapping: the status, the endpoint, a hint."""
    async with await AsyncDesktop.create(base_url=service.url, token=service.token) as d:
        refusing = planner(
            d, "model-x", base_url=fake_vendor.url + suffix, max_retries=0, api_key="k"
        )
        with pytest.raises(ModelError) as refused:  # nothing scripted: the fake answers 418
            await refusing.turn()
        assert refused.value.status == 418
        assert f"the {name} endpoint answered HTTP 418" in refused.value.message
        assert "check that it serves 'model-x'" in refused.value.message
        down = f"http://127.0.0.1:{_closed_port()}{suffix}"
        unreachable = planner(d, "model-x", base_url=down, max_retries=0, api_key="k")
        with pytest.raises(ModelError, match=f"cannot reach the {name} endpoint"):
            await unreachable.turn()
