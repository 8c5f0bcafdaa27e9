"""`/api/desktops/{id}/osworld`: open (or close) a desktop's OSWorld surface, opt-in.

    POST   /api/desktops/{id}/osworld     {"port": 5000} optional → {"desktop_id", "port", "url"}
    DELETE /api/desktops/{id}/osworld
    GET    /api/osworld                   the open surfaces

A surface closes with its desktop (looked at every few seconds) and with the service. The
evaluations' room mounts `router`; every route needs the service's token (the surface
itself has none: OSWorld's clients send none).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from cubicle import Conflict, DesktopGone, DesktopNotFound, NotFound
from cubicle.protocol.evals import SurfaceInfo
from cubicle.server.api.auth import require_token
from cubicle.server.evals.osworld.surface import Surface, serve
from cubicle.server.services import Services, services_of

log = logging.getLogger("cubicle.osworld")
CHECK_EVERY_S = 5.0
"""Seconds between looks for surfaces whose desktop is gone."""


class OpenSurface(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: Annotated[int, Field(ge=1024, le=65535)] | None = None
    """The loopback port to listen on; None: a free one."""


class NoSurface(NotFound):
    """The desktop has no OSWorld surface open."""

    code = "osworld_surface_not_found"


class Surfaces:
    """The open OSWorld surfaces of one service."""

    def __init__(self, services: Services) -> None:
        self._services = services
        """Whose in-process door the surfaces drive their desktops through."""
        self._open: dict[str, Surface] = {}
        self._lock = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._watch = asyncio.create_task(self._keep_watch(), name="osworld-watch")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        async with self._lock:
            for surface in self._open.values():
                await surface.close()
            self._open.clear()

    def list(self) -> list[SurfaceInfo]:
        return [_info(surface) for surface in self._open.values()]

    async def open(self, desktop_id: str, port: int | None) -> SurfaceInfo:
        async with self._lock:
            if (surface := self._open.get(desktop_id)) is not None:
                if port not in (None, surface.port):
                    raise Conflict(f"desktop {desktop_id}'s surface is open on {surface.port}")
                return _info(surface)
            desktop = await self._services.desktop(desktop_id)
            try:
                surface = await serve(desktop, port or 0)
            except OSError as exc:
                await desktop.close()
                raise Conflict(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from exc
            self._open[desktop_id] = surface
            log.info("desktop %s: OSWorld surface on %s", desktop_id, surface.url)
            return _info(surface)

    async def close(self, desktop_id: str) -> None:
        async with self._lock:
            surface = self._open.pop(desktop_id, None)
            if surface is None:
                raise NoSurface(f"desktop {desktop_id} has no OSWorld surface open")
            await surface.close()

    async def _keep_watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            for desktop_id, surface in list(self._open.items()):
                try:
                    await surface.desktop.refresh()
                except (DesktopNotFound, DesktopGone):
                    with contextlib.suppress(NoSurface):
                        await self.close(desktop_id)
                except Exception:  # the service may be busy: look again later
                    log.debug("looking at desktop %s failed", desktop_id, exc_info=True)


def _info(surface: Surface) -> SurfaceInfo:
    return SurfaceInfo(desktop_id=surface.desktop.id, port=surface.port, url=surface.url)


async def get_surfaces(request: Request) -> Surfaces:
    return services_of(request).get(Surfaces)


SurfacesDep = Annotated[Surfaces, Depends(get_surfaces)]

router = APIRouter(tags=["osworld"], dependencies=[Depends(require_token)])


@router.get("/api/osworld")
async def list_surfaces(surfaces: SurfacesDep) -> list[SurfaceInfo]:
    """The desktops whose OSWorld surface is open."""
    return surfaces.list()


@router.post("/api/desktops/{desktop_id}/osworld")
async def open_surface(
    desktop_id: str, surfaces: SurfacesDep, body: OpenSurface | None = None
) -> SurfaceInfo:
    """Open the desktop's OSWorld guest surface on a loopback port (idempotent)."""
    return await surfaces.open(desktop_id, body.port if body else None)


@router.delete("/api/desktops/{desktop_id}/osworld", status_code=204)
async def close_surface(desktop_id: str, surfaces: SurfacesDep) -> Response:
    await surfaces.close(desktop_id)
    return Response(status_code=204)
