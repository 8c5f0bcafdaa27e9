"""One task's run: a fresh desktop, the recording, the start app, the agent, the clean-up.

A `TaskRun` lives while a worker holds the task. It reaches the desktops through the SDK,
as any program would, over the service's in-process door (`cubicle.server.inside`).
Whatever ends the run (the agent finishing, a person cancelling or marking it done, the
service stopping), the recording is finished and the desktop released, or kept for
inspection when the board says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from cubicle import RecordingInfo
from cubicle.agent import actions as p
from cubicle.agent.act import act
from cubicle.agent.loop import Agent
from cubicle.agent.run import agent_for
from cubicle.agent.settings import AgentSettings
from cubicle.agent.steps import StepRecord
from cubicle.agent.store import RunStore
from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol.board import Profile, Task, TaskStatus, TaskStep
from cubicle.protocol.errors import CubicleError, DesktopGone, GuestUnreachable
from cubicle.server.board.hooks import TaskHooks

log = logging.getLogger("cubicle.board")

_DESKTOP_IDLE_MARGIN_S = 600
"""Idle timeout of a task's desktop beyond the task's time cap (a person may hold it)."""
_DESKTOP_FAILED_WAIT_S = 30.0
"""Longest wait, after a desktop stopped answering, for the service to say why."""


@dataclass(frozen=True)
class RunPlan:
    """What a run needs to know besides the task."""

    settings: AgentSettings
    """The agent's settings: the task's profile with the board's caps, resolved."""
    profile: Profile
    resolution: tuple[int, int]
    record: bool
    keep_desktop_s: int


NewDesktop = Callable[..., Awaitable[AsyncDesktop]]
"""Starts a desktop with `AsyncDesktop.create`'s options (`Services.create_desktop`)."""
Update = Callable[..., Awaitable[Task | None]]
"""Sets fields of the task in the database and tells the pages."""
StepSink = Callable[[TaskStep], None]


@dataclass
class TaskRun:
    """A task held by a worker, from the desktop's creation to its release."""

    task: Task
    plan: RunPlan
    new_desktop: NewDesktop
    store: RunStore
    update: Update
    on_step: StepSink
    desktop: AsyncDesktop | None = None
    agent: Agent | None = None
    ending: tuple[TaskStatus, str] | None = None
    """How a person or the service ended the run before the agent did."""
    pause_requested: bool = False
    recording: RecordingInfo | None = None
    """The run's recording, while one runs or after."""
    ended: bool = False
    """Whether `run()` returned (the task is being finished and released)."""
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the task's final status is stored (its desktop may still be releasing)."""
    hooks: TaskHooks | None = None
    """What the room that tagged the task does around the agent (`cubicle.server.board.hooks`)."""
    last_step: StepRecord | None = None

    async def run(self) -> tuple[TaskStatus, str | None]:
        """Carry the task out; returns its final status and result. Cancelling the task
        that runs this ends the run with `ending` (default: cancelled). Call `release()`
        afterwards, whatever happened."""
        try:
            self.desktop = await self._create_desktop()
            await self.update(self.task.id, desktop_id=self.desktop.id)
            if self.plan.record:
                self.recording = await self._start_recording()
            if self.task.start:
                await self._open_start(self.task.start)
            if self.hooks is not None:
                await self.hooks.before_agent(self.task, self.desktop)
            async with agent_for(
                self.desktop,
                self.plan.settings,
                store=self.store,
                on_step=self._step_done,
                run_id=self.task.run_id,
                recording=self.recording,
            ) as agent:
                self.agent = agent
                if self.pause_requested:
                    await agent.pause()
                record = await agent.run(self.task.text)
            if record.status == "done":
                status, result = "done", record.reason
            else:
                status, result = await self._failed(record.reason)
            if self.hooks is not None and status != "interrupted":  # a broken desktop: no
                note = await self.hooks.after_agent(self.task, self.desktop, record, self.last_step)
                result = f"{result} · {note}" if result and note else (note or result)
            return status, result
        except asyncio.CancelledError:
            return self.ending or ("cancelled", "cancelled by a person")
        except CubicleError as exc:
            return await self._failed(exc.message)
        except Exception as exc:
            log.exception("task %s failed", self.task.id)
            return "failed", f"internal error: {exc!r}"

    async def pause(self) -> None:
        self.pause_requested = True
        if self.agent is not None:
            await self.agent.pause()

    def resume(self) -> None:
        self.pause_requested = False
        if self.agent is not None:
            self.agent.resume()

    async def _failed(self, reason: str | None) -> tuple[TaskStatus, str | None]:
        """`failed`, unless the desktop itself broke under the task (its node died, say):
        then `interrupted`, ready to retry on a fresh desktop."""
        broke = await self._desktop_broke()
        if broke is None:
            return "failed", reason
        return "interrupted", f"the desktop broke under the task ({broke}): retry it"

    async def _desktop_broke(self) -> str | None:
        """Why the task's desktop no longer works, or None while it answers."""
        if self.desktop is None:
            return None
        try:
            await self.desktop.get_cursor_position()
            return None
        except (DesktopGone, GuestUnreachable) as exc:
            broke = exc.message
        except CubicleError:
            return None
        # The service may not have heard yet that the desktop's sandbox or node is gone.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _DESKTOP_FAILED_WAIT_S
        while loop.time() < deadline:
            with contextlib.suppress(CubicleError):
                info = await self.desktop.refresh()
                if info.status != "ready":
                    return info.reason or broke
            await asyncio.sleep(0.5)
        return broke

    # --- the desktop ------------------------------------------------------------------------

    async def _create_desktop(self) -> AsyncDesktop:
        start = self.task.start or ""
        network = self.plan.profile.network or urlsplit(start).scheme in ("http", "https")
        idle_s = int(self.plan.settings.limits.max_wall_s) + _DESKTOP_IDLE_MARGIN_S
        options: dict[str, Any] = {"resolution": self.plan.resolution, "network": network}
        return await self.new_desktop(timeout_s=min(idle_s, 86_400), **options)

    async def _start_recording(self) -> RecordingInfo | None:
        assert self.desktop is not None
        try:
            info = await self.desktop.start_recording()
        except CubicleError as exc:  # the run goes on without a video
            log.warning("task %s: no recording: %s", self.task.id, exc.message)
            return None
        await self.update(self.task.id, recording_id=info.id)
        return info

    async def _open_start(self, start: str) -> None:
        """Open the task's start app, file or URL as the agent's own `launch`/`open` would:
        wait for its window, then for the screen to settle."""
        assert self.desktop is not None
        if urlsplit(start).scheme or start.startswith(("/", "~")):
            action: p.PlannedAction = p.Open(target=start)
        else:
            app, *args = start.split()
            action = p.Launch(app=app, args=args)
        await act(self.desktop, action, [], self.plan.settings.limits)

    async def release(self) -> None:
        """Finish the recording, then stop the desktop or keep it for a while."""
        desktop = self.desktop
        if desktop is None:
            return
        try:
            if self.recording is not None:
                await desktop.stop_recording()
            if self.plan.keep_desktop_s > 0:
                await desktop.set_timeout(max(10, self.plan.keep_desktop_s))
                await desktop.close()
            else:
                await desktop.kill()
        except Exception as exc:  # the desktop may already be gone; the task's end stands
            log.warning("task %s: releasing desktop %s: %r", self.task.id, desktop.id, exc)
            await desktop.close()

    # --- steps ------------------------------------------------------------------------------

    def _step_done(self, step: StepRecord) -> None:
        self.last_step = step
        point = step.grounded[0] if step.grounded else None
        self.on_step(
            TaskStep(
                task_id=self.task.id,
                run_id=step.run_id,
                index=step.index,
                started_at=step.started_at,
                action=step.action_text,
                thought=step.thought,
                outcome=step.outcome,
                x=point.x if point else None,
                y=point.y if point else None,
                source=point.source if point else None,
                error=step.error,
                observe_ms=step.timings.observe_ms,
                model_ms=step.timings.model_ms,
                total_ms=step.timings.total_ms,
                screenshot=(
                    f"/api/runs/{step.run_id}/steps/{step.index}.png" if step.screenshot else ""
                ),
                video_offset_ms=step.video_offset_ms,
            )
        )
