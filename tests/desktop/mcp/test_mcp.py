"""Cubicle's MCP server judged by the official `mcp` client, over stdio (`cubicle mcp`, as
Claude Desktop launches it) and over streamable HTTP (`/mcp` on the service)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import sys
import time
from collections.abc import AsyncIterator

import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from PIL import Image

from tests.agent.board_api import set_board
from tests.conftest import Service

EXPECTED_TOOLS = {
    "create_desktop", "list_desktops", "kill_desktop", "screenshot", "click", "double_click",
    "triple_click", "move", "drag", "scroll", "type_text", "key", "key_down", "key_up", "wait",
    "wait_for_settle", "mouse_down", "mouse_up", "cursor_position", "list_windows",
    "window_action", "accessibility_tree", "exec_command", "read_file", "write_file",
    "list_files", "launch", "open", "get_clipboard", "set_clipboard", "add_task", "list_tasks",
    "get_task", "cancel_task",
}  # fmt: skip


@contextlib.asynccontextmanager
async def connect(service: Service, transport: str) -> AsyncIterator[Client]:
    if transport == "stdio":
        env = {"CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token, "PATH": "/usr/bin:/bin"}
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "cubicle.cli", "mcp"], env=env
        )
        async with Client(params) as client:
            yield client
    else:
        headers = {"Authorization": f"Bearer {service.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120) as http,
            Client(streamable_http_client(service.url + "/mcp", http_client=http)) as client,
        ):
            yield client


def text_of(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def call(client: Client, tool: str, **arguments) -> CallToolResult:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, text_of(result)
    return result


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_an_mcp_client_drives_a_desktop(service, transport):
    async with connect(service, transport) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        assert tools >= EXPECTED_TOOLS

        created = await call(client, "create_desktop")
        desktop_id = created.structured_content["desktop_id"]
        assert desktop_id in text_of(created)
        try:
            listed = await call(client, "list_desktops")
            assert desktop_id in [d["id"] for d in listed.structured_content["desktops"]]
            await call(client, "launch", desktop_id=desktop_id, app="mousepad")
            deadline = time.monotonic() + 20
            while True:
                listed = await call(client, "list_windows", desktop_id=desktop_id)
                editors = [
                    w for w in listed.structured_content["windows"] if w["app"] == "Mousepad"
                ]
                if editors:
                    break
                assert time.monotonic() < deadline, text_of(listed)
                await asyncio.sleep(0.2)
            await call(client, "wait_for_settle", desktop_id=desktop_id, quiet_ms=300)

            shot = await call(client, "screenshot", desktop_id=desktop_id, max_width=640)
            expected = {"width": 640, "height": 400, "screen": [1280, 800], "scale": 2.0}
            assert shot.structured_content == {"desktop_id": desktop_id} | expected
            image_block = next(block for block in shot.content if block.type == "image")
            image = Image.open(io.BytesIO(base64.b64decode(image_block.data)))
            assert image.size == (640, 400) and image_block.mime_type == "image/png"
            assert "scale 2" in text_of(shot)

            editor = editors[0]  # screen pixels; the frame is now half of them
            x, y = (editor["x"] + 200) // 2, (editor["y"] + 150) // 2
            clicked = await call(client, "click", desktop_id=desktop_id, x=x, y=y)
            assert desktop_id in text_of(clicked) and "640×400 screenshot" in text_of(clicked)
            pointer = await call(client, "cursor_position", desktop_id=desktop_id)
            assert pointer.structured_content == {"desktop_id": desktop_id, "x": x, "y": y}
            await call(client, "type_text", desktop_id=desktop_id, text="héllo ✓ 你好 Ω")
            deadline = time.monotonic() + 10
            while True:
                tree = await call(
                    client,
                    "accessibility_tree",
                    desktop_id=desktop_id,
                    app="mousepad",
                    format="json",
                )
                texts = [n for n in _walk(tree.structured_content["nodes"]) if n.get("text")]
                if any("héllo ✓ 你好 Ω" in n["text"] for n in texts):
                    break
                assert time.monotonic() < deadline, texts
                await asyncio.sleep(0.2)
            compact = await call(
                client, "accessibility_tree", desktop_id=desktop_id, app="mousepad"
            )
            assert "application 'mousepad'" in text_of(compact)

            ran = await call(
                client, "exec_command", desktop_id=desktop_id, command="echo out; exit 3"
            )
            assert (
                ran.structured_content["stdout"] == "out\n"
                and ran.structured_content["exit_code"] == 3
            )
            await call(
                client, "write_file", desktop_id=desktop_id, path="~/m.txt", content="zwölf ✓"
            )
            read = await call(client, "read_file", desktop_id=desktop_id, path="~/m.txt")
            assert read.content[0].text.endswith("\nzwölf ✓")

            off = await client.call_tool("click", {"desktop_id": desktop_id, "x": 5000, "y": 10})
            assert off.is_error
            assert "is off the 640×400 screenshot of the 1280×800 screen" in text_of(off)
            await call(client, "screenshot", desktop_id=desktop_id)  # back to the whole screen
            off = await client.call_tool("click", {"desktop_id": desktop_id, "x": 5000, "y": 10})
            assert off.is_error and "point (5000, 10) is off the 1280×800 screen" in text_of(off)
        finally:
            await call(client, "kill_desktop", desktop_id=desktop_id)
        missing = await client.call_tool("screenshot", {"desktop_id": desktop_id})
        assert missing.is_error and desktop_id in text_of(missing)
        assert "not found" in text_of(missing) or "no desktop" in text_of(missing)


def _walk(nodes: list[dict]) -> list[dict]:
    found = []
    for node in nodes:
        found.append(node)
        found.extend(_walk(node.get("children", [])))
    return found


async def test_http_mcp_needs_the_token_and_the_service_keeps_answering(service):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=service.url) as http:
        bare = await http.post("/mcp", json=body, headers=headers)
        assert bare.status_code == 401 and bare.json()["error"] == "unauthorized"
        wrong = await http.post("/mcp", json=body, headers=headers | {"Authorization": "Bearer x"})
        assert wrong.status_code == 401
        health = await http.get("/healthz")
        assert health.status_code == 200


async def test_the_board_through_mcp(service, board):
    set_board(board, concurrency=0)  # held: the task stays queued
    async with connect(service, "http") as client:
        added = await call(client, "add_task", text="Write a haiku in the editor")
        task_id = added.structured_content["task"]["id"]
        listed = await call(client, "list_tasks", status="queued")
        assert task_id in [task["id"] for task in listed.structured_content["tasks"]]
        got = await call(client, "get_task", task_id=task_id)
        assert got.structured_content["task"]["status"] == "queued"
        assert got.structured_content["steps"] == []
        cancelled = await call(client, "cancel_task", task_id=task_id)
        assert cancelled.structured_content["task"]["status"] == "cancelled"
        missing = await client.call_tool("get_task", {"task_id": 999_999})
        assert missing.is_error and "999999" in text_of(missing)
        assert json.loads(json.dumps(got.structured_content))  # plain JSON all through
