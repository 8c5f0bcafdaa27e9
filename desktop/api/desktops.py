"""`/api/desktops`: create, list and kill desktops, and everything one can do on them.

Each per-desktop call is checked here (the body's types and sizes) and forwarded to the
desktop's guest daemon, whose answer, or error, comes back unchanged.
"""

from __future__ import annotations

import contextlib
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.background import BackgroundTask

from desktop import actions as a
from desktop.api.auth import admin_access
from desktop.api.deps import GuestDep, ManagerDep, SettingsDep
from desktop.errors import PayloadTooLarge
from desktop.models import (
    A11yTree,
    ClipboardText,
    CreateDesktop,
    CursorPosition,
    DesktopInfo,
    ExecRequest,
    ExecResult,
    FileEntry,
    Launched,
    LaunchRequest,
    OpenRequest,
    SetTimeout,
    WindowInfo,
    WindowOp,
)

router = APIRouter(prefix="/api/desktops", tags=["desktops"])

_PASSED_HEADERS = (
    "content-type",
    "x-screen-width",
    "x-screen-height",
    "x-image-width",
    "x-image-height",
    "x-scale",
    "x-screenshot-cache",
)


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


def _standalone(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema with its `$defs` written out in place, to stand alone inside OpenAPI.

    (The app's components cannot hold them under their own names: the agent's action
    models have the same names, so FastAPI renames both.) Discriminator mappings point
    into `$defs`, so they go; the `type` property still tells the actions apart.
    """
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items() if k != "mapping"}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    return inline(schema)


@router.post(
    "/{desktop_id}/actions",
    response_model=a.ActionsResponse,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _standalone(a.action_batch_adapter.json_schema())}
            },
        }
    },
)
async def run_actions(desktop_id: str, request: Request) -> Response:
    """Run one action or a list, in order; nothing runs if any action is invalid."""
    # The click path: the app answers it in a FastLane, ahead of FastAPI's machinery,
    # so this checks the token, parses the body and finds the guest itself.
    admin_access(request)
    body = await request.body()
    try:
        batch = a.action_batch_adapter.validate_json(body)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    guest = request.app.state.manager.guest(desktop_id)
    started = time.monotonic()
    # The guest gets the bytes as they came (it checks them once more against its screen).
    answer = await guest.post_json("/actions", body)
    actions = batch if isinstance(batch, list) else [batch]
    request.app.state.live.log_actions(desktop_id, actions, started, "api")
    return Response(answer, media_type="application/json")


@router.get("/{desktop_id}/screenshot", response_class=Response)
async def screenshot(
    guest: GuestDep,
    format: Literal["png", "jpeg", "jpg", "webp"] = "png",
    quality: Annotated[int, Query(ge=1, le=100)] = 80,
    max_width: Annotated[int | None, Query(ge=16, le=16384)] = None,
    max_height: Annotated[int | None, Query(ge=16, le=16384)] = None,
    cursor: bool = False,
) -> Response:
    """The screen as an image; `X-Scale` is screen pixels per image pixel."""
    params = {"format": format, "quality": quality, "cursor": cursor}
    params |= {k: v for k, v in (("max_width", max_width), ("max_height", max_height)) if v}
    response = await guest.request("GET", "/screenshot", params=params)
    headers = {k: v for k, v in response.headers.items() if k in _PASSED_HEADERS}
    headers["cache-control"] = "no-store"
    return Response(response.content, headers=headers)


@router.get("/{desktop_id}/cursor")
async def cursor(guest: GuestDep) -> CursorPosition:
    return CursorPosition.model_validate_json((await guest.request("GET", "/cursor")).content)


@router.get("/{desktop_id}/windows")
async def windows(guest: GuestDep, include_shell: bool = False) -> list[WindowInfo]:
    response = await guest.request("GET", "/windows", params={"include_shell": include_shell})
    return [WindowInfo.model_validate(item) for item in response.json()]


@router.post("/{desktop_id}/windows/{window_id}/{op}", status_code=204)
async def window_op(guest: GuestDep, window_id: int, op: WindowOp) -> Response:
    await guest.request("POST", f"/windows/{window_id}/{op}")
    return Response(status_code=204)


@router.get("/{desktop_id}/a11y")
async def accessibility(
    guest: GuestDep,
    app: str | None = None,
    max_depth: Annotated[int, Query(ge=1, le=100)] = 30,
) -> A11yTree:
    """The accessibility (AT-SPI) tree: roles, names, states, boxes in screen pixels."""
    params = {"max_depth": max_depth} | ({"app": app} if app else {})
    response = await guest.request("GET", "/a11y", params=params)
    return A11yTree.model_validate_json(response.content)


@router.post("/{desktop_id}/exec", response_model=ExecResult)
async def exec_command(guest: GuestDep, body: ExecRequest) -> Response:
    """Run a command inside the desktop; `stream: true` answers NDJSON as output comes."""
    payload = body.model_dump(mode="json")
    if not body.stream:
        response = await guest.request("POST", "/exec", json=payload)
        return Response(response.content, media_type="application/json")
    # The guest's response stays open until the last line has been passed on.
    held = contextlib.AsyncExitStack()
    response = await held.enter_async_context(
        guest.stream("POST", "/exec", json=payload, timeout=body.timeout_s + 30)
    )
    return StreamingResponse(
        response.aiter_raw(),
        media_type="application/x-ndjson",
        background=BackgroundTask(held.aclose),
    )


@router.get("/{desktop_id}/files", response_model=list[FileEntry])
async def read_file(guest: GuestDep, path: str) -> Response:
    """A file's bytes, or a directory's listing as JSON."""
    response = await guest.request("GET", "/files", params={"path": path})
    return Response(response.content, media_type=response.headers["content-type"])


@router.put("/{desktop_id}/files")
async def write_file(
    guest: GuestDep, settings: SettingsDep, path: str, request: Request
) -> FileEntry:
    """Write the request body to a file (parents are created)."""
    limit = settings.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"upload of {declared} bytes is over the {limit}-byte limit (CUBICLE_MAX_UPLOAD_MB)"
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise PayloadTooLarge(f"upload is over the {limit}-byte limit (CUBICLE_MAX_UPLOAD_MB)")
    response = await guest.request("PUT", "/files", params={"path": path}, content=bytes(body))
    return FileEntry.model_validate_json(response.content)


@router.delete("/{desktop_id}/files", status_code=204)
async def delete_file(guest: GuestDep, path: str) -> Response:
    await guest.request("DELETE", "/files", params={"path": path})
    return Response(status_code=204)


@router.get("/{desktop_id}/clipboard")
async def get_clipboard(guest: GuestDep) -> ClipboardText:
    return ClipboardText.model_validate_json((await guest.request("GET", "/clipboard")).content)


@router.put("/{desktop_id}/clipboard", status_code=204)
async def set_clipboard(guest: GuestDep, body: ClipboardText) -> Response:
    await guest.request("PUT", "/clipboard", json=body.model_dump())
    return Response(status_code=204)


@router.post("/{desktop_id}/open")
async def open_target(guest: GuestDep, body: OpenRequest) -> Launched:
    """Open a file or URL with its default application."""
    response = await guest.request("POST", "/open", json=body.model_dump())
    return Launched.model_validate_json(response.content)


@router.post("/{desktop_id}/launch")
async def launch(guest: GuestDep, body: LaunchRequest) -> Launched:
    """Start an application by name (`mousepad`, `terminal`, `files`, `browser`, …)."""
    response = await guest.request("POST", "/launch", json=body.model_dump())
    return Launched.model_validate_json(response.content)
