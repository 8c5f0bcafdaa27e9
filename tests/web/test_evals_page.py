"""The evaluation pages in a real Chromium: a run's report (rate, interval, per-task table with
tokens and replay links), the comparison of two runs showing the task that flipped, and
"Run suite" on the board starting a run whose tasks show on the board tagged with it. The
runs are real (real desktops, the real agent); the model is scripted per task."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from tests.agent.board_api import empty_board, say, set_board, use_fake_model
from tests.agent.evals.helpers import PerTask, wait_done
from tests.agent.fake_model import FakeModelServer, Turn
from tests.conftest import Service

TASKS = ["terminal-mkdir", "os-infeasible-photoshop"]
MKDIR = "mkdir -p ~/projects/cubicle"


def _run(api: httpx.Client, name: str) -> str:
    body = {"suite": "evals", "task_ids": TASKS, "name": name, "concurrency": 2}
    created = api.post("/api/evals", json=body)
    assert created.status_code == 201, created.text
    return wait_done(api, created.json()["id"])["run"]["id"]


@pytest.fixture(scope="module")
def runs(api: httpx.Client, fake_model_server: FakeModelServer):
    """Run A does both tasks (reporting token usage), run B neither: both flip."""
    fake_model = fake_model_server
    fake_model.reset()
    profile = {
        "base_url": fake_model.url,
        "planner_model": "fake-model",
        "grounder": "a11y",
        "allow_exec": True,
    }
    assert api.put("/api/board/profiles/default", json=profile).json()["ready"]
    set_board(api, concurrency=2, record=False)
    used = (1200, 30)
    fake_model.respond_with(
        PerTask(
            {
                "terminal-mkdir": [
                    Turn.answer(say("Shell.", type="exec", command=MKDIR), usage=used),
                    Turn.answer(say("Made.", type="done", summary="made"), usage=used),
                ],
                "os-infeasible-photoshop": [
                    Turn.answer(say("No.", type="fail", reason="no Photoshop"), usage=used)
                ],
            },
            say("Done.", type="done", summary="nothing"),
        )
    )
    a = _run(api, "run A: does the tasks")
    fake_model.respond_with(PerTask({}, say("Done.", type="done", summary="nothing")))
    b = _run(api, "run B: does nothing")
    yield a, b
    use_fake_model(api, fake_model)
    empty_board(api)


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], f"the page threw: {errors}"


def test_the_report_shows_the_rate_and_every_task(page, service: Service, runs):
    a, _ = runs
    page.goto(f"{service.url}/web/evals.html?run={a}&token={service.token}")
    expect(page.locator("#name")).to_have_text("run A: does the tasks")
    expect(page.locator("#rate")).to_have_text("100.0 %")
    expect(page.locator("#interval")).to_contain_text("95 % CI")
    rows = page.locator("#items tbody tr")
    expect(rows).to_have_count(2)
    mkdir = page.locator('#items tr[data-task="terminal-mkdir"]')
    expect(mkdir).to_contain_text("passed")
    expect(mkdir).to_contain_text("2400 + 60")  # two planner calls of 1200 + 30 tokens
    steps = mkdir.get_by_role("link", name="steps")
    assert "/web/runs.html?run=" in steps.get_attribute("href")
    expect(page.locator("#domains tbody tr")).to_have_count(2)
    expect(page.locator("#time-plot rect").first).to_be_attached()

    steps.click()
    expect(page.locator("#task")).to_contain_text("projects/cubicle")


def test_the_comparison_shows_the_tasks_that_flipped(page, service: Service, runs):
    a, b = runs
    page.goto(f"{service.url}/web/evals.html?token={service.token}")
    page.get_by_label("pick run A: does the tasks").first.check()
    page.get_by_label("pick run B: does nothing").first.check()
    page.click("#compare")
    expect(page.locator("#flipped-title")).to_contain_text("Flipped tasks: 2 of 2")
    flipped = page.locator('#flipped tr[data-task="terminal-mkdir"]')
    expect(flipped).to_contain_text("passed")
    expect(flipped).to_contain_text("failed")
    expect(page.locator("#sides")).to_contain_text("100.0 %")
    expect(page.locator("#sides")).to_contain_text("0.0 %")
    assert f"a={a}" in page.url and f"b={b}" in page.url


def test_run_suite_on_the_board_starts_a_run_whose_tasks_are_tagged(
    page, service: Service, api: httpx.Client, fake_model: FakeModelServer
):
    use_fake_model(api, fake_model)
    set_board(api, concurrency=0)
    try:
        page.goto(f"{service.url}/web/board.html?token={service.token}")
        page.click("#run-suite summary")
        expect(page.locator("#suite option")).to_have_count(1)
        expect(page.locator("#suite")).to_contain_text("evals: 31 tasks")
        page.fill('#suite-form [name="concurrency"]', "1")
        page.click("#suite-form button")
        expect(page.locator("#suite-status")).to_contain_text("started: 31 tasks")
        report = page.locator("#suite-status a")
        run_id = report.get_attribute("href").split("run=")[1].split("&")[0]
        expect(page.locator(".card", has_text=run_id).first).to_be_visible()
        tasks = api.get("/api/tasks", params={"status": "queued,running"}).json()["items"]
        assert [t["tag"] for t in tasks] == [f"eval:{run_id}:chrome-agree:1"]  # one at once
        assert api.post(f"/api/evals/{run_id}/stop").json()["status"] == "stopped"
    finally:
        empty_board(api)
