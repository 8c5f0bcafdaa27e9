"""Input the fuzzer found answered with a 500, now refused with a clear 422 (issue 17)."""

from __future__ import annotations

import httpx
import pytest


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("launch", {"app": "mousepad", "args": ["a\u0000b"]}),
        ("launch", {"app": "mouse\u0000pad"}),
        ("open", {"target": "~/a\u0000b.txt"}),
        ("exec", {"command": ["echo", "a\u0000b"]}),
        ("exec", {"command": "echo hi", "env": {"A=B": "c"}}),
        ("exec", {"command": "echo hi", "env": {"A": "c\u0000"}}),
    ],
)
def test_a_nul_byte_where_a_program_or_file_name_takes_it_is_a_422(
    api: httpx.Client, desktop: dict, path: str, body: dict
):
    response = api.post(f"/api/desktops/{desktop['id']}/{path}", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_request"


def test_a_file_name_longer_than_linux_takes_is_a_422_naming_the_limit(
    api: httpx.Client, desktop: dict
):
    base = f"/api/desktops/{desktop['id']}"
    long_name = "~/" + "x" * 4000
    opened = api.post(f"{base}/open", json={"target": long_name})
    assert opened.status_code == 422, opened.text
    assert "at most 255" in opened.json()["detail"]
    for method in ("GET", "PUT", "DELETE"):
        response = api.request(method, f"{base}/files", params={"path": long_name}, content=b"x")
        assert response.status_code == 422, (method, response.text)
    # A name of 255 bytes, the most there is, still works: uploads keep no longer temp name.
    longest = "~/" + "y" * 255
    written = api.put(f"{base}/files", params={"path": longest}, content=b"fits")
    assert written.status_code == 200, written.text
    assert api.get(f"{base}/files", params={"path": longest}).content == b"fits"


def test_a_command_line_longer_than_linux_takes_is_a_422(api: httpx.Client, desktop: dict):
    response = api.post(
        f"/api/desktops/{desktop['id']}/exec", json={"command": ["echo", "é" * 100_000]}
    )
    assert response.status_code == 422, response.text
    assert "stdin" in response.json()["detail"]


def test_the_openapi_document_states_errors_as_they_are_answered(api: httpx.Client):
    schema = api.get("/openapi.json").json()
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    actions = schema["paths"]["/api/desktops/{desktop_id}/actions"]["post"]["responses"]
    assert actions["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    assert "default" in actions
    bad = api.post("/api/desktops/nope/actions", json={"type": "fly"})
    assert set(bad.json()) == {"error", "detail"}
    batch = schema["paths"]["/api/tasks/batch"]["post"]
    assert "tasks" in batch["requestBody"]["content"]["application/json"]["schema"]["properties"]
