"""`board`: the task board's own cost: Add → the agent's first screenshot, and 20 tasks at 2.

One real service (`cubicle serve` in a subprocess, default settings: warm pool of one,
runs recorded), real desktops, the real board and agent; the planner is the fake model
server (`tests/agent/fake_model.py`), which answers at once, so what is measured is the board.

1. Overhead from Add to the first screenshot: `POST /api/tasks` while the board is idle and
   the warm pool holds a drawn desktop (as a person adding one task finds it), until the
   agent holds its first screenshot (step 1's start plus its observe time, from the step
   record). Desktop creation, the recording's start and the agent's set-up are inside.
   Also reported: Add → the first request at the model server (the screenshot sent).
2. Throughput: 20 tasks queued at once with concurrency 2. Each task is two model turns
   and a 1 s `wait` action. Reported: all 20 done (none lost), the wall time from the
   first Add to the last task's end, the sum of the tasks' own run times (start → end),
   and the wall time against sum / 2.

The reference products have no task board; there is no baseline to run beside this.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from datetime import datetime
from typing import Any

from bench._run import Options, Target, progress
from bench._service import Service, running_service
from bench._stats import summarize
from tests.agent.fake_model import FakeModelServer, RecordedRequest

TARGET_FIRST_SCREENSHOT_S = 2.0
BATCH = 20
CONCURRENCY = 2
_WORK_S = 1
"""Seconds each batch task spends in its `wait` action."""


def _say(**action: Any) -> str:
    return json.dumps({"thought": "benchmark", "action": action})


def _planner(request: RecordedRequest) -> str:
    """Step 1: wait a second; step 2: done. Decided from the request, so that runs may
    interleave."""
    if "What happened at step 1" in request.text:
        return _say(type="done", summary="benchmark task over")
    return _say(type="wait", seconds=_WORK_S)


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _wait_finished(service: Service, task_ids: list[int], timeout_s: float) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = [service.client.get(f"/api/tasks/{i}").json() for i in task_ids]
        if all(t["status"] in ("done", "failed", "cancelled", "interrupted") for t in tasks):
            return tasks
        if time.monotonic() > deadline:
            states = [t["status"] for t in tasks]
            raise RuntimeError(f"tasks not finished within {timeout_s:.0f} s: {states}")
        time.sleep(0.1)


def _configure(service: Service, server: FakeModelServer, concurrency: int) -> None:
    profile = {"base_url": server.url, "planner_model": "fake-model", "grounder": "a11y"}
    response = service.client.put("/api/board/profiles/default", json=profile)
    response.raise_for_status()
    settings = service.client.get("/api/board/settings").json()
    service.client.put(
        "/api/board/settings", json=settings | {"concurrency": concurrency}
    ).raise_for_status()


def _first_screenshot(service: Service, server: FakeModelServer, samples: int) -> dict:
    to_screenshot, to_request = [], []
    for n in range(samples):
        service.wait_for_warm_desktop()
        server.reset()
        server.respond_with(_planner)
        added_wall, added = time.time(), time.monotonic()
        response = service.client.post("/api/tasks", json={"text": f"first look {n}"})
        response.raise_for_status()
        task_id = response.json()["id"]
        request = server.wait_for_requests(1, timeout_s=60)[0]
        to_request.append(request.received_at - added)
        task = _wait_finished(service, [task_id], 60)[0]
        if task["status"] != "done":
            raise RuntimeError(f"task {task_id} ended {task['status']}: {task['result']}")
        step = service.client.get(f"/api/tasks/{task_id}/steps").json()[0]
        seen = _when(step["started_at"]) + step["observe_ms"] / 1000
        to_screenshot.append(seen - added_wall)
        progress(f"add → first screenshot {to_screenshot[-1] * 1000:.0f} ms")
    ours = summarize(to_screenshot)
    return {
        "add_to_first_screenshot": asdict(ours),
        "add_to_first_model_request": asdict(summarize(to_request)),
        "target": asdict(
            Target(
                f"add → first screenshot p50 ≤ {TARGET_FIRST_SCREENSHOT_S:g} s",
                ours.p50_ms <= TARGET_FIRST_SCREENSHOT_S * 1000,
            )
        ),
    }


def _batch(service: Service, server: FakeModelServer, size: int) -> dict:
    service.wait_for_warm_desktop()
    server.reset()
    server.respond_with(_planner)
    started = time.time()
    tasks = [{"text": f"batch task {n}"} for n in range(size)]
    response = service.client.post("/api/tasks/batch", json={"tasks": tasks})
    response.raise_for_status()
    ids = [t["id"] for t in response.json()["tasks"]]
    finished = _wait_finished(service, ids, 60 * size)
    done = [t for t in finished if t["status"] == "done"]
    runs = [_when(t["finished_at"]) - _when(t["started_at"]) for t in finished]
    wall = max(_when(t["finished_at"]) for t in finished) - started
    ideal = sum(runs) / CONCURRENCY
    progress(f"{len(done)}/{size} done in {wall:.1f} s; sum of runs / {CONCURRENCY} {ideal:.1f} s")
    return {
        "tasks": size,
        "concurrency": CONCURRENCY,
        "done": len(done),
        "lost": size - len(finished),
        "wall_s": round(wall, 2),
        "sum_of_task_runs_s": round(sum(runs), 2),
        "sum_over_concurrency_s": round(ideal, 2),
        "wall_over_ideal": round(wall / ideal, 3),
        "task_run_s": asdict(summarize(runs)),
        "work_per_task_s": _WORK_S,
        "target": asdict(
            Target(
                f"{size} tasks at concurrency {CONCURRENCY}: all done, wall ≈ sum / "
                f"{CONCURRENCY} + per-task overhead",
                len(done) == size,
            )
        ),
    }


def run(options: Options) -> dict[str, Any]:
    samples = 3 if options.quick else 10
    size = 6 if options.quick else BATCH
    with running_service() as service, FakeModelServer() as server:
        _configure(service, server, concurrency=1)
        first = _first_screenshot(service, server, samples)
        _configure(service, server, concurrency=CONCURRENCY)
        batch = _batch(service, server, size)
    return {"first_screenshot": first, "batch": batch}
