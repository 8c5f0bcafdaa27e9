"""Evaluation runs end to end: the real service, its board, real desktops and the real agent;
only the model is scripted (`FakeModelServer`, answered per task by its instruction).

A scripted agent that does each task scores 100 % through `cubicle eval`, one that does
nothing 0 %; two attempts at two at once give the right pass@k, and a service SIGKILLed in
the middle of a run finishes it after a restart without losing or redoing a verdict.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence

import httpx
import pytest

from tests.agent.board_api import empty_board, say, set_board, use_fake_model
from tests.agent.evals.helpers import PERFECT, SUITE, PerTask, report_of, wait_done
from tests.agent.fake_model import FakeModelServer, Turn
from tests.conftest import Service, start_service, stop_service, wait_until


@pytest.fixture(autouse=True)
def _board_emptied_after(api: httpx.Client) -> Iterator[None]:
    yield
    empty_board(api)


def _cubicle(service: Service, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token}
    return subprocess.run(
        [sys.executable, "-m", "cubicle.cli", "eval", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_perfect_agent_scores_100_percent_through_the_cli_and_a_wrong_one_0(
    service: Service, api: httpx.Client, fake_model: FakeModelServer
):
    use_fake_model(api, fake_model)
    set_board(api, concurrency=2, record=True, keep_desktop_s=0)
    fake_model.respond_with(PerTask(PERFECT, say("Looks done.", type="done", summary="?")))
    sample = ",".join(PERFECT)
    ran = _cubicle(
        service,
        str(SUITE),
        "--tasks", sample,
        "--model-url", fake_model.url,
        "--model", "fake-model",
        "--grounder", "a11y",
        "--allow-exec",
        "--concurrency", "2",
        "--name", "perfect",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr + ran.stdout
    assert "score: 4/4 passed = 100.0 %" in ran.stdout, ran.stdout
    assert "report: " in ran.stdout and "/web/evals.html?run=eval-" in ran.stdout
    perfect_id = ran.stdout.split("run ", 1)[1].split(":", 1)[0]
    report = report_of(api, perfect_id)
    assert report["summary"]["rate"] == 1.0 and report["summary"]["scored"] == 4
    assert {item["status"] for item in report["items"]} == {"passed"}
    for item in report["items"]:
        assert item["agent_run_id"] and item["recording_id"] and item["steps"] >= 1
        steps = api.get(f"/api/runs/{item['agent_run_id']}").json()["steps"]
        assert len(steps) == item["steps"]

    fake_model.respond_with(PerTask({}, say("Looks done.", type="done", summary="nothing")))
    created = api.post(
        "/api/evals",
        json={"suite": "evals", "task_ids": list(PERFECT), "name": "wrong", "concurrency": 2},
    )
    assert created.status_code == 201, created.text
    wrong = wait_done(api, created.json()["id"])
    assert wrong["summary"]["rate"] == 0.0 and wrong["summary"]["scored"] == 4
    assert {item["status"] for item in wrong["items"]} == {"failed"}
    assert wrong["summary"]["ci_low"] == 0.0 and 0.4 < wrong["summary"]["ci_high"] < 0.6

    comparison = api.get("/api/evals/compare", params={"a": perfect_id, "b": wrong["run"]["id"]})
    flipped = {flip["task_id"] for flip in comparison.json()["flipped"]}
    assert flipped == set(PERFECT)


def test_stopping_a_run_keeps_its_verdicts_and_resuming_runs_only_the_rest(
    api: httpx.Client, fake_model: FakeModelServer
):
    use_fake_model(api, fake_model)
    set_board(api, concurrency=1, record=False)
    held = Turn.hang(30, say("Late.", type="done", summary="late"))
    fake_model.respond_with(
        PerTask({"terminal-today": [held]}, say("Done.", type="done", summary="nothing"))
    )
    tasks = ["terminal-mkdir", "terminal-today", "files-delete"]  # the suite's order
    run = api.post("/api/evals", json={"suite": "evals", "task_ids": tasks, "concurrency": 1})
    run_id = run.json()["id"]

    def first_scored_second_running() -> dict | None:
        items = {i["task_id"]: i for i in report_of(api, run_id)["items"]}
        ready = items["terminal-mkdir"]["status"] == "failed"
        return items if ready and items["terminal-today"]["status"] == "running" else None

    before = wait_until(first_scored_second_running, 90, 0.2, "one verdict, one attempt running")
    stopped = api.post(f"/api/evals/{run_id}/stop")
    assert stopped.status_code == 200 and stopped.json()["status"] == "stopped"
    items = {i["task_id"]: i for i in report_of(api, run_id)["items"]}
    assert items["terminal-mkdir"] == before["terminal-mkdir"]
    assert items["terminal-today"]["status"] == "pending"
    assert items["files-delete"]["status"] == "pending"
    assert api.post(f"/api/evals/{run_id}/stop").status_code == 409

    fake_model.respond_with(PerTask({}, say("Done.", type="done", summary="nothing")))
    assert api.post(f"/api/evals/{run_id}/resume").json()["status"] == "running"
    done = wait_done(api, run_id)
    items = {i["task_id"]: i for i in done["items"]}
    assert items["terminal-mkdir"] == before["terminal-mkdir"]  # not run again
    assert {i["status"] for i in items.values()} == {"failed"}
    card = api.get(f"/api/tasks/{items['terminal-today']['board_task_id']}").json()
    assert card["attempts"] == 2  # the cancelled card, retried


def test_two_attempts_at_two_at_once_survive_a_sigkilled_service(fake_model: FakeModelServer):
    """A#1 passes, A#2 does nothing; B never passes. B#1 is mid-run when the service is
    SIGKILLed; after the restart the run finishes with A#1's verdict untouched."""
    scripts: dict[str, Sequence[str | Turn]] = {
        "terminal-mkdir": [
            say("Shell.", type="exec", command="mkdir -p ~/projects/cubicle"),
            say("Made.", type="done", summary="made"),
        ],
        "files-delete": [Turn.hang(60, say("Late.", type="done", summary="late"))],
    }
    answers = PerTask(scripts, say("Done.", type="done", summary="nothing"))
    fake_model.respond_with(answers)
    service = start_service()
    api = service.client()
    try:
        profile = {
            "base_url": fake_model.url,
            "planner_model": "fake-model",
            "grounder": "a11y",
            "allow_exec": True,
        }
        assert api.put("/api/board/profiles/default", json=profile).json()["ready"]
        set_board(api, concurrency=2, record=False)
        body = {
            "suite": "evals",
            "task_ids": ["terminal-mkdir", "files-delete"],
            "attempts": 2,
            "concurrency": 2,
        }
        run_id = api.post("/api/evals", json=body).json()["id"]

        def a1_passed_b1_asking() -> dict | None:
            items = {(i["task_id"], i["attempt"]): i for i in report_of(api, run_id)["items"]}
            a1, b1 = items[("terminal-mkdir", 1)], items[("files-delete", 1)]
            asking = b1["status"] == "running" and answers.asked["files-delete"] == 1
            return items if a1["status"] == "passed" and asking else None

        before = wait_until(a1_passed_b1_asking, 90, 0.2, "A#1 passed while B#1 waits")
        service.process.send_signal(signal.SIGKILL)
        service.process.wait()
        api.close()

        service = start_service(data_dir=service.data_dir, token=service.token)
        api = service.client()
        done = wait_done(api, run_id)
        items = {(i["task_id"], i["attempt"]): i for i in done["items"]}
        assert len(items) == 4 and all(i["status"] in ("passed", "failed") for i in items.values())
        assert items[("terminal-mkdir", 1)] == before[("terminal-mkdir", 1)]
        assert items[("terminal-mkdir", 2)]["status"] == "failed"
        assert items[("files-delete", 1)]["status"] == "failed"
        b1_card = api.get(f"/api/tasks/{items[('files-delete', 1)]['board_task_id']}").json()
        assert b1_card["attempts"] == 2  # interrupted by the kill, then retried
        a1_card = api.get(f"/api/tasks/{items[('terminal-mkdir', 1)]['board_task_id']}").json()
        assert a1_card["attempts"] == 1
        summary = done["summary"]
        assert (summary["passed"], summary["scored"]) == (1, 4)
        assert summary["pass_at"] == {"1": 0.25, "2": 0.5}
        report = json.loads((service.data_dir / "evals" / run_id / "report.json").read_text())
        assert report["summary"] == summary
    finally:
        api.close()
        stop_service(service)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({}, 422, "suite"),
        ({"suite": "nope"}, 422, "no suite 'nope'"),
        ({"suite": "evals", "task_ids": ["missing"]}, 422, "no task 'missing'"),
        ({"suite": "evals", "attempts": 0}, 422, "attempts"),
        ({"tasks": [{"id": "x", "instruction": "y"}]}, 422, "evaluator"),
        ({"tasks": [], "files": {"a": "%%%"}}, 422, "base64"),
        ({"tasks": [], "files": {"../../etc/cron.d/x": "eA=="}}, 422, "inside the suite"),
        ({"suite": "evals", "profile": "ghost"}, 422, "unknown profile"),
    ],
)
def test_bad_requests_get_a_clear_4xx(api: httpx.Client, body: dict, status: int, words: str):
    response = api.post("/api/evals", json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]
    assert api.get("/healthz").status_code == 200


def test_a_task_cannot_read_the_services_own_files(api: httpx.Client, fake_model: FakeModelServer):
    use_fake_model(api, fake_model)
    fake_model.respond_with(PerTask({}, say("Done.", type="done", summary="nothing")))
    task = {
        "id": "steal",
        "instruction": "Look at the file.",
        "config": [
            {"type": "upload_file", "parameters": {"files": [
                {"local_path": "/etc/shadow", "path": "/home/user/shadow"}]}},
        ],
        "evaluator": {"func": "exact_match", "result": {"type": "vm_file_exists",
                      "path": "/home/user/shadow"}, "expected": {"type": "rule",
                      "rules": {"expected": True}}},
    }  # fmt: skip
    escape = {**task, "id": "escape", "config": [{"type": "upload_file", "parameters": {
        "files": [{"local_path": "../../token", "path": "/home/user/token"}]}}]}  # fmt: skip
    run = api.post("/api/evals", json={"tasks": [task, escape], "name": "steal"}).json()
    report = wait_done(api, run["id"], 120)
    for item in report["items"]:
        assert item["status"] == "error", item
        assert "not a file of the suite" in item["detail"]
    assert api.get("/healthz").status_code == 200


def test_unsupported_tasks_are_reported_not_scored(api: httpx.Client, fake_model: FakeModelServer):
    use_fake_model(api, fake_model)
    task = {
        "id": "needs-gdrive",
        "instruction": "Upload the file to Google Drive.",
        "config": [{"type": "googledrive", "parameters": {}}],
        "evaluator": {"func": "compare_pptx_files", "result": {"type": "googledrive_file"}},
    }
    run = api.post("/api/evals", json={"tasks": [task], "name": "unsupported"}).json()
    report = wait_done(api, run["id"], 30)
    assert report["summary"]["unsupported"] == 1 and report["summary"]["scored"] == 0
    assert report["summary"]["rate"] is None
    (row,) = report["tasks"]
    assert row["status"] == "unsupported"
    assert any("googledrive" in p for p in row["unsupported"])
    assert any("compare_pptx_files" in p for p in row["unsupported"])
    assert fake_model.requests == []  # no agent ran
