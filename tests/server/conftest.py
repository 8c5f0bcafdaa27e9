"""The service's app in this process: `create_app` with the rooms `cubicle serve` mounts,
its lifespan run for real, requests through httpx's ASGI transport (no socket, no
subprocess). For what needs no desktop; the warm pool is off, so none ever starts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from cubicle.server.app import create_app
from cubicle.server.board.room import AgentRoom
from cubicle.server.evals.room import EvalRoom
from cubicle.server.live.api import LiveRoom
from cubicle.server.mcp import McpRoom
from cubicle.server.settings import Settings

TOKEN = "in-process-token"
BASE_URL = "http://cubicle.test"
MAX_BODY_MB = 1
"""The body cap of the in-process service (`CUBICLE_MAX_BODY_MB`), small to test it cheaply."""


@dataclass
class InProcess:
    """A running app: `api` carries the admin token, `anonymous` carries none (a test
    that receives a cookie uses a `browser()` of its own: clients keep cookies)."""

    api: httpx.AsyncClient
    anonymous: httpx.AsyncClient
    transport: httpx.ASGITransport
    data_dir: Path

    def browser(self) -> httpx.AsyncClient:
        """A new client with an empty cookie jar."""
        return httpx.AsyncClient(transport=self.transport, base_url=BASE_URL)


class _WithState:
    """What uvicorn does with a lifespan's state: a shallow copy in every request's scope
    (httpx's ASGI transport sends requests only, no lifespan)."""

    def __init__(self, app: ASGIApp, state: Mapping[str, Any]) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["state"] = dict(self.state)
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[Mapping[str, Any]]:
    """Run the app's lifespan in a task of its own, as a server does: its rooms enter
    task groups (the MCP room's) that must be left by the task that entered them."""
    started: asyncio.Future[Mapping[str, Any]] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()

    async def lifespan() -> None:
        try:
            async with app.router.lifespan_context(app) as state:
                started.set_result(state or {})
                await stop.wait()
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    task = asyncio.create_task(lifespan(), name="in-process-lifespan")
    try:
        yield await started
    finally:
        stop.set()
        await task


@pytest.fixture(scope="module")
async def inprocess() -> AsyncIterator[InProcess]:
    umask = os.umask(0o077)  # read it: the lifespan sets the service's own process-wide
    os.umask(umask)
    with tempfile.TemporaryDirectory(prefix="cubicle-inprocess-") as tmp:
        data_dir = Path(tmp)
        settings = Settings(
            data_dir=data_dir,
            token=TOKEN,
            runtime="local",
            warm_pool=0,
            max_body_mb=MAX_BODY_MB,
        )
        app = create_app(settings, rooms=[LiveRoom(), AgentRoom(), McpRoom(), EvalRoom()])
        try:
            async with running(app) as state:
                transport = httpx.ASGITransport(app=_WithState(app, state))
                headers = {"Authorization": f"Bearer {TOKEN}"}
                async with (
                    httpx.AsyncClient(transport=transport, base_url=BASE_URL) as anonymous,
                    httpx.AsyncClient(
                        transport=transport, base_url=BASE_URL, headers=headers
                    ) as api,
                ):
                    yield InProcess(api, anonymous, transport, data_dir)
        finally:
            os.umask(umask)
            gc.unfreeze()  # the lifespan froze the heap for a service's life, not a test's
