"""`/api/tasks` and `/api/board`: the task board over HTTP, with live updates as SSE.

The agent's room (`cubicle.server.board.room.AgentRoom`) mounts `router` and
runs the board's workers
with the service; every route needs the service's token.
"""

from __future__ import annotations

from typing import Annotated, Any, get_args

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import TypeAdapter, ValidationError

from cubicle.protocol.board import (
    SQLITE_MAX,
    BoardSettings,
    HandDone,
    NewTask,
    NewTasks,
    Profile,
    ProfileName,
    ProfileView,
    Task,
    TaskEdit,
    TaskMove,
    TaskPage,
    TaskStatus,
    TaskStep,
)
from cubicle.protocol.errors import InvalidRequest
from cubicle.server.api.auth import require_token
from cubicle.server.board.board import Board
from cubicle.server.services import services_of

BATCH_BYTES = 32 * 1024 * 1024
"""Largest body of `POST /api/tasks/batch`."""
"""Largest body `POST /api/tasks/batch` reads."""
_STATUSES = get_args(TaskStatus)
_PROFILE_NAME = TypeAdapter(ProfileName)


async def get_board(request: Request) -> Board:
    return services_of(request).get(Board)


BoardDep = Annotated[Board, Depends(get_board)]

router = APIRouter(tags=["tasks"], dependencies=[Depends(require_token)])

TaskIdPath = Annotated[int, Path(ge=1, le=SQLITE_MAX)]
"""A task id in a URL: beyond SQLite's INTEGER it is a 422, not a 500."""


def _statuses(status: str | None) -> list[TaskStatus]:
    if not status:
        return []
    found = [s.strip() for s in status.split(",") if s.strip()]
    unknown = [s for s in found if s not in _STATUSES]
    if unknown:
        raise InvalidRequest(f"unknown status {unknown[0]!r}: use {', '.join(_STATUSES)}")
    return found  # type: ignore[return-value]


@router.get("/api/tasks")
async def list_tasks(
    board: BoardDep,
    status: Annotated[str | None, Query(description="e.g. failed,cancelled")] = None,
    offset: Annotated[int, Query(ge=0, le=SQLITE_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> TaskPage:
    """A page of tasks: queued ones in queue order, running ones oldest first, finished
    ones newest first."""
    return await board.list(_statuses(status), offset, limit)


@router.post("/api/tasks", status_code=201)
async def add_task(task: NewTask, board: BoardDep) -> Task:
    """Queue a task at the end of the queue."""
    return (await board.add([task]))[0]


_BATCH_SCHEMA = NewTasks.model_json_schema(ref_template="#/components/schemas/{model}")
_BATCH_SCHEMA.pop("$defs", None)  # NewTask is a component of its own (POST /api/tasks)
_BATCH_BODY = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": _BATCH_SCHEMA}}}
}
"""The body the batch route reads by itself (so its size is checked before parsing)."""


@router.post("/api/tasks/batch", status_code=201, openapi_extra=_BATCH_BODY)
async def add_tasks(request: Request, board: BoardDep) -> dict[str, Any]:
    """Queue up to 10,000 tasks at once, in order: `{"tasks": [{"text": …}, …]}`.
    Answers how many were added (and the tasks themselves when there are at most 100)."""
    try:  # the body's size is capped before it is read (`AgentRoom.body_limits`)
        batch = NewTasks.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None
    added = await board.add(batch.tasks)
    return {"added": len(batch.tasks), "tasks": added}


@router.delete("/api/tasks")
async def delete_tasks(
    board: BoardDep,
    status: Annotated[str, Query(min_length=1, description="e.g. queued, or done,failed")],
) -> dict[str, int]:
    """Delete every task with these statuses (e.g. `?status=queued` clears the queue);
    running and paused tasks are never deleted: cancel them first."""
    statuses = _statuses(status)
    if not statuses:
        raise InvalidRequest("say which tasks to delete: ?status=queued (or done,failed…)")
    return {"deleted": await board.delete_where(statuses)}


@router.get("/api/tasks/counts")
async def task_counts(board: BoardDep) -> dict[str, int]:
    """How many tasks have each status."""
    return {status: 0 for status in _STATUSES} | await board.counts()


@router.get("/api/tasks/events", response_class=StreamingResponse)
async def task_events(board: BoardDep) -> StreamingResponse:
    """Server-sent events: `task` (a task as it now is), `step` (a step of a run),
    `deleted`, `moved`, `bulk` (many tasks added: reload), `settings`."""
    return StreamingResponse(
        board.feed.listen(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/api/tasks/{task_id}")
async def get_task(task_id: TaskIdPath, board: BoardDep) -> Task:
    return await board.get(task_id)


@router.patch("/api/tasks/{task_id}")
async def edit_task(task_id: TaskIdPath, edit: TaskEdit, board: BoardDep) -> Task:
    """Change a queued task's text, profile, start or caps."""
    return await board.edit(task_id, edit)


@router.delete("/api/tasks/{task_id}", status_code=204)
async def delete_task(task_id: TaskIdPath, board: BoardDep) -> Response:
    """Delete a queued or finished task (cancel a running one first)."""
    await board.delete(task_id)
    return Response(status_code=204)


@router.get("/api/tasks/{task_id}/steps")
async def task_steps(task_id: TaskIdPath, board: BoardDep) -> list[TaskStep]:
    """The steps of the task's current (or last) run, in order."""
    return await board.steps(task_id)


@router.post("/api/tasks/{task_id}/move")
async def move_task(task_id: TaskIdPath, where: TaskMove, board: BoardDep) -> Task:
    """Reorder the queue: `{"before": id}`, `{"after": id}` or `{"to": "top"|"bottom"}`."""
    return await board.move(task_id, where)


@router.post("/api/tasks/{task_id}/cancel")
async def cancel_task(task_id: TaskIdPath, board: BoardDep) -> Task:
    """Take a queued task off the queue, or stop a running one and release its desktop."""
    return await board.cancel(task_id)


@router.post("/api/tasks/{task_id}/retry")
async def retry_task(task_id: TaskIdPath, board: BoardDep) -> Task:
    """Queue a failed, cancelled or interrupted task again (a fresh run on a fresh desktop)."""
    return await board.retry(task_id)


@router.post("/api/tasks/{task_id}/pause")
async def pause_task(task_id: TaskIdPath, board: BoardDep) -> Task:
    """Stop the agent acting so a person can use the desktop; returns once it is idle."""
    return await board.pause(task_id)


@router.post("/api/tasks/{task_id}/resume")
async def resume_task(task_id: TaskIdPath, board: BoardDep) -> Task:
    """Let the agent go on; it looks at the screen afresh."""
    return await board.resume(task_id)


@router.post("/api/tasks/{task_id}/done")
async def mark_task_done(
    task_id: TaskIdPath, board: BoardDep, body: HandDone | None = None
) -> Task:
    """End a running or paused task as done by hand, with an optional message."""
    return await board.mark_done(task_id, body.message if body else "")


@router.get("/api/board/settings")
async def get_settings(board: BoardDep) -> BoardSettings:
    return await board.settings()


@router.put("/api/board/settings")
async def put_settings(settings: BoardSettings, board: BoardDep) -> BoardSettings:
    """Tasks run at once, default caps, whether runs are recorded, how long a finished
    task's desktop stays up."""
    return await board.put_settings(settings)


@router.get("/api/board/profiles")
async def list_profiles(board: BoardDep) -> list[ProfileView]:
    """Model profiles tasks can name (keys are never sent back)."""
    return await board.profile_views()


@router.put("/api/board/profiles/{name}")
async def put_profile(name: str, profile: Profile, board: BoardDep) -> ProfileView:
    """Add or replace a profile; `default` overrides the service's environment."""
    return await board.put_profile(_profile_name(name), profile)


@router.delete("/api/board/profiles/{name}", status_code=204)
async def delete_profile(name: str, board: BoardDep) -> Response:
    await board.delete_profile(name)
    return Response(status_code=204)


def _profile_name(name: str) -> str:
    try:
        return _PROFILE_NAME.validate_python(name)
    except ValidationError:
        raise InvalidRequest(
            f"{name!r} is not a profile name: letters, digits, '_', '.', '-', up to 64"
        ) from None
