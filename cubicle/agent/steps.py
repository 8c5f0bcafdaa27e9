"""What a run leaves behind: one `RunRecord` and one `StepRecord` per step.

They are written to disk by `cubicle.agent.store` and served as they are by `GET /api/runs/{id}`,
so they are frozen pydantic models: typed inside, JSON at the edge.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from cubicle.agent.actions import PlannedAction

RunStatus = Literal["running", "done", "failed", "cancelled"]
StepOutcome = Literal["acted", "error", "done", "fail"]
"""`acted`: the action ran; `error`: the step failed (the run may go on); `done`/`fail`: the
planner ended the run."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelCall(_Record):
    """One question to a model and its answer."""

    prompt: str
    """The request's messages as text, images shown as `[image W×H]`."""
    answer: str
    """The model's whole answer ("" when the request failed)."""
    elapsed_ms: float
    """Milliseconds, retries and backoff included."""
    attempts: int = 1
    """HTTP requests made for this call."""
    prompt_tokens: int | None = None
    """Tokens in the request, as the endpoint reported them (None: it did not say)."""
    completion_tokens: int | None = None
    """Tokens in the answer, as the endpoint reported them (None: it did not say)."""
    error: str | None = None
    """Why the answer could not be used (fed back to the model), or why the call failed."""


class Grounded(_Record):
    """Where one target of the action was found, in real screen pixels."""

    target: str
    """The description, or `(x, y)` for a point the planner gave itself."""
    x: int
    """Screen pixels from the left edge."""
    y: int
    """Screen pixels from the top edge."""
    box: tuple[int, int, int, int] | None = None
    """The element's box (left, top, right, bottom) in screen pixels, when known."""
    source: str
    """Who placed the point: "a11y", "ocr", "vlm:ui-tars", "planner:ui-tars-1.5"…"""
    elapsed_ms: float
    """Milliseconds the grounder took (0 for a planner's own point)."""
    raw: str = ""
    """The grounder's raw output."""


class StepTimings(_Record):
    """Where one step's time went, in milliseconds."""

    observe_ms: float = 0.0
    """Screenshot (and accessibility text) taken and decoded."""
    plan_ms: float = 0.0
    """The planner's whole decision: image preparation and model calls."""
    model_ms: float = 0.0
    """Of `plan_ms`, time spent waiting for the model."""
    ground_ms: float = 0.0
    """Descriptions turned into screen points."""
    act_ms: float = 0.0
    """The action itself on the desktop (input events, launch, exec…)."""
    settle_ms: float = 0.0
    """Waiting for the screen to stop changing after the action."""
    total_ms: float = 0.0
    """The whole step, start to end."""

    @property
    def overhead_ms(self) -> float:
        """Everything but waiting for the model: the agent's own cost per step."""
        return self.total_ms - self.model_ms


class StepRecord(_Record):
    """One turn of the loop: what was seen, asked, answered, grounded and done."""

    run_id: str
    index: int
    """1 for the first step."""
    started_at: datetime
    screen_size: tuple[int, int]
    """(width, height) of the real screen, pixels."""
    screenshot: str
    """File name of the screenshot (with the grounded points drawn) next to the record."""
    thought: str = ""
    action: PlannedAction | None = None
    """The action the planner chose, points in screen pixels; None when planning failed."""
    action_text: str = ""
    """The action in one line for people."""
    calls: tuple[ModelCall, ...] = ()
    """The planner's model calls for this step, re-asks after unusable answers included."""
    grounded: tuple[Grounded, ...] = ()
    outcome: StepOutcome
    result: str = ""
    """What happened, as told to the planner at the next step."""
    error: str | None = None
    """Why the step failed, when it did."""
    settled: bool | None = None
    """Whether the screen went quiet before the settle timeout; None when not waited for."""
    timings: StepTimings
    video_offset_ms: float | None = None
    """Milliseconds from the start of the run's recording to this step's action (to its
    screenshot when it did not act), for seeking the video; None without a recording."""

    @property
    def point(self) -> tuple[int, int] | None:
        """Where the step acted first, in screen pixels."""
        return (self.grounded[0].x, self.grounded[0].y) if self.grounded else None


class RunRecord(_Record):
    """One task run by the agent on one desktop."""

    id: str
    task: str
    status: RunStatus
    reason: str | None = None
    """How it ended: the planner's summary when done, why it failed or was cancelled."""
    desktop_id: str
    planner: str
    """The planner's kind and model, e.g. "json:qwen2.5-vl-7b"."""
    grounder: str | None
    """The grounder spec ("a11y,ocr,vlm"), None when the planner grounds itself."""
    started_at: datetime
    finished_at: datetime | None = None
    steps: int = 0
    """Steps recorded so far."""
    recording_id: str | None = None
    """The run's video: recording `recording_id` of desktop `desktop_id`, when one was made
    (`GET /api/desktops/{desktop_id}/recordings/{recording_id}.mp4`)."""
    max_steps: int
    max_wall_s: float
    """The run's time limit, seconds."""


class RunDetail(_Record):
    """A run and all its steps, as `GET /api/runs/{id}` answers."""

    run: RunRecord
    steps: list[StepRecord]
