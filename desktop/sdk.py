"""The Python SDK: `Desktop` (blocking) and `AsyncDesktop` (asyncio).

    from desktop import Desktop

    with Desktop.create() as d:
        d.launch("mousepad")
        d.write("héllo ✓")
        d.press("ctrl+s")
        png = d.screenshot()

Method names follow E2B Desktop's, so agents written for it move over unchanged. The
blocking `Desktop` is a thin wrapper: each method runs its `AsyncDesktop` twin on a
private event loop thread.

The service is found through `base_url`/`token`, else `CUBICLE_URL`/`CUBICLE_TOKEN`,
else http://127.0.0.1:8000 with the token file of the default data directory.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

import httpx

from desktop import actions as a
from desktop._http import raise_for_error
from desktop._transport import build_request, lean_transport_for, send
from desktop.errors import AuthError
from desktop.models import (
    A11yTree,
    CreateDesktop,
    CursorPosition,
    DesktopInfo,
    ExecResult,
    FileEntry,
    Launched,
    WindowInfo,
)
from desktop.settings import Settings

T = TypeVar("T")
Point = tuple[int, int]


def _connection(base_url: str | None, token: str | None) -> tuple[str, str]:
    base_url = base_url or os.environ.get("CUBICLE_URL") or "http://127.0.0.1:8000"
    token = token or os.environ.get("CUBICLE_TOKEN")
    if not token:
        path = Settings().data_dir / "token"
        if not path.is_file():
            raise AuthError(
                f"no token: pass token=..., set CUBICLE_TOKEN, or start the service ({path})"
            )
        token = path.read_text().strip()
    return base_url.rstrip("/"), token


class _Api:
    """An authenticated HTTP client for the service."""

    def __init__(self, base_url: str | None, token: str | None, timeout_s: float) -> None:
        url, token = _connection(base_url, token)
        self._url = url
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._lean = lean_transport_for(url)
        self.http = httpx.AsyncClient(
            base_url=url, transport=self._lean, headers=self._headers, timeout=self._timeout
        )

    async def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if self._lean is None:  # https or a proxy: httpx's own client and transport
            response = await self.http.request(method, path, **kwargs)
        else:  # plain http: straight to the lean transport, whose pool the client shares
            request = build_request(
                method, self._url + path, self._timeout, headers=self._headers, **kwargs
            )
            response = await send(self._lean, request)
        if response.status_code >= 400:
            raise_for_error(response)
        return response


class AsyncCommands:
    """`desktop.commands`: run shell commands inside the desktop."""

    def __init__(self, desktop: AsyncDesktop) -> None:
        self._d = desktop

    async def run(
        self,
        command: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = 60,
        stdin: str | None = None,
    ) -> ExecResult:
        body = {"command": command, "cwd": cwd, "env": env or {}, "timeout_s": timeout_s}
        response = await self._d._call("POST", "exec", json=body | {"stdin": stdin})
        return ExecResult.model_validate_json(response.content)


class AsyncFiles:
    """`desktop.files`: read, write, list and remove files inside the desktop."""

    def __init__(self, desktop: AsyncDesktop) -> None:
        self._d = desktop

    async def read(self, path: str) -> bytes:
        return (await self._d._call("GET", "files", params={"path": path})).content

    async def write(self, path: str, data: bytes | str) -> FileEntry:
        content = data.encode() if isinstance(data, str) else data
        response = await self._d._call("PUT", "files", params={"path": path}, content=content)
        return FileEntry.model_validate_json(response.content)

    async def list(self, path: str = "~") -> list[FileEntry]:
        response = await self._d._call("GET", "files", params={"path": path})
        return [FileEntry.model_validate(item) for item in response.json()]

    async def remove(self, path: str) -> None:
        await self._d._call("DELETE", "files", params={"path": path})


class AsyncDesktop:
    """One desktop of a Cubicle service, driven with asyncio."""

    def __init__(self, info: DesktopInfo, api: _Api) -> None:
        self.info = info
        self._api = api
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)

    # --- lifecycle --------------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        *,
        resolution: Point = (1280, 800),
        timeout_s: int = 600,
        network: bool = False,
        memory_mb: int | None = None,
        base_url: str | None = None,
        token: str | None = None,
    ) -> AsyncDesktop:
        """Start a new desktop; returns once it is drawn."""
        api = _Api(base_url, token, timeout_s=120)
        request = CreateDesktop(
            resolution=resolution, timeout_s=timeout_s, network=network, memory_mb=memory_mb
        )
        try:
            response = await api.call("POST", "/api/desktops", json=request.model_dump())
        except BaseException:
            await api.http.aclose()
            raise
        return cls(DesktopInfo.model_validate_json(response.content), api)

    @classmethod
    async def connect(
        cls, desktop_id: str, *, base_url: str | None = None, token: str | None = None
    ) -> AsyncDesktop:
        """Attach to a desktop that already runs."""
        api = _Api(base_url, token, timeout_s=120)
        response = await api.call("GET", f"/api/desktops/{desktop_id}")
        return cls(DesktopInfo.model_validate_json(response.content), api)

    @property
    def id(self) -> str:
        return self.info.id

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self._api.call(method, f"/api/desktops/{self.id}/{path}", **kwargs)

    async def refresh(self) -> DesktopInfo:
        self.info = DesktopInfo.model_validate_json(
            (await self._api.call("GET", f"/api/desktops/{self.id}")).content
        )
        return self.info

    async def set_timeout(self, timeout_s: int) -> None:
        """Stop the desktop after `timeout_s` idle seconds from now."""
        await self._call("POST", "timeout", json={"timeout_s": timeout_s})

    async def kill(self) -> None:
        """Stop the desktop and close the connection."""
        try:
            await self._api.call("DELETE", f"/api/desktops/{self.id}")
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the connection to the service; the desktop keeps running."""
        await self._api.http.aclose()

    async def __aenter__(self) -> AsyncDesktop:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.kill()

    # --- input --------------------------------------------------------------------------

    async def actions(self, *actions: a.Action) -> a.ActionsResponse:
        """Run actions in order (all are checked before any runs)."""
        payload = [action.model_dump(mode="json") for action in actions]
        response = await self._call("POST", "actions", json=payload)
        return a.ActionsResponse.model_validate_json(response.content)

    async def left_click(self, x: int | None = None, y: int | None = None) -> None:
        await self.actions(a.Click(x=x, y=y))

    async def double_click(self, x: int | None = None, y: int | None = None) -> None:
        await self.actions(a.Click(x=x, y=y, count=2))

    async def right_click(self, x: int | None = None, y: int | None = None) -> None:
        await self.actions(a.Click(x=x, y=y, button="right"))

    async def middle_click(self, x: int | None = None, y: int | None = None) -> None:
        await self.actions(a.Click(x=x, y=y, button="middle"))

    async def move_mouse(self, x: int, y: int) -> None:
        await self.actions(a.Move(x=x, y=y))

    async def mouse_press(self, button: a.Button = "left") -> None:
        await self.actions(a.MouseDown(button=button))

    async def mouse_release(self, button: a.Button = "left") -> None:
        await self.actions(a.MouseUp(button=button))

    async def drag(self, fr: Point, to: Point) -> None:
        """Press at `fr`, move to `to`, release."""
        await self.actions(a.Drag(path=[fr, to]))

    async def scroll(
        self,
        direction: Literal["up", "down", "left", "right"] = "down",
        amount: int = 1,
        x: int | None = None,
        y: int | None = None,
    ) -> None:
        """Turn the wheel `amount` clicks, at (x, y) when given."""
        dx = {"left": -amount, "right": amount}.get(direction, 0)
        dy = {"up": -amount, "down": amount}.get(direction, 0)
        await self.actions(a.Scroll(x=x, y=y, dx=dx, dy=dy))

    async def write(self, text: str) -> None:
        """Type any Unicode text."""
        await self.actions(a.Type(text=text))

    async def press(self, keys: str | list[str]) -> None:
        """Press a key or combination: `"enter"`, `"ctrl+s"` or `["ctrl", "s"]`."""
        await self.actions(a.Key(keys=keys if isinstance(keys, str) else "+".join(keys)))

    async def wait(self, ms: int) -> None:
        await self.actions(a.Wait(ms=ms))

    async def wait_for_settle(self, quiet_ms: int = 300, timeout_ms: int = 5000) -> bool:
        """Wait until the screen has not changed for `quiet_ms`; False on timeout."""
        result = await self.actions(a.WaitForSettle(quiet_ms=quiet_ms, timeout_ms=timeout_ms))
        return bool(result.results[0].settled)

    # --- seeing -------------------------------------------------------------------------

    async def screenshot(
        self,
        format: Literal["png", "jpeg", "webp"] = "png",
        *,
        quality: int = 80,
        max_width: int | None = None,
        max_height: int | None = None,
        cursor: bool = False,
    ) -> bytes:
        """The screen as image bytes."""
        params: dict[str, Any] = {"format": format, "quality": quality, "cursor": cursor}
        params |= {k: v for k, v in (("max_width", max_width), ("max_height", max_height)) if v}
        return (await self._call("GET", "screenshot", params=params)).content

    async def get_screen_size(self) -> Point:
        return self.info.screen.width, self.info.screen.height

    async def get_cursor_position(self) -> Point:
        position = CursorPosition.model_validate_json((await self._call("GET", "cursor")).content)
        return position.x, position.y

    async def get_windows(self) -> list[WindowInfo]:
        return [WindowInfo.model_validate(w) for w in (await self._call("GET", "windows")).json()]

    async def get_application_windows(self, application: str) -> list[WindowInfo]:
        """Windows whose application (WM_CLASS) matches, case-insensitively."""
        wanted = application.lower()
        return [w for w in await self.get_windows() if w.app.lower() == wanted]

    async def get_current_window_id(self) -> int | None:
        return next((w.id for w in await self.get_windows() if w.focused), None)

    async def get_window_title(self, window_id: int) -> str:
        return next((w.title for w in await self.get_windows() if w.id == window_id), "")

    async def window(
        self, window_id: int, op: Literal["activate", "close", "maximize", "minimize"]
    ) -> None:
        await self._call("POST", f"windows/{window_id}/{op}")

    async def accessibility_tree(self, app: str | None = None) -> A11yTree:
        params = {"app": app} if app else {}
        return A11yTree.model_validate_json(
            (await self._call("GET", "a11y", params=params)).content
        )

    # --- the computer -------------------------------------------------------------------

    async def open(self, file_or_url: str) -> Launched:
        """Open a file or URL with its default application."""
        response = await self._call("POST", "open", json={"target": file_or_url})
        return Launched.model_validate_json(response.content)

    async def launch(self, application: str, *args: str) -> Launched:
        response = await self._call("POST", "launch", json={"app": application, "args": args})
        return Launched.model_validate_json(response.content)

    async def exec(self, command: str | list[str], **kwargs: Any) -> ExecResult:
        return await self.commands.run(command, **kwargs)

    async def share(self, mode: Literal["view", "control"] = "view", ttl_s: int = 86_400) -> str:
        """A link to the desktop's live view, valid `ttl_s` seconds; `control` may take over."""
        response = await self._call("POST", "share", json={"mode": mode, "ttl_s": ttl_s})
        return str(response.json()["url"])

    async def start_recording(self) -> dict[str, Any]:
        """Start recording the screen to MP4 (or get the recording already running): the
        recording's info, its `id` among it."""
        return (await self._call("POST", "recording/start")).json()

    async def stop_recording(self) -> dict[str, Any]:
        """Stop the running recording; its final info (duration, frames, size)."""
        return (await self._call("POST", "recording/stop")).json()

    async def get_clipboard(self) -> str:
        return (await self._call("GET", "clipboard")).json()["text"]

    async def set_clipboard(self, text: str) -> None:
        await self._call("PUT", "clipboard", json={"text": text})


# --- the blocking twin ------------------------------------------------------------------------


class _LoopThread:
    """One event loop on a daemon thread, shared by every blocking client."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coroutine: Coroutine[Any, Any, T]) -> T:
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=cls._loop.run_forever, name="cubicle-sdk", daemon=True
                ).start()
        return asyncio.run_coroutine_threadsafe(coroutine, cls._loop).result()


def _blocking(method: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> T:
        return _LoopThread.run(method(self._async, *args, **kwargs))

    return call


class Commands:
    __doc__ = AsyncCommands.__doc__

    def __init__(self, twin: AsyncCommands) -> None:
        self._async = twin

    run = _blocking(AsyncCommands.run)


class Files:
    __doc__ = AsyncFiles.__doc__

    def __init__(self, twin: AsyncFiles) -> None:
        self._async = twin

    read = _blocking(AsyncFiles.read)
    write = _blocking(AsyncFiles.write)
    list = _blocking(AsyncFiles.list)
    remove = _blocking(AsyncFiles.remove)


class Desktop:
    """One desktop of a Cubicle service, driven with blocking calls."""

    def __init__(self, twin: AsyncDesktop) -> None:
        self._async = twin
        self.commands = Commands(twin.commands)
        self.files = Files(twin.files)

    @classmethod
    def create(cls, **kwargs: Any) -> Desktop:
        """Start a new desktop; takes `AsyncDesktop.create`'s arguments."""
        return cls(_LoopThread.run(AsyncDesktop.create(**kwargs)))

    @classmethod
    def connect(cls, desktop_id: str, **kwargs: Any) -> Desktop:
        return cls(_LoopThread.run(AsyncDesktop.connect(desktop_id, **kwargs)))

    @property
    def id(self) -> str:
        return self._async.id

    @property
    def info(self) -> DesktopInfo:
        return self._async.info

    def __enter__(self) -> Desktop:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

    refresh = _blocking(AsyncDesktop.refresh)
    set_timeout = _blocking(AsyncDesktop.set_timeout)
    kill = _blocking(AsyncDesktop.kill)
    close = _blocking(AsyncDesktop.close)
    actions = _blocking(AsyncDesktop.actions)
    left_click = _blocking(AsyncDesktop.left_click)
    double_click = _blocking(AsyncDesktop.double_click)
    right_click = _blocking(AsyncDesktop.right_click)
    middle_click = _blocking(AsyncDesktop.middle_click)
    move_mouse = _blocking(AsyncDesktop.move_mouse)
    mouse_press = _blocking(AsyncDesktop.mouse_press)
    mouse_release = _blocking(AsyncDesktop.mouse_release)
    drag = _blocking(AsyncDesktop.drag)
    scroll = _blocking(AsyncDesktop.scroll)
    write = _blocking(AsyncDesktop.write)
    press = _blocking(AsyncDesktop.press)
    wait = _blocking(AsyncDesktop.wait)
    wait_for_settle = _blocking(AsyncDesktop.wait_for_settle)
    screenshot = _blocking(AsyncDesktop.screenshot)
    get_screen_size = _blocking(AsyncDesktop.get_screen_size)
    get_cursor_position = _blocking(AsyncDesktop.get_cursor_position)
    get_windows = _blocking(AsyncDesktop.get_windows)
    get_application_windows = _blocking(AsyncDesktop.get_application_windows)
    get_current_window_id = _blocking(AsyncDesktop.get_current_window_id)
    get_window_title = _blocking(AsyncDesktop.get_window_title)
    window = _blocking(AsyncDesktop.window)
    accessibility_tree = _blocking(AsyncDesktop.accessibility_tree)
    open = _blocking(AsyncDesktop.open)
    launch = _blocking(AsyncDesktop.launch)
    exec = _blocking(AsyncDesktop.exec)
    share = _blocking(AsyncDesktop.share)
    start_recording = _blocking(AsyncDesktop.start_recording)
    stop_recording = _blocking(AsyncDesktop.stop_recording)
    get_clipboard = _blocking(AsyncDesktop.get_clipboard)
    set_clipboard = _blocking(AsyncDesktop.set_clipboard)


async def list_desktops(
    *, base_url: str | None = None, token: str | None = None
) -> list[DesktopInfo]:
    """Every desktop the service knows, with its status."""
    api = _Api(base_url, token, timeout_s=30)
    try:
        response = await api.call("GET", "/api/desktops")
    finally:
        await api.http.aclose()
    return [DesktopInfo.model_validate(item) for item in response.json()]
