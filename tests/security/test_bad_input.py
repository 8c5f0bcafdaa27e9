"""Bad input gets a clear 4xx and takes nothing down: bodies over their cap (declared or
chunked) are 413 before they are read, numbers out of range are 422, never 500."""

from __future__ import annotations

import json

from tests.security.attack import still_answering

MIB = 1024 * 1024


def _chunked(total: int, piece: bytes = b" " * 65536):
    """A body with no Content-Length: httpx sends a generator chunked."""
    sent = 0
    while sent < total:
        yield piece
        sent += len(piece)


def test_a_chunked_batch_of_40_mb_is_413(api, victim):
    head = b'{"tasks": ['
    body = head + b'{"text": "x"},' * (40 * MIB // 14) + b'{"text": "x"}]}'

    def chunks():
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    json_type = {"content-type": "application/json"}
    answer = api.post("/api/tasks/batch", content=chunks(), headers=json_type)
    assert answer.status_code == 413, answer.text[:200]
    assert answer.json()["error"] == "payload_too_large"
    assert api.get("/api/tasks/counts").status_code == 200
    still_answering(api, victim["id"])


def test_exec_with_40_mb_of_stdin_is_413_declared_or_chunked(api, victim):
    body = json.dumps({"command": "wc -c", "stdin": "x" * (40 * MIB)}).encode()
    url = f"/api/desktops/{victim['id']}/exec"
    declared = api.post(url, content=body, headers={"content-type": "application/json"})
    assert declared.status_code == 413 and "limit" in declared.json()["detail"]

    def chunks():
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    chunked = api.post(url, content=chunks(), headers={"content-type": "application/json"})
    assert chunked.status_code == 413
    # A body under the cap still runs.
    small = api.post(url, json={"command": "wc -c", "stdin": "x" * 1000})
    assert small.status_code == 200 and small.json()["stdout"].strip() == "1000"
    still_answering(api, victim["id"])


def test_an_upload_over_the_limit_is_413_even_chunked(api, victim):
    url = f"/api/desktops/{victim['id']}/files"
    chunked = api.put(url, params={"path": "~/big.bin"}, content=_chunked(3 * MIB))
    assert chunked.status_code == 413
    still_answering(api, victim["id"])


def test_numbers_out_of_range_are_422(api):
    for path in (
        "/api/tasks?offset=1e20",
        "/api/tasks?offset=99999999999999999999",
        "/api/tasks?limit=1e20",
        "/api/tasks/99999999999999999999",
        "/api/tasks/99999999999999999999/steps",
        "/api/tasks/-1",
    ):
        answer = api.get(path)
        assert answer.status_code == 422, (path, answer.status_code, answer.text)
        assert answer.json()["error"] == "invalid_request"
    moved = api.post("/api/tasks/1/move", json={"before": 2**70})
    assert moved.status_code == 422
    assert api.get("/api/tasks").status_code == 200
