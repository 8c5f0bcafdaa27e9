"""The README's integration snippets run as printed: the Claude Desktop MCP config launches
`cubicle mcp`, and the Anthropic, OpenAI and Agents SDK loops drive a real desktop, their
models being scripted servers the real clients talk to (through the usual environment
variables, as users point them at the vendors)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from mcp import Client, StdioServerParameters

from tests.agent.fake_vendors import (
    FakeVendorServer,
    claude_text,
    claude_tool_use,
    computer_call,
    response_text,
)
from tests.conftest import Service

ROOT = Path(__file__).resolve().parent.parent


def snippet(name: str) -> str:
    readme = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- snippet: {name} -->\n```\w+\n(.*?)```", readme, re.S)
    assert found, f"no snippet {name!r} in README.md"
    return found.group(1)


def run_snippet(name: str, service: Service, vendor: FakeVendorServer) -> str:
    env = os.environ | {
        "CUBICLE_URL": service.url,
        "CUBICLE_TOKEN": service.token,
        "ANTHROPIC_BASE_URL": vendor.url,
        "ANTHROPIC_API_KEY": "k",
        "OPENAI_BASE_URL": vendor.url + "/v1",
        "OPENAI_API_KEY": "k",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",  # traces would go to OpenAI
        "PYTHONPATH": str(ROOT),
    }
    ran = subprocess.run(
        [sys.executable, "-c", snippet(name)], env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    return ran.stdout


async def test_the_claude_desktop_config_starts_the_mcp_server(service):
    config = json.loads(snippet("claude-desktop"))["mcpServers"]["cubicle"]
    command = config["command"].replace("/path/to/cubicle", str(ROOT))
    env = config["env"] | {"CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token}
    params = StdioServerParameters(command=command, args=config["args"], env=env)
    async with Client(params) as client:
        tools = {tool.name for tool in (await client.list_tools()).tools}
        listed = await client.call_tool("list_desktops", {})
    assert {"create_desktop", "screenshot", "click", "type_text"} <= tools
    assert not listed.is_error


def test_the_anthropic_loop(service, fake_vendor):
    fake_vendor.script(
        "messages",
        [
            claude_tool_use({"action": "screenshot"}),
            claude_tool_use({"action": "key", "text": "Escape"}),
            claude_text("A haiku, written."),
        ],
    )
    assert run_snippet("anthropic", service, fake_vendor).strip() == "A haiku, written."
    requests = fake_vendor.requests("messages")
    assert len(requests) == 3
    answer = requests[1].body["messages"][-1]["content"][0]
    assert answer["type"] == "tool_result" and answer["content"][0]["type"] == "image"
    assert [image.size for image in requests[2].images()] == [(1280, 800), (1280, 800)]


def test_the_openai_loop(service, fake_vendor):
    fake_vendor.script(
        "responses",
        [
            computer_call([{"type": "screenshot"}]),
            computer_call(
                [{"type": "type", "text": "hello"}, {"type": "keypress", "keys": ["ESC"]}]
            ),
            response_text("Done, haiku written."),
        ],
    )
    assert run_snippet("openai", service, fake_vendor).strip() == "Done, haiku written."
    _, second, third = fake_vendor.requests("responses")
    assert second.body["previous_response_id"] and third.body["input"][0]["type"] == (
        "computer_call_output"
    )
    assert [image.size for image in third.images()] == [(1280, 800)]


def test_the_agents_sdk_agent(service, fake_vendor):
    fake_vendor.script(
        "responses",
        [
            computer_call([{"type": "move", "x": 640, "y": 400}]),
            response_text("The haiku is in the editor."),
        ],
    )
    output = run_snippet("agents", service, fake_vendor)
    assert output.strip() == "The haiku is in the editor."
    second = fake_vendor.requests("responses")[1]
    assert [image.size for image in second.images()] == [(1280, 800)]


def test_the_ports_snippet_opens_a_dev_server_and_drives_chromium(service, fake_vendor):
    host, preview, heading = run_snippet("ports", service, fake_vendor).splitlines()
    port = service.url.rsplit(":", 1)[1]
    assert re.fullmatch(rf"3000-[0-9a-f]{{12}}\.cubicle\.localhost:{port}", host), host
    assert preview.startswith(f"https://{host}/?cubicle_token=preview1.")
    assert heading == "built by the agent"  # read by Playwright in the desktop's Chromium


def test_the_e2b_snippet_runs_unchanged_with_the_three_exports(service):
    env = os.environ | {
        "E2B_API_URL": service.url,
        "E2B_SANDBOX_URL": service.url,
        "E2B_API_KEY": service.token,
    }
    ran = subprocess.run(
        [sys.executable, "-c", snippet("e2b")], env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines() == ["hi from user", "2"]


def test_the_pause_snippet_pauses_and_resumes_with_the_editor_open(service, fake_vendor):
    paused, resumed = run_snippet("pause", service, fake_vendor).splitlines()
    assert paused == "paused"
    assert resumed.startswith("ready") and "Mousepad" in resumed
