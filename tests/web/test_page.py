"""The page the service's URL opens: list desktops, start one, see its screen, kill it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect


@pytest.fixture(scope="module")
def page(browser):
    page = browser.new_page()
    yield page
    page.close()


def test_start_watch_and_kill_a_desktop_from_the_page(page, service, api):
    page.goto(f"{service.url}/?token={service.token}")
    expect(page.locator("#status")).to_contain_text("desktop(s)")
    before = {d["id"] for d in api.get("/api/desktops").json()}
    page.click("#create")
    expect(page.locator("#create")).to_be_enabled(timeout=30_000)  # the create call returned
    (desktop_id,) = {d["id"] for d in api.get("/api/desktops").json()} - before
    mine = page.locator("article.desktop", has=page.locator(".id", has_text=desktop_id))
    expect(mine.locator(".state")).to_have_text("ready", timeout=5_000)
    # The card shows the desktop's screen, scaled to 640 pixels wide.
    expect(mine.locator("img")).to_have_js_property("naturalWidth", 640, timeout=10_000)
    mine.locator(".kill").click()
    expect(mine).to_have_count(0, timeout=15_000)
    assert desktop_id not in {d["id"] for d in api.get("/api/desktops").json()}


def test_a_wrong_token_is_reported_on_the_page(page, service):
    page.goto(f"{service.url}/?token=wrong")
    expect(page.locator("#status")).to_contain_text("wrong token")
