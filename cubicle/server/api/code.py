"""`/api/desktops/{id}/code` and `/contexts`: code contexts, passed through to the guest.

A run's NDJSON events go on to the caller as the guest sends them: nothing is collected,
so a flood of output costs the service one chunk at a time.
"""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from cubicle.protocol.code import ContextInfo, CreateContext, RunCode, language_of
from cubicle.protocol.errors import InvalidRequest
from cubicle.protocol.routes import GuestPath, context_path
from cubicle.server.api.deps import GuestDep

router = APIRouter(prefix="/api/desktops", tags=["code"])

_START_ALLOWANCE_S = 90.0
"""Seconds a run may take beyond its timeout: a kernel's start and an interrupt's grace."""


def check_language(language: str | None) -> None:
    if language is not None:
        language_of(language)


def _json(content: bytes, status_code: int = 200) -> Response:
    return Response(content, status_code, media_type="application/json")


@router.post("/{desktop_id}/code", response_class=StreamingResponse)
async def run_code(guest: GuestDep, body: RunCode) -> Response:
    """Run code in a context; answers NDJSON events (stdout, stderr, result, error,
    number_of_executions, end_of_execution) as the kernel sends them."""
    check_language(body.language)
    held = contextlib.AsyncExitStack()
    events = await held.enter_async_context(
        guest.stream(
            "POST", GuestPath.CODE, json=body, read_timeout_s=body.timeout_s + _START_ALLOWANCE_S
        )
    )
    return StreamingResponse(
        events.chunks(),
        media_type="application/x-ndjson",
        background=BackgroundTask(held.aclose),
    )


@router.post("/{desktop_id}/contexts", status_code=201)
async def create_context(guest: GuestDep, body: CreateContext) -> ContextInfo:
    check_language(body.language)
    timeout_s = _START_ALLOWANCE_S
    answer = await guest.request("POST", GuestPath.CONTEXTS, json=body, timeout_s=timeout_s)
    return _json(answer.content, 201)


@router.get("/{desktop_id}/contexts")
async def list_contexts(guest: GuestDep) -> list[ContextInfo]:
    return _json((await guest.request("GET", GuestPath.CONTEXTS)).content)


@router.post("/{desktop_id}/contexts/{context_id}/restart")
async def restart_context(guest: GuestDep, context_id: str) -> ContextInfo:
    path = context_path(GuestPath.CONTEXT_RESTART, context_segment(context_id))
    return _json((await guest.request("POST", path, timeout_s=_START_ALLOWANCE_S)).content)


@router.post("/{desktop_id}/contexts/{context_id}/interrupt", status_code=204)
async def interrupt_context(guest: GuestDep, context_id: str) -> Response:
    """Interrupt what runs in a context (an endless loop); the context keeps its state."""
    await guest.request(
        "POST", context_path(GuestPath.CONTEXT_INTERRUPT, context_segment(context_id))
    )
    return Response(status_code=204)


@router.delete("/{desktop_id}/contexts/{context_id}", status_code=204)
async def delete_context(guest: GuestDep, context_id: str) -> Response:
    await guest.request("DELETE", context_path(GuestPath.CONTEXT, context_segment(context_id)))
    return Response(status_code=204)


def context_segment(context_id: str) -> str:
    if not context_id or not all(c.isalnum() or c in "-_." for c in context_id):
        raise InvalidRequest(f"context id {context_id!r} is not a context id")
    return context_id
