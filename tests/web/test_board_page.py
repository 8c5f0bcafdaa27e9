"""The task board page in a real Chromium: add a task and watch it run, take over a running
task, and a queue of 10,000 that stays usable. The model is scripted (`fake_model`)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.agent.board_api import FINISHED, say, set_board, wait_status
from tests.agent.fake_model import Turn
from tests.conftest import wait_until
from tests.web.test_viewer import on_page

NOTE = "written from the task board"


@pytest.fixture
def page(browser, service):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{service.url}/web/board.html?token={service.token}")
    yield page
    context.close()
    assert errors == [], f"the page threw: {errors}"


def column(page, name: str):
    return page.locator(f'[data-column="{name}"]')


def card(page, text: str):
    return page.locator(".card", has_text=text)


def test_a_task_added_in_the_form_goes_queued_running_done(page, board, fake_model):
    # GTK's Save dialog (1096×856 by default) is fitted to the 1280×800 screen by the guest,
    # so its Save button can be clicked.
    set_board(board, concurrency=0, keep_desktop_s=120)
    fake_model.script([
        say("Write the note.", type="type", text=NOTE),
        say("Open the File menu.", type="click", target="the File menu"),
        say("Choose Save As.", type="click", target="the Save As menu item"),
        say("Let the dialog open.", type="wait", seconds=1),
        say("Name the file.", type="type", text="board-note.txt"),
        say("Save.", type="click", target="the Save button"),
        say("Saved.", type="done", summary="saved ~/board-note.txt"),
    ])  # fmt: skip
    page.fill("#text", "Write a note in the editor and save it as ~/board-note.txt")
    page.fill("#start", "mousepad")
    page.click("#add-button")
    queued = column(page, "queued").locator(".card", has_text="board-note.txt")
    expect(queued).to_be_visible()
    expect(queued.locator(".badge")).to_have_text("queued")

    page.click("#settings summary")
    # The form shows the settings as they are now, the change made through the API included.
    expect(page.locator('#settings-form [name="keep_desktop_s"]')).to_have_value("120")
    page.fill('#settings-form [name="concurrency"]', "1")
    page.click('#settings-form button[type="submit"]')
    expect(page.locator("#settings-status")).to_have_text("Settings saved.")

    running = column(page, "running").locator(".card", has_text="board-note.txt")
    expect(running).to_be_visible(timeout=30_000)
    expect(running.locator(".live iframe")).to_be_visible()
    done = column(page, "done").locator(".card", has_text="board-note.txt")
    expect(done).to_be_visible(timeout=90_000)
    expect(done.locator(".result")).to_have_text("saved ~/board-note.txt")
    expect(done.locator(".timeline li")).to_have_count(7)
    expect(done.locator(".timeline li").nth(1)).to_contain_text("a11y")
    expect(done.locator("video.recording")).to_be_visible()

    task = board.get("/api/tasks", params={"status": "done"}).json()["items"][0]
    saved = board.get(
        f"/api/desktops/{task['desktop_id']}/files", params={"path": "~/board-note.txt"}
    )
    assert saved.status_code == 200 and saved.text == NOTE
    board.delete(f"/api/desktops/{task['desktop_id']}")


def test_take_over_pause_control_resume(page, board, fake_model):
    fake_model.script([
        say("Look around first.", type="wait", seconds=1),
        Turn.hang(60, say("Made before the pause.", type="type", text="stale")),
        say("The person is done; so am I.", type="done", summary="finished after a takeover"),
    ])  # fmt: skip
    page.fill("#text", "A task a person takes over")
    page.click("#add-button")
    fake_model.wait_for_requests(2, timeout_s=60)
    running = column(page, "running").locator(".card", has_text="takes over")
    running.get_by_role("button", name="Pause").click()
    expect(running.locator(".badge")).to_have_text("paused")
    task = board.get("/api/tasks", params={"status": "paused"}).json()["items"][0]

    # Enlarge the live view, take control in it, click: the click reaches the desktop.
    expect(running.locator(".live iframe")).to_be_visible()
    running.get_by_role("button", name="Enlarge").click()
    viewer = page.frame_locator("#enlarged iframe")
    expect(viewer.locator("#transport")).to_have_text("WebRTC", timeout=20_000)
    viewer.locator("#take").click()
    expect(viewer.locator("#control-state")).to_have_text("You are in control")
    frame = page.locator("#enlarged iframe")
    box = frame.bounding_box()
    x, y = on_page(frame.element_handle().content_frame(), "#screen", 700, 300)
    page.mouse.click(box["x"] + x, box["y"] + y)

    def cursor() -> tuple[int, int]:
        position = board.get(f"/api/desktops/{task['desktop_id']}/cursor").json()
        return position["x"], position["y"]

    wait_until(lambda: cursor() == (700, 300), 10, what="the click at (700, 300) on the desktop")
    page.click("#shrink")

    running.get_by_role("button", name="Resume").click()
    fake_model.release()  # the answer to what was asked before the pause comes only now
    done = column(page, "done").locator(".card", has_text="takes over")
    expect(done).to_be_visible(timeout=60_000)
    expect(done.locator(".result")).to_have_text("finished after a takeover")
    last = fake_model.requests[-1]
    assert "a person paused the agent" in last.text
    assert "stale" not in "".join(last.texts("assistant"))
    assert wait_status(board, task["id"], *FINISHED)["steps"] == 2


def test_ten_thousand_queued_tasks_leave_the_page_usable(page, board):
    set_board(board, concurrency=0)
    tasks = [{"text": f"bulk task {n}"} for n in range(10_000)]
    assert board.post("/api/tasks/batch", json={"tasks": tasks}).status_code == 201
    page.reload()
    queued = column(page, "queued")
    expect(queued.locator(".count")).to_have_text("10000")
    expect(queued.locator(".card")).to_have_count(50)
    expect(queued.locator(".more")).to_have_text("Show more (9950 left)")
    queued.locator(".more").click()
    expect(queued.locator(".card")).to_have_count(100)

    page.fill("#text", "   ")
    page.click("#add-button")
    expect(page.locator("#form-error")).to_contain_text("text")
    page.fill("#text", "one more, from the page")
    page.click("#add-button")
    expect(queued.locator(".count")).to_have_text("10001")

    first = queued.locator(".card").first
    expect(first).to_contain_text("bulk task 0")
    first.get_by_role("button", name="Cancel").click()
    cancelled = column(page, "failed").locator(".card", has_text="bulk task 0")
    expect(cancelled.locator(".badge")).to_have_text("cancelled")
    cancelled.get_by_role("button", name="Retry").click()
    expect(queued.locator(".card").last).to_contain_text("bulk task 0")
