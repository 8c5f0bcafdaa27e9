"""The guest protocol over HTTP: one small Starlette app per desktop (docs/protocol.md).

The control plane forwards its `/api/desktops/{id}/...` calls here; this app knows nothing
of the service's tokens or of other desktops. Requests and answers are the models of
`cubicle.protocol`; every error answers as an `ErrorBody` with the status of its class.
With a secret, every request must carry it as `Authorization: Bearer <secret>`.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from cubicle.guest import a11y, browser, dispatch, relay, windows
from cubicle.guest.code.routes import code_routes
from cubicle.guest.core import VERSION, Guest
from cubicle.guest.frames import frame_routes
from cubicle.guest.relay import SecretCheck
from cubicle.guest.web import answer, body, error_answer, query
from cubicle.protocol import actions as a
from cubicle.protocol.errors import (
    AuthError,
    CubicleError,
    DesktopGone,
    InvalidRequest,
    PayloadTooLarge,
    describe_validation,
)
from cubicle.protocol.lanes import LaneName
from cubicle.protocol.models import (
    A11yQuery,
    ClipboardText,
    CursorPosition,
    ExecRequest,
    FileEntry,
    FilesQuery,
    Health,
    LaunchRequest,
    ListeningPort,
    OpenRequest,
    Screen,
    ScreenshotInfo,
    ScreenshotQuery,
    WindowInfo,
    WindowOpPath,
    WindowsQuery,
)
from cubicle.protocol.routes import GuestPath
from cubicle.protocol.streams import until

log = logging.getLogger("cubicle.guest")

_entries = TypeAdapter(list[FileEntry])
_windows = TypeAdapter(list[WindowInfo])
_ports = TypeAdapter(list[ListeningPort])


async def _disconnected(request: Request) -> None:
    """Return once the caller has gone (its body was read: what comes next is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _on_error(_: Request, exc: Exception) -> Response:
    return error_answer(exc)


class RequireSecret:
    """ASGI middleware: answer 401 unless the request carries `Bearer <secret>`."""

    def __init__(self, app: ASGIApp, check: SecretCheck) -> None:
        self.app = app
        self._check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._check.accepts(scope["headers"]):
            refused = error_answer(AuthError("this desktop answers its runtime only"))
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)


class GuestRoutes:
    """The guest protocol's endpoints for one `Guest`."""

    def __init__(self, guest: Guest) -> None:
        self.guest = guest

    def alive(self) -> Guest:
        if self.guest.failure:
            raise DesktopGone(f"the desktop session died: {self.guest.failure}")
        return self.guest

    async def health(self, request: Request) -> Response:
        guest = self.guest
        return answer(
            Health(
                ok=guest.drawn and guest.failure is None,
                x_server=guest.session.xvfb.poll() is None,
                window_manager=guest.drawn,
                desktop_drawn=guest.drawn,
                screen=Screen(width=guest.width, height=guest.height),
                version=VERSION,
                reason=guest.failure,
            )
        )

    async def actions(self, request: Request) -> Response:
        """One action or a list: checked as a whole against the live screen, then run."""
        guest = self.alive()
        try:
            batch = a.action_batch_adapter.validate_json(await request.body())
        except ValidationError as exc:
            raise InvalidRequest(describe_validation(exc.errors())) from None
        return answer(await dispatch.run_batch(guest, batch))

    async def screenshot(self, request: Request) -> Response:
        params = query(request, ScreenshotQuery)
        guest = self.alive()
        async with guest.lanes[LaneName.SCREENSHOT].slot():
            await guest.input_processed()  # a click just answered is in the picture's past
            shot = await guest.screen.screenshot(
                params.image_format,
                quality=params.quality,
                max_width=params.max_width,
                max_height=params.max_height,
                cursor=params.cursor,
            )
        info = ScreenshotInfo(
            screen_width=guest.width,
            screen_height=guest.height,
            image_width=shot.width,
            image_height=shot.height,
            scale=shot.scale,
            capture=shot.capture,
            cached=shot.cached,
            cursor=shot.cursor_at,
        )
        headers = {**info.headers(), "Cache-Control": "no-store"}
        return Response(shot.data, media_type=shot.content_type, headers=headers)

    async def cursor(self, request: Request) -> Response:
        guest = self.alive()
        x, y = await guest.on_x(guest.input.cursor_position)
        return answer(CursorPosition(x=x, y=y))

    async def list_windows(self, request: Request) -> Response:
        params = query(request, WindowsQuery)
        guest = self.alive()
        list_all = functools.partial(windows.list_windows, include_shell=params.include_shell)
        found = await guest.on_x(list_all, guest.display)
        return Response(_windows.dump_json(found), media_type="application/json")

    async def window_op(self, request: Request) -> Response:
        try:
            target = WindowOpPath.model_validate(request.path_params)
        except ValidationError as exc:
            raise InvalidRequest(describe_validation(exc.errors())) from None
        guest = self.alive()
        await guest.on_x(windows.window_op, guest.display, target.window_id, target.op)
        return Response(status_code=204)

    async def accessibility(self, request: Request) -> Response:
        params = query(request, A11yQuery)
        guest = self.alive()
        async with guest.lanes[LaneName.A11Y].slot():
            tree = await asyncio.to_thread(
                a11y.snapshot, app=params.app, max_depth=params.max_depth
            )
        return answer(tree)

    async def run_command(self, request: Request) -> Response:
        command = await body(request, ExecRequest)
        guest = self.alive()
        if not command.stream:
            return answer(await guest.system.run(command))
        chunks = await guest.system.start(command)  # an unknown command is a 4xx here

        async def lines():
            # Nothing else notices a caller that left while the command is silent: its
            # leaving closes `chunks`, which ends the command's process group.
            async for chunk in until(chunks, _disconnected(request)):
                yield chunk.model_dump_json() + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def read_file(self, request: Request) -> Response:
        path = query(request, FilesQuery).path
        system = self.guest.system
        resolved, entry = system.stat_path(path)
        if entry.type == "dir":
            async with self.guest.lanes[LaneName.FILES].slot():
                listing = await asyncio.to_thread(system.list_dir, resolved)
            return Response(_entries.dump_json(listing), media_type="application/json")
        return FileResponse(resolved, media_type="application/octet-stream")

    async def write_file(self, request: Request) -> Response:
        path = query(request, FilesQuery).path
        system = self.guest.system
        limit = system.max_file_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"upload of {declared} bytes is over the {limit}-byte limit")
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > limit:
                raise PayloadTooLarge(f"upload is over the {limit}-byte limit")
        async with self.guest.lanes[LaneName.FILES].slot():
            return answer(await asyncio.to_thread(system.write, path, bytes(data)))

    async def delete_file(self, request: Request) -> Response:
        path = query(request, FilesQuery).path
        await asyncio.to_thread(self.guest.system.delete, path)
        return Response(status_code=204)

    async def get_clipboard(self, request: Request) -> Response:
        clipboard = self.alive().clipboard
        return answer(ClipboardText(text=await asyncio.to_thread(clipboard.get_text)))

    async def set_clipboard(self, request: Request) -> Response:
        text = (await body(request, ClipboardText)).text
        await asyncio.to_thread(self.alive().clipboard.set_text, text)
        return Response(status_code=204)

    async def open_target(self, request: Request) -> Response:
        target = (await body(request, OpenRequest)).target
        return answer(await self.alive().system.open(target))

    async def launch(self, request: Request) -> Response:
        launch = await body(request, LaunchRequest)
        if not launch.app.strip():
            raise InvalidRequest("app is empty: name an application such as mousepad")
        return answer(await self.alive().system.launch(launch.app, launch.args))

    async def ports(self, request: Request) -> Response:
        """The TCP ports something listens on inside (the relay reaches any of them)."""
        found = await asyncio.to_thread(relay.listening)
        return Response(_ports.dump_json(found), media_type="application/json")

    async def devtools(self, request: Request) -> Response:
        """The desktop's Chromium with DevTools on (started if none runs)."""
        return answer(await browser.devtools(self.alive().system))


def create_app(guest: Guest, *, check: SecretCheck | None = None) -> ASGIApp:
    """The guest protocol's ASGI app for `guest`; with `check`, for the secret's holder only."""
    api = GuestRoutes(guest)
    routes = [
        Route(GuestPath.HEALTH, api.health, methods=["GET"]),
        Route(GuestPath.ACTIONS, api.actions, methods=["POST"]),
        Route(GuestPath.SCREENSHOT, api.screenshot, methods=["GET"]),
        Route(GuestPath.CURSOR, api.cursor, methods=["GET"]),
        Route(GuestPath.WINDOWS, api.list_windows, methods=["GET"]),
        Route(GuestPath.WINDOW_OP, api.window_op, methods=["POST"]),
        Route(GuestPath.A11Y, api.accessibility, methods=["GET"]),
        Route(GuestPath.EXEC, api.run_command, methods=["POST"]),
        Route(GuestPath.FILES, api.read_file, methods=["GET"]),
        Route(GuestPath.FILES, api.write_file, methods=["PUT"]),
        Route(GuestPath.FILES, api.delete_file, methods=["DELETE"]),
        Route(GuestPath.CLIPBOARD, api.get_clipboard, methods=["GET"]),
        Route(GuestPath.CLIPBOARD, api.set_clipboard, methods=["PUT"]),
        Route(GuestPath.OPEN, api.open_target, methods=["POST"]),
        Route(GuestPath.LAUNCH, api.launch, methods=["POST"]),
        Route(GuestPath.PORTS, api.ports, methods=["GET"]),
        Route(GuestPath.DEVTOOLS, api.devtools, methods=["POST"]),
        *frame_routes(lambda: guest.video),
        *code_routes(lambda: guest.code),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            CubicleError: _on_error,
            HTTPException: _on_error,
            Exception: _on_error,
        },
    )
    return RequireSecret(app, check) if check is not None else app
