"""The guest protocol: HTTP/1.1 + JSON on a Unix socket, one app per desktop.

The control plane forwards its `/api/desktops/{id}/...` calls here; this app knows nothing
of tokens or other desktops.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Annotated, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from pydantic import TypeAdapter, ValidationError

from desktop import actions as a
from desktop.api.errors import install as install_error_handlers
from desktop.api.lane import FastLane
from desktop.errors import DesktopGone, InvalidRequest, PayloadTooLarge
from desktop.guest import a11y, dispatch, windows
from desktop.guest.daemon import VERSION, Guest
from desktop.guest.frames import frames_router
from desktop.models import (
    A11yTree,
    ClipboardText,
    CursorPosition,
    ExecRequest,
    ExecResult,
    FileEntry,
    Health,
    Launched,
    LaunchRequest,
    OpenRequest,
    Screen,
    WindowInfo,
    WindowOp,
)

_entries = TypeAdapter(list[FileEntry])


def create_app(guest: Guest) -> FastAPI:
    app = FastAPI(title="Cubicle guest", version=VERSION, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.include_router(frames_router(guest.video))

    def check_alive() -> None:
        if guest.failure:
            raise DesktopGone(f"the desktop session died: {guest.failure}")

    @app.get("/health")
    async def health() -> Health:
        return Health(
            ok=guest.drawn and guest.failure is None,
            x_server=guest.session.xvfb.poll() is None,
            window_manager=guest.drawn,
            desktop_drawn=guest.drawn,
            screen=Screen(width=guest.width, height=guest.height),
            version=VERSION,
            reason=guest.failure,
        )

    async def run_actions(request: Request) -> Response:
        """`POST /actions`, the hot path of every click and key, answered in a FastLane.

        The body is parsed and validated in one pydantic pass over its bytes, and its
        errors answer exactly as FastAPI's would (422 `invalid_request`).
        """
        check_alive()
        try:
            batch = a.action_batch_adapter.validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        items = batch if isinstance(batch, list) else [batch]
        dispatch.validate(items, guest.width, guest.height)
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = [await dispatch.execute(action, guest) for action in items]
        answer = a.ActionsResponse(results=results, elapsed_ms=(loop.time() - started) * 1000)
        return Response(answer.model_dump_json(), media_type="application/json")

    app.add_route("/actions", run_actions, methods=["POST"])
    app.add_middleware(FastLane, method="POST", path="/actions", endpoint=run_actions)

    @app.get("/screenshot")
    async def screenshot(
        format: Literal["png", "jpeg", "jpg", "webp"] = "png",
        quality: Annotated[int, Query(ge=1, le=100)] = 80,
        max_width: Annotated[int | None, Query(ge=16, le=16384)] = None,
        max_height: Annotated[int | None, Query(ge=16, le=16384)] = None,
        cursor: bool = False,
    ) -> Response:
        check_alive()
        await guest.input_processed()  # a click just answered is in the picture's past
        fmt = "jpeg" if format == "jpg" else format
        shot = await guest.screen.screenshot(
            fmt, quality=quality, max_width=max_width, max_height=max_height, cursor=cursor
        )
        return Response(
            shot.data,
            media_type=shot.content_type,
            headers={
                "X-Screen-Width": str(guest.width),
                "X-Screen-Height": str(guest.height),
                "X-Image-Width": str(shot.width),
                "X-Image-Height": str(shot.height),
                "X-Scale": f"{shot.scale:.6f}",
                "X-Screenshot-Cache": "hit" if shot.cached else "miss",
                "Cache-Control": "no-store",
            },
        )

    @app.get("/cursor")
    async def cursor() -> CursorPosition:
        check_alive()
        x, y = await guest.on_x(guest.input.cursor_position)
        return CursorPosition(x=x, y=y)

    @app.get("/windows")
    async def list_windows(include_shell: bool = False) -> list[WindowInfo]:
        check_alive()
        list_all = functools.partial(windows.list_windows, include_shell=include_shell)
        return await guest.on_x(list_all, guest.display)

    @app.post("/windows/{window_id}/{op}", status_code=204)
    async def window_op(window_id: int, op: WindowOp) -> Response:
        check_alive()
        await guest.on_x(windows.window_op, guest.display, window_id, op)
        return Response(status_code=204)

    @app.get("/a11y")
    async def accessibility(
        app_name: Annotated[str | None, Query(alias="app")] = None,
        max_depth: Annotated[int, Query(ge=1, le=100)] = 30,
    ) -> A11yTree:
        check_alive()
        return await asyncio.to_thread(a11y.snapshot, app=app_name, max_depth=max_depth)

    @app.post("/exec", response_model=None)
    async def run_command(request: ExecRequest) -> ExecResult | StreamingResponse:
        check_alive()
        if not request.stream:
            return await guest.system.run(request)
        chunks = guest.system.stream(request)
        first = await anext(chunks)  # errors such as an unknown command surface as 4xx

        async def lines():
            yield first.model_dump_json() + "\n"
            async for chunk in chunks:
                yield chunk.model_dump_json() + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.get("/files", response_model=None)
    async def read_file(path: str) -> FileResponse | JSONResponse:
        resolved, entry = guest.system.stat_path(path)
        if entry.type == "dir":
            listing = await asyncio.to_thread(guest.system.list_dir, resolved)
            return JSONResponse(_entries.dump_python(listing, mode="json"))
        return FileResponse(resolved, media_type="application/octet-stream")

    @app.put("/files")
    async def write_file(path: str, request: Request) -> FileEntry:
        limit = guest.system.max_file_bytes
        declared = request.headers.get("content-length")
        if declared is not None and int(declared) > limit:
            raise PayloadTooLarge(f"upload of {declared} bytes is over the {limit}-byte limit")
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise PayloadTooLarge(f"upload is over the {limit}-byte limit")
        return await asyncio.to_thread(guest.system.write, path, bytes(body))

    @app.delete("/files", status_code=204)
    async def delete_file(path: str) -> Response:
        await asyncio.to_thread(guest.system.delete, path)
        return Response(status_code=204)

    @app.get("/clipboard")
    async def get_clipboard() -> ClipboardText:
        check_alive()
        return ClipboardText(text=await asyncio.to_thread(guest.clipboard.get_text))

    @app.put("/clipboard", status_code=204)
    async def set_clipboard(body: ClipboardText) -> Response:
        check_alive()
        await asyncio.to_thread(guest.clipboard.set_text, body.text)
        return Response(status_code=204)

    @app.post("/open")
    async def open_target(body: OpenRequest) -> Launched:
        check_alive()
        return await guest.system.open(body.target)

    @app.post("/launch")
    async def launch(body: LaunchRequest) -> Launched:
        check_alive()
        if not body.app.strip():
            raise InvalidRequest("app is empty: name an application such as mousepad")
        return await guest.system.launch(body.app, body.args)

    return app
