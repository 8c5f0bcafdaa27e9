"""OSWorld's guest HTTP surface for one Cubicle desktop, on a loopback port of the service.

OSWorld's harness drives a VM through a Flask server inside it (`desktop_env/server`); its
`PythonController` and `SetupController` call these endpoints. Here each one is carried out
through Cubicle's own API (the SDK, through the service's in-process door: no second hop
over HTTP), so OSWorld's harness, its agents and its evaluators can use a Cubicle desktop
unchanged:

    GET  /screenshot /accessibility /terminal /platform /cursor_position
    POST /execute /setup/execute /run_python /run_bash_script /file /setup/upload
         /setup/launch /setup/open_file /setup/activate_window /setup/close_window
         /screen_size /window_size /desktop_path /list_directory
         /start_recording /end_recording

`python` in a command is the service's interpreter (its virtualenv is bound into every
desktop), so `python -c "import pyautogui; …"`, OSWorld's way to act, works as is. The
surface has no token: OSWorld's clients send none. It listens on 127.0.0.1 only and exists
only for desktops it was opened for (`POST /api/desktops/{id}/osworld`).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from cubicle import AsyncDesktop, CubicleError, FileNotFound, NotFound, PathNotAllowed
from cubicle.evals import chrome
from cubicle.evals.a11y_xml import tree_to_xml
from cubicle.evals.context import GUEST_HOME, TaskContext, desktop_path_env, desktop_python
from cubicle.evals.getters import PathConfig, list_directory
from cubicle.evals.setup import WINDOW_WAIT_S

_EXEC_TIMEOUT_S = 120.0
"""Seconds a command may run, as OSWorld's server allows."""
_HOME = Path(GUEST_HOME)


def _command(data: dict[str, Any]) -> tuple[str | list[str], bool]:
    shell = bool(data.get("shell", False))
    command = data.get("command", "" if shell else [])
    if not command:
        raise ValueError("an empty command")
    return command, shell


async def _form(request: Request) -> dict[str, Any]:
    form = await request.form()
    return {key: form[key] for key in form}


class OsworldRoutes:
    """The endpoints of OSWorld's guest server, answered for one Cubicle desktop."""

    def __init__(self, desktop: AsyncDesktop) -> None:
        self.desktop = desktop
        self.ctx = TaskContext(desktop, files_root=_HOME, cache_dir=_HOME)  # neither is used
        self._recording: str | None = None
        """The id of the recording `/start_recording` began, until `/end_recording`."""

    async def screenshot(self) -> Response:
        return Response(await self.desktop.screenshot("png", cursor=True), media_type="image/png")

    async def accessibility(self) -> dict[str, str]:
        return {"AT": tree_to_xml(await self.desktop.accessibility_tree())}

    async def terminal(self) -> JSONResponse:
        tree = await self.desktop.accessibility_tree()
        stack = list(tree.nodes)
        while stack:
            node = stack.pop()
            if node.role == "terminal" and node.text is not None:
                return JSONResponse({"output": node.text})
            stack.extend(node.children)
        return JSONResponse({"status": "error", "message": "no terminal window"}, 404)

    async def platform(self) -> PlainTextResponse:
        return PlainTextResponse("Linux")

    async def cursor_position(self) -> list[int]:
        return list(await self.desktop.get_cursor_position())

    async def execute(self, request: Request) -> dict[str, Any]:
        command, shell = _command(await request.json())
        ran = await self.ctx.run(command, shell=shell, timeout_s=_EXEC_TIMEOUT_S)
        return {
            "status": "success",
            "output": ran.stdout,
            "error": ran.stderr,
            "returncode": ran.exit_code if ran.exit_code is not None else -1,
        }

    async def run_python(self, request: Request) -> dict[str, Any]:
        ran = await self.ctx.python(str((await request.json()).get("code", "")), timeout_s=90)
        ok = ran.exit_code == 0
        return {
            "status": "success" if ok else "error",
            "message": "" if ok else f"exit code {ran.exit_code}",
            "output": ran.stdout,
            "error": ran.stderr,
        }

    async def run_bash_script(self, request: Request) -> dict[str, Any]:
        data = await request.json()
        ran = await self.desktop.exec(
            ["/bin/bash", "-s"],
            stdin=str(data.get("script", "")),
            cwd=data.get("working_dir") or None,
            env=desktop_path_env(),
            timeout_s=float(data.get("timeout", 30)),
        )
        return {
            "status": "success" if ran.exit_code == 0 else "error",
            "output": ran.stdout,
            "error": ran.stderr,
            "returncode": ran.exit_code if ran.exit_code is not None else -1,
        }

    async def file(self, request: Request) -> Response:
        path = str((await _form(request)).get("file_path", ""))
        try:
            data = await self.desktop.files.read(path)
            return Response(data, media_type="application/octet-stream")
        except (FileNotFound, PathNotAllowed) as exc:
            return JSONResponse({"status": "error", "message": exc.message}, 404)

    async def upload(self, request: Request) -> PlainTextResponse:
        form = await request.form()
        path, data = str(form.get("file_path", "")), form.get("file_data")
        if not path or data is None or isinstance(data, str):
            raise ValueError("send file_path and file_data as multipart form fields")
        parent = path.rsplit("/", 1)[0]
        if parent:
            await self.ctx.run(["mkdir", "-p", parent])
        await self.desktop.files.write(path, await data.read())
        return PlainTextResponse("File uploaded")

    async def launch(self, request: Request) -> PlainTextResponse:
        command, shell = _command(await request.json())
        argv = ["/bin/sh", "-c", command if isinstance(command, str) else " ".join(command)]
        if not shell:
            argv = shlex.split(command) if isinstance(command, str) else list(command)
            argv = [GUEST_HOME + a[1:] if a.startswith("~/") else a for a in argv]
            if chrome.is_browser(argv):
                argv = chrome.browser_argv(argv)
            elif argv[0] in ("python", "python3"):
                argv[0] = desktop_python()
        await self.desktop.launch(*argv)
        return PlainTextResponse(f"{' '.join(argv)} launched successfully")

    async def open_file(self, request: Request) -> PlainTextResponse:
        path = str((await request.json()).get("path", ""))
        before = await self.ctx.window_marks()
        await self.desktop.open(path)
        if await self.ctx.wait_for_window_change(before, WINDOW_WAIT_S) is None:
            return PlainTextResponse(f"no window showed {path} in time", 500)
        return PlainTextResponse(f"{path} opened successfully")

    async def _window(self, request: Request, op: str) -> PlainTextResponse:
        data = await request.json()
        window = await self.ctx.find_window(
            str(data.get("window_name", "")),
            strict=bool(data.get("strict", False)),
            by_class=bool(data.get("by_class", False)),
        )
        if window is None:
            return PlainTextResponse(f"no window matches {data.get('window_name')!r}", 404)
        await self.desktop.window(window.id, op)  # type: ignore[arg-type]
        return PlainTextResponse(f"window {op}d")

    async def activate_window(self, request: Request) -> PlainTextResponse:
        return await self._window(request, "activate")

    async def close_window(self, request: Request) -> PlainTextResponse:
        return await self._window(request, "close")

    async def screen_size(self) -> dict[str, int]:
        return {"width": self.desktop.info.screen.width, "height": self.desktop.info.screen.height}

    async def window_size(self, request: Request) -> JSONResponse:
        name = str((await _form(request)).get("app_class_name", ""))
        window = await self.ctx.find_window(name, by_class=True)
        if window is None:
            return JSONResponse({"status": "error", "message": f"no {name} window"}, 404)
        return JSONResponse({"width": window.width, "height": window.height})

    async def desktop_path(self) -> dict[str, str]:
        return {"desktop_path": f"{GUEST_HOME}/Desktop"}

    async def directory(self, request: Request) -> dict[str, Any]:
        path = str((await request.json()).get("path", ""))
        return {"directory_tree": await list_directory(self.ctx, PathConfig(type="x", path=path))}

    async def start_recording(self) -> PlainTextResponse:
        self._recording = (await self.desktop.start_recording()).id
        return PlainTextResponse("Recording started")

    async def end_recording(self) -> Response:
        if self._recording is None:
            return JSONResponse({"status": "error", "message": "no recording running"}, 400)
        await self.desktop.stop_recording()
        recording, self._recording = self._recording, None
        video = await self.desktop.recording_video(recording)
        return Response(video, media_type="video/mp4")


ROUTES: list[tuple[str, str, Callable[..., Awaitable[Any]]]] = [
    ("GET", "/screenshot", OsworldRoutes.screenshot),
    ("GET", "/accessibility", OsworldRoutes.accessibility),
    ("GET", "/terminal", OsworldRoutes.terminal),
    ("GET", "/platform", OsworldRoutes.platform),
    ("GET", "/cursor_position", OsworldRoutes.cursor_position),
    ("POST", "/execute", OsworldRoutes.execute),
    ("POST", "/setup/execute", OsworldRoutes.execute),
    ("POST", "/run_python", OsworldRoutes.run_python),
    ("POST", "/run_bash_script", OsworldRoutes.run_bash_script),
    ("POST", "/file", OsworldRoutes.file),
    ("POST", "/setup/upload", OsworldRoutes.upload),
    ("POST", "/setup/launch", OsworldRoutes.launch),
    ("POST", "/setup/open_file", OsworldRoutes.open_file),
    ("POST", "/setup/activate_window", OsworldRoutes.activate_window),
    ("POST", "/setup/close_window", OsworldRoutes.close_window),
    ("POST", "/screen_size", OsworldRoutes.screen_size),
    ("POST", "/window_size", OsworldRoutes.window_size),
    ("POST", "/desktop_path", OsworldRoutes.desktop_path),
    ("POST", "/list_directory", OsworldRoutes.directory),
    ("POST", "/start_recording", OsworldRoutes.start_recording),
    ("POST", "/end_recording", OsworldRoutes.end_recording),
]
"""(method, path, handler) of every endpoint, as OSWorld's `PythonController` and
`SetupController` call them."""


async def _cubicle_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, CubicleError)
    status = 404 if isinstance(exc, NotFound) else 400 if exc.status_code == 422 else 500
    return JSONResponse({"status": "error", "message": exc.message}, status_code=status)


async def _bad_value(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"status": "error", "message": str(exc)}, status_code=400)


def build_app(desktop: AsyncDesktop) -> FastAPI:
    """The OSWorld surface of `desktop`: `ROUTES` bound to its `OsworldRoutes`."""
    app = FastAPI(title=f"OSWorld surface of desktop {desktop.id}", openapi_url=None)
    app.add_exception_handler(CubicleError, _cubicle_error)
    app.add_exception_handler(ValueError, _bad_value)
    routes = OsworldRoutes(desktop)
    for method, path, handler in ROUTES:
        bound = getattr(routes, handler.__name__)
        app.add_api_route(path, bound, methods=[method], name=handler.__name__)
    return app


class _Server(uvicorn.Server):
    """uvicorn inside the service's own loop: the signals stay the service's."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class Surface:
    """One open surface: its desktop, port and server."""

    desktop: AsyncDesktop
    port: int
    server: uvicorn.Server
    task: asyncio.Task[None]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        self.server.should_exit = True
        await asyncio.gather(self.task, return_exceptions=True)
        await self.desktop.close()


async def serve(desktop: AsyncDesktop, port: int = 0) -> Surface:
    """Start the surface of `desktop` on 127.0.0.1:`port` (0: a free one)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(
        build_app(desktop),
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"osworld-{desktop.id}")
    while not server.started:
        if task.done():
            sock.close()
            await task  # raises what stopped it
            raise RuntimeError("the OSWorld surface stopped before it started")
        await asyncio.sleep(0.01)
    return Surface(desktop, sock.getsockname()[1], server, task)
