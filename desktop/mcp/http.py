"""`/mcp` on the service: the MCP server over streamable HTTP, behind the service's token.

`cubicle serve` includes `router()` like the board's; its lifespan builds the MCP server
once the service knows its address and token, and runs the MCP session manager with it.
Requests without the service's token get the API's usual 401 before MCP sees them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from desktop.api.auth import access_of
from desktop.api.errors import error_response
from desktop.errors import CubicleError, DesktopUnavailable, Forbidden
from desktop.mcp.server import build_server
from desktop.mcp.session import Connection, Desktops

PATH = "/mcp"


def _loopback_url(host: str, port: int) -> str:
    """The service's own address as its MCP server reaches it (loopback for a wildcard)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Endpoint:
    """The ASGI app at `/mcp`: the token checked, then the MCP session manager."""

    def __init__(self) -> None:
        self.manager: StreamableHTTPSessionManager | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            access = access_of(HTTPConnection(scope))
            if not access.admin:
                raise Forbidden(
                    "a share link opens a live view only: MCP needs the service's token"
                )
            if self.manager is None:
                raise DesktopUnavailable("the MCP server is starting or stopping: try again")
        except CubicleError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)


def router() -> APIRouter:
    """The `/mcp` route and the lifespan that runs its MCP server."""
    endpoint = _Endpoint()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings = app.state.settings
        connection = Connection(_loopback_url(settings.host, settings.port), app.state.token)
        desktops = Desktops(connection)
        server = build_server(desktops)
        # The token guards the route; a Host check would only refuse remote clients the
        # service itself lets in (when it binds beyond loopback).
        server.streamable_http_app(
            streamable_http_path=PATH,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        manager = server.session_manager
        try:
            async with manager.run():
                endpoint.manager = manager
                yield
        finally:
            endpoint.manager = None
            await desktops.stop()

    routes = APIRouter(lifespan=lifespan)
    routes.routes.append(
        Route(PATH, endpoint=endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    )
    return routes
