"""An evaluation run's records: the request, the run, one item per task attempt, the report.

Frozen pydantic models: checked at the edge (`NewEvalRun`) and served as they are
(`EvalRun`, `EvalItem`, `EvalReport`, `Comparison`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from cubicle.protocol.board import MaxSteps, MaxWall, ProfileName

RunStatus = Literal["running", "stopped", "done"]
"""`running`: tasks are queued on the board as slots free up; `stopped`: by a person, the
finished attempts kept (resume it); `done`: every attempt has a verdict."""
ItemStatus = Literal["pending", "queued", "running", "passed", "failed", "error", "unsupported"]
"""An attempt: waiting, on the board, or its verdict: `passed`/`failed` (the checker's
score), `error` (its setup or checker broke, or the run broke: counted as not passed),
`unsupported` (Cubicle cannot run the task as written: left out of the rate)."""
FINAL: tuple[ItemStatus, ...] = ("passed", "failed", "error", "unsupported")
ACTIVE: tuple[ItemStatus, ...] = ("queued", "running")
MAX_ATTEMPTS = 20
MAX_FILES_BYTES = 64 * 1024 * 1024
"""Bytes of task files one request may carry."""

RunName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]


class NewEvalRun(BaseModel):
    """`POST /api/evals`: which tasks, with which model profile, how."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    suite: str | None = None
    """A suite the service has (`GET /api/evals/suites`), e.g. "evals"."""
    tasks: list[dict[str, Any]] | None = None
    """The tasks themselves, OSWorld's JSON (what `cubicle eval` sends)."""
    files: dict[str, str] = Field(default_factory=dict)
    """Files the inline tasks name by relative path (`upload_file`'s `local_path`…),
    base64-encoded, by that path."""
    task_ids: list[str] | None = None
    """Run only these tasks of the suite."""
    name: RunName | None = None
    """What reports call the run; default: the suite and the profile's model."""
    profile: ProfileName = "default"
    """The board's model profile the agent runs with."""
    attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)] = 1
    """Independent tries per task, each on a fresh desktop (pass@k up to this)."""
    concurrency: Annotated[int, Field(ge=1, le=64)] | None = None
    """Tasks of this run at once; None: the board's setting. The board's own setting caps
    it, so a higher value raises the board's."""
    max_steps: MaxSteps | None = None
    max_wall_s: MaxWall | None = None

    @model_validator(mode="after")
    def _one_source(self) -> NewEvalRun:
        if (self.suite is None) == (self.tasks is None):
            raise ValueError('give either "suite" (a suite the service has) or "tasks"')
        return self


class EvalRun(BaseModel):
    """One evaluation run."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    suite: str
    profile: str
    model: str | None = None
    """The planner model the profile named when the run started."""
    status: RunStatus
    attempts: int
    concurrency: int
    max_steps: int | None = None
    max_wall_s: float | None = None
    created_at: datetime
    finished_at: datetime | None = None
    tasks: int = 0
    """Tasks in the run (unsupported ones included)."""
    counts: dict[str, int] = Field(default_factory=dict)
    """Attempts by status."""


class EvalItem(BaseModel):
    """One attempt at one task."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    task_id: str
    attempt: int
    """1 for the first try."""
    domain: str
    status: ItemStatus
    score: float | None = None
    """The checker's score, 0.0 to 1.0 (passed at 1.0)."""
    detail: str | None = None
    """What the checker saw, why the attempt errored, or why the task is unsupported."""
    board_task_id: int | None = None
    agent_run_id: str | None = None
    """The agent's run: steps and screenshots at `/api/runs/{id}`, replay on the runs page."""
    desktop_id: str | None = None
    recording_id: str | None = None
    steps: int | None = None
    wall_s: float | None = None
    """Seconds the agent ran."""
    prompt_tokens: int | None = None
    """Planner tokens, summed over the run, when the endpoint reports usage."""
    completion_tokens: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class TaskRow(BaseModel):
    """One task of a run, its attempts folded."""

    task_id: str
    domain: str
    instruction: str
    attempts: int
    """Attempts with a verdict (unsupported tasks: 0)."""
    passes: int
    status: ItemStatus
    """`passed` if any attempt passed, else the first attempt's status."""
    unsupported: list[str] = Field(default_factory=list)


class Summary(BaseModel):
    tasks: int
    scored: int
    """Attempts with a verdict, unsupported ones left out."""
    passed: int
    failed: int
    errors: int
    unsupported: int
    """Tasks Cubicle cannot run as written."""
    pending: int
    """Attempts without a verdict yet."""
    rate: float | None
    """passed / scored: the success rate (pass@1 over attempts)."""
    ci_low: float | None
    """95 % Wilson score interval of `rate`."""
    ci_high: float | None
    mean_score: float | None
    pass_at: dict[int, float] = Field(default_factory=dict)
    """pass@k for k = 1…attempts, unbiased (Chen et al. 2021), over tasks with every
    attempt scored."""


class DomainRow(BaseModel):
    domain: str
    tasks: int
    scored: int
    passed: int
    rate: float | None


class EvalReport(BaseModel):
    """Everything the report page shows, and what `GET /api/evals/{id}` answers."""

    run: EvalRun
    summary: Summary
    domains: list[DomainRow]
    tasks: list[TaskRow]
    items: list[EvalItem]


class Flip(BaseModel):
    task_id: str
    domain: str
    a: ItemStatus
    b: ItemStatus


class Comparison(BaseModel):
    """Two runs side by side: which tasks passed in one and not the other."""

    a: EvalRun
    b: EvalRun
    a_summary: Summary
    b_summary: Summary
    common: int
    """Tasks both runs scored."""
    flipped: list[Flip]
    """Tasks whose outcome differs (passed in one, not in the other)."""
    both_passed: int
    both_failed: int


class SurfaceInfo(BaseModel):
    """A desktop's open OSWorld surface (`POST /api/desktops/{id}/osworld`)."""

    desktop_id: str
    port: int
    url: str
    """Give it to OSWorld's controllers: `PythonController("127.0.0.1", port)`."""
