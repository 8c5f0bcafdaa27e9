"""What the MCP tools share: the service they reach, the desktops they hold, each desktop's
frame, and how results and errors are shaped.

The MCP server is a client of the REST API like any other (the SDK), whether it runs as
`cubicle mcp` beside the service (over HTTP, with the token) or inside it at `/mcp` (through
the service's in-process door, with no token): one way to the desktops.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ImageContent, TextContent

from cubicle.client.sdk import AsyncDesktop, AsyncServiceClient
from cubicle.protocol.errors import CubicleError, DesktopNotFound, DesktopUnavailable
from cubicle.tools.frame import Frame

_KEPT = 64
"""Desktop connections kept open at once (the least recently used is closed past that)."""


@dataclass(frozen=True, slots=True)
class Connection:
    """Where the service is and the token it takes; or, inside the service, the transport
    that sends requests into it (`cubicle.server.inside`), with no token."""

    base_url: str
    token: str | None
    transport: httpx.AsyncBaseTransport | None = None

    @classmethod
    def resolve(cls, base_url: str | None = None, token: str | None = None) -> Connection:
        """As the SDK finds the service: the arguments, else `CUBICLE_URL`/`CUBICLE_TOKEN`,
        else http://127.0.0.1:8000 and the token file of the default data directory."""
        from cubicle.client.sdk import service_address

        return cls(*service_address(base_url, token))


@dataclass
class Held:
    """A desktop the MCP server talks to, and the frame its coordinates are read in."""

    desktop: AsyncDesktop
    frame: Frame


class Desktops:
    """The desktops this server has touched, each with its frame (set by `screenshot`).

    Connections are opened on first use and kept (up to `_KEPT`); `stop()` closes them all.
    Frames belong to the desktop, not to an MCP session: a client that drives a desktop
    through several sessions sees one frame."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._held: OrderedDict[str, Held] = OrderedDict()
        self._service: AsyncServiceClient | None = None

    def _where(self) -> dict[str, Any]:
        c = self.connection
        return {"base_url": c.base_url, "token": c.token, "transport": c.transport}

    async def create(self, **options: Any) -> Held:
        desktop = await AsyncDesktop.create(**self._where(), **options)
        return await self._keep(desktop)

    async def get(self, desktop_id: str) -> Held:
        held = self._held.get(desktop_id)
        if held is not None:
            self._held.move_to_end(desktop_id)
            return held
        desktop = await AsyncDesktop.connect(desktop_id, **self._where())
        return await self._keep(desktop)

    async def _keep(self, desktop: AsyncDesktop) -> Held:
        screen = (desktop.info.screen.width, desktop.info.screen.height)
        held = self._held[desktop.id] = Held(desktop, Frame.fit(screen))
        while len(self._held) > _KEPT:
            _, oldest = self._held.popitem(last=False)
            await oldest.desktop.close()
        return held

    async def forget(self, desktop_id: str) -> None:
        held = self._held.pop(desktop_id, None)
        if held is not None:
            await held.desktop.close()

    async def call(
        self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        """A JSON call to the service's other APIs (the board); its error as the
        `CubicleError` it carries."""
        if self._service is None:
            self._service = AsyncServiceClient(**self._where(), timeout_s=60)
        return await self._service.request(method, path, json=json, params=params)

    async def stop(self) -> None:
        """Close every connection; idempotent."""
        while self._held:
            _, held = self._held.popitem()
            await held.desktop.close()
        if self._service is not None:
            await self._service.close()
            self._service = None


TEXT_LIMIT = 100_000
"""Characters of a file, printed output or one result a tool gives back (the rest is cut,
and said so)."""


def cut(text: str) -> str:
    """`text`, cut to `TEXT_LIMIT` characters with a note of how many were left out."""
    if len(text) <= TEXT_LIMIT:
        return text
    return text[:TEXT_LIMIT] + f"\n… ({len(text) - TEXT_LIMIT} more characters not shown)"


def result(
    text: str, data: dict[str, Any] | None = None, *images: tuple[bytes, str]
) -> CallToolResult:
    """A tool result: text for the model, the data as structured content (and serialized as
    a second text block, as the MCP spec asks, for clients that read text only), and images
    as (bytes, media type)."""
    content: list[TextContent | ImageContent] = [TextContent(type="text", text=text)]
    if data is not None:
        content.append(TextContent(type="text", text=json.dumps(data, ensure_ascii=False)))
    for data_bytes, media_type in images:
        encoded = base64.b64encode(data_bytes).decode("ascii")
        content.append(ImageContent(type="image", data=encoded, mime_type=media_type))
    return CallToolResult(content=content, structured_content=data)


@contextlib.asynccontextmanager
async def guarded(desktops: Desktops, desktop_id: str | None = None) -> AsyncIterator[None]:
    """Turn a `CubicleError` into an MCP tool error carrying the API's message (and forget
    a desktop that is gone)."""
    try:
        yield
    except CubicleError as exc:
        if desktop_id is not None and isinstance(exc, DesktopNotFound | DesktopUnavailable):
            await desktops.forget(desktop_id)
        raise ToolError(exc.message) from exc
    except httpx.TransportError as exc:
        raise ToolError(
            f"cannot reach the Cubicle service at {desktops.connection.base_url}: {exc}"
        ) from exc
