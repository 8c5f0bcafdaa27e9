"""Tokens stay out of URLs, pages carry a CSP, and share links can be listed and revoked."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from playwright.sync_api import expect

from tests.conftest import wait_until
from tests.security.attack import create, still_answering

pytestmark = pytest.mark.root_only  # Chromium runs once, in the root part


def test_a_token_link_becomes_an_httponly_cookie_and_leaves_the_address(browser, service, victim):
    context = browser.new_context()
    page = context.new_page()
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    answer = page.goto(f"{service.url}/?token={service.token}")
    assert answer is not None and answer.ok
    expect(page.locator("#status")).to_contain_text("desktop", timeout=15_000)
    assert "token" not in page.url
    (cookie,) = [c for c in context.cookies() if c["name"] == "cubicle_admin"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""  # no script can read it
    # The board: an event stream, pictures and links, all without the token.
    page.goto(f"{service.url}/web/board.html")
    page.wait_for_timeout(1500)
    page.goto(f"{service.url}/view/{victim['id']}")
    expect(page.locator("#transport")).not_to_have_text("connecting…", timeout=20_000)
    assert len(urls) > 5
    assert [u for u in urls if service.token in u] == [urls[0]]  # only the link it opened
    headers = answer.headers
    assert "frame-ancestors 'self'" in headers["content-security-policy"]
    assert "script-src 'self'" in headers["content-security-policy"]
    assert headers["referrer-policy"] == "no-referrer"
    context.close()


def test_another_site_cannot_frame_the_service(browser, service):
    context = browser.new_context()
    page = context.new_page()
    page.set_content(f'<iframe name="board" src="{service.url}/web/board.html"></iframe>')
    page.wait_for_timeout(1500)
    (framed,) = [f for f in page.frames if f.name == "board"]
    assert framed.url.startswith("chrome-error://")  # Chromium refused to show it
    assert "task board" not in framed.content()
    context.close()


def test_api_calls_refuse_a_token_in_the_url(service, api):
    anonymous = httpx.get(f"{service.url}/api/desktops?token={service.token}")
    assert anonymous.status_code == 401


def test_cookie_calls_that_change_things_must_come_from_the_pages(service, victim):
    cookies = {"cubicle_admin": service.token}
    with httpx.Client(base_url=service.url, cookies=cookies) as browser_like:
        assert browser_like.get("/api/desktops").status_code == 200
        forged = browser_like.delete(
            f"/api/desktops/{victim['id']}", headers={"origin": "http://evil.example"}
        )
        assert forged.status_code == 403
    assert (
        httpx.get(
            f"{service.url}/api/desktops/{victim['id']}",
            headers={"authorization": f"Bearer {service.token}"},
        ).json()["status"]
        == "ready"
    )


def _watch(service, link: dict, desktop_id: str, seen: list[int], done: threading.Event):
    """Read the MJPEG stream with a share link until it ends; count the bytes."""
    cookies = {f"cubicle_share_{desktop_id}": link["token"]}
    try:
        with (
            httpx.Client(base_url=service.url, cookies=cookies, timeout=60) as client,
            client.stream("GET", f"/api/desktops/{desktop_id}/mjpeg") as stream,
        ):
            for chunk in stream.iter_bytes():
                seen.append(len(chunk))
    except httpx.HTTPError:
        pass
    finally:
        done.set()


def test_share_links_are_listed_and_revoked_at_once(service, api, victim, neighbour):
    base = f"/api/desktops/{victim['id']}"
    link = api.post(f"{base}/share", json={"mode": "view", "ttl_s": 3600}).json()
    listed = api.get(f"{base}/shares").json()
    assert [entry["id"] for entry in listed] == [link["id"]]
    assert listed[0]["token"] is None and "token" not in listed[0]["url"]
    seen: list[int] = []
    ended = threading.Event()
    watcher = threading.Thread(target=_watch, args=(service, link, victim["id"], seen, ended))
    watcher.start()
    wait_until(lambda: sum(seen) > 0, 20, what="the share link's MJPEG stream")
    assert api.delete(f"{base}/shares/{link['id']}").status_code == 204
    assert ended.wait(10), "the revoked link's stream kept going"
    watcher.join(5)
    bearer = {"authorization": f"Bearer {link['token']}"}
    again = httpx.get(f"{service.url}{base}/live", headers=bearer)
    assert again.status_code == 401 and "revoked" in again.json()["detail"]
    assert api.get(f"{base}/shares").json() == []
    assert api.delete(f"{base}/shares/{link['id']}").status_code == 404
    still_answering(api, victim["id"], neighbour["id"])


def test_a_view_only_watcher_does_not_keep_a_desktop_alive(service, api):
    info = create(api, timeout_s=10)
    link = api.post(f"/api/desktops/{info['id']}/share", json={"mode": "view"}).json()
    seen: list[int] = []
    ended = threading.Event()
    watcher = threading.Thread(target=_watch, args=(service, link, info["id"], seen, ended))
    watcher.start()
    bearer = {"authorization": f"Bearer {link['token']}"}
    started = time.monotonic()

    def stopped() -> bool:
        httpx.get(f"{service.url}/api/desktops/{info['id']}/live", headers=bearer)  # polling
        return api.get(f"/api/desktops/{info['id']}").json()["status"] == "stopped"

    wait_until(stopped, 40, interval_s=1, what="the idle desktop to stop")
    assert time.monotonic() - started < 30
    assert ended.wait(10)
    watcher.join(5)
    # Its share links went with it.
    assert httpx.get(f"{service.url}/api/session", headers=bearer).status_code == 401


def test_a_file_the_desktop_wrote_downloads_and_never_runs_as_a_page(browser, service, api, victim):
    """The issue's first probe, end to end: an HTML file from the desktop, opened in a
    browser holding the admin cookie, is a download; none of its script runs."""
    page_bytes = b"<html><title>x</title><script>document.title='pwned'</script></html>"
    url = f"/api/desktops/{victim['id']}/files"
    assert api.put(url, params={"path": "~/evil.html"}, content=page_bytes).status_code == 200
    context = browser.new_context(accept_downloads=True)
    page = context.new_page()
    page.goto(f"{service.url}/?token={service.token}")
    expect(page.locator("#status")).to_contain_text("desktop", timeout=15_000)
    with page.expect_download(timeout=15_000) as download:
        page.evaluate(f"window.location.href = '{url}?path=~/evil.html'")
    assert download.value.suggested_filename == "evil.html"
    page.wait_for_timeout(500)
    assert page.title() != "pwned" and page.url.startswith(f"{service.url}/")
    context.close()
