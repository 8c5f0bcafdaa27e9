"""Replaying a board run in a real Chromium: its recording beside its steps, on the runs
page and in the finished card. Choosing a step seeks the video to that step's action;
playing the video marks the step it shows. The model is scripted (`fake_model`)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.agent.board_api import add, empty_board, say, set_board, use_fake_model, wait_status
from tests.conftest import wait_until

SCRIPT = [
    say("Look first.", type="wait", seconds=0.6),
    say("Close whatever is open.", type="key", keys="Escape"),
    say("Give it a moment.", type="wait", seconds=0.8),
    say("Once more, to be sure.", type="key", keys="Escape"),
    say("Nothing is open.", type="done", summary="pressed Escape twice"),
]


@pytest.fixture(scope="module")
def finished_run(api, fake_model_server):
    """One recorded board run shared by the module's tests: (task, run detail)."""
    fake_model_server.reset()
    use_fake_model(api, fake_model_server)
    set_board(api, concurrency=1, record=True, keep_desktop_s=0)
    fake_model_server.script(SCRIPT)
    try:
        task = add(api, "Press Escape twice, a moment apart")
        done = wait_status(api, task["id"], "done", timeout_s=120)
        yield done, api.get(f"/api/runs/{done['run_id']}").json()
    finally:
        empty_board(api)
        fake_model_server.reset()


@pytest.fixture
def page(browser, service):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert errors == [], f"the page threw: {errors}"


def video_ms(page, selector: str) -> float | None:
    """The video's position in ms once it is not seeking, else None."""
    return page.eval_on_selector(
        selector, "v => v.seeking || v.readyState < 1 ? null : v.currentTime * 1000"
    )


def seeked_to(page, selector: str, target_ms: float) -> float:
    found = wait_until(
        lambda: (ms := video_ms(page, selector)) is not None and abs(ms - target_ms) <= 100 and ms,
        timeout_s=10,
        what=f"{selector} at {target_ms:.0f} ms",
    )
    return found


def test_each_step_knows_its_offset_into_the_runs_recording(api, finished_run):
    task, run = finished_run
    assert run["run"]["recording_id"] == task["recording_id"] is not None
    offsets = [step["video_offset_ms"] for step in run["steps"]]
    assert len(offsets) == len(SCRIPT) and None not in offsets
    assert offsets == sorted(offsets) and offsets[0] > 0
    # The offsets are the moments the actions reached the desktop, as its recording logged
    # them: each key press of the run is there within a few tens of milliseconds.
    base = f"/api/desktops/{task['desktop_id']}/recordings/{task['recording_id']}"
    # The task is stored as finished before its recording is closed (its desktop is
    # released after that): the log has its duration once the recording is finished.
    log = wait_until(
        lambda: (
            (got := api.get(f"{base}/actions").json())["recording"]["duration_ms"] is not None
            and got
        ),
        30,
        0.2,
        "the run's recording to be finished",
    )
    presses = [e["offset_ms"] for e in log["actions"] if e["action"]["type"] == "key"]
    assert len(presses) == 2
    assert abs(presses[0] - offsets[1]) < 100 and abs(presses[1] - offsets[3]) < 100
    assert log["recording"]["duration_ms"] > offsets[-1]


def test_the_runs_page_seeks_to_a_step_and_follows_the_video(page, service, finished_run):
    _, run = finished_run
    offsets = [step["video_offset_ms"] for step in run["steps"]]
    page.goto(f"{service.url}/web/runs.html?token={service.token}&run={run['run']['id']}")
    expect(page.locator("#video")).to_be_visible()
    steps = page.locator("#timeline li")
    expect(steps).to_have_count(len(SCRIPT))
    expect(steps.nth(2)).to_contain_text("Give it a moment.")  # the model's words
    expect(steps.nth(2).locator("img")).to_have_js_property("naturalWidth", 1280)

    steps.nth(2).locator("button").click()
    seeked_to(page, "#video", offsets[2])
    expect(steps.nth(2)).to_have_class("current")
    expect(page.locator("#thought")).to_have_text("Give it a moment.")

    # The video, moved by hand, marks the step it shows.
    page.eval_on_selector("#video", "(v, s) => { v.currentTime = s }", offsets[1] / 1000 + 0.05)
    expect(steps.nth(1)).to_have_class("current")
    # Playing from step 1 moves the mark on as the video passes the next steps.
    steps.nth(0).locator("button").click()
    seeked_to(page, "#video", offsets[0])
    page.click("#play")
    expect(steps.nth(1)).to_have_class("current", timeout=10_000)
    page.click("#play")
    expect(page.locator("#play")).to_have_text("Play")


def test_a_finished_card_seeks_its_recording_to_a_step(page, service, finished_run):
    task, run = finished_run
    offsets = [step["video_offset_ms"] for step in run["steps"]]
    page.goto(f"{service.url}/web/board.html?token={service.token}")
    card = page.locator(f'.card[data-id="{task["id"]}"]')
    expect(card.locator("video.recording")).to_be_visible()
    card.locator(".timeline-box summary").click()
    steps = card.locator(".timeline li")
    expect(steps).to_have_count(len(SCRIPT))
    expect(steps.nth(2)).to_contain_text("Give it a moment.")
    steps.nth(2).click()
    seeked_to(page, f'.card[data-id="{task["id"]}"] video.recording', offsets[2])
    expect(steps.nth(2)).to_have_class("seekable current")
