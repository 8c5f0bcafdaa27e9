"""The service's API in this process (`tests/server/conftest.py`): auth, error answers,
body caps, the board's CRUD, the pool and the OpenAPI document, each in milliseconds.

What needs a desktop stays with the subprocess tests (`tests/desktop`); these check the
same routes, auth and error mapping users meet, without a socket."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from cubicle.protocol.errors import ErrorBody
from tests.server.conftest import MAX_BODY_MB, TOKEN, InProcess

pytestmark = pytest.mark.fast

JSON_TYPE = {"content-type": "application/json"}


def error_of(response: httpx.Response) -> ErrorBody:
    """The answer's `ErrorBody`: every error the service sends has exactly this shape."""
    assert response.headers["content-type"] == "application/json", response.text
    assert set(response.json()) == {"error", "detail"}, response.text
    return ErrorBody.model_validate_json(response.content)


# --- auth -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/api/desktops", "/api/pool", "/api/tasks", "/api/board/settings", "/api/runs"]
)
async def test_an_api_call_without_a_token_is_a_401_saying_how_to_send_one(
    inprocess: InProcess, path: str
):
    response = await inprocess.anonymous.get(path)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = error_of(response)
    assert error.error == "unauthorized"
    assert "Authorization: Bearer" in error.detail


async def test_a_wrong_token_is_a_401_and_a_token_in_the_url_is_not_read(inprocess: InProcess):
    wrong = await inprocess.anonymous.get(
        "/api/desktops", headers={"Authorization": "Bearer not-the-token"}
    )
    assert wrong.status_code == 401
    assert "wrong token" in error_of(wrong).detail
    in_url = await inprocess.anonymous.get("/api/desktops", params={"token": TOKEN})
    assert in_url.status_code == 401


async def test_the_right_token_opens_the_api_and_health_needs_none(inprocess: InProcess):
    listed = await inprocess.api.get("/api/desktops")
    assert listed.status_code == 200 and listed.json() == []
    health = await inprocess.anonymous.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}


async def test_the_admin_cookie_only_changes_things_from_the_services_own_pages(
    inprocess: InProcess,
):
    cookie = {"Cookie": f"cubicle_admin={TOKEN}"}
    read = await inprocess.anonymous.get("/api/desktops", headers=cookie)
    assert read.status_code == 200
    foreign = {**cookie, "Origin": "https://evil.example"}
    changed = await inprocess.anonymous.put(
        "/api/board/settings", headers=foreign, json={"concurrency": 0}
    )
    assert changed.status_code == 403
    assert error_of(changed).error == "forbidden"


async def test_a_page_opened_with_the_token_gets_it_as_an_httponly_cookie(inprocess: InProcess):
    async with inprocess.browser() as browser:
        page = await browser.get("/", params={"token": TOKEN})
        assert browser.cookies["cubicle_admin"] == TOKEN
    assert page.status_code == 200
    cookie = page.headers["set-cookie"]
    assert cookie.startswith(f"cubicle_admin={TOKEN};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "frame-ancestors 'self'" in page.headers["content-security-policy"]


async def test_mcp_and_an_unknown_share_link_are_refused_like_the_rest_of_the_api(
    inprocess: InProcess,
):
    # /mcp checks the token itself (it is an ASGI app, not a FastAPI route): same answer.
    mcp = await inprocess.anonymous.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert mcp.status_code == 401 and error_of(mcp).error == "unauthorized"
    forged = {"Authorization": "Bearer share2.nolink.nosecret"}
    for path in ("/api/desktops", "/mcp"):
        response = await inprocess.anonymous.get(path, headers=forged)
        assert response.status_code == 401, path
        assert "share link is unknown" in error_of(response).detail


# --- error answers ----------------------------------------------------------------------


async def test_an_unknown_desktop_is_a_404_desktop_not_found_on_every_kind_of_call(
    inprocess: InProcess,
):
    for method, path in [
        ("GET", "/api/desktops/nope"),
        ("DELETE", "/api/desktops/nope"),
        ("GET", "/api/desktops/nope/screenshot"),
        ("POST", "/api/desktops/nope/actions"),
    ]:
        body = [{"type": "wait", "ms": 0}] if method == "POST" else None
        response = await inprocess.api.request(method, path, json=body)
        assert response.status_code == 404, (method, path, response.text)
        error = error_of(response)
        assert error.error == "desktop_not_found", (method, path)
        assert "'nope'" in error.detail


async def test_an_unknown_route_and_a_wrong_method_answer_an_error_body(inprocess: InProcess):
    missing = await inprocess.api.get("/api/nothing-here")
    assert missing.status_code == 404 and error_of(missing).error == "not_found"
    wrong = await inprocess.api.put("/api/pool")
    assert wrong.status_code == 405 and error_of(wrong).error == "method_not_allowed"


async def test_malformed_json_is_a_422_that_says_the_body_is_not_json(inprocess: InProcess):
    response = await inprocess.api.post(
        "/api/desktops", content=b'{"resolution": [1280,', headers=JSON_TYPE
    )
    assert response.status_code == 422
    error = error_of(response)
    assert error.error == "invalid_request"
    assert "not valid JSON" in error.detail


async def test_a_bad_field_is_a_422_naming_the_field(inprocess: InProcess):
    response = await inprocess.api.post("/api/desktops", json={"resolution": [1, 1]})
    assert response.status_code == 422
    error = error_of(response)
    assert error.error == "invalid_request" and "resolution" in error.detail
    unknown = await inprocess.api.post("/api/desktops", json={"resolutoin": [1280, 800]})
    assert unknown.status_code == 422 and "resolutoin" in error_of(unknown).detail


async def test_a_body_over_the_cap_is_a_413_whether_declared_or_streamed(inprocess: InProcess):
    cap = MAX_BODY_MB * 1024 * 1024
    huge = b"[" + b"0," * (cap // 2) + b"0]"
    declared = await inprocess.api.post("/api/desktops", content=huge, headers=JSON_TYPE)
    assert declared.status_code == 413
    error = error_of(declared)
    assert error.error == "payload_too_large" and str(cap) in error.detail

    async def pieces() -> AsyncIterator[bytes]:  # chunked: no Content-Length to refuse early
        for start in range(0, len(huge), 64 * 1024):
            yield huge[start : start + 64 * 1024]

    streamed = await inprocess.api.post("/api/desktops", content=pieces(), headers=JSON_TYPE)
    assert streamed.status_code == 413
    assert error_of(streamed).error == "payload_too_large"
    # Just under the cap, the body is read and judged on its content.
    under = await inprocess.api.post(
        "/api/desktops",
        content=json.dumps({"resolution": [1, 1], "pad": "x" * (cap - 100)}).encode(),
        headers=JSON_TYPE,
    )
    assert under.status_code == 422


async def test_every_answer_carries_the_security_headers(inprocess: InProcess):
    for response in (
        await inprocess.api.get("/api/desktops"),
        await inprocess.anonymous.get("/api/desktops"),
        await inprocess.api.get("/api/desktops/nope"),
    ):
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] == "no-referrer"
        assert "default-src 'self'" in response.headers["content-security-policy"]


async def test_agent_and_evaluation_runs_start_empty_and_unknown_ones_are_404(
    inprocess: InProcess,
):
    assert (await inprocess.api.get("/api/runs")).json() == []
    assert (await inprocess.api.get("/api/evals")).json() == []
    for path in ("/api/runs/20260101-000000-abcdef", "/api/evals/nope"):
        response = await inprocess.api.get(path)
        assert response.status_code == 404, path
        assert error_of(response).error.endswith("not_found"), path


# --- the pool ---------------------------------------------------------------------------


async def test_the_pool_says_it_is_off_and_that_the_board_wants_spares(inprocess: InProcess):
    await _hold_the_queue(inprocess.api)
    pool = (await inprocess.api.get("/api/pool")).json()
    assert pool["enabled"] is False
    assert (pool["target"], pool["ready"], pool["booting"]) == (0, 0, 0)
    assert pool["kinds"] == []
    settings = (await inprocess.api.get("/api/board/settings")).json()
    await inprocess.api.put("/api/board/settings", json=settings | {"concurrency": 3})
    assert (await inprocess.api.get("/api/pool")).json()["wanted"] == {"board": 3}
    await _hold_the_queue(inprocess.api)
    assert (await inprocess.api.get("/api/pool")).json()["wanted"] == {}


# --- the board --------------------------------------------------------------------------


async def _hold_the_queue(api: httpx.AsyncClient) -> None:
    """Concurrency 0: added tasks stay queued (nothing here could run them)."""
    settings = (await api.get("/api/board/settings")).json()
    response = await api.put("/api/board/settings", json=settings | {"concurrency": 0})
    assert response.status_code == 200, response.text


@pytest.fixture
async def board(inprocess: InProcess) -> AsyncIterator[httpx.AsyncClient]:
    """The board with its queue held, a ready `default` profile, and no tasks left after."""
    api = inprocess.api
    await _hold_the_queue(api)
    profile = {"base_url": "http://127.0.0.1:9/v1", "planner_model": "m", "grounder": "a11y"}
    assert (await api.put("/api/board/profiles/default", json=profile)).status_code == 200
    yield api
    statuses = "queued,done,failed,cancelled,interrupted"
    await api.delete("/api/tasks", params={"status": statuses})


async def _add(api: httpx.AsyncClient, text: str, **fields: object) -> dict:
    response = await api.post("/api/tasks", json={"text": text, **fields})
    assert response.status_code == 201, response.text
    return response.json()


async def _queue(api: httpx.AsyncClient) -> list[str]:
    page = (await api.get("/api/tasks", params={"status": "queued"})).json()
    return [task["text"] for task in page["items"]]


async def test_tasks_are_added_listed_edited_moved_and_deleted(board: httpx.AsyncClient):
    a, b, c = [await _add(board, f"task {name}") for name in "abc"]
    assert a["status"] == "queued" and a["profile"] == "default" and a["attempts"] == 0
    assert await _queue(board) == ["task a", "task b", "task c"]

    moved = await board.post(f"/api/tasks/{c['id']}/move", json={"to": "top"})
    assert moved.status_code == 200 and moved.json()["id"] == c["id"]
    assert await _queue(board) == ["task c", "task a", "task b"]
    moved = await board.post(f"/api/tasks/{a['id']}/move", json={"after": b["id"]})
    assert moved.status_code == 200
    assert await _queue(board) == ["task c", "task b", "task a"]

    edited = await board.patch(f"/api/tasks/{b['id']}", json={"text": "task b, edited"})
    assert edited.status_code == 200 and edited.json()["text"] == "task b, edited"
    assert (await board.get(f"/api/tasks/{b['id']}")).json()["text"] == "task b, edited"

    assert (await board.delete(f"/api/tasks/{c['id']}")).status_code == 204
    gone = await board.get(f"/api/tasks/{c['id']}")
    assert gone.status_code == 404 and error_of(gone).error == "task_not_found"
    assert await _queue(board) == ["task b, edited", "task a"]
    counts = (await board.get("/api/tasks/counts")).json()
    assert counts["queued"] == 2 and counts["running"] == 0

    cancelled = await board.post(f"/api/tasks/{a['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    retried = await board.post(f"/api/tasks/{a['id']}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "queued"
    deleted = await board.delete("/api/tasks", params={"status": "queued"})
    assert deleted.status_code == 200 and deleted.json() == {"deleted": 2}
    assert await _queue(board) == []


async def test_a_batch_is_queued_in_order_and_the_list_pages(board: httpx.AsyncClient):
    batch = {"tasks": [{"text": f"batch {n}"} for n in range(120)]}
    added = await board.post("/api/tasks/batch", json=batch)
    assert added.status_code == 201
    assert added.json()["added"] == 120 and added.json()["tasks"] == []  # over 100: not echoed
    query = {"status": "queued", "offset": 100, "limit": 50}
    page = (await board.get("/api/tasks", params=query)).json()
    assert page["total"] == 120 and page["offset"] == 100
    assert [task["text"] for task in page["items"]] == [f"batch {n}" for n in range(100, 120)]


async def test_the_board_refuses_what_it_cannot_do_with_the_right_error(
    board: httpx.AsyncClient,
):
    missing = await board.get("/api/tasks/999999")
    assert missing.status_code == 404 and error_of(missing).error == "task_not_found"
    unknown_status = await board.get("/api/tasks", params={"status": "queued,lost"})
    assert unknown_status.status_code == 422
    assert "unknown status 'lost'" in error_of(unknown_status).detail
    unknown_profile = await board.post("/api/tasks", json={"text": "x", "profile": "nobody"})
    assert unknown_profile.status_code == 422
    assert "unknown profile 'nobody'" in error_of(unknown_profile).detail
    empty = await board.post("/api/tasks", json={"text": "   "})
    assert empty.status_code == 422 and error_of(empty).error == "invalid_request"

    task = await _add(board, "queued")
    two_places = await board.post(f"/api/tasks/{task['id']}/move", json={"to": "top", "after": 1})
    assert two_places.status_code == 422
    not_running = await board.post(f"/api/tasks/{task['id']}/pause")
    assert not_running.status_code == 409 and error_of(not_running).error == "conflict"
    not_failed = await board.post(f"/api/tasks/{task['id']}/retry")
    assert not_failed.status_code == 409
    beyond_sqlite = await board.get(f"/api/tasks/{2**63}")
    assert beyond_sqlite.status_code == 422


async def test_profiles_are_stored_without_ever_sending_a_key_back(board: httpx.AsyncClient):
    secret = "sk-in-process-secret"
    profile = {"base_url": "http://127.0.0.1:9/v1", "api_key": secret, "planner_model": "big"}
    put = await board.put("/api/board/profiles/vision.2", json=profile)
    assert put.status_code == 200
    view = put.json()
    assert view["name"] == "vision.2" and view["api_key_set"] is True
    listed = await board.get("/api/board/profiles")
    assert secret not in put.text and secret not in listed.text
    assert {p["name"] for p in listed.json()} == {"default", "vision.2"}

    task = await _add(board, "with a profile", profile="vision.2")
    assert task["profile"] == "vision.2"
    assert (await board.delete("/api/board/profiles/vision.2")).status_code == 204
    again = await board.delete("/api/board/profiles/vision.2")
    assert again.status_code == 404 and error_of(again).error == "profile_not_found"
    bad_name = await board.put("/api/board/profiles/no%20spaces", json=profile)
    assert bad_name.status_code == 422 and "not a profile name" in error_of(bad_name).detail


async def test_board_settings_are_checked_and_kept(board: httpx.AsyncClient):
    settings = (await board.get("/api/board/settings")).json()
    changed = settings | {"max_steps": 7, "record": False, "resolution": [1024, 768]}
    put = await board.put("/api/board/settings", json=changed)
    assert put.status_code == 200 and put.json() == changed
    assert (await board.get("/api/board/settings")).json() == changed
    too_many = await board.put("/api/board/settings", json=changed | {"concurrency": 65})
    assert too_many.status_code == 422 and "concurrency" in error_of(too_many).detail
    assert (await board.put("/api/board/settings", json=settings)).status_code == 200


# --- the OpenAPI document ---------------------------------------------------------------


async def test_the_openapi_document_lists_every_room_and_answers_errors_as_error_bodies(
    inprocess: InProcess,
):
    response = await inprocess.anonymous.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    paths = document["paths"]
    for path in (
        "/api/desktops",
        "/api/desktops/{desktop_id}",
        "/api/pool",
        "/api/tasks",
        "/api/tasks/{task_id}/move",
        "/api/board/profiles/{name}",
        "/api/runs",
    ):
        assert path in paths, path
    assert "ErrorBody" in document["components"]["schemas"]
    assert "HTTPValidationError" not in document["components"]["schemas"]
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for path, item in paths.items():
        if not path.startswith("/api"):
            continue
        for method, operation in item.items():
            default = operation["responses"]["default"]
            assert default["content"]["application/json"]["schema"] == error_ref, (method, path)
    created = paths["/api/desktops"]["post"]["responses"]["201"]
    assert "links" in created  # from a created desktop to the calls on it
