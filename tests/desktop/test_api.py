"""The REST API's contract: lifecycle, screenshots, clicks, files, and bad input."""

from __future__ import annotations

import io
import json
import re
import time

import httpx
import pytest
from PIL import Image

from tests.conftest import create_desktop, wait_until

BOTH_RUNTIMES = True


def test_every_api_route_needs_the_token(service, desktop):
    for method, path in [
        ("GET", "/api/desktops"),
        ("POST", "/api/desktops"),
        ("GET", f"/api/desktops/{desktop['id']}/screenshot"),
        ("POST", f"/api/desktops/{desktop['id']}/actions"),
    ]:
        response = httpx.request(method, service.url + path)
        assert response.status_code == 401, path
        assert response.json()["error"] == "unauthorized"
        wrong = httpx.request(method, service.url + path, headers={"Authorization": "Bearer x"})
        assert wrong.status_code == 401


def test_created_desktop_is_listed_ready_with_its_screen(api, desktop):
    assert desktop["status"] == "ready"
    assert desktop["screen"] == {"width": 1280, "height": 800}
    listed = {d["id"]: d for d in api.get("/api/desktops").json()}
    assert listed[desktop["id"]]["status"] == "ready"
    assert api.get(f"/api/desktops/{desktop['id']}").json()["id"] == desktop["id"]


def test_screenshot_formats_and_scale_header(api, desktop):
    base = f"/api/desktops/{desktop['id']}/screenshot"
    for fmt, pil_format in [("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")]:
        response = api.get(base, params={"format": fmt})
        assert response.status_code == 200
        image = Image.open(io.BytesIO(response.content))
        assert image.format == pil_format
        assert image.size == (1280, 800)
        assert response.headers["x-scale"] == "1.000000"
    small = api.get(base, params={"format": "jpeg", "max_width": 640})
    assert Image.open(io.BytesIO(small.content)).size == (640, 400)
    assert float(small.headers["x-scale"]) == pytest.approx(2.0)


def test_screenshot_shows_the_desktop_not_a_blank_frame(api, desktop):
    png = api.get(f"/api/desktops/{desktop['id']}/screenshot").content
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 20  # panel text, icons, backdrop


def test_move_and_click_reach_the_pointer(api, desktop):
    base = f"/api/desktops/{desktop['id']}"
    result = api.post(f"{base}/actions", json={"type": "move", "x": 321, "y": 456}).json()
    assert result["results"][0]["type"] == "move"
    assert api.get(f"{base}/cursor").json() == {"x": 321, "y": 456}
    api.post(f"{base}/actions", json={"type": "click", "x": 700, "y": 500, "button": "right"})
    assert api.get(f"{base}/cursor").json() == {"x": 700, "y": 500}
    api.post(f"{base}/actions", json={"type": "key", "keys": "Escape"})


def test_a_screenshot_right_after_a_move_shows_the_pointer_there(api, desktop):
    """A move answers once its events are sent; the next screenshot still shows them done.

    The pictures with and without the pointer are compared only when both were made from
    the same capture (`X-Capture`), so nothing else drawn between them can tell them apart.
    """
    base = f"/api/desktops/{desktop['id']}"

    def shot(cursor: bool) -> tuple[Image.Image, str, str | None]:
        params = {"format": "png", "cursor": str(cursor).lower()}
        response = api.get(f"{base}/screenshot", params=params)
        image = Image.open(io.BytesIO(response.content)).convert("RGB")
        return image, response.headers["x-capture"], response.headers.get("x-cursor")

    def around(image: Image.Image, x: int, y: int) -> bytes:
        return image.crop((x - 32, y - 32, x + 32, y + 32)).tobytes()

    points = [(300, 300), (900, 500)]
    for turn in range(6):
        (x, y), (other_x, other_y) = points[turn % 2], points[(turn + 1) % 2]
        api.post(f"{base}/actions", json={"type": "move", "x": x, "y": y}).raise_for_status()
        for _ in range(20):  # something else on screen may draw between the two pictures
            (with_cursor, capture, drawn_at), (without, other_capture, _) = (
                shot(cursor=True),
                shot(cursor=False),
            )
            if capture == other_capture:
                break
        assert capture == other_capture, "the screen never held still for two pictures"
        assert drawn_at == f"{x},{y}", turn
        assert around(with_cursor, x, y) != around(without, x, y), (turn, x, y)
        assert around(with_cursor, other_x, other_y) == around(without, other_x, other_y)


def test_openapi_documents_the_actions_body_and_every_reference_resolves(service):
    document = httpx.get(service.url + "/openapi.json").json()
    components = document["components"]["schemas"]

    def resolved(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return resolved(components[node["$ref"].rsplit("/", 1)[-1]])
            return {key: resolved(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolved(item) for item in node]
        return node

    body = document["paths"]["/api/desktops/{desktop_id}/actions"]["post"]["requestBody"]
    schema = json.dumps(resolved(body["content"]["application/json"]["schema"]))
    for action in ("click", "move", "key", "type", "wait_for_settle"):
        assert f'"const": "{action}"' in schema
    text = json.dumps(document)
    references = set(re.findall(r'"#/components/schemas/([^"]+)"', text))
    assert references <= set(document["components"]["schemas"])
    assert "#/$defs/" not in text


def test_files_round_trip_and_listing(api, desktop):
    base = f"/api/desktops/{desktop['id']}/files"
    data = "zwölf ✓\n".encode() * 1000
    written = api.put(base, params={"path": "~/docs/zw.txt"}, content=data)
    assert written.status_code == 200, written.text
    assert written.json()["size"] == len(data)
    assert api.get(base, params={"path": "/home/user/docs/zw.txt"}).content == data
    listing = api.get(base, params={"path": "~/docs"}).json()
    assert [entry["name"] for entry in listing] == ["zw.txt"]
    assert api.delete(base, params={"path": "~/docs/zw.txt"}).status_code == 204
    assert api.get(base, params={"path": "~/docs/zw.txt"}).status_code == 404


def test_exec_returns_output_and_exit_code(api, desktop):
    base = f"/api/desktops/{desktop['id']}/exec"
    result = api.post(base, json={"command": "echo out; echo err >&2; exit 3"}).json()
    assert (result["stdout"], result["stderr"], result["exit_code"]) == ("out\n", "err\n", 3)
    fed = api.post(base, json={"command": ["wc", "-c"], "stdin": "naïve"}).json()
    assert fed["stdout"].strip() == "6"
    timed = api.post(base, json={"command": "sleep 30", "timeout_s": 0.5}).json()
    assert timed["timed_out"] is True and timed["exit_code"] is None


def test_exec_streams_lines_as_they_come(api, desktop):
    body = {"command": "for i in 1 2 3; do echo $i; sleep 0.1; done", "stream": True}
    with api.stream("POST", f"/api/desktops/{desktop['id']}/exec", json=body) as response:
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = [httpx.Response(200, content=line).json() for line in response.iter_lines()]
    assert "".join(line["data"] for line in lines if line["stream"] == "stdout") == "1\n2\n3\n"
    assert lines[-1] == {"stream": "exit", "data": "", "exit_code": 0, "timed_out": False}


def test_a_streamed_command_ends_when_its_caller_leaves(api, desktop):
    """Even while it prints nothing: it used to run on until its own end."""
    base = f"/api/desktops/{desktop['id']}/exec"
    body = {"command": "sleep 97; echo late", "stream": True, "timeout_s": 300}
    with api.stream("POST", base, json=body) as response:
        assert response.status_code == 200
        time.sleep(0.5)  # it is running, silent; the caller leaves
    deadline = time.monotonic() + 10
    while api.post(base, json={"command": "pgrep -f '^sleep 97'"}).json()["exit_code"] == 0:
        assert time.monotonic() < deadline, "the command outlived its caller"
        time.sleep(0.2)


def test_clipboard_round_trip(api, desktop):
    base = f"/api/desktops/{desktop['id']}/clipboard"
    assert api.put(base, json={"text": "copié ✓ 你好"}).status_code == 204
    assert api.get(base).json() == {"text": "copié ✓ 你好"}


def test_timeout_can_be_extended(api, desktop):
    response = api.post(f"/api/desktops/{desktop['id']}/timeout", json={"timeout_s": 1200})
    assert response.status_code == 200
    assert response.json()["timeout_s"] == 1200


@pytest.mark.parametrize(
    ("body", "status", "error", "hint"),
    [
        ({"type": "click", "x": 1280, "y": 10}, 422, "off_screen", "x must be 0–1279"),
        ({"type": "move", "x": -5, "y": 10}, 422, "invalid_request", "greater than or equal"),
        ({"type": "key", "keys": "ctrl+shft+t"}, 422, "unknown_key", "'shft'"),
        ({"type": "teleport", "x": 1, "y": 1}, 422, "invalid_request", "teleport"),
        ({"type": "click", "x": 10}, 422, "off_screen", "both x and y"),
        ({"type": "click", "x": 1, "y": 1, "count": 5}, 422, "invalid_request", "count"),
    ],
)
def test_bad_actions_get_a_4xx_that_says_what_to_fix(api, desktop, body, status, error, hint):
    response = api.post(f"/api/desktops/{desktop['id']}/actions", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"] == error
    assert hint in response.json()["detail"]


def test_a_batch_with_one_bad_action_runs_nothing(api, desktop):
    base = f"/api/desktops/{desktop['id']}"
    api.post(f"{base}/actions", json={"type": "move", "x": 10, "y": 10})
    batch = [{"type": "move", "x": 600, "y": 600}, {"type": "key", "keys": "nosuchkey"}]
    assert api.post(f"{base}/actions", json=batch).status_code == 422
    assert api.get(f"{base}/cursor").json() == {"x": 10, "y": 10}


def test_malformed_json_and_unknown_desktops(api, desktop):
    response = api.post(
        f"/api/desktops/{desktop['id']}/actions",
        content=b'{"type": "click", ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["detail"]
    missing = api.get("/api/desktops/nope/screenshot")
    assert missing.status_code == 404
    assert missing.json()["error"] == "desktop_not_found"
    assert api.delete("/api/desktops/nope").status_code == 404
    bad_create = api.post("/api/desktops", json={"resolution": [10, 10]})
    assert bad_create.status_code == 422


def test_file_paths_outside_home_and_oversized_uploads_are_refused(api, desktop):
    base = f"/api/desktops/{desktop['id']}/files"
    for path in ["/etc/passwd", "~/../../etc/passwd", "/usr/bin/x"]:
        response = api.put(base, params={"path": path}, content=b"x")
        assert response.status_code == 403, path
        assert response.json()["error"] == "path_not_allowed"
    too_big = api.put(base, params={"path": "~/big.bin"}, content=b"\0" * (1024 * 1024 + 1))
    assert too_big.status_code == 413
    assert "limit" in too_big.json()["detail"]
    assert api.get(base, params={"path": "~/big.bin"}).status_code == 404


def test_unknown_application_and_window(api, desktop):
    base = f"/api/desktops/{desktop['id']}"
    response = api.post(f"{base}/launch", json={"app": "no-such-app"})
    assert response.status_code == 422
    assert "mousepad" in response.json()["detail"]
    assert api.post(f"{base}/windows/12345/close").status_code == 404


def test_idle_desktop_is_stopped_after_its_timeout(api):
    info = create_desktop(api, timeout_s=10)
    try:
        stopped = wait_until(
            lambda: api.get(f"/api/desktops/{info['id']}").json()["status"] == "stopped",
            timeout_s=20,
            interval_s=1,
            what="the idle desktop to stop",
        )
        assert stopped
        response = api.get(f"/api/desktops/{info['id']}/screenshot")
        assert response.status_code == 410
        assert "idle" in response.json()["detail"]
    finally:
        api.delete(f"/api/desktops/{info['id']}")
