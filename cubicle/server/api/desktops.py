"""`/api/desktops`: create, list and kill desktops, and everything one can do on them.

Each per-desktop call is checked here against the protocol's models and forwarded to the
desktop's guest daemon, whose answer, or error, comes back unchanged. Actions go through
the manager's one door (`SandboxManager.run_actions`), like the viewers' and the agent's.
"""

from __future__ import annotations

import contextlib
import shutil
from datetime import datetime
from os import PathLike
from pathlib import PurePosixPath
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Body, Path, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import TypeAdapter
from starlette.background import BackgroundTask

from cubicle.protocol import actions as a
from cubicle.protocol.errors import DiskFull
from cubicle.protocol.lanes import LaneName
from cubicle.protocol.models import (
    SCREENSHOT_HEADERS,
    A11yQuery,
    A11yTree,
    ClipboardText,
    CursorPosition,
    ExecRequest,
    ExecResult,
    FileEntry,
    FilesQuery,
    Launched,
    LaunchRequest,
    OpenRequest,
    ScreenshotQuery,
    WindowInfo,
    WindowOp,
    WindowsQuery,
)
from cubicle.protocol.routes import GuestPath, window_op_path
from cubicle.protocol.service import (
    CreateDesktop,
    DesktopEgress,
    DesktopInfo,
    DesktopMetrics,
    DesktopNetwork,
    ForkDesktop,
    Forked,
    PauseDesktop,
    SetTimeout,
    SnapshotInfo,
    TakeSnapshot,
)
from cubicle.server.api.deps import GuestDep, ManagerDep, SettingsDep
from cubicle.server.guest_client import GuestAnswer

router = APIRouter(prefix="/api/desktops", tags=["desktops"])

_PASSED_HEADERS = frozenset(SCREENSHOT_HEADERS.values())
"""The screenshot's own headers the service passes on (the guest's `Content-Type` is not
one of them: the service states the type from the format asked for)."""
_IMAGE_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


def _json(answer: GuestAnswer, status_code: int = 200) -> Response:
    """A guest's JSON answer, passed on as it came (it was checked against its model)."""
    return Response(answer.content, status_code, media_type="application/json")


@router.post("", status_code=201)
async def create_desktop(
    manager: ManagerDep, body: Annotated[CreateDesktop | None, Body()] = None
) -> DesktopInfo:
    """Start a desktop; answers once XFCE is drawn and the guest answers."""
    return await manager.create(body or CreateDesktop())


@router.get("")
async def list_desktops(manager: ManagerDep) -> list[DesktopInfo]:
    return manager.list()


@router.get("/{desktop_id}")
async def get_desktop(desktop_id: str, manager: ManagerDep) -> DesktopInfo:
    return manager.get(desktop_id)


@router.delete("/{desktop_id}", status_code=204)
async def kill_desktop(desktop_id: str, manager: ManagerDep) -> Response:
    await manager.kill(desktop_id)
    return Response(status_code=204)


@router.post("/{desktop_id}/timeout")
async def set_timeout(desktop_id: str, body: SetTimeout, manager: ManagerDep) -> DesktopInfo:
    """Set the idle timeout, counted from now."""
    return manager.extend(desktop_id, body.timeout_s)


@router.put("/{desktop_id}/network")
async def set_egress(desktop_id: str, body: DesktopEgress, manager: ManagerDep) -> DesktopInfo:
    """The desktop's own egress rules, from its next connection on: `allow` (when not
    empty, the only destinations) and `deny`, CIDRs and host names (judged by TLS SNI and
    HTTP Host on ports 80 and 443), within the operator's policy, which they narrow and
    never widen. `{}` clears them."""
    return manager.set_egress(desktop_id, body)


@router.get("/{desktop_id}/network")
async def get_network(desktop_id: str, manager: ManagerDep) -> DesktopNetwork:
    """The desktop's egress rules, the secrets it uses, and what its egress proxy refused
    lately (newest last)."""
    return manager.network(desktop_id)


@router.post("/{desktop_id}/snapshot", status_code=201)
async def take_snapshot(desktop_id: str, body: TakeSnapshot, manager: ManagerDep) -> SnapshotInfo:
    """Save the desktop as it is (local: its disk; microvm: disk and memory);
    `POST /api/desktops {"snapshot": name}` starts copies, `GET /api/snapshots` lists them."""
    return await manager.snapshot(desktop_id, body.name)


@router.post("/{desktop_id}/fork", status_code=201)
async def fork_desktop(
    desktop_id: str, manager: ManagerDep, body: Annotated[ForkDesktop | None, Body()] = None
) -> Forked:
    """`count` new desktops starting from this one as it is now (its disk; in microvm its
    memory too); it goes on running. Children that could not be made are in `errors`."""
    return await manager.fork(desktop_id, (body or ForkDesktop()).count)


@router.get("/{desktop_id}/metrics")
async def metrics(
    desktop_id: str,
    manager: ManagerDep,
    start: datetime | None = None,
    end: datetime | None = None,
) -> DesktopMetrics:
    """Its CPU, memory, disk and network readings, every `CUBICLE_METRICS_INTERVAL_S`
    (5 s), from `start` to `end` (ISO 8601; the whole life kept when absent)."""
    return manager.metrics_of(desktop_id, start, end)


@router.post("/{desktop_id}/pause")
async def pause_desktop(
    desktop_id: str, manager: ManagerDep, body: Annotated[PauseDesktop | None, Body()] = None
) -> DesktopInfo:
    """Freeze the desktop where it stands (processes, windows, memory) until resumed: it
    uses no CPU, its calls answer 409 `desktop_paused`, its idle timeout stops. 409 if
    it is paused already."""
    return await manager.pause(desktop_id, keep_memory=(body or PauseDesktop()).keep_memory)


@router.post("/{desktop_id}/resume")
async def resume_desktop(desktop_id: str, manager: ManagerDep) -> DesktopInfo:
    """Let a paused desktop run on from where it stopped (a running one: unchanged)."""
    return await manager.resume(desktop_id)


@router.post("/{desktop_id}/actions", response_model=a.ActionsResponse)
async def run_actions(
    desktop_id: str, batch: Annotated[a.ActionBatch, Body()], manager: ManagerDep
) -> Response:
    """Run one action or a list, in order; nothing runs if any action is invalid."""
    actions = batch if isinstance(batch, list) else [batch]
    result = await manager.run_actions(desktop_id, actions, source="api")
    return Response(result.model_dump_json(), media_type="application/json")


@router.get("/{desktop_id}/screenshot", response_class=Response)
async def screenshot(
    desktop_id: str,
    guest: GuestDep,
    manager: ManagerDep,
    params: Annotated[ScreenshotQuery, Query()],
) -> Response:
    """The screen as an image; `X-Scale` is screen pixels per image pixel. A few are made
    at once per desktop; past a short line, 429 with `Retry-After`."""
    async with manager.lane(desktop_id, LaneName.SCREENSHOT).slot():
        answer = await guest.request(
            "GET", GuestPath.SCREENSHOT, params=params.model_dump(exclude_none=True, mode="json")
        )
    headers = {k: v for k, v in answer.headers.items() if k in _PASSED_HEADERS}
    headers["cache-control"] = "no-store"
    return Response(answer.content, headers=headers, media_type=_IMAGE_TYPES[params.image_format])


@router.get("/{desktop_id}/cursor", response_model=CursorPosition)
async def cursor(guest: GuestDep) -> Response:
    """Where the pointer is (the guest's answer, checked, passed on as it came)."""
    answer = await guest.request("GET", GuestPath.CURSOR)
    answer.model(CursorPosition)
    return _json(answer)


_WINDOWS = TypeAdapter(list[WindowInfo])
_ENTRIES = TypeAdapter(list[FileEntry])


@router.get("/{desktop_id}/windows")
async def windows(guest: GuestDep, params: Annotated[WindowsQuery, Query()]) -> list[WindowInfo]:
    answer = await guest.request("GET", GuestPath.WINDOWS, params=params.model_dump(mode="json"))
    return _WINDOWS.validate_json(answer.content)


@router.post("/{desktop_id}/windows/{window_id}/{op}", status_code=204)
async def window_op(
    guest: GuestDep, window_id: Annotated[int, Path(ge=0, le=2**32 - 1)], op: WindowOp
) -> Response:
    await guest.request("POST", window_op_path(window_id, op))
    return Response(status_code=204)


@router.get("/{desktop_id}/a11y")
async def accessibility(
    desktop_id: str, guest: GuestDep, manager: ManagerDep, params: Annotated[A11yQuery, Query()]
) -> A11yTree:
    """The accessibility (AT-SPI) tree: roles, names, states, boxes in screen pixels."""
    async with manager.lane(desktop_id, LaneName.A11Y).slot():
        answer = await guest.request(
            "GET", GuestPath.A11Y, params=params.model_dump(exclude_none=True)
        )
    return answer.model(A11yTree)


@router.post("/{desktop_id}/exec", response_model=ExecResult)
async def exec_command(guest: GuestDep, body: ExecRequest) -> Response:
    """Run a command inside the desktop; `stream: true` answers NDJSON as output comes."""
    if not body.stream:
        answer = await guest.request(
            "POST", GuestPath.EXEC, json=body, timeout_s=body.timeout_s + 30
        )
        return _json(answer)
    # The guest's answer stays open until the last line has been passed on.
    held = contextlib.AsyncExitStack()
    output = await held.enter_async_context(
        guest.stream("POST", GuestPath.EXEC, json=body, read_timeout_s=body.timeout_s + 30)
    )
    return StreamingResponse(
        output.chunks(),
        media_type="application/x-ndjson",
        background=BackgroundTask(held.aclose),
    )


@router.get("/{desktop_id}/files", response_model=list[FileEntry])
async def read_file(
    desktop_id: str, guest: GuestDep, manager: ManagerDep, params: Annotated[FilesQuery, Query()]
) -> Response:
    """A file's bytes, or a directory's listing as JSON."""
    async with manager.lane(desktop_id, LaneName.FILES).slot():
        answer = await guest.request("GET", GuestPath.FILES, params=params.model_dump())
    if answer.headers.get("content-type") == "application/json":  # a directory's listing
        listing = _ENTRIES.validate_json(answer.content)  # checked, never passed on blind
        return Response(_ENTRIES.dump_json(listing), media_type="application/json")
    # Bytes the desktop chose: a download, never a page of the service's origin.
    name = quote(PurePosixPath(params.path).name or "file")
    headers = {
        "content-disposition": f"attachment; filename*=UTF-8''{name}",
        "x-content-type-options": "nosniff",
        "cache-control": "no-store",
    }
    return Response(answer.content, media_type="application/octet-stream", headers=headers)


UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}
"""The upload's body as the route reads it: raw bytes (up to CUBICLE_MAX_UPLOAD_MB)."""


_HOST_MARGIN = 16 << 20


def _check_host_room(data_dir: PathLike, size: int) -> None:
    """A desktop's disk is a sparse file that grows into the host's disk as it fills: a
    write inside that finds the host's disk full is lost at writeback, however much of
    `disk_mb` is left. An upload that would leave the host's disk (nearly) full is
    refused whole instead."""
    free = shutil.disk_usage(data_dir).free
    if free < size + _HOST_MARGIN:
        raise DiskFull(
            f"the host's disk under the service's data directory has {free >> 20} MiB free: "
            f"{size} bytes would not fit safely in the desktop's disk (disk_mb is a cap, "
            "not a reservation); free space on the host"
        )


@router.put("/{desktop_id}/files", openapi_extra=UPLOAD_BODY)
async def write_file(
    desktop_id: str,
    guest: GuestDep,
    manager: ManagerDep,
    settings: SettingsDep,
    params: Annotated[FilesQuery, Query()],
    request: Request,
) -> FileEntry:
    """Write the request body to a file (parents are created)."""
    # `Guard` caps the body at CUBICLE_MAX_UPLOAD_MB, chunked or not (413).
    data = await request.body()
    if manager.runtime(manager.get(desktop_id).runtime).disks_on_this_host:
        _check_host_room(settings.data_dir, len(data))
    async with manager.lane(desktop_id, LaneName.FILES).slot():
        answer = await guest.request(
            "PUT", GuestPath.FILES, params=params.model_dump(), content=data
        )
    return answer.model(FileEntry)


@router.delete("/{desktop_id}/files", status_code=204)
async def delete_file(guest: GuestDep, params: Annotated[FilesQuery, Query()]) -> Response:
    await guest.request("DELETE", GuestPath.FILES, params=params.model_dump())
    return Response(status_code=204)


@router.get("/{desktop_id}/clipboard")
async def get_clipboard(guest: GuestDep) -> ClipboardText:
    return (await guest.request("GET", GuestPath.CLIPBOARD)).model(ClipboardText)


@router.put("/{desktop_id}/clipboard", status_code=204)
async def set_clipboard(guest: GuestDep, body: ClipboardText) -> Response:
    await guest.request("PUT", GuestPath.CLIPBOARD, json=body)
    return Response(status_code=204)


@router.post("/{desktop_id}/open")
async def open_target(guest: GuestDep, body: OpenRequest) -> Launched:
    """Open a file or URL with its default application."""
    return (await guest.request("POST", GuestPath.OPEN, json=body)).model(Launched)


@router.post("/{desktop_id}/launch")
async def launch(guest: GuestDep, body: LaunchRequest) -> Launched:
    """Start an application by name (`mousepad`, `terminal`, `files`, `browser`, …)."""
    return (await guest.request("POST", GuestPath.LAUNCH, json=body)).model(Launched)
