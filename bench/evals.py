"""`evals`: suite throughput (tasks per hour) at 1, 2 and 4 tasks at once, and the time from
"run" to the first task's first screenshot reaching the model.

One real service (`cubicle serve` in a subprocess) and its task board; the built-in suite's
tasks, each on a fresh recorded desktop, set up, run by the real agent, checked and
released. The model (`tests/agent/fake_model.py`) answers every request at once with
`done`, so the figures are Cubicle's own overhead per task: desktop, setup, screenshot,
planner round trip, checker, recording, release. The same tasks run at each concurrency in
the same service, so the speedups are measured side by side; concurrency 1 is the
baseline (OSWorld's own harness resets a VM snapshot per task, which cannot run here).

    python -m bench evals [--quick]
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from bench._run import Target, machine, progress
from bench._service import Service, running_service
from tests.agent.fake_model import FakeModelServer

LEVELS = (1, 2, 4)
"""Tasks at once."""
TASKS = (
    "mousepad-fix-typo",
    "mousepad-append-line",
    "terminal-mkdir",
    "terminal-count-lines",
    "files-rename",
    "files-delete",
    "chrome-counter",
    "chrome-follow-link",
    "settings-wm-theme",
    "settings-double-click",
    "os-infeasible-photoshop",
    "terminal-extract",
)
"""Two or so per domain of the built-in suite, every kind of setup and checker."""
QUICK_TASKS = TASKS[:4]
DONE = '{"thought": "benchmark", "action": {"type": "done", "summary": "benchmark"}}'


def _run_suite(
    service: Service, server: FakeModelServer, tasks: tuple[str, ...], concurrency: int
) -> dict[str, Any]:
    server.reset()
    server.respond_with(lambda request: DONE)
    body = {
        "suite": "evals",
        "task_ids": list(tasks),
        "concurrency": concurrency,
        "name": f"bench at {concurrency}",
    }
    started = time.monotonic()
    response = service.client.post("/api/evals", json=body)
    if response.status_code != 201:
        raise RuntimeError(f"the run did not start: {response.status_code} {response.text}")
    run_id = response.json()["id"]
    deadline = started + 60 * len(tasks)
    while True:
        report = service.client.get(f"/api/evals/{run_id}").json()
        if report["run"]["status"] == "done":
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} did not finish: {report['run']['counts']}")
        time.sleep(0.2)
    wall = time.monotonic() - started
    first_shot = server.requests[0].received_at - started
    statuses = {item["status"] for item in report["items"]}
    if not statuses <= {"passed", "failed"}:
        raise RuntimeError(f"run {run_id} had errors: {report['items']}")
    progress(
        f"{len(tasks)} tasks at {concurrency}: {wall:.1f} s, first screenshot {first_shot:.2f} s"
    )
    return {
        "tasks": len(tasks),
        "wall_s": round(wall, 2),
        "tasks_per_hour": round(len(tasks) / wall * 3600, 1),
        "seconds_per_task": round(wall / len(tasks), 2),
        "first_screenshot_s": round(first_shot, 3),
    }


def run(quick: bool = False) -> dict[str, Any]:
    tasks = QUICK_TASKS if quick else TASKS
    with running_service() as service, FakeModelServer() as server:
        profile = {"base_url": server.url, "planner_model": "fake-model", "grounder": "a11y"}
        service.client.put("/api/board/profiles/default", json=profile).raise_for_status()
        levels = {}
        for concurrency in LEVELS:
            levels[str(concurrency)] = _run_suite(service, server, tasks, concurrency)
    one = levels["1"]["tasks_per_hour"]
    return {
        "tasks": list(tasks),
        "by_concurrency": levels,
        "speedup_vs_1": {k: round(v["tasks_per_hour"] / one, 2) for k, v in levels.items()},
        "first_screenshot_s_at_1": levels["1"]["first_screenshot_s"],
        "target": asdict(
            Target(
                "more tasks per hour with more at once (4 at once beats 1)",
                levels["4"]["tasks_per_hour"] > one,
            )
        ),
        "machine": asdict(machine()),
    }
