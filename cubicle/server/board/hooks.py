"""What another room (an evaluation run) does around the board's run of one of its tasks.

A task with a tag `<prefix>:…` runs with the hooks registered under `<prefix>`
(`Board.hooks`): they set its fresh desktop up before the agent starts, check the desktop
once the agent is done (the desktop is still up), and hear the task's final status. The
board stays the one scheduler: hooks never start or stop a desktop themselves.
"""

from __future__ import annotations

from typing import Protocol

from cubicle import AsyncDesktop
from cubicle.agent.steps import RunRecord, StepRecord
from cubicle.protocol.board import Task


class TaskHooks(Protocol):
    async def before_agent(self, task: Task, desktop: AsyncDesktop) -> None:
        """Set the task's desktop up; a `CubicleError` fails the task with its message."""

    async def after_agent(
        self, task: Task, desktop: AsyncDesktop, record: RunRecord, last: StepRecord | None
    ) -> str | None:
        """Look at the desktop the agent left (`last`: its final step); returns a note added
        to the task's result."""

    async def ended(self, task: Task) -> None:
        """The task's final status is stored (whatever ended it) and its desktop released."""


def tag_prefix(tag: str | None) -> str | None:
    """The part of a tag that names its hooks: `eval` of `eval:…`."""
    return tag.split(":", 1)[0] if tag else None
