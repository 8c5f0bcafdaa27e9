"""Every checker of the built-in suite, shown to fail and to pass, on real desktops.

Each task runs its own setup on a fresh desktop; its checker must fail on the desktop as
set up, then pass once the task's solution (`solutions.py`) is applied. No agent runs
here: the agent's side is `test_eval_runs.py`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cubicle import AsyncDesktop
from cubicle.evals import chrome
from cubicle.evals.check import evaluate, unsupported
from cubicle.evals.context import TaskContext
from cubicle.evals.setup import run_steps
from cubicle.evals.suite import EvalTask, load_suite
from tests.agent.evals.solutions import SOLUTIONS, Keys, Open, Shell, Tabs
from tests.conftest import Service

REPO = Path(__file__).resolve().parents[3]
SUITE = load_suite(REPO / "evals")
DOMAINS = sorted({task.domain for task in SUITE.tasks})
AT_ONCE = 2
"""Tasks of a domain checked at the same time, each on its own desktop."""


def test_the_built_in_suite_is_whole_and_runnable():
    assert len(SUITE.tasks) >= 30
    assert {"mousepad", "terminal", "thunar", "chromium", "settings"} <= set(DOMAINS)
    assert {task.id for task in SUITE.tasks} == set(SOLUTIONS)
    for task in SUITE.tasks:
        assert unsupported(task) == [], task.id


async def _solve(ctx: TaskContext, task: EvalTask) -> None:
    for step in SOLUTIONS[task.id]:
        match step:
            case Shell(command=command):
                ran = await ctx.run(command, shell=True)
                assert ran.exit_code == 0, (task.id, ran)
            case Keys(calls=calls):
                code = f"import pyautogui, time\npyautogui.PAUSE = 0.05\npyautogui.{calls}\n"
                code = code.replace("; ", "\npyautogui.")
                ran = await ctx.python(code)
                assert ran.exit_code == 0, (task.id, ran)
            case Tabs(urls=urls):
                await chrome.open_tabs(ctx, list(urls))
            case Open(path=path):
                before = await ctx.window_marks()
                await ctx.desktop.open(path)
                assert await ctx.wait_for_window_change(before, 10)
    await ctx.desktop.wait_for_settle(quiet_ms=200, timeout_ms=5000)


async def _check_task(service: Service, task: EvalTask, scratch: Path) -> str | None:
    """None when the checker failed before the solution and passed after; else why not."""
    desktop = await AsyncDesktop.create(base_url=service.url, token=service.token)
    try:
        ctx = TaskContext(desktop, SUITE.root, scratch / task.id)
        await run_steps(ctx, task.config)
        await desktop.wait_for_settle(quiet_ms=200, timeout_ms=5000)
        before = await evaluate(ctx, task, agent_gave_up=False)
        if before.passed:
            return f"{task.id}: passed before the solution ({before.detail})"
        await _solve(ctx, task)
        infeasible = task.evaluator.func == "infeasible"
        after = await evaluate(ctx, task, agent_gave_up=infeasible)
        if not after.passed:
            return f"{task.id}: failed after the solution ({after.detail})"
        return None
    finally:
        await desktop.kill()


@pytest.mark.parametrize("domain", DOMAINS)
async def test_each_checker_fails_before_and_passes_after_the_solution(
    service: Service, domain: str, tmp_path: Path
):
    tasks = [task for task in SUITE.tasks if task.domain == domain]
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(task: EvalTask) -> str | None:
        async with gate:
            return await _check_task(service, task, tmp_path)

    problems = [p for p in await asyncio.gather(*(one(t) for t in tasks)) if p]
    assert problems == []
