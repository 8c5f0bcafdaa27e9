"""The task board's records: tasks, their steps, model profiles and the board's settings.

Frozen pydantic models, checked at the edge (`NewTask`, `TaskEdit`, `Profile`,
`BoardSettings`) and served as they are (`Task`, `TaskStep`, `TaskPage`).
"""

from __future__ import annotations

import os
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator


class BoardEvent(StrEnum):
    """The kinds of the board's server-sent events (`GET /api/tasks/events`), as the board
    page reads them."""

    HELLO = "hello"
    """Sent first on every stream: the page (re)loads the board."""
    TASK = "task"
    """A task changed: `{"task": Task}`."""
    MOVED = "moved"
    """A task moved in the queue: `{"task": Task}`."""
    DELETED = "deleted"
    """A task was deleted: `{"id": int}`."""
    BULK = "bulk"
    """Many tasks changed at once (`{"added": n}` or `{"deleted": n}`): reload."""
    STEP = "step"
    """A running task took a step: `{"step": TaskStep}`."""
    SETTINGS = "settings"
    """The board's settings changed: `{"settings": BoardSettings}`."""


PlannerKind = Literal["json", "ui-tars", "anthropic", "openai-computer"]
TaskStatus = Literal["queued", "running", "paused", "done", "failed", "cancelled", "interrupted"]
ACTIVE: tuple[TaskStatus, ...] = ("running", "paused")
"""A worker holds the task and its desktop."""
FINISHED: tuple[TaskStatus, ...] = ("done", "failed", "cancelled", "interrupted")
RETRYABLE: tuple[TaskStatus, ...] = ("failed", "cancelled", "interrupted")

TaskText = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=4000)]
ProfileName = Annotated[
    str, StringConstraints(strip_whitespace=True, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
]
StartTarget = Annotated[str, StringConstraints(strip_whitespace=True, max_length=2000)]
Tag = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:#-]{0,255}$")]
"""Marks a task as another room's (`eval:<run>:<task>:<attempt>`): the board runs it with
that room's hooks (`cubicle.server.board.hooks`)."""
MaxSteps = Annotated[int, Field(ge=1, le=999)]
SQLITE_MAX = 2**63 - 1
TaskId = Annotated[int, Field(ge=1, le=SQLITE_MAX)]
"""A task's id: a SQLite INTEGER, so anything larger is a 422, never a database error."""
MaxWall = Annotated[float, Field(gt=0, le=86_400)]
Width = Annotated[int, Field(ge=320, le=7680)]
Height = Annotated[int, Field(ge=240, le=4320)]

DEFAULT_PROFILE = "default"
MAX_BATCH = 10_000
"""Tasks one `POST /api/tasks/batch` may queue."""


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NewTask(_In):
    """A task to queue: what to do, with which model profile, starting from what."""

    text: TaskText
    """What to do, in words."""
    profile: ProfileName = DEFAULT_PROFILE
    start: StartTarget | None = None
    """Opened before the agent starts: an application name ("mousepad"), a file or a URL."""
    max_steps: MaxSteps | None = None
    """The step cap of this task; None: the board's default."""
    max_wall_s: MaxWall | None = None
    """The time cap of this task, seconds; None: the board's default."""
    tag: Tag | None = None
    """Whose task it is, when another room queued it (an evaluation run)."""


class NewTasks(_In):
    tasks: Annotated[list[NewTask], Field(min_length=1, max_length=MAX_BATCH)]


class TaskEdit(_In):
    """Changes to a queued task; fields left out stay as they are."""

    text: TaskText | None = None
    profile: ProfileName | None = None
    start: StartTarget | None = None
    max_steps: MaxSteps | None = None
    max_wall_s: MaxWall | None = None


class TaskMove(_In):
    """Where a queued task goes: before or after another queued task, or to an end."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1, "maxProperties": 1})

    before: TaskId | None = None
    after: TaskId | None = None
    to: Literal["top", "bottom"] | None = None

    @model_validator(mode="after")
    def _one_place(self) -> TaskMove:
        given = [name for name in ("before", "after", "to") if getattr(self, name) is not None]
        if len(given) != 1 or len(self.model_fields_set) != 1:
            raise ValueError('give exactly one of "before", "after" or "to"')
        return self


class HandDone(_In):
    message: Annotated[str, StringConstraints(strip_whitespace=True, max_length=4000)] = ""
    """What the person says was done; kept as the task's result."""


class Task(BaseModel):
    """A task on the board."""

    model_config = ConfigDict(frozen=True)

    id: int
    text: str
    profile: str
    start: str | None
    status: TaskStatus
    result: str | None = None
    """The agent's final message, why the task failed, or who stopped it."""
    position: float
    """Order in the queue (smallest first)."""
    attempts: int = 0
    """Runs started for this task (a retry adds one)."""
    steps: int = 0
    """Steps of the current run so far."""
    max_steps: int | None = None
    max_wall_s: float | None = None
    run_id: str | None = None
    """The agent run (see `/api/runs/{id}`), once one started."""
    desktop_id: str | None = None
    """The desktop of the current or last run."""
    recording_id: str | None = None
    """The recording of the last run (MP4 under the desktop's recordings)."""
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    version: int = 0
    """Counts every change: of two copies of a task, the higher version is the newer."""
    tag: str | None = None
    """Whose task it is, when another room queued it (see `NewTask.tag`)."""


class TaskPage(BaseModel):
    """One page of tasks, and how many match in all."""

    items: list[Task]
    total: int
    offset: int
    limit: int


class TaskStep(BaseModel):
    """One step of a task's run, as the timeline shows it."""

    model_config = ConfigDict(frozen=True)

    task_id: int
    run_id: str
    index: int
    started_at: datetime
    action: str
    """The action in one line ("" when the planner gave none)."""
    thought: str = ""
    outcome: str
    x: int | None = None
    """Where the step acted, screen pixels."""
    y: int | None = None
    source: str | None = None
    """Who placed the point: a11y, ocr, vlm:…, planner."""
    error: str | None = None
    observe_ms: float = 0.0
    model_ms: float = 0.0
    total_ms: float = 0.0
    screenshot: str = ""
    """URL path of the step's screenshot with the point drawn ("" when it has none)."""
    video_offset_ms: float | None = None
    """Milliseconds into the task's recording at which the step acted; None without one."""


class Profile(_In):
    """A model setup tasks can name: endpoint, key, planner model, grounder chain."""

    base_url: str | None = None
    """OpenAI-compatible endpoint, usually ending in /v1; None: the service's default."""
    api_key: str | None = None
    planner_model: str | None = None
    planner_kind: PlannerKind | None = None
    planner_family: str | None = None
    grounder: str | None = None
    """Grounders in order, e.g. "a11y,ocr,vlm"."""
    grounder_model: str | None = None
    grounder_family: str | None = None
    a11y_text: bool | None = None
    allow_exec: bool | None = None
    network: bool = False
    """Give the task's desktop a user-mode network."""

    def flags(self) -> dict[str, Any]:
        """The agent settings this profile sets, as `load_settings` flags."""
        return {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "planner.model": self.planner_model,
            "planner.kind": self.planner_kind,
            "planner.family": self.planner_family,
            "grounder.spec": self.grounder,
            "grounder.model": self.grounder_model,
            "grounder.family": self.grounder_family,
            "a11y_text": self.a11y_text,
            "allow_exec": self.allow_exec,
        }


class ProfileView(BaseModel):
    """A profile as the API shows it: the key is never sent back."""

    name: str
    base_url: str | None
    api_key_set: bool
    planner_model: str | None
    planner_kind: str | None
    grounder: str | None
    network: bool
    ready: bool
    """Whether tasks can run with it (endpoint and model known)."""
    problem: str | None = None
    """What is missing when it is not ready."""


def _default_concurrency() -> int:
    return max(1, min(4, os.cpu_count() or 1))


class BoardSettings(_In):
    """How the board runs tasks."""

    concurrency: Annotated[int, Field(ge=0, le=64)] = Field(default_factory=_default_concurrency)
    """Tasks run at once (default: one per core, up to 4); 0 holds the queue."""
    max_steps: MaxSteps = 30
    """Default step cap of a task."""
    max_wall_s: MaxWall = 900.0
    """Default time cap of a task, seconds."""
    keep_desktop_s: Annotated[int, Field(ge=0, le=86_400)] = 0
    """Seconds a finished task's desktop stays up for inspection (0: released at once)."""
    record: bool = True
    """Record each run's screen to MP4."""
    resolution: tuple[Width, Height] = (1280, 800)
    """Screen size of each task's desktop, pixels."""
