"""What each integration adds to an action: the adapters beside the raw REST call, one run.

One desktop (1280×800), one click point on the backdrop. Each way is timed end to end from
the caller's side, p50 of `n` calls, interleaved by rounds so load on the shared machine
falls on all of them alike:

- `rest`: `POST /api/desktops/{id}/actions` with httpx (keep-alive), the baseline;
- `sdk`: `AsyncDesktop.actions(Click)`;
- `anthropic`, `openai`: the executors' mapping and send (`plan` + `send`), no screenshot;
- `agents`: `CubicleComputer.click` (the Agents SDK's computer);
- `functions`: `CubicleFunctions.call("click", json)`;
- `mcp_stdio`, `mcp_http`: an MCP `tools/call` of `click`, official client, over `cubicle
  mcp` and over the service's `/mcp`.

Screenshots the same way: `GET …/screenshot` (PNG) against each adapter's screenshot answer
(Claude's image block, OpenAI's data URL, MCP image content). `overhead_ms` is an adapter's
p50 minus the raw REST call's; `overhead_vs_sdk_ms` minus the SDK's, which the adapters use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from bench._run import Options, progress
from bench._service import Service, running_service
from bench._stats import summarize
from cubicle import AsyncDesktop
from cubicle.protocol import actions as a
from cubicle.tools import AnthropicComputer, CubicleComputer, CubicleFunctions, OpenAIComputer

POINT = (640, 400)
Call = Callable[[], Awaitable[Any]]


@contextlib.asynccontextmanager
async def _mcp(service: Service, transport: str) -> AsyncIterator[Client]:
    if transport == "stdio":
        env = {"CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token, "PATH": "/usr/bin:/bin"}
        args = ["-m", "cubicle.cli", "mcp"]
        async with Client(StdioServerParameters(command=sys.executable, args=args, env=env)) as c:
            yield c
        return
    headers = {"Authorization": f"Bearer {service.token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(service.url + "/mcp", http_client=http)) as c,
    ):
        yield c


async def _time(ways: dict[str, Call], rounds: int) -> dict[str, dict[str, Any]]:
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for call in ways.values():  # warm every path (connections, imports) once
        await call()
    for _ in range(rounds):
        for name, call in ways.items():
            started = time.perf_counter()
            await call()
            samples[name].append(time.perf_counter() - started)
    summaries = {name: summarize(values) for name, values in samples.items()}
    base = summaries["rest"].p50_ms
    sdk = summaries["sdk"].p50_ms
    return {
        name: {
            "p50_ms": s.p50_ms,
            "p95_ms": s.p95_ms,
            "n": s.n,
            "overhead_ms": round(s.p50_ms - base, 3),
            "overhead_vs_sdk_ms": round(s.p50_ms - sdk, 3),
        }
        for name, s in summaries.items()
    }


async def _measure(service: Service, rounds: int) -> dict[str, Any]:
    desktop = await AsyncDesktop.create(base_url=service.url, token=service.token)
    service.desktop_ids.add(desktop.id)
    rest = httpx.AsyncClient(
        base_url=f"{service.url}/api/desktops/{desktop.id}",
        headers={"Authorization": f"Bearer {service.token}"},
        timeout=60,
    )
    claude = AnthropicComputer(desktop, settle=None)
    operator = OpenAIComputer(desktop, settle=None)
    computer = CubicleComputer(desktop, settle=None)
    functions = CubicleFunctions(desktop)
    click_json = {"type": "click", "x": POINT[0], "y": POINT[1]}
    claude_click = {"action": "left_click", "coordinate": list(POINT)}
    try:
        async with _mcp(service, "stdio") as stdio, _mcp(service, "http") as http:
            mcp_click = {"desktop_id": desktop.id, "x": POINT[0], "y": POINT[1]}
            await stdio.call_tool("screenshot", {"desktop_id": desktop.id})  # the full frame

            async def posted() -> None:
                (await rest.post("/actions", json=click_json)).raise_for_status()

            clicks = {
                "rest": posted,
                "sdk": lambda: desktop.actions(a.Click(x=POINT[0], y=POINT[1])),
                "anthropic": lambda: claude.screen.send(claude.plan(claude_click).actions),
                "openai": lambda: operator.screen.send(operator.plan(click_json).actions),
                "agents": lambda: computer.click(*POINT, "left"),
                "functions": lambda: functions.call(
                    "click", json.dumps({"x": POINT[0], "y": POINT[1]})
                ),
                "mcp_stdio": lambda: stdio.call_tool("click", mcp_click),
                "mcp_http": lambda: http.call_tool("click", mcp_click),
            }
            progress(f"adapters: {rounds} rounds of clicks")
            click_results = await _time(clicks, rounds)

            async def shot() -> None:
                (await rest.get("/screenshot", params={"format": "png"})).raise_for_status()

            shots = {
                "rest": shot,
                "sdk": lambda: desktop.screenshot("png"),
                "anthropic": lambda: claude({"action": "screenshot"}),
                "openai": lambda: operator([{"type": "screenshot"}]),
                "agents": computer.screenshot,
                "mcp_stdio": lambda: stdio.call_tool("screenshot", {"desktop_id": desktop.id}),
                "mcp_http": lambda: http.call_tool("screenshot", {"desktop_id": desktop.id}),
            }
            progress(f"adapters: {max(5, rounds // 4)} rounds of screenshots")
            shot_results = await _time(shots, max(5, rounds // 4))
    finally:
        await rest.aclose()
        await desktop.kill()
    return {"click": click_results, "screenshot_png_1280x800": shot_results}


def run(options: Options) -> dict[str, Any]:
    rounds = 20 if options.quick else 100
    with running_service(CUBICLE_WARM_POOL="1") as service:
        result = asyncio.run(_measure(service, rounds))
    result["rounds"] = rounds
    return result
