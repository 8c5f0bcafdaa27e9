"""Driving the task board from tests: the fake model as the default profile, settings,
adding tasks and waiting for their status. The `board` fixture (tests/conftest.py) uses them."""

from __future__ import annotations

import json

import httpx

from tests.agent.fake_model import FakeModelServer
from tests.conftest import wait_until

FINISHED = ("done", "failed", "cancelled", "interrupted")


def say(thought: str, **action) -> str:
    return json.dumps({"thought": thought, "action": action})


def use_fake_model(api: httpx.Client, server: FakeModelServer) -> None:
    profile = {"base_url": server.url, "planner_model": "fake-model", "grounder": "a11y"}
    response = api.put("/api/board/profiles/default", json=profile)
    assert response.status_code == 200, response.text
    assert response.json()["ready"] is True


def set_board(api: httpx.Client, **changes) -> dict:
    settings = api.get("/api/board/settings").json() | changes
    response = api.put("/api/board/settings", json=settings)
    assert response.status_code == 200, response.text
    return response.json()


def add(api: httpx.Client, text: str, **fields) -> dict:
    response = api.post("/api/tasks", json={"text": text, **fields})
    assert response.status_code == 201, response.text
    return response.json()


def wait_status(api: httpx.Client, task_id: int, *statuses: str, timeout_s: float = 60) -> dict:
    def reached() -> dict | None:
        task = api.get(f"/api/tasks/{task_id}").json()
        return task if task["status"] in statuses else None

    return wait_until(reached, timeout_s, 0.1, f"task {task_id} to become {'/'.join(statuses)}")


def desktop_gone(api: httpx.Client, desktop_id: str) -> bool:
    return api.get(f"/api/desktops/{desktop_id}").status_code == 404


def empty_board(api: httpx.Client) -> None:
    """Hold the queue, cancel what runs, delete every task."""
    set_board(api, concurrency=0, resolution=[1280, 800])
    for status in ("running", "paused"):
        for task in api.get("/api/tasks", params={"status": status}).json()["items"]:
            api.post(f"/api/tasks/{task['id']}/cancel")
    api.delete("/api/tasks", params={"status": ",".join(("queued", *FINISHED))})
