"""Board tasks added together: from Add to each task's first screenshot.

The board of a real service runs the tasks (recorded, as by default); the planner is the
fake model server (`tests/agent/fake_model.py`), which ends each task at its first turn, so
what is measured is getting a desktop and looking at it. On a service with the warm pool,
the board asks for its concurrency in spares: the tasks should all take drawn desktops.
Before each batch the pool is drawn again (or, without a pool, the last batch's desktops
are gone), so one batch's boots never run behind the next.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime

from bench._run import progress
from bench._service import Service
from tests.agent.fake_model import FakeModelServer, RecordedRequest

_FINISHED = ("done", "failed", "cancelled", "interrupted")
_KEEP_S = 60
"""Seconds the tasks' desktops stay listed, to read whether each came from the pool."""


@dataclass(frozen=True)
class Batch:
    """One batch of tasks added together."""

    first_screenshot_s: tuple[float, ...]
    """Add → each task's first screenshot (its step 1 start plus observe time), seconds."""
    from_pool: int
    """How many of the tasks' desktops were taken from the warm pool."""


def _done_at_once(request: RecordedRequest) -> str:
    return json.dumps({"thought": "benchmark", "action": {"type": "done", "summary": "over"}})


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def configure(service: Service, server: FakeModelServer, concurrency: int) -> None:
    """The board on the fake model, `concurrency` tasks at once, desktops kept a while."""
    profile = {"base_url": server.url, "planner_model": "fake-model", "grounder": "a11y"}
    service.client.put("/api/board/profiles/default", json=profile).raise_for_status()
    settings = service.client.get("/api/board/settings").json()
    changes = {"concurrency": concurrency, "keep_desktop_s": _KEEP_S, "record": True}
    service.client.put("/api/board/settings", json=settings | changes).raise_for_status()


def _quiet(service: Service, pooled: bool) -> None:
    """Wait until no boot runs: the pool drawn, or no desktop of an earlier batch left."""
    if pooled:
        service.wait_for_warm_desktop()
        return
    deadline = time.monotonic() + 60
    while service.client.get("/api/desktops").json() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)


def _finished(service: Service, ids: list[int], timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = [service.client.get(f"/api/tasks/{i}").json() for i in ids]
        if all(t["status"] in _FINISHED for t in tasks):
            return tasks
        if time.monotonic() > deadline:
            raise RuntimeError(f"tasks not finished in {timeout_s:.0f} s: {tasks}")
        time.sleep(0.05)


def batch(service: Service, server: FakeModelServer, count: int, *, pooled: bool) -> Batch:
    """Add `count` tasks in one call and time each one's first screenshot."""
    _quiet(service, pooled)
    server.reset()
    server.respond_with(_done_at_once)
    tasks = [{"text": f"together {n}"} for n in range(count)]
    added = time.time()
    response = service.client.post("/api/tasks/batch", json={"tasks": tasks})
    response.raise_for_status()
    ids = [t["id"] for t in response.json()["tasks"]]
    finished = _finished(service, ids, 120)
    seen, from_pool = [], 0
    for task in finished:
        if task["status"] != "done":
            raise RuntimeError(f"task {task['id']} ended {task['status']}: {task['result']}")
        step = service.client.get(f"/api/tasks/{task['id']}/steps").json()[0]
        seen.append(_when(step["started_at"]) + step["observe_ms"] / 1000 - added)
        desktop = service.client.get(f"/api/desktops/{task['desktop_id']}").json()
        from_pool += bool(desktop.get("from_pool"))
        service.kill_desktop(task["desktop_id"])
    shown = ", ".join(f"{s * 1000:.0f}" for s in seen)
    kind = "pool" if pooled else "cold"
    progress(f"{count} tasks together ({kind}): first screenshots at {shown} ms")
    return Batch(tuple(seen), from_pool)
