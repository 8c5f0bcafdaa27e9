"""The board's hooks for evaluation tasks: set each fresh desktop up, score it, hear the end.

`EvalRuns` registers an `EvalHooks` under the tag prefix `eval`; the board calls it around
the agent's run of every task tagged `eval:<run>:<task>:<attempt>` (`cubicle.server.board.hooks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cubicle import AsyncDesktop, CubicleError, InvalidRequest, NotFound, WaitForSettle
from cubicle.agent.steps import RunRecord, StepRecord
from cubicle.agent.store import RunStore
from cubicle.evals.check import evaluate
from cubicle.evals.context import TaskContext
from cubicle.evals.errors import EvalError
from cubicle.evals.setup import run_steps
from cubicle.evals.suite import EvalTask
from cubicle.protocol.board import Task
from cubicle.protocol.evals import FINAL
from cubicle.server.evals.store import now

if TYPE_CHECKING:
    from cubicle.server.evals.runs import EvalRuns

TAG = "eval"
"""Prefix of the board tags of evaluation tasks: `eval:<run>:<task>:<attempt>`."""
SETTLE_AFTER_SETUP = WaitForSettle(quiet_ms=300, timeout_ms=5000, idle_ms=50)
"""The agent's first screenshot shows the setup done: the screen quiet, or the desktop idle."""


def tag_for(run_id: str, task_id: str, attempt: int) -> str:
    return f"{TAG}:{run_id}:{task_id}:{attempt}"


def parse_tag(tag: str | None) -> tuple[str, str, int] | None:
    parts = (tag or "").split(":")
    if len(parts) != 4 or parts[0] != TAG or not parts[3].isdigit():
        return None
    return parts[1], parts[2], int(parts[3])


class EvalHooks:
    """What the board does around an evaluation task's agent (see `cubicle.server.board.hooks`)."""

    def __init__(self, runs: EvalRuns) -> None:
        self.runs = runs
        self._records = RunStore(runs.data_dir)

    async def before_agent(self, task: Task, desktop: AsyncDesktop) -> None:
        run_id, task_id, attempt = self._parsed(task)
        spec = await self._spec(run_id, task_id)
        item = await self.runs.call(self.runs.store.item, run_id, task_id, attempt)
        if item is not None:
            await self.runs.update_item(
                item,
                status="running",
                board_task_id=task.id,
                agent_run_id=task.run_id,
                desktop_id=desktop.id,
                started_at=now(),
            )
        await run_steps(self._context(run_id, task_id, attempt, desktop), spec.config)
        await desktop.actions(SETTLE_AFTER_SETUP)

    async def after_agent(
        self, task: Task, desktop: AsyncDesktop, record: RunRecord, last: StepRecord | None
    ) -> str | None:
        run_id, task_id, attempt = self._parsed(task)
        spec = await self._spec(run_id, task_id)
        gave_up = last is not None and last.outcome == "fail"
        ctx = self._context(run_id, task_id, attempt, desktop)
        try:
            verdict = await evaluate(ctx, spec, agent_gave_up=gave_up)
            status, score, detail = (
                "passed" if verdict.passed else "failed",
                verdict.score,
                verdict.detail,
            )
        except (EvalError, CubicleError) as exc:
            status, score, detail = "error", None, f"the checker could not run: {exc.message}"
        prompt, answer = await self._tokens(record.id)
        wall = (
            (record.finished_at - record.started_at).total_seconds() if record.finished_at else None
        )
        item = await self.runs.call(self.runs.store.item, run_id, task_id, attempt)
        if item is not None:
            await self.runs.update_item(
                item,
                status=status,
                score=score,
                detail=detail,
                steps=record.steps,
                wall_s=wall,
                prompt_tokens=prompt,
                completion_tokens=answer,
                finished_at=now(),
            )
        return f"checker: {status}" + (f" ({score:g})" if score is not None else "")

    async def ended(self, task: Task) -> None:
        if self.runs.stopped or (parsed := parse_tag(task.tag)) is None:
            return
        run_id, task_id, attempt = parsed
        item = await self.runs.call(self.runs.store.item, run_id, task_id, attempt)
        if item is None:
            return
        fields: dict[str, Any] = {
            "board_task_id": task.id,
            "agent_run_id": task.run_id,
            "desktop_id": task.desktop_id,
            "recording_id": task.recording_id,
        }
        if item.status not in FINAL and task.status != "interrupted":
            run = await self.runs.get(run_id)
            if task.status == "cancelled" and run.status == "stopped":
                fields["status"] = "pending"
            else:
                why = task.result or task.status
                fields |= {"status": "error", "detail": why, "finished_at": now()}
        await self.runs.update_item(item, **fields)
        await self.runs.feed(run_id)

    def _parsed(self, task: Task) -> tuple[str, str, int]:
        parsed = parse_tag(task.tag)
        if parsed is None:
            raise EvalError(f"task {task.id} has no evaluation tag ({task.tag!r})")
        return parsed

    async def _spec(self, run_id: str, task_id: str) -> EvalTask:
        spec = await self.runs.call(self.runs.store.task, run_id, task_id)
        if spec is None:
            raise EvalError(f"evaluation run {run_id} has no task {task_id!r}")
        return spec

    def _context(
        self, run_id: str, task_id: str, attempt: int, desktop: AsyncDesktop
    ) -> TaskContext:
        folder = self.runs.store.run_dir(run_id)
        return TaskContext(desktop, folder / "files", folder / "cache" / f"{task_id}-{attempt}")

    async def _tokens(self, agent_run_id: str) -> tuple[int | None, int | None]:
        """Planner tokens of the agent's run, summed, when the endpoint reported any."""
        try:
            detail = await self._records.get_run(agent_run_id)
        except (NotFound, InvalidRequest):
            return None, None
        calls = [call for step in detail.steps for call in step.calls]
        prompt = [c.prompt_tokens for c in calls if c.prompt_tokens is not None]
        answer = [c.completion_tokens for c in calls if c.completion_tokens is not None]
        return (sum(prompt) if prompt else None), (sum(answer) if answer else None)
