"""Scoring a task: what Cubicle cannot run (said before anything runs), then the checker.

The checker follows OSWorld's `DesktopEnv.evaluate`: the `postconfig` steps first; a task
whose `func` is `infeasible` passes when the agent gave up (its last action was `fail`),
any other fails then; otherwise each metric gets its getters' values, and `conj` combines
the scores (`and`: the mean, 0 as soon as one is 0; `or`: 1 as soon as one is 1, else the
best). Cubicle adds the `python` metric: `options.code` runs inside the desktop under the
service's Python, with the result getter's value (JSON) as `sys.argv[1]`; exit status 0
scores 1, any other 0, unless the last line printed is a number, which is the score.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from cubicle import CubicleError
from cubicle.evals.context import TaskContext
from cubicle.evals.errors import CheckerError
from cubicle.evals.getters import check_getter, get
from cubicle.evals.metrics import METRICS, known
from cubicle.evals.setup import check_step, run_steps
from cubicle.evals.suite import EvalTask, Metric

PASS_SCORE = 1.0
"""A task passes when its score reaches this."""
_PYTHON_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Verdict:
    """What the checker found."""

    score: float
    """0.0 to 1.0."""
    detail: str
    """What each metric scored, in words."""

    @property
    def passed(self) -> bool:
        return self.score >= PASS_SCORE - 1e-9


def unsupported(task: EvalTask) -> list[str]:
    """Why Cubicle cannot run `task` as written ([] when it can): unknown setup steps,
    getters or metrics, or parameters their models reject."""
    problems = [p for step in task.config if (p := check_step(step))]
    problems += [p for step in task.evaluator.postconfig if (p := check_step(step))]
    try:
        metrics = task.evaluator.metrics()
    except CubicleError as exc:
        return [*problems, exc.message]
    for metric in metrics:
        if metric.func not in known():
            problems.append(f"metric {metric.func!r} is not supported")
        if metric.func == "python" and not isinstance(metric.options.get("code"), str):
            problems.append("metric 'python' needs options.code, the snippet to run")
        for config in (metric.result, metric.expected):
            if config and (problem := check_getter(config)):
                problems.append(problem)
    return problems


async def evaluate(ctx: TaskContext, task: EvalTask, *, agent_gave_up: bool) -> Verdict:
    """Run the task's checker on its desktop; `CheckerError` (or `SetupFailed`) when the
    checker itself could not run."""
    evaluator = task.evaluator
    await run_steps(ctx, evaluator.postconfig, phase="postconfig")
    if evaluator.func == "infeasible":
        if agent_gave_up:
            return Verdict(1.0, "infeasible: the agent said it cannot be done")
        return Verdict(0.0, "infeasible: the agent did not say it cannot be done")
    if agent_gave_up:
        return Verdict(0.0, "the agent gave up (fail) on a feasible task")
    scores: list[float] = []
    notes: list[str] = []
    for metric in evaluator.metrics():
        score = await _score(ctx, metric)
        scores.append(score)
        notes.append(f"{metric.func}: {score:g}")
        if evaluator.conj == "and" and score == 0.0:
            return Verdict(0.0, "; ".join(notes))
        if evaluator.conj == "or" and score >= PASS_SCORE:
            return Verdict(1.0, "; ".join(notes))
    total = sum(scores) / len(scores) if evaluator.conj == "and" else max(scores)
    return Verdict(total, "; ".join(notes))


async def _score(ctx: TaskContext, metric: Metric) -> float:
    result = await get(ctx, metric.result) if metric.result else None
    if metric.func == "python":
        return await _python(ctx, metric.options["code"], result)
    function = METRICS.get(metric.func)
    if function is None:
        raise CheckerError(f"metric {metric.func!r} is not supported")
    args: tuple[Any, ...] = (result,)
    if metric.expected:
        args += (await get(ctx, metric.expected),)
    try:
        score = await asyncio.to_thread(function, *args, **metric.options)
    except (KeyError, TypeError, ValueError, SyntaxError) as exc:
        raise CheckerError(f"metric {metric.func} could not run: {exc!r}") from exc
    return float(score)


async def _python(ctx: TaskContext, code: str, result: Any) -> float:
    ran = await ctx.python(code, json.dumps(result, default=str), timeout_s=_PYTHON_TIMEOUT_S)
    if ran.timed_out:
        raise CheckerError(f"the python checker ran over {_PYTHON_TIMEOUT_S:g} s")
    lines = ran.stdout.strip().splitlines()
    if ran.exit_code == 0 and lines:
        try:
            return min(1.0, max(0.0, float(lines[-1])))
        except ValueError:
            pass
    return 1.0 if ran.exit_code == 0 else 0.0
