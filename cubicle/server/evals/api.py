"""`/api/evals`: evaluation runs over HTTP, for `cubicle eval` and the report page.

The evaluations' room (`cubicle.server.evals.room.EvalRoom`) mounts `router`; every route needs the
service's token. Suites offered by name are the built-in one (`evals/` beside the code)
and every folder under `<data_dir>/suites/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from cubicle import CubicleError, PayloadTooLarge
from cubicle.evals.suite import load_suite
from cubicle.protocol.evals import MAX_FILES_BYTES, Comparison, EvalReport, EvalRun, NewEvalRun
from cubicle.server.api.auth import require_token
from cubicle.server.evals.runs import EvalRuns
from cubicle.server.services import services_of

BUILT_IN = Path(__file__).resolve().parents[3] / "evals"
"""The built-in suite, beside the code."""
_BODY_BYTES = MAX_FILES_BYTES * 4 // 3 + 16 * 1024 * 1024
"""Largest `POST /api/evals` body read: the task files base64-encoded, and the tasks."""


def known_suites(data_dir: Path) -> dict[str, Path]:
    """Suites the service offers by name: `evals` (built in), then `<data_dir>/suites/*`."""
    suites = {"evals": BUILT_IN} if BUILT_IN.is_dir() else {}
    folder = Path(data_dir) / "suites"
    if folder.is_dir():
        suites |= {path.name: path for path in sorted(folder.iterdir()) if path.is_dir()}
    return suites


async def get_runs(request: Request) -> EvalRuns:
    return services_of(request).get(EvalRuns)


RunsDep = Annotated[EvalRuns, Depends(get_runs)]

router = APIRouter(prefix="/api/evals", tags=["evals"], dependencies=[Depends(require_token)])


class SuiteInfo(BaseModel):
    name: str
    tasks: int
    domains: list[str]
    problem: str | None = None
    """Why the suite cannot be read, when it cannot."""


@router.get("")
async def list_runs(runs: RunsDep) -> list[EvalRun]:
    """Every evaluation run, newest first."""
    return await runs.list()


@router.post("", status_code=201)
async def create_run(request: Request, runs: RunsDep) -> EvalRun:
    """Start a run: `{"suite": "evals"}` or `{"tasks": [...], "files": {...}}`, with
    `profile`, `attempts`, `concurrency`, `max_steps`, `max_wall_s`."""
    size = int(request.headers.get("content-length") or 0)
    if size > _BODY_BYTES:
        raise PayloadTooLarge(f"the request is {size} bytes; send at most {_BODY_BYTES}")
    try:
        body = NewEvalRun.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None
    return await runs.create(body)


@router.get("/suites")
async def list_suites(runs: RunsDep) -> list[SuiteInfo]:
    """Suites this service can run by name."""
    found = []
    for name, folder in runs.suites.items():
        try:
            suite = load_suite(folder)
        except CubicleError as exc:
            found.append(SuiteInfo(name=name, tasks=0, domains=[], problem=exc.message))
            continue
        domains = sorted({task.group for task in suite.tasks})
        found.append(SuiteInfo(name=name, tasks=len(suite.tasks), domains=domains))
    return found


@router.get("/compare")
async def compare_runs(
    runs: RunsDep,
    a: Annotated[str, Query(description="the baseline run")],
    b: Annotated[str, Query(description="the run compared with it")],
) -> Comparison:
    """Two runs side by side: rates, and the tasks that flipped."""
    return await runs.compare(a, b)


@router.get("/{run_id}")
async def get_report(run_id: str, runs: RunsDep) -> EvalReport:
    """The run's report: rate with its 95 % interval, pass@k, per domain, per task, every
    attempt (score, steps, time, tokens, agent run and recording)."""
    return await runs.report(run_id)


@router.post("/{run_id}/stop")
async def stop_run(run_id: str, runs: RunsDep) -> EvalRun:
    """Stop the run; attempts with a verdict keep it, the rest run again on resume."""
    return await runs.stop_run(run_id)


@router.post("/{run_id}/resume")
async def resume_run(run_id: str, runs: RunsDep) -> EvalRun:
    """Go on with a stopped run, without rerunning finished attempts."""
    return await runs.resume_run(run_id)
