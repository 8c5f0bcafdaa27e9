"""The agent loop: observe → decide → ground → act → wait for settle → record → repeat.

    agent = Agent(desktop, planner, grounder, store=RunStore(data_dir))
    record = await cubicle.agent.run("Write a haiku in mousepad")

(`cubicle.agent.run` builds the planner and grounder from settings.) `Agent` drives one desktop
through the SDK, as any program would. A run ends when the planner says `done` or `fail`,
or at a cap: `max_steps`, `max_wall_s`, or `max_consecutive_errors` failed steps in a row
(a model endpoint down, answers that stay unusable, an element that cannot be found, an
action the desktop refuses). A desktop that is gone ends it at once. Cancelling the task
that runs `Agent.run` stops it at once and leaves the desktop as it is; the run is then
recorded as cancelled.

`Agent.pause()` hands the desktop to a person: it returns once no action is under way, and
the agent acts no more until `resume()`. A decision made meanwhile is dropped (the screen
may have changed), the step is taken again from a fresh screenshot, and the time spent
paused does not count against `max_wall_s`.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from PIL import Image

from cubicle import RecordingInfo
from cubicle.agent import actions as p
from cubicle.agent.act import act
from cubicle.agent.grounding.base import Grounder
from cubicle.agent.planner import (
    Decision,
    Observation,
    PastStep,
    PlanError,
    Planner,
    a11y_text,
)
from cubicle.agent.settings import RunLimits
from cubicle.agent.steps import Grounded, ModelCall, RunRecord, RunStatus, StepRecord, StepTimings
from cubicle.agent.store import RunStore, new_run_id, step_name
from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol.errors import (
    AuthError,
    CubicleError,
    DesktopNotFound,
    DesktopUnavailable,
    GuestUnreachable,
    InvalidRequest,
    SandboxStartError,
    ServiceUnreachable,
)

OnStep = Callable[[StepRecord], None]
"""Called with each step's record as soon as the step is over."""

_OBSERVE_QUALITY = 90
"""JPEG quality of the screenshot taken at each step: at 1280×800 it comes and decodes in
about half the time of a PNG, and text stays sharp enough for models and OCR."""
_FATAL = (
    DesktopUnavailable,
    DesktopNotFound,
    GuestUnreachable,
    SandboxStartError,
    AuthError,
    ServiceUnreachable,
)
"""Errors after which no further step can work: the run ends at once."""


class _StepFailed(Exception):
    """A step cannot go on; the message says why (told to the planner and recorded)."""


class _Paused(Exception):
    """The agent was paused before the step could act: its decision is stale."""


_HANDED_BACK = (
    " Then a person paused the agent, used the desktop and handed it back: the screen may "
    "have changed."
)
"""Added to the last step's result, as the planner sees it, after a pause."""


@dataclass
class _Draft:
    """A step being built (mutable), turned into a frozen `StepRecord` when it ends."""

    index: int
    started_at: datetime
    started: float
    image: Image.Image | None = None
    a11y: str | None = None
    decision: Decision | None = None
    calls: tuple[ModelCall, ...] = ()
    grounded: list[Grounded] = field(default_factory=list)
    result: str = ""
    error: str | None = None
    settled: bool | None = None
    timings: dict[str, float] = field(default_factory=dict)
    acted_at: datetime | None = None
    """When the action was sent to the desktop."""


def _decode(encoded: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(encoded))
    image.load()
    return image if image.mode == "RGB" else image.convert("RGB")


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


def _fatal(exc: BaseException) -> bool:
    return isinstance(exc, _FATAL)


class Agent:
    """Runs one task on one desktop with one planner and, unless the planner grounds
    itself, one grounder. `store` records every run and step (nothing is recorded without one);
    `on_step` hears each step as it ends. `a11y_text` adds the accessibility tree, as
    text, to what the planner sees. `recording`: the desktop's recording of this run, whose
    id the run keeps and into which each step notes its offset."""

    def __init__(
        self,
        desktop: AsyncDesktop,
        planner: Planner,
        grounder: Grounder | None = None,
        *,
        limits: RunLimits | None = None,
        store: RunStore | None = None,
        on_step: OnStep | None = None,
        a11y_text: bool = False,
        grounder_name: str | None = None,
        run_id: str | None = None,
        recording: RecordingInfo | None = None,
    ) -> None:
        if grounder is None and not planner.grounds_itself:
            raise InvalidRequest(
                f"the planner {planner.name} names elements by description: give the agent a "
                'grounder (e.g. "a11y,ocr,vlm") or use a planner that grounds itself'
            )
        self.desktop = desktop
        self.planner = planner
        self.grounder = grounder
        self.limits = limits or RunLimits()
        self.store = store
        self.on_step = on_step
        self.a11y_text = a11y_text
        self.grounder_name = grounder_name or (type(grounder).__name__ if grounder else None)
        self.run_id = run_id or new_run_id()
        """The id the run is recorded under, known before it starts."""
        self.recording = recording
        self._ran = False
        self._history: list[PastStep] = []
        self._saving: asyncio.Task[None] | None = None
        self._running: RunRecord | None = None
        self._timer: asyncio.Timeout | None = None
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._pauses = 0
        """Pauses so far: a decision made before the latest one is stale."""
        self._paused_since = 0.0

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    async def pause(self) -> None:
        """Stop acting on the desktop; returns once an action under way has ended."""
        if not self.paused:
            self._pauses += 1
            self._paused_since = time.monotonic()
            self._resumed.clear()
        await self._idle.wait()

    def resume(self) -> None:
        """Go on from a fresh look at the screen; the pause does not count as run time."""
        if not self.paused:
            return
        if self._timer is not None and (deadline := self._timer.when()) is not None:
            self._timer.reschedule(deadline + time.monotonic() - self._paused_since)
        self._resumed.set()

    async def run(self, task: str) -> RunRecord:
        """Carry out `task`; returns the run's final record (status done or failed). An
        `Agent` runs one task: its `run_id` names that run."""
        if self._ran:
            raise InvalidRequest(f"this agent already ran {self.run_id}: make a new Agent")
        self._ran = True
        record = RunRecord(
            id=self.run_id,
            task=task,
            status="running",
            desktop_id=self.desktop.id,
            planner=self.planner.name,
            grounder=self.grounder_name if self.grounder is not None else None,
            recording_id=self.recording.id if self.recording is not None else None,
            started_at=datetime.now(UTC),
            max_steps=self.limits.max_steps,
            max_wall_s=self.limits.max_wall_s,
        )
        self._running = record
        if self.store is not None:
            await self.store.save_run(record)
        steps: list[StepRecord] = []
        timer = self._timer = asyncio.timeout(self.limits.max_wall_s)
        try:
            async with timer:
                status, reason = await self._loop(task, steps)
        except TimeoutError as exc:
            if not timer.expired():  # not the run's time cap: a bug somewhere below
                await self._finish(record, "failed", f"internal error: {exc!r}", steps)
                raise
            status = "failed"
            reason = f"ran out of time: the run may take {self.limits.max_wall_s:g} s"
        except asyncio.CancelledError:
            reason = f"cancelled during step {len(steps) + 1}; the desktop was left as it was"
            await asyncio.shield(self._finish(record, "cancelled", reason, steps))
            raise
        except _FATAL as exc:
            status, reason = "failed", exc.message
        except Exception as exc:
            await self._finish(record, "failed", f"internal error: {exc!r}", steps)
            raise
        return await self._finish(record, status, reason, steps)

    async def _finish(
        self, record: RunRecord, status: RunStatus, reason: str | None, steps: list[StepRecord]
    ) -> RunRecord:
        final = record.model_copy(
            update={
                "status": status,
                "reason": reason,
                "finished_at": datetime.now(UTC),
                "steps": len(steps),
            }
        )
        if self._saving is not None:
            await self._saving
            self._saving = None
        if self.store is not None:
            await self.store.save_run(final)
        return final

    async def _loop(self, task: str, steps: list[StepRecord]) -> tuple[RunStatus, str | None]:
        in_a_row = 0
        index = 1
        pauses = 0
        while index <= self.limits.max_steps:
            await self._resumed.wait()
            if self._pauses != pauses:  # a person had the desktop since the last look
                pauses = self._pauses
                self._note_handed_back()
            try:
                step = await self._step(task, index, pauses)
            except _Paused:
                continue
            index += 1
            steps.append(step)
            if self.on_step is not None:
                self.on_step(step)
            action = step.action
            if isinstance(action, p.Done):
                return "done", action.summary or None
            if isinstance(action, p.Fail):
                return "failed", f"the planner gave up: {action.reason}"
            in_a_row = in_a_row + 1 if step.outcome == "error" else 0
            if in_a_row >= self.limits.max_consecutive_errors:
                return "failed", f"{in_a_row} steps in a row failed; the last: {step.error}"
        return (
            "failed",
            f"reached the limit of {self.limits.max_steps} steps before the task was done",
        )

    def _note_handed_back(self) -> None:
        if self._history:
            last = self._history[-1]
            self._history[-1] = replace(last, result=last.result + _HANDED_BACK)

    # --- one step -------------------------------------------------------------------------

    async def _step(self, task: str, index: int, pauses: int) -> StepRecord:
        """Step `index`, dropped (`_Paused`) if the agent is paused again before it acts."""
        draft = _Draft(index, datetime.now(UTC), time.perf_counter())
        try:
            await self._observe(draft)
            await self._decide(draft, task)
            assert draft.decision is not None
            final = isinstance(draft.decision.action, p.Done | p.Fail)
            if not final:
                await self._ground(draft)
            if self._pauses != pauses:
                raise _Paused
            if not final:
                await self._act(draft)
        except (_StepFailed, CubicleError) as exc:
            if _fatal(exc):
                raise
            draft.error = exc.message if isinstance(exc, CubicleError) else str(exc)
            draft.result = f"error: {draft.error}"
        return await self._record(draft)

    async def _observe(self, draft: _Draft) -> None:
        started = time.perf_counter()
        encoded = await self.desktop.screenshot("jpeg", quality=_OBSERVE_QUALITY)
        draft.image = await asyncio.to_thread(_decode, encoded)
        if self.grounder is not None:
            self.grounder.prepare(draft.image, draft.image.size)
        if self.a11y_text:
            draft.a11y = a11y_text(await self.desktop.accessibility_tree())
        draft.timings["observe_ms"] = _ms(started)

    async def _decide(self, draft: _Draft, task: str) -> None:
        assert draft.image is not None
        started = time.perf_counter()
        screen = self.desktop.info.screen
        size = (screen.width, screen.height)
        observation = Observation(task, draft.index, draft.image, size, draft.a11y)
        try:
            draft.decision = await self.planner.decide(observation, self._history)
        except PlanError as exc:
            draft.calls = exc.calls
            raise
        finally:
            draft.timings["plan_ms"] = _ms(started)
        draft.calls = draft.decision.calls
        draft.timings["model_ms"] = draft.decision.model_ms

    async def _ground(self, draft: _Draft) -> None:
        assert draft.decision is not None and draft.image is not None
        started = time.perf_counter()
        try:
            for target in p.targets(draft.decision.action):
                draft.grounded.append(await self._locate(target, draft.image))
        finally:
            draft.timings["ground_ms"] = _ms(started)

    async def _locate(self, target: p.Target, image: Image.Image) -> Grounded:
        """Where `target` is on the screen `image` shows (a full-size screenshot)."""
        if isinstance(target, tuple):
            x, y = target
            return Grounded(target=f"({x}, {y})", x=x, y=y, source="planner", elapsed_ms=0.0)
        if self.grounder is None:
            raise _StepFailed(f"{target!r} is a description but this run has no grounder")
        found = await self.grounder.ground(target, image, image.size)
        if found is None:
            raise _StepFailed(f"could not find {target!r} on the screen")
        return Grounded(
            target=target,
            x=found.x,
            y=found.y,
            box=found.box,
            source=found.source,
            elapsed_ms=found.elapsed_ms,
            raw=found.raw,
        )

    async def _act(self, draft: _Draft) -> None:
        assert draft.decision is not None
        points = [(g.x, g.y) for g in draft.grounded]
        self._idle.clear()
        draft.acted_at = datetime.now(UTC)
        try:
            acted = await act(self.desktop, draft.decision.action, points, self.limits)
        finally:
            self._idle.set()
        draft.result, draft.settled = acted.result, acted.settled
        draft.timings |= {"act_ms": acted.act_ms, "settle_ms": acted.settle_ms}

    async def _record(self, draft: _Draft) -> StepRecord:
        decision = draft.decision
        action = decision.action if decision is not None else None
        if isinstance(action, p.Done | p.Fail) and draft.error is None:
            outcome = "done" if isinstance(action, p.Done) else "fail"
            draft.result = f"ok: {p.describe(action)}"
        else:
            outcome = "error" if draft.error is not None else "acted"
        timings = StepTimings(**draft.timings, total_ms=_ms(draft.started))
        screen = self.desktop.info.screen
        step = StepRecord(
            run_id=self.run_id,
            index=draft.index,
            started_at=draft.started_at,
            screen_size=(screen.width, screen.height),
            screenshot=f"{step_name(draft.index)}.png" if draft.image is not None else "",
            thought=decision.thought if decision is not None else "",
            action=action,
            action_text=p.describe(action) if action is not None else "",
            calls=draft.calls,
            grounded=tuple(draft.grounded),
            outcome=outcome,
            result=draft.result,
            error=draft.error,
            settled=draft.settled,
            timings=timings,
            video_offset_ms=self._video_offset_ms(draft.acted_at or draft.started_at),
        )
        self._remember(draft, step)
        if self.store is not None:
            if self._saving is not None:
                await asyncio.shield(self._saving)
            self._saving = asyncio.create_task(self._save(self.store, step, draft.image))
        return step

    def _video_offset_ms(self, moment: datetime) -> float | None:
        """Where `moment` falls in the run's recording, milliseconds from its start. The
        recording started (`started_at`) at time 0 of its video, on this machine's clock."""
        if self.recording is None:
            return None
        return max(0.0, (moment - self.recording.started_at).total_seconds() * 1000)

    async def _save(self, store: RunStore, step: StepRecord, image: Image.Image | None) -> None:
        """Write the step, then the run's step count (so readers see the run progress);
        runs in the background while the next step observes and plans."""
        assert self._running is not None
        await store.save_step(step, image)
        await store.save_run(self._running.model_copy(update={"steps": step.index}))

    def _remember(self, draft: _Draft, step: StepRecord) -> None:
        """Add the step to the planner's history; keep only the last screenshots."""
        decision = draft.decision
        answer = decision.answer if decision is not None and draft.error is None else ""
        image = decision.image if decision is not None else None
        self._history.append(PastStep(step.index, answer, step.result, image))
        for position in range(len(self._history) - self.limits.history_screenshots):
            if self._history[position].image is not None:
                self._history[position] = replace(self._history[position], image=None)
