"""The control plane: one FastAPI app built around a sandbox manager.

`create_app(settings)` builds nothing until the app starts: the lifespan creates the
runtime and the manager, and stops every desktop when the app stops.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from desktop.api import desktops, stream
from desktop.api.auth import load_or_create_token, require_token
from desktop.api.errors import install as install_error_handlers
from desktop.api.lane import FastLane
from desktop.manager import SandboxManager
from desktop.runtime.local import LocalRuntime
from desktop.settings import Settings, get_settings
from streaming.live import LiveDesktops

log = logging.getLogger("cubicle")

WEB = Path(__file__).resolve().parent.parent / "web"


def create_app(
    settings: Settings | None = None,
    *,
    on_ready: Callable[[str], None] | None = None,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """Build the app; `on_ready` hears the URL (with token) once the service can answer.

    `routers` are other rooms' APIs (the agent's `/api/runs`), included behind the
    service's token: the assembly (`cubicle serve`) passes them, so `desktop` imports none.
    """
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        app.state.settings = settings
        app.state.token = load_or_create_token(settings.data_dir, settings.token)
        runtime = LocalRuntime(settings.data_dir, max_sandboxes=settings.max_desktops)
        app.state.manager = SandboxManager(runtime, settings)
        app.state.manager.start()
        app.state.live = LiveDesktops(app.state.manager, settings.data_dir / "recordings")
        app.state.live.start()
        if on_ready is not None:
            on_ready(f"http://{settings.host}:{settings.port}/?token={app.state.token}")
        try:
            yield
        finally:
            await app.state.live.stop()
            await app.state.manager.stop()

    app = FastAPI(
        title="Cubicle",
        summary="Isolated Linux desktops for computer-use agents.",
        version="0.1.0",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.include_router(desktops.router, dependencies=[Depends(require_token)])
    app.add_middleware(
        FastLane,
        method="POST",
        path="/api/desktops/{desktop_id}/actions",
        endpoint=desktops.run_actions,
    )
    for router in routers:
        app.include_router(router, dependencies=[Depends(require_token)])
    app.include_router(stream.router)  # each route checks its token's scope

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
