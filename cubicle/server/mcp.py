"""`/mcp` on the service: the MCP server over streamable HTTP, behind the service's token.

`cubicle serve` passes `McpRoom()` among its rooms; once the service starts, the room builds
the MCP server (a client of the service's own REST API through its in-process door, as the
board is: no socket, no token) and runs its session manager until the service stops.
Requests without the service's token get the API's usual 401 before MCP sees them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from fastapi import APIRouter
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from cubicle.mcp.server import build_server
from cubicle.mcp.session import Connection, Desktops
from cubicle.protocol.errors import CubicleError, DesktopUnavailable, Forbidden
from cubicle.server import inside
from cubicle.server.api.auth import access_of
from cubicle.server.api.errors import response_for
from cubicle.server.services import Services

PATH = "/mcp"


class _Asgi:
    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


class McpRoom:
    """Mounts `/mcp` and runs the MCP server with the service."""

    def __init__(self) -> None:
        router = APIRouter()
        endpoint = _Asgi(self._serve)  # an ASGI app: Starlette calls methods with a Request
        methods = ["GET", "POST", "DELETE"]
        router.routes.append(
            Route(PATH, endpoint=endpoint, methods=methods, include_in_schema=False)
        )
        self.routers = (router,)
        self._manager: StreamableHTTPSessionManager | None = None
        self._desktops: Desktops | None = None
        self._running = contextlib.AsyncExitStack()

    async def start(self, services: Services) -> None:
        connection = Connection(inside.URL, None, services.transport)
        self._desktops = Desktops(connection)
        server = build_server(self._desktops)
        # The token guards the route; a Host check would only refuse the remote clients the
        # service itself lets in when it binds beyond loopback.
        security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
        server.streamable_http_app(streamable_http_path=PATH, transport_security=security)
        await self._running.enter_async_context(server.session_manager.run())
        self._manager = server.session_manager

    async def stop(self) -> None:
        """Close the MCP sessions and the server's connections; idempotent."""
        self._manager = None
        await self._running.aclose()
        if self._desktops is not None:
            await self._desktops.stop()
            self._desktops = None

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            access = access_of(HTTPConnection(scope))
            if not access.admin:
                raise Forbidden("a share link opens a live view only: /mcp needs the token")
            if self._manager is None:
                raise DesktopUnavailable("the MCP server is starting or stopping: try again")
        except CubicleError as exc:
            await response_for(exc)(scope, receive, send)
            return
        await self._manager.handle_request(scope, receive, send)
