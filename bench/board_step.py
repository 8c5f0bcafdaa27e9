"""`board_step`: what the task board adds to each agent step, outside model time.

One real service (`cubicle serve` in a subprocess, default settings), one board task on a
real desktop, the real board and agent; the planner is the fake model server
(`tests/agent/fake_model.py`), which answers at once. Each step is `key Escape` (no
grounding, an action of a few milliseconds), so what is measured is the cost of a step as
the board runs it: the screenshot, the action and the settle, each a request from the
board's runner to the service (through its in-process door, `cubicle.server.inside`),
plus the board's own bookkeeping between steps (the step stored, the pages told).

Reported, per step, from the task's step records (`GET /api/tasks/{id}/steps`):

- `step_less_model`: from one step's start to the next one's, less the time the step
  waited for the model: everything the board and the agent spend per step.
- `in_step_less_model`: the step's own span (`total_ms - model_ms`), without the board's
  work between steps.
- `between_steps`: `step_less_model - in_step_less_model`: the board's work between steps.

The reference products have no task board; there is no baseline to run beside this.

    python -m bench board_step [--quick]
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict
from datetime import datetime
from typing import Any

from bench._run import Options, progress
from bench._service import Service, running_service
from bench._stats import summarize
from tests.agent.fake_model import FakeModelServer

STEPS = 40
"""`key Escape` steps of the measured task (then `done`); the first is left out."""


def _say(**action: Any) -> str:
    return json.dumps({"thought": "benchmark step", "action": action})


def _script(steps: int) -> list[str]:
    turns = [_say(type="key", keys="Escape") for _ in range(steps)]
    return [*turns, _say(type="done", summary="benchmark over")]


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _configure(service: Service, server: FakeModelServer, steps: int) -> None:
    profile = {"base_url": server.url, "planner_model": "fake-model", "grounder": "a11y"}
    service.client.put("/api/board/profiles/default", json=profile).raise_for_status()
    settings = service.client.get("/api/board/settings").json()
    settings |= {"concurrency": 1, "max_steps": steps + 5}
    service.client.put("/api/board/settings", json=settings).raise_for_status()


def _run_task(service: Service, steps: int, timeout_s: float) -> list[dict[str, Any]]:
    response = service.client.post("/api/tasks", json={"text": "press Escape, again and again"})
    response.raise_for_status()
    task_id = response.json()["id"]
    deadline = time.monotonic() + timeout_s
    while True:
        task = service.client.get(f"/api/tasks/{task_id}").json()
        if task["status"] in ("done", "failed", "cancelled", "interrupted"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"task {task_id} not finished in {timeout_s:.0f} s")
        time.sleep(0.2)
    if task["status"] != "done":
        raise RuntimeError(f"task {task_id} ended {task['status']}: {task['result']}")
    found = service.client.get(f"/api/tasks/{task_id}/steps").json()
    if len(found) != steps + 1:
        raise RuntimeError(f"task {task_id} took {len(found)} steps, not {steps + 1}")
    return found


def run(options: Options) -> dict[str, Any]:
    steps = 10 if options.quick else STEPS
    with running_service() as service, FakeModelServer() as server:
        _configure(service, server, steps)
        service.wait_for_warm_desktop()
        server.reset()
        server.script(_script(steps))
        records = _run_task(service, steps, timeout_s=30 + 5 * steps)
    whole, inside = [], []
    # Step 1 pays for first touches (the desktop's first screenshot); the last one (`done`)
    # is only measured to.
    for step, after in itertools.pairwise(records[1:]):
        span_s = _when(after["started_at"]) - _when(step["started_at"])
        whole.append(span_s - step["model_ms"] / 1000)
        inside.append((step["total_ms"] - step["model_ms"]) / 1000)
    between = [w - i for w, i in zip(whole, inside, strict=True)]
    ours = summarize(whole)
    progress(f"{len(whole)} steps: step less model p50 {ours.p50_ms:.0f} ms")
    return {
        "steps": len(whole),
        "action": "key Escape",
        "step_less_model": asdict(ours),
        "in_step_less_model": asdict(summarize(inside)),
        "between_steps": asdict(summarize(between)),
    }
