"""The Python SDK: `Desktop` (blocking) and `AsyncDesktop` (asyncio).

    from cubicle import Desktop

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
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import BaseModel, JsonValue, TypeAdapter

from cubicle.client import code as _code
from cubicle.protocol import actions as a
from cubicle.protocol.code import ContextInfo, CreateContext, RunCode
from cubicle.protocol.data_dir import default_data_dir
from cubicle.protocol.errors import (
    AuthError,
    CubicleError,
    ServiceUnreachable,
    WindowNotFound,
    from_code,
    raise_for_status,
)
from cubicle.protocol.models import (
    A11yTree,
    ClipboardText,
    CursorPosition,
    ExecRequest,
    ExecResult,
    FileEntry,
    Launched,
    ScreenshotInfo,
    WindowInfo,
)
from cubicle.protocol.service import (
    ActionLog,
    CdpEndpoint,
    CreateDesktop,
    CreateSecret,
    DesktopEgress,
    DesktopInfo,
    DesktopMetrics,
    DesktopNetwork,
    Forked,
    Lifecycle,
    PortAccess,
    PortInfo,
    PreviewLink,
    RecordingInfo,
    SecretInfo,
    ShareLink,
    SnapshotInfo,
    VolumeInfo,
    VolumeMount,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
Point = tuple[int, int]
_WINDOWS = TypeAdapter(list[WindowInfo])
_ENTRIES = TypeAdapter(list[FileEntry])
_PORTS = TypeAdapter(list[PortInfo])
_DESKTOPS = TypeAdapter(list[DesktopInfo])
_RECORDINGS = TypeAdapter(list[RecordingInfo])
_SECRETS = TypeAdapter(list[SecretInfo])
_SNAPSHOTS = TypeAdapter(list[SnapshotInfo])
_VOLUMES = TypeAdapter(list[VolumeInfo])
_CONTEXTS = TypeAdapter(list[ContextInfo])


def service_address(base_url: str | None, token: str | None) -> tuple[str, str]:
    """The service's URL and token: those given, else `CUBICLE_URL`/`CUBICLE_TOKEN`, else
    http://127.0.0.1:8000 and the token file of the default data directory."""
    base_url = base_url or os.environ.get("CUBICLE_URL") or "http://127.0.0.1:8000"
    token = token or os.environ.get("CUBICLE_TOKEN")
    if not token:
        path = default_data_dir() / "token"
        if not path.is_file():
            raise AuthError(
                f"no token: pass token=..., set CUBICLE_TOKEN, or start the service ({path})"
            )
        token = path.read_text().strip()
    return base_url.rstrip("/"), token


BUSY_RETRIES = 3
"""Times a call answered `busy` (429, too many slow calls wait on the desktop) is sent again."""
_MAX_BUSY_WAIT_S = 5.0


def _busy_wait_s(response: httpx.Response) -> float | None:
    """Seconds to wait before sending again a call answered `busy`; None for any other."""
    if response.status_code != 429 or b'"busy"' not in response.content[:64]:
        return None
    try:
        return min(float(response.headers.get("retry-after", "1")), _MAX_BUSY_WAIT_S)
    except ValueError:
        return 1.0


@dataclass(frozen=True)
class Screenshot:
    """A screenshot and how its pixels map to the screen."""

    data: bytes
    """The image, encoded."""
    format: Literal["png", "jpeg", "webp"]
    info: ScreenshotInfo
    """Sizes (screen and image pixels), scale, capture number, pointer position."""


class _Api:
    """An authenticated HTTP client for the service: every answer, or a `CubicleError`."""

    def __init__(
        self,
        base_url: str | None,
        token: str | None,
        timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if transport is None:
            self.url, token = service_address(base_url, token)
        else:  # the transport reaches the service its own way: it may need no token
            self.url = (base_url or "http://cubicle").rstrip("/")
        self._transport = transport
        self.http = httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"} if token else {},
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            transport=transport,
        )

    def sibling(self) -> _Api:
        """Another client of the same service with the same credentials (for a desktop
        this one made: each desktop object closes its own)."""
        twin = object.__new__(_Api)
        twin.url, twin._transport = self.url, self._transport
        twin.http = httpx.AsyncClient(
            base_url=self.url,
            headers=self.http.headers,
            timeout=self.http.timeout,
            transport=self._transport,
        )
        return twin

    async def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call; a `busy` answer (nothing ran) is sent again after its `Retry-After`,
        up to `BUSY_RETRIES` times, before it is raised as `Busy`."""
        for _ in range(BUSY_RETRIES):
            response = await self._send(method, path, **kwargs)
            wait_s = _busy_wait_s(response)
            if wait_s is None:
                break
            await asyncio.sleep(wait_s)
        else:
            response = await self._send(method, path, **kwargs)
        raise_for_status(response.status_code, response.content)
        return response

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self.http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise ServiceUnreachable(
                f"the Cubicle service at {self.url} did not answer {method} {path} in time "
                f"({type(exc).__name__}): it may be overloaded; try again"
            ) from exc
        except httpx.TransportError as exc:
            raise ServiceUnreachable(
                f"cannot reach the Cubicle service at {self.url} ({exc or type(exc).__name__}): "
                "is it running? Start it with ./scripts/serve.sh, or set CUBICLE_URL"
            ) from exc

    async def model(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        """Call, and read the answer as `model`."""
        return model.model_validate_json((await self.call(method, path, **kwargs)).content)

    async def close(self) -> None:
        await self.http.aclose()


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
        """Run a shell command line (or an argv list) and wait for it to end."""
        request = ExecRequest(
            command=command, cwd=cwd, env=env or {}, timeout_s=timeout_s, stdin=stdin
        )
        return await self._d._model(ExecResult, "POST", "exec", json=request.model_dump())


class AsyncFiles:
    """`desktop.files`: read, write, list and remove files inside the desktop."""

    def __init__(self, desktop: AsyncDesktop) -> None:
        self._d = desktop

    async def read(self, path: str) -> bytes:
        return (await self._d._call("GET", "files", params={"path": path})).content

    async def write(self, path: str, data: bytes | str) -> FileEntry:
        content = data.encode() if isinstance(data, str) else data
        return await self._d._model(
            FileEntry, "PUT", "files", params={"path": path}, content=content
        )

    async def list(self, path: str = "~") -> list[FileEntry]:
        response = await self._d._call("GET", "files", params={"path": path})
        return _ENTRIES.validate_json(response.content)

    async def remove(self, path: str) -> None:
        await self._d._call("DELETE", "files", params={"path": path})


class AsyncBrowser:
    """`desktop.browser`: the desktop's Chromium, for programs that drive browsers."""

    def __init__(self, desktop: AsyncDesktop) -> None:
        self._d = desktop

    async def cdp(self, *, expires_s: int = 3600) -> CdpEndpoint:
        """`cdp_url` with when it expires and the DevTools port inside."""
        body = {"ttl_s": expires_s}
        return await self._d._model(CdpEndpoint, "POST", "browser/cdp", json=body)

    async def cdp_url(self, *, expires_s: int = 3600) -> str:
        """A WebSocket URL to the desktop's Chromium (started if none runs) for
        `playwright.chromium.connect_over_cdp(url)`: the browser the live view shows.
        It opens DevTools alone, for `expires_s` seconds."""
        return (await self.cdp(expires_s=expires_s)).url


class AsyncDesktop:
    """One desktop of a Cubicle service, driven with asyncio."""

    def __init__(self, info: DesktopInfo, api: _Api) -> None:
        self.info = info
        self._api = api
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.browser = AsyncBrowser(self)

    # --- lifecycle --------------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        *,
        resolution: Point = (1280, 800),
        timeout_s: int = 600,
        network: bool = False,
        memory_mb: int | None = None,
        disk_mb: int | None = None,
        runtime: str | None = None,
        networks: list[str] | None = None,
        alias: str | None = None,
        egress: DesktopEgress | None = None,
        secrets: list[str] | None = None,
        hosts: dict[str, str] | None = None,
        snapshot: str | None = None,
        lifecycle: Lifecycle | None = None,
        volumes: dict[str, str | VolumeMount] | None = None,
        base_url: str | None = None,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> AsyncDesktop:
        """Start a new desktop; returns once it is drawn. `networks`: private networks to
        join (`POST /api/networks`), where it answers to its id and `alias`. `secrets`:
        secrets (`AsyncServiceClient.create_secret`) its programs use without seeing them,
        through the egress proxy. `hosts`: extra lines of its /etc/hosts. `snapshot`: start
        from a named snapshot (`snapshot()`). `lifecycle`: pause at the idle timeout, resume
        on use, a longest life. `volumes`: `{"/mnt/data": "team-data"}` (read-write) or
        `VolumeMount(volume=…, read_only=True)`. `transport`: how requests reach the
        service (httpx's), for a program that holds it in process."""
        api = _Api(base_url, token, timeout_s=120, transport=transport)
        request = CreateDesktop(
            resolution=resolution,
            timeout_s=timeout_s,
            network=network,
            memory_mb=memory_mb,
            disk_mb=disk_mb,
            runtime=runtime,
            networks=networks or [],
            alias=alias,
            egress=egress,
            secrets=secrets or [],
            hosts=hosts or {},
            snapshot=snapshot,
            lifecycle=lifecycle or Lifecycle(),
            volumes=volumes or {},
        )
        try:
            body = request.model_dump(exclude_none=True)
            info = await api.model(DesktopInfo, "POST", "/api/desktops", json=body)
        except BaseException:
            await api.close()
            raise
        return cls(info, api)

    @classmethod
    async def connect(
        cls,
        desktop_id: str,
        *,
        base_url: str | None = None,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> AsyncDesktop:
        """Attach to a desktop that already runs, resuming it if it is paused
        (`transport`: as in `create`)."""
        api = _Api(base_url, token, timeout_s=120, transport=transport)
        try:
            path = f"/api/desktops/{quote(desktop_id, safe='')}"  # any text: a 404, not a bad URL
            info = await api.model(DesktopInfo, "GET", path)
            if info.status == "paused":
                info = await api.model(DesktopInfo, "POST", f"{path}/resume")
        except BaseException:
            await api.close()
            raise
        return cls(info, api)

    @property
    def id(self) -> str:
        return self.info.id

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self._api.call(method, f"/api/desktops/{self.id}/{path}", **kwargs)

    async def _model(self, model: type[M], method: str, path: str, **kwargs: Any) -> M:
        return await self._api.model(model, method, f"/api/desktops/{self.id}/{path}", **kwargs)

    async def refresh(self) -> DesktopInfo:
        self.info = await self._api.model(DesktopInfo, "GET", f"/api/desktops/{self.id}")
        return self.info

    async def set_timeout(self, timeout_s: int) -> None:
        """Stop the desktop after `timeout_s` idle seconds from now."""
        self.info = await self._model(DesktopInfo, "POST", "timeout", json={"timeout_s": timeout_s})

    async def metrics(
        self, start: datetime | None = None, end: datetime | None = None
    ) -> DesktopMetrics:
        """Its CPU, memory, disk and network readings (one every few seconds), oldest
        first, from `start` to `end`; `self.info.usage` after `refresh()` is the latest."""
        params = {k: v.isoformat() for k, v in (("start", start), ("end", end)) if v}
        return await self._model(DesktopMetrics, "GET", "metrics", params=params)

    async def snapshot(self, name: str) -> SnapshotInfo:
        """Save this desktop as `name` (local: its disk; microvm: disk and memory); start
        copies with `AsyncDesktop.create(snapshot=name)`."""
        return await self._model(SnapshotInfo, "POST", "snapshot", json={"name": name})

    async def fork(self, count: int = 1) -> list[AsyncDesktop | CubicleError]:
        """`count` new desktops from this one as it is now (local: its disk; microvm: disk
        and memory); it goes on. One entry per child, in order: the desktop, or the error
        that kept it from being made."""
        answer = await self._model(Forked, "POST", "fork", json={"count": count})
        made = iter(answer.desktops)
        failed = {error.index: error for error in answer.errors}
        children: list[AsyncDesktop | CubicleError] = []
        for index in range(count):
            if (error := failed.get(index)) is not None:
                children.append(from_code(error.error, error.detail))
            else:
                children.append(AsyncDesktop(next(made), self._api.sibling()))
        return children

    async def pause(self, *, keep_memory: bool = True) -> None:
        """Freeze the desktop where it stands until `resume()`: its programs, windows and
        memory stay as they are and use no CPU; other calls to it fail with
        `DesktopPaused` meanwhile. `Conflict` if it is paused already."""
        self.info = await self._model(
            DesktopInfo, "POST", "pause", json={"keep_memory": keep_memory}
        )

    async def resume(self) -> None:
        """Let a paused desktop run on from where it stopped."""
        self.info = await self._model(DesktopInfo, "POST", "resume")

    async def kill(self) -> None:
        """Stop the desktop and close the connection."""
        try:
            await self._api.call("DELETE", f"/api/desktops/{self.id}")
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the connection to the service; the desktop keeps running."""
        await self._api.close()

    async def __aenter__(self) -> AsyncDesktop:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.kill()

    # --- input --------------------------------------------------------------------------

    async def actions(self, *actions: a.Action) -> a.ActionsResponse:
        """Run actions in order (all are checked before any runs)."""
        body = a.action_batch_adapter.dump_json(list(actions))
        headers = {"Content-Type": "application/json"}
        return await self._model(
            a.ActionsResponse, "POST", "actions", content=body, headers=headers
        )

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
        """The screen as image bytes (`screenshot_with_info` also says how they map to it)."""
        shot = await self.screenshot_with_info(
            format, quality=quality, max_width=max_width, max_height=max_height, cursor=cursor
        )
        return shot.data

    async def screenshot_with_info(
        self,
        format: Literal["png", "jpeg", "webp"] = "png",
        *,
        quality: int = 80,
        max_width: int | None = None,
        max_height: int | None = None,
        cursor: bool = False,
    ) -> Screenshot:
        """The screen as image bytes with how its pixels map to the screen (`scale`, sizes,
        the capture it shows, where the pointer was when `cursor=True`)."""
        params: dict[str, Any] = {"format": format, "quality": quality, "cursor": cursor}
        params |= {k: v for k, v in (("max_width", max_width), ("max_height", max_height)) if v}
        response = await self._call("GET", "screenshot", params=params)
        return Screenshot(response.content, format, ScreenshotInfo.from_headers(response.headers))

    async def get_screen_size(self) -> Point:
        return self.info.screen.width, self.info.screen.height

    async def get_cursor_position(self) -> Point:
        position = await self._model(CursorPosition, "GET", "cursor")
        return position.x, position.y

    async def get_windows(self) -> list[WindowInfo]:
        return _WINDOWS.validate_json((await self._call("GET", "windows")).content)

    async def get_application_windows(self, application: str) -> list[WindowInfo]:
        """Windows whose application (WM_CLASS) matches, case-insensitively."""
        wanted = application.lower()
        return [w for w in await self.get_windows() if w.app.lower() == wanted]

    async def get_current_window_id(self) -> int | None:
        """The focused window's id; None when no window has the focus."""
        return next((w.id for w in await self.get_windows() if w.focused), None)

    async def get_window_title(self, window_id: int) -> str:
        """A window's title; `WindowNotFound` when no such window is open."""
        for window in await self.get_windows():
            if window.id == window_id:
                return window.title
        raise WindowNotFound(
            f"no window {window_id} on desktop {self.id}: list them with get_windows()"
        )

    async def window(
        self, window_id: int, op: Literal["activate", "close", "maximize", "minimize"]
    ) -> None:
        await self._call("POST", f"windows/{window_id}/{op}")

    async def accessibility_tree(self, app: str | None = None) -> A11yTree:
        params = {"app": app} if app else {}
        return await self._model(A11yTree, "GET", "a11y", params=params)

    # --- the computer -------------------------------------------------------------------

    async def open(self, file_or_url: str) -> Launched:
        """Open a file or URL with its default application."""
        return await self._model(Launched, "POST", "open", json={"target": file_or_url})

    async def launch(self, application: str, *args: str) -> Launched:
        body = {"app": application, "args": list(args)}
        return await self._model(Launched, "POST", "launch", json=body)

    async def exec(self, command: str | list[str], **kwargs: Any) -> ExecResult:
        return await self.commands.run(command, **kwargs)

    async def get_clipboard(self) -> str:
        return (await self._model(ClipboardText, "GET", "clipboard")).text

    async def set_clipboard(self, text: str) -> None:
        await self._call("PUT", "clipboard", json=ClipboardText(text=text).model_dump())

    # --- code contexts ----------------------------------------------------------------------

    async def run_code(
        self,
        code: str,
        language: str | None = None,
        context: ContextInfo | str | None = None,
        *,
        on_stdout: _code.OnOutput | None = None,
        on_stderr: _code.OnOutput | None = None,
        on_result: _code.OnResult | None = None,
        on_error: _code.OnError | None = None,
        timeout_s: float = 300,
        envs: dict[str, str] | None = None,
    ) -> _code.Execution:
        """Run code in a persistent context (an IPython process in the desktop): variables,
        imports and data stay for the next run. Without `context`, the language's default
        context runs it (Python when no language is given). Past `timeout_s` the run is
        interrupted and `.error.name` is `TimeoutError`; the context keeps its state."""
        context_id = context.id if isinstance(context, ContextInfo) else context
        request = RunCode(
            code=code,
            language=None if context_id else (language or "python"),
            context_id=context_id,
            env_vars=envs or {},
            timeout_s=timeout_s,
        )
        return await _code.run_code(
            self._api.http,
            f"/api/desktops/{self.id}/code",
            request,
            on_stdout=on_stdout,
            on_stderr=on_stderr,
            on_result=on_result,
            on_error=on_error,
        )

    async def create_code_context(
        self, language: str = "python", cwd: str | None = None
    ) -> ContextInfo:
        """A new context with its own process and state; `cwd` is its working directory."""
        body = CreateContext(language=language, cwd=cwd).model_dump(exclude_none=True)
        return await self._model(ContextInfo, "POST", "contexts", json=body)

    async def list_code_contexts(self) -> list[ContextInfo]:
        return _CONTEXTS.validate_json((await self._call("GET", "contexts")).content)

    async def restart_code_context(self, context: ContextInfo | str) -> ContextInfo:
        """Start the context's process afresh: its state is dropped."""
        context_id = context.id if isinstance(context, ContextInfo) else context
        return await self._model(ContextInfo, "POST", f"contexts/{quote(context_id)}/restart")

    async def interrupt_code(self, context: ContextInfo | str) -> None:
        """Interrupt what runs in a context (an endless loop); its state stays."""
        context_id = context.id if isinstance(context, ContextInfo) else context
        await self._call("POST", f"contexts/{quote(context_id)}/interrupt")

    async def remove_code_context(self, context: ContextInfo | str) -> None:
        context_id = context.id if isinstance(context, ContextInfo) else context
        await self._call("DELETE", f"contexts/{quote(context_id)}")

    # --- watching and recording ---------------------------------------------------------

    async def share(
        self, mode: Literal["view", "control"] = "view", ttl_s: int = 86_400
    ) -> ShareLink:
        """A link to the desktop's live view, valid `ttl_s` seconds; `control` may take over."""
        return await self._model(ShareLink, "POST", "share", json={"mode": mode, "ttl_s": ttl_s})

    # --- ports ------------------------------------------------------------------------------

    def get_host(self, port: int) -> str:
        """`<port>-<id>.<domain>`: where `port` inside answers through the service (a
        request there needs `X-Access-Token`, or use `preview_url`). No call is made."""
        if not self.info.domain:
            raise CubicleError("this service does not say where desktops' ports answer")
        return f"{port}-{self.id}.{self.info.domain}"

    async def ports(self) -> list[PortInfo]:
        """The TCP ports programs listen on inside, each with its `host`."""
        return _PORTS.validate_json((await self._call("GET", "ports")).content)

    async def preview(self, port: int, *, expires_s: int = 3600) -> PreviewLink:
        """A link that opens `port` alone, for `expires_s` seconds (revocable by its id)."""
        body = {"ttl_s": expires_s}
        return await self._model(PreviewLink, "POST", f"ports/{port}/previews", json=body)

    async def preview_url(self, port: int, *, expires_s: int = 3600) -> str:
        """An https URL that opens `port` in a browser for `expires_s` seconds, without
        the service's token in it (`cubicle ca` says how to trust its certificate)."""
        url = (await self.preview(port, expires_s=expires_s)).url
        assert url is not None  # the answer that makes a link carries it
        return url

    async def set_egress(
        self, *, allow: list[str] | None = None, deny: list[str] | None = None
    ) -> DesktopInfo:
        """The desktop's own egress rules from its next connection on, CIDRs and host names
        (`api.example.com`, `*.example.com`; judged on ports 80 and 443): `allow`, when
        given, is the only way out; `deny` wins over it. Both narrow the operator's policy;
        no arguments clears them."""
        rules = DesktopEgress(allow=allow or [], deny=deny or [])
        self.info = await self._model(DesktopInfo, "PUT", "network", json=rules.model_dump())
        return self.info

    async def network(self) -> DesktopNetwork:
        """Its egress rules, the secrets it uses, and what its egress proxy refused lately."""
        return await self._model(DesktopNetwork, "GET", "network")

    async def revoke_preview(self, link_id: str) -> None:
        """Revoke a preview link by its id: later requests with it are refused."""
        await self._call("DELETE", f"previews/{link_id}")

    async def set_port_public(self, port: int, public: bool = True) -> None:
        """Let anyone who reaches the service open `port` without a token (or stop)."""
        await self._call("PUT", f"ports/{port}", json=PortAccess(public=public).model_dump())

    async def start_recording(self, *, overlay: bool = False) -> RecordingInfo:
        """Start recording the screen to MP4 (or get the recording already running).
        `overlay`: draw the actions into the video (clicks, drags, scrolls, typed text)."""
        body = {"overlay": True} if overlay else None
        return await self._model(RecordingInfo, "POST", "recording/start", json=body)

    async def stop_recording(self) -> RecordingInfo:
        """Stop the running recording; its final info (duration, frames, size)."""
        return await self._model(RecordingInfo, "POST", "recording/stop")

    async def recordings(self) -> list[RecordingInfo]:
        """Every recording of this desktop, the running one included."""
        return _RECORDINGS.validate_json((await self._call("GET", "recordings")).content)

    async def recording_actions(self, recording_id: str) -> ActionLog:
        """The actions run during a recording, each with its offset into the video."""
        return await self._model(ActionLog, "GET", f"recordings/{recording_id}/actions")

    async def recording_video(self, recording_id: str) -> bytes:
        """The MP4 of a finished recording."""
        return (await self._call("GET", f"recordings/{recording_id}.mp4")).content


# --- the blocking twin ------------------------------------------------------------------------


class AsyncServiceClient:
    """The service's routes beyond one desktop's (the task board's, evaluations', OSWorld
    surfaces…), with the SDK's authentication and errors: each answer is its JSON, each
    failure a `CubicleError` (`ServiceUnreachable` when the service does not answer)."""

    def __init__(
        self,
        *,
        base_url: str | None = None,
        token: str | None = None,
        timeout_s: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`transport`: as in `AsyncDesktop.create`."""
        self._api = _Api(base_url, token, timeout_s, transport)

    @property
    def url(self) -> str:
        return self._api.url

    @overload
    async def request(
        self,
        method: str,
        path: str,
        *,
        json: JsonValue = None,
        params: dict[str, Any] | None = None,
        model: type[M],
    ) -> M: ...

    @overload
    async def request(
        self,
        method: str,
        path: str,
        *,
        json: JsonValue = None,
        params: dict[str, Any] | None = None,
        model: None = None,
    ) -> JsonValue: ...

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: JsonValue = None,
        params: dict[str, Any] | None = None,
        model: type[BaseModel] | None = None,
    ) -> BaseModel | JsonValue:
        """Send one call (`path` from the service's root, ids quoted). Its answer as
        `model` when given (validated by pydantic), else as plain JSON (None when the
        answer has no body)."""
        if model is not None:
            return await self._api.model(model, method, path, json=json, params=params)
        response = await self._api.call(method, path, json=json, params=params)
        content: JsonValue = response.json() if response.content else None
        return content

    async def create_secret(
        self,
        name: str,
        value: str,
        hosts: list[str],
        *,
        header: str = "Authorization",
        format: str = "Bearer {value}",
        env: str | None = None,
    ) -> SecretInfo:
        """Keep a secret (encrypted): desktops created with `secrets=[name]` see only its
        placeholder in `env`, and their requests to `hosts` get `header: format` with the
        value put in by the egress proxy."""
        body = CreateSecret(
            name=name, value=value, hosts=hosts, header=header, format=format, env=env
        )
        return await self.request("POST", "/api/secrets", json=body.model_dump(), model=SecretInfo)

    async def secrets(self) -> list[SecretInfo]:
        """Every secret, without its value."""
        response = await self._api.call("GET", "/api/secrets")
        return _SECRETS.validate_json(response.content)

    async def delete_secret(self, name: str) -> None:
        await self._api.call("DELETE", f"/api/secrets/{quote(name, safe='')}")

    async def snapshots(self) -> list[SnapshotInfo]:
        """Every named snapshot (`AsyncDesktop.snapshot`, forks of microVM desktops)."""
        response = await self._api.call("GET", "/api/snapshots")
        return _SNAPSHOTS.validate_json(response.content)

    async def delete_snapshot(self, name: str) -> None:
        await self._api.call("DELETE", f"/api/snapshots/{quote(name, safe='')}")

    async def create_volume(self, name: str, size_mb: int = 1024) -> VolumeInfo:
        """A volume of `size_mb` (its quota), for `AsyncDesktop.create(volumes=…)`."""
        body = {"name": name, "size_mb": size_mb}
        return await self._api.model(VolumeInfo, "POST", "/api/volumes", json=body)

    async def volumes(self) -> list[VolumeInfo]:
        return _VOLUMES.validate_json((await self._api.call("GET", "/api/volumes")).content)

    async def delete_volume(self, name: str) -> None:
        await self._api.call("DELETE", f"/api/volumes/{quote(name, safe='')}")

    async def close(self) -> None:
        await self._api.close()

    async def __aenter__(self) -> AsyncServiceClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


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


class Browser:
    __doc__ = AsyncBrowser.__doc__

    def __init__(self, twin: AsyncBrowser) -> None:
        self._async = twin

    cdp = _blocking(AsyncBrowser.cdp)
    cdp_url = _blocking(AsyncBrowser.cdp_url)


class Desktop:
    """One desktop of a Cubicle service, driven with blocking calls."""

    def __init__(self, twin: AsyncDesktop) -> None:
        self._async = twin
        self.commands = Commands(twin.commands)
        self.files = Files(twin.files)
        self.browser = Browser(twin.browser)

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
    metrics = _blocking(AsyncDesktop.metrics)
    snapshot = _blocking(AsyncDesktop.snapshot)

    def fork(self, count: int = 1) -> list[Desktop | CubicleError]:
        """`AsyncDesktop.fork`, each child a `Desktop`."""
        made = _LoopThread.run(self._async.fork(count))
        return [Desktop(m) if isinstance(m, AsyncDesktop) else m for m in made]

    pause = _blocking(AsyncDesktop.pause)
    resume = _blocking(AsyncDesktop.resume)
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
    screenshot_with_info = _blocking(AsyncDesktop.screenshot_with_info)
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
    ports = _blocking(AsyncDesktop.ports)
    preview = _blocking(AsyncDesktop.preview)
    preview_url = _blocking(AsyncDesktop.preview_url)
    revoke_preview = _blocking(AsyncDesktop.revoke_preview)
    set_egress = _blocking(AsyncDesktop.set_egress)
    network = _blocking(AsyncDesktop.network)
    set_port_public = _blocking(AsyncDesktop.set_port_public)

    def get_host(self, port: int) -> str:
        return self._async.get_host(port)

    start_recording = _blocking(AsyncDesktop.start_recording)
    stop_recording = _blocking(AsyncDesktop.stop_recording)
    get_clipboard = _blocking(AsyncDesktop.get_clipboard)
    set_clipboard = _blocking(AsyncDesktop.set_clipboard)
    recordings = _blocking(AsyncDesktop.recordings)
    recording_actions = _blocking(AsyncDesktop.recording_actions)
    recording_video = _blocking(AsyncDesktop.recording_video)
    run_code = _blocking(AsyncDesktop.run_code)
    create_code_context = _blocking(AsyncDesktop.create_code_context)
    list_code_contexts = _blocking(AsyncDesktop.list_code_contexts)
    restart_code_context = _blocking(AsyncDesktop.restart_code_context)
    interrupt_code = _blocking(AsyncDesktop.interrupt_code)
    remove_code_context = _blocking(AsyncDesktop.remove_code_context)


class ServiceClient:
    """`AsyncServiceClient` with blocking calls."""

    def __init__(self, **kwargs: Any) -> None:
        """Takes `AsyncServiceClient`'s arguments."""
        self._async = AsyncServiceClient(**kwargs)

    @property
    def url(self) -> str:
        return self._async.url

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    if TYPE_CHECKING:  # `request`'s overloads, as its async twin's

        @overload
        def request(
            self,
            method: str,
            path: str,
            *,
            json: JsonValue = None,
            params: dict[str, Any] | None = None,
            model: type[M],
        ) -> M: ...

        @overload
        def request(
            self,
            method: str,
            path: str,
            *,
            json: JsonValue = None,
            params: dict[str, Any] | None = None,
            model: None = None,
        ) -> JsonValue: ...

        def request(
            self,
            method: str,
            path: str,
            *,
            json: JsonValue = None,
            params: dict[str, Any] | None = None,
            model: type[BaseModel] | None = None,
        ) -> BaseModel | JsonValue: ...
    else:
        request = _blocking(AsyncServiceClient.request)

    create_secret = _blocking(AsyncServiceClient.create_secret)
    secrets = _blocking(AsyncServiceClient.secrets)
    delete_secret = _blocking(AsyncServiceClient.delete_secret)
    snapshots = _blocking(AsyncServiceClient.snapshots)
    delete_snapshot = _blocking(AsyncServiceClient.delete_snapshot)
    create_volume = _blocking(AsyncServiceClient.create_volume)
    volumes = _blocking(AsyncServiceClient.volumes)
    delete_volume = _blocking(AsyncServiceClient.delete_volume)
    close = _blocking(AsyncServiceClient.close)


async def list_desktops(
    *, base_url: str | None = None, token: str | None = None
) -> list[DesktopInfo]:
    """Every desktop the service knows, with its status."""
    api = _Api(base_url, token, timeout_s=30)
    try:
        response = await api.call("GET", "/api/desktops")
    finally:
        await api.close()
    return _DESKTOPS.validate_json(response.content)


async def wait_for_service(
    *, base_url: str | None = None, token: str | None = None, timeout_s: float = 30.0
) -> None:
    """Return once the service answers; `ServiceUnreachable` if it has not within `timeout_s`."""
    api = _Api(base_url, token, timeout_s=2)
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        while True:
            try:
                await api.call("GET", "/healthz")
                return
            except ServiceUnreachable:
                if asyncio.get_running_loop().time() > deadline:
                    raise
            await asyncio.sleep(0.05)
    finally:
        await api.close()
