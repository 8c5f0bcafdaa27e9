"""E2B's code-interpreter surface (its port 49999) over a desktop's code contexts.

`POST /execute`, `/contexts` (create, list, restart, delete) and `/health`, in the shapes
the unmodified `e2b-code-interpreter` SDK sends and parses. The events are the guest's own
(`cubicle.protocol.code` already speaks E2B's), passed through as they come. Mounted under
`/api/desktops/{id}/e2b-code-interpreter` with the service's token; a proxy that routes
E2B's `E2b-Sandbox-Port: 49999` requests forwards them here.
"""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.background import BackgroundTask

from cubicle.protocol.code import CreateContext, RunCode
from cubicle.protocol.errors import InvalidRequest, describe_validation
from cubicle.protocol.routes import GuestPath, context_path
from cubicle.server.api.code import check_language, context_segment
from cubicle.server.api.deps import GuestDep

router = APIRouter(prefix="/api/desktops/{desktop_id}/e2b-code-interpreter", tags=["code"])

_RUN_LIMIT_S = 3600.0
"""E2B's request carries no timeout (its client's read timeout bounds the run, and a
client that goes away interrupts it): the guest's longest."""


class E2bExecute(BaseModel):
    """E2B's `POST /execute` body; its SDK sends every field, null when unset."""

    code: str
    context_id: str | None = None
    language: str | None = None
    env_vars: dict[str, str] | None = None


class E2bCreateContext(BaseModel):
    language: str | None = None
    cwd: str | None = None


@router.get("/health")
async def health(desktop_id: str, guest: GuestDep) -> Response:
    await guest.request("GET", GuestPath.HEALTH)
    return Response('"ok"', media_type="application/json")


@router.post("/execute", response_class=StreamingResponse)
async def execute(guest: GuestDep, body: E2bExecute) -> Response:
    if body.context_id and body.language:
        raise InvalidRequest("context_id and language are exclusive: give one")
    check_language(body.language)
    try:
        run = RunCode(
            code=body.code,
            context_id=body.context_id,
            language=None if body.context_id else body.language or "python",
            env_vars=body.env_vars or {},
            timeout_s=_RUN_LIMIT_S,
        )
    except ValidationError as exc:
        raise InvalidRequest(describe_validation(exc.errors())) from None
    held = contextlib.AsyncExitStack()
    events = await held.enter_async_context(
        guest.stream("POST", GuestPath.CODE, json=run, read_timeout_s=None)
    )
    return StreamingResponse(
        events.chunks(),
        media_type="application/x-ndjson",
        background=BackgroundTask(held.aclose),
    )


@router.post("/contexts")
async def create_context(guest: GuestDep, body: E2bCreateContext) -> Response:
    check_language(body.language)
    try:
        create = CreateContext(language=body.language or "python", cwd=body.cwd)
    except ValidationError as exc:
        raise InvalidRequest(describe_validation(exc.errors())) from None
    answer = await guest.request("POST", GuestPath.CONTEXTS, json=create, timeout_s=90)
    return Response(answer.content, media_type="application/json")


@router.get("/contexts")
async def list_contexts(guest: GuestDep) -> Response:
    answer = await guest.request("GET", GuestPath.CONTEXTS)
    return Response(answer.content, media_type="application/json")


@router.post("/contexts/{context_id}/restart")
async def restart_context(guest: GuestDep, context_id: str) -> Response:
    path = context_path(GuestPath.CONTEXT_RESTART, context_segment(context_id))
    answer = await guest.request("POST", path, timeout_s=90)
    return Response(answer.content, media_type="application/json")


@router.delete("/contexts/{context_id}", status_code=204)
async def delete_context(guest: GuestDep, context_id: str) -> Response:
    await guest.request("DELETE", context_path(GuestPath.CONTEXT, context_segment(context_id)))
    return Response(status_code=204)
