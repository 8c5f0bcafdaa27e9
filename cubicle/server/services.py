"""`Services`: the long-lived objects of one running service, built by the app's lifespan.

Routes reach them through FastAPI dependencies (`cubicle.server.api.deps`); other rooms add their
own long-lived objects as `Room`s (the live view, the agent's board), which `create_app`
starts after the manager and stops before it. A room that drives desktops does it with the
SDK through the in-process door (`desktop`, `create_desktop`, `client`): its requests go
straight into the app (`cubicle.server.inside`), with no socket and no token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fastapi import APIRouter
from starlette.requests import HTTPConnection

from cubicle.client.sdk import AsyncDesktop, AsyncServiceClient
from cubicle.server import inside
from cubicle.server.e2b import Sandboxes
from cubicle.server.manager import SandboxManager
from cubicle.server.ports import Ports
from cubicle.server.settings import Settings
from cubicle.server.shares import ShareLinks

T = TypeVar("T")


@dataclass
class Services:
    """What every request of one service may use."""

    settings: Settings
    token: str
    """The admin token: every `/api` call carries it (or a share token signed with it)."""
    manager: SandboxManager
    shares: ShareLinks
    """Every share link (`cubicle.server.shares`): made by the live view, checked by auth."""
    ports: Ports
    """Preview links and public ports of desktops (`cubicle.server.ports`)."""
    e2b: Sandboxes
    """Desktops made through E2B's API, as E2B sees them (`cubicle.server.e2b`)."""
    door: inside.InProcessTransport | None = None
    """Requests from the service to itself (`cubicle.server.inside`); set by the lifespan."""
    _rooms: dict[type, object] = field(default_factory=dict)

    @property
    def transport(self) -> inside.InProcessTransport:
        if self.door is None:
            raise RuntimeError("the service's in-process door opens with its lifespan")
        return self.door

    async def create_desktop(self, **options: Any) -> AsyncDesktop:
        """A new desktop, driven in process; takes `AsyncDesktop.create`'s options."""
        return await AsyncDesktop.create(base_url=inside.URL, transport=self.transport, **options)

    async def desktop(self, desktop_id: str) -> AsyncDesktop:
        """A desktop that runs, driven in process (`DesktopNotFound` if there is none)."""
        return await AsyncDesktop.connect(desktop_id, base_url=inside.URL, transport=self.transport)

    def client(self, timeout_s: float = 120.0) -> AsyncServiceClient:
        """A client of the service's other routes (the board's…), in process."""
        return AsyncServiceClient(
            base_url=inside.URL, timeout_s=timeout_s, transport=self.transport
        )

    def add(self, room: object) -> None:
        """Make a room's object findable by its type (`get`)."""
        self._rooms[type(room)] = room

    def get(self, kind: type[T]) -> T:
        """The room object of type `kind`; `LookupError` when the service runs without it."""
        try:
            return self._rooms[kind]  # type: ignore[return-value]
        except KeyError:
            raise LookupError(f"this service runs without {kind.__name__}") from None


class Room(Protocol):
    """A part of the service another package adds: its routes and what it runs."""

    routers: Sequence[APIRouter]
    """Included as they are: each router declares the auth its routes need."""
    body_limits: Mapping[tuple[str, str], int]
    """The bodies some of its routes take beyond `CUBICLE_MAX_BODY_MB`: (method, path
    pattern) → bytes (`cubicle.server.api.security`); empty for most rooms."""

    async def start(self, services: Services) -> None:
        """Start what the room runs; register what its routes need with `services.add`."""
        ...

    async def stop(self) -> None: ...


def services_of(connection: HTTPConnection) -> Services:
    """The services of the app serving this request or WebSocket."""
    return connection.state.services
