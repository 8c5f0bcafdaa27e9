"""The control plane: one FastAPI app built around a sandbox manager.

`create_app(settings, rooms=...)` builds nothing until the app starts: the lifespan creates
the manager (which builds the runtime `CUBICLE_RUNTIME` names), starts each room (the live
view, the agent's board: whatever the assembly in `cubicle serve` passes), and stops them
all, desktops included, when the app stops.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from cubicle.server import at_rest
from cubicle.server.api import (
    code,
    code_interpreter,
    desktops,
    networks,
    pool,
    secrets,
    session,
    snapshots,
    volumes,
)
from cubicle.server.api.auth import load_or_create_token, require_token
from cubicle.server.api.errors import install as install_error_handlers
from cubicle.server.api.openapi import install as install_openapi
from cubicle.server.api.security import BodyLimits, Guard
from cubicle.server.e2b import Sandboxes
from cubicle.server.e2b import control as e2b_control
from cubicle.server.inside import InProcessTransport
from cubicle.server.manager import SandboxManager
from cubicle.server.ports import Ports
from cubicle.server.ports import api as ports_api
from cubicle.server.ports.proxy import PortProxy
from cubicle.server.services import Room, Services
from cubicle.server.settings import Settings, get_settings
from cubicle.server.shares import ShareLinks

log = logging.getLogger("cubicle")

WEB = Path(__file__).resolve().parents[2] / "web"


def _freeze_what_start_up_made() -> None:
    """Keep the objects start-up made (modules, routes, schemas: most of the heap, for the
    service's life) out of the garbage collector's full passes. Each pass walked all of
    them: about 125 ms with the event loop stopped, every few seconds under load, which was
    the p99 of every call, `GET /healthz` included. No collection first: at this point one
    took about 120 ms of every start and found some 85 objects to free."""
    gc.freeze()


def create_app(
    settings: Settings | None = None,
    *,
    rooms: Sequence[Room] = (),
    on_ready: Callable[[str], None] | None = None,
) -> FastAPI:
    """Build the app; `on_ready` hears the URL (with token) once the service can answer."""
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Services]]:
        at_rest.protect(settings.data_dir)
        manager = SandboxManager(settings)
        token = load_or_create_token(settings.data_dir, settings.token)
        ports = Ports(settings, manager.events)
        services = Services(
            settings, token, manager, ShareLinks(manager.events), ports, Sandboxes(manager.events)
        )
        services.door = InProcessTransport(app, {"services": services})
        await manager.start()
        started: list[Room] = []
        try:
            for room in rooms:
                await room.start(services)
                started.append(room)
            _freeze_what_start_up_made()
            if on_ready is not None:
                on_ready(f"http://{settings.host}:{settings.port}/?token={services.token}")
            yield {"services": services}
        finally:
            for room in reversed(started):
                await room.stop()
            services.shares.close()
            services.ports.close()
            await services.e2b.aclose()
            await manager.stop()

    app = FastAPI(
        title="Cubicle",
        summary="Isolated Linux desktops for computer-use agents.",
        version="0.2.0",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    install_openapi(app)
    limits = {
        ("PUT", r"/api/desktops/[^/]+/files"): settings.max_upload_bytes,
        ("PUT", r"/api/volumes/[^/]+/files"): settings.max_upload_bytes,
    }
    for room in rooms:
        limits.update(room.body_limits)
    app.add_middleware(Guard, limits=BodyLimits(settings.max_body_bytes, limits))
    # Outermost: a request for a desktop's port is carried there whole, whatever its size.
    app.add_middleware(PortProxy, domain_name=settings.port_domain_name)
    app.include_router(desktops.router, dependencies=[Depends(require_token)])
    app.include_router(code.router, dependencies=[Depends(require_token)])
    app.include_router(code_interpreter.router, dependencies=[Depends(require_token)])
    app.include_router(session.router)
    app.include_router(pool.router, dependencies=[Depends(require_token)])
    app.include_router(ports_api.router, dependencies=[Depends(require_token)])
    app.include_router(networks.router, dependencies=[Depends(require_token)])
    app.include_router(secrets.router, dependencies=[Depends(require_token)])
    app.include_router(snapshots.router, dependencies=[Depends(require_token)])
    app.include_router(volumes.router, dependencies=[Depends(require_token)])
    app.include_router(e2b_control.router)  # X-API-KEY, E2B's way
    for room in rooms:
        for router in room.routers:
            app.include_router(router)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    if WEB.is_dir():

        @app.get("/", include_in_schema=False)
        async def index() -> FileResponse:
            return FileResponse(WEB / "index.html")

        @app.get("/view/{desktop_id}", include_in_schema=False)
        async def viewer(desktop_id: str) -> FileResponse:
            return FileResponse(WEB / "viewer.html")

        app.mount("/web", StaticFiles(directory=WEB), name="web")
    return app
