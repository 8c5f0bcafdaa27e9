"""The service's in-process door: how rooms that run inside `cubicle serve` (the board's
runs, the MCP room, OSWorld's surfaces) reach its API without a socket or the admin token.

A room holds an SDK object (`AsyncDesktop`, `AsyncServiceClient`) whose HTTP client sends
each request straight into the service's own ASGI app (`InProcessTransport`): the same
routes, checks and errors as a request from outside, minus the loopback hop. The request's
ASGI scope carries `INSIDE`, a key bound to an object of this module: the auth dependency
admits a request that carries it as the admin. Nothing from outside can set it: a server
builds each scope from the bytes it read (headers land in `scope["headers"]`), and the
value must be this very object, not something equal to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

INSIDE = "cubicle.inside"
"""The ASGI scope key that marks a request sent by the service to itself."""
_MARK = object()
URL = "http://cubicle.inside"
"""The base URL of in-process clients: only its path reaches the app."""


def marked(scope: Scope) -> Scope:
    """`scope` as the service's own request: for a request the service checked itself
    and hands to one of its routes (E2B's code interpreter port, `cubicle.server.ports`)."""
    return {**scope, INSIDE: _MARK}


def is_inside(scope: Scope) -> bool:
    """Whether the request came through `InProcessTransport` (the service itself)."""
    return scope.get(INSIDE) is _MARK


class InProcessTransport(httpx.AsyncBaseTransport):
    """Sends requests into `app` in this process, marked as the service's own.

    Each request runs in a task of its own, as one over a socket would: cancelling the
    caller (a cancelled task run, say) does not cancel the request half way (a desktop half
    created), and what the app puts in its context stays there. The client's read timeout
    bounds the wait (an `httpx.ReadTimeout`, as over a socket). The answer is whole before
    it is returned: no route the SDK calls streams without end."""

    def __init__(self, app: ASGIApp, state: Mapping[str, Any]) -> None:
        self._app = app
        self._state = state
        self._asgi = httpx.ASGITransport(app=self._enter, raise_app_exceptions=False)
        self._running: set[asyncio.Task[httpx.Response]] = set()

    async def _enter(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The lifespan's state, as a server hands it to each request (a shallow copy).
        scope = {**scope, INSIDE: _MARK, "state": dict(self._state)}
        await self._app(scope, receive, send)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        task = asyncio.create_task(self._asgi.handle_async_request(request))
        self._running.add(task)
        task.add_done_callback(_forget(self._running))
        timeout = request.extensions.get("timeout", {}).get("read")
        try:
            return await asyncio.wait_for(asyncio.shield(task), timeout)
        except TimeoutError:
            raise httpx.ReadTimeout(
                f"the service did not answer in {timeout} s", request=request
            ) from None


def _forget(running: set[asyncio.Task[httpx.Response]]) -> Any:
    def done(task: asyncio.Task[httpx.Response]) -> None:
        running.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a caller that left does not get a warning

    return done
