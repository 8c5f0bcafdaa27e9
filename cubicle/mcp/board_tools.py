"""MCP tools for the task board: add a task for the built-in agent, list tasks, read one
with its steps, cancel one. They call the board's REST API (`/api/tasks`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.types import CallToolResult
from pydantic import Field

from cubicle.mcp.session import Desktops, guarded, result


def _line(task: dict[str, Any]) -> str:
    outcome = f": {task['result']}" if task.get("result") else ""
    return f"#{task['id']} [{task['status']}] {task['text'][:80]}{outcome}"


class BoardTools:
    """The task board, as MCP tools: hand a task to the built-in agent and follow it."""

    def __init__(self, desktops: Desktops) -> None:
        self.desktops = desktops

    async def add_task(
        self,
        text: Annotated[str, Field(min_length=1, max_length=10_000)],
        profile: str = "default",
        start: Annotated[
            str | None, Field(description="An app, file or URL to open first.")
        ] = None,
        max_steps: Annotated[int | None, Field(ge=1, le=999)] = None,
    ) -> CallToolResult:
        """Give a task to the built-in agent: it runs on a fresh desktop of its own."""
        async with guarded(self.desktops):
            body: dict[str, Any] = {"text": text, "profile": profile}
            body |= {k: v for k, v in (("start", start), ("max_steps", max_steps)) if v}
            task = await self.desktops.call("POST", "/api/tasks", json=body)
            return result(f"queued {_line(task)}", {"task": task})

    async def list_tasks(
        self,
        status: Annotated[str | None, Field(description="e.g. queued,running,done")] = None,
        limit: Annotated[int, Field(ge=1, le=500)] = 50,
    ) -> CallToolResult:
        """The board's tasks, in board order."""
        async with guarded(self.desktops):
            params: dict[str, Any] = {"limit": limit} | ({"status": status} if status else {})
            page = await self.desktops.call("GET", "/api/tasks", params=params)
            lines = [_line(task) for task in page["items"]]
            text = "\n".join(lines) or "no tasks"
            return result(
                f"{page['total']} tasks\n{text}", {"tasks": page["items"], "total": page["total"]}
            )

    async def get_task(self, task_id: int) -> CallToolResult:
        """One task with the agent's steps so far (action, thought, outcome)."""
        async with guarded(self.desktops):
            task = await self.desktops.call("GET", f"/api/tasks/{task_id}")
            steps = await self.desktops.call("GET", f"/api/tasks/{task_id}/steps")
            lines = [f"  {s['index']}. {s['action']} → {s['outcome']}" for s in steps]
            text = "\n".join([_line(task), *lines])
            return result(
                text, {"task": task, "steps": steps, "desktop_id": task.get("desktop_id")}
            )

    async def cancel_task(self, task_id: int) -> CallToolResult:
        """Cancel a queued or running task."""
        async with guarded(self.desktops):
            task = await self.desktops.call("POST", f"/api/tasks/{task_id}/cancel")
            return result(f"cancelled {_line(task)}", {"task": task})


TOOLS: list[Callable[..., Awaitable[CallToolResult]]] = [
    BoardTools.add_task,
    BoardTools.list_tasks,
    BoardTools.get_task,
    BoardTools.cancel_task,
]
"""The tools, in the order a client lists them."""
