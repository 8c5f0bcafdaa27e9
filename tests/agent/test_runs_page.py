"""Replaying a recorded run in the web page: the list, each step's screenshot and action."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.agent.fake_model import FakeModelServer
from tests.agent.test_cli_run import cubicle_run, say
from tests.conftest import Service


@pytest.fixture
def page(browser):
    page = browser.new_page()
    yield page
    page.close()


def test_a_recorded_run_replays_step_by_step(service: Service, fake_model: FakeModelServer, page):
    fake_model.script([
        say("Start the text editor.", type="launch", app="mousepad"),
        say("Open the File menu.", type="click", target="the File menu"),
        say("Close it again.", type="key", keys="Escape"),
        say("Done.", type="done", summary="looked at the File menu"),
    ])  # fmt: skip
    task = "Look at the File menu of the text editor"
    finished = cubicle_run(
        service, task, "--model-url", fake_model.url, "--model", "fake-model",
        "--grounder", "a11y",
    )  # fmt: skip
    assert finished.returncode == 0, finished.stdout + finished.stderr

    page.goto(f"{service.url}/web/runs.html?token={service.token}")
    entry = page.locator("#run-list a", has_text=task)
    expect(entry).to_contain_text("done · 4 step(s)")
    entry.click()
    expect(page.locator("#outcome")).to_have_text("done: looked at the File menu")
    expect(page.locator("#timeline img")).to_have_count(4)
    expect(page.locator("#position")).to_have_text("step 1 of 4")
    page.click("#next")
    expect(page.locator("#action")).to_contain_text('click "the File menu"')
    expect(page.locator("#action")).to_contain_text("a11y")
    expect(page.locator("#thought")).to_have_text("Open the File menu.")
    # The step's screenshot is loaded, at the desktop's size.
    expect(page.locator("#shot")).to_have_js_property("naturalWidth", 1280)
    page.click("#play")
    expect(page.locator("#position")).to_have_text("step 4 of 4", timeout=10_000)
    expect(page.locator("#play")).to_have_text("Play")
