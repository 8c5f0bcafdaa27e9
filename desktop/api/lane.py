"""`FastLane`: one hot route answered before FastAPI's routing and dependency machinery.

Every click crosses FastAPI twice, in the service and in the guest. There, routing,
dependency solving and the middlewares inside these cost about 0.15 ms of Python per
request, and twice that once the machine has idled a moment (caches gone cold): as much
as the rest of a click. A FastLane, added with `app.add_middleware`, answers requests for
one method and path itself and hands everything else on. The route stays declared on the
app as usual (the same endpoint: it documents the call), so OpenAPI still shows it.
Errors are answered as the app's handlers answer them (`desktop.api.errors`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from desktop.api.errors import response_for

Endpoint = Callable[..., Awaitable[Response]]
"""Called as `endpoint(request=request, **path_parameters)`."""


class FastLane:
    """ASGI middleware: `method path` (a route template, `{name}` for a parameter) goes
    straight to `endpoint`; everything else to the app."""

    def __init__(self, app: ASGIApp, *, method: str, path: str, endpoint: Endpoint) -> None:
        self.app = app
        self._method = method
        self._pattern = compile_path(path)[0]
        self._endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != self._method
            or (match := self._pattern.match(scope["path"])) is None
        ):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await self._endpoint(request=request, **match.groupdict())
        except Exception as exc:  # answered as the app's handlers would
            response = response_for(exc)
        await response(scope, receive, send)
