"""`/api/runs`: the agent's recorded runs, for the web page and for replay.

The agent's room (`cubicle.server.board.room.AgentRoom`) mounts `router`; every route
needs the service's
token. Runs are read from `<data_dir>/runs`, where `cubicle run` and the task board write
them.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse

from cubicle.agent.steps import RunDetail, RunRecord
from cubicle.agent.store import RunStore
from cubicle.server.api.auth import require_token
from cubicle.server.services import services_of


async def get_run_store(request: Request) -> RunStore:
    """The runs of the service's data directory."""
    return RunStore(services_of(request).settings.data_dir)


RunStoreDep = Annotated[RunStore, Depends(get_run_store)]

router = APIRouter(prefix="/api/runs", tags=["runs"], dependencies=[Depends(require_token)])


@router.get("")
async def list_runs(store: RunStoreDep) -> list[RunRecord]:
    """Every recorded run, newest first."""
    return await store.list_runs()


@router.get("/{run_id}")
async def get_run(run_id: str, store: RunStoreDep) -> RunDetail:
    """A run and every step: screenshot file, prompt and answer, action, grounded points,
    timings and errors."""
    return await store.get_run(run_id)


@router.get("/{run_id}/steps/{index}.png", response_class=FileResponse)
async def step_screenshot(run_id: str, index: int, store: RunStoreDep) -> FileResponse:
    """The screenshot step `index` (1 for the first) saw, its grounded points drawn on it."""
    path = store.step_image(run_id, index)
    return FileResponse(path, media_type="image/png", headers={"Cache-Control": "no-cache"})
