"""How the escape suite attacks a desktop, and how it checks that nothing else gave way.

Every probe goes through the public API, as code running inside a desktop would: the
probe script (`probe_inside.py`) is uploaded with the files API and run with exec. After
each attack, `still_answering` checks that the attacked desktop, a neighbour and the
service all keep answering.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

PROBE = Path(__file__).with_name("probe_inside.py")
ROOT = os.geteuid() == 0


def run(api: httpx.Client, desktop_id: str, command: str, timeout_s: float = 30) -> dict:
    """Run a shell command in the desktop; its `ExecResult` as a dict."""
    response = api.post(
        f"/api/desktops/{desktop_id}/exec", json={"command": command, "timeout_s": timeout_s}
    )
    assert response.status_code == 200, response.text
    return response.json()


_UPLOADED: set[str] = set()


def probe(api: httpx.Client, desktop_id: str, *args: str, timeout_s: float = 60) -> dict:
    """Upload the probe script (once per desktop) and run one of its attacks."""
    if desktop_id not in _UPLOADED:
        uploaded = api.put(
            f"/api/desktops/{desktop_id}/files",
            params={"path": "~/.probe_inside.py"},
            content=PROBE.read_bytes(),
        )
        assert uploaded.status_code == 200, uploaded.text
        _UPLOADED.add(desktop_id)
    line = " ".join(["python3", "~/.probe_inside.py", *args])
    result = run(api, desktop_id, line, timeout_s=timeout_s)
    assert result["exit_code"] == 0, result
    return json.loads(result["stdout"].strip().splitlines()[-1])


def still_answering(api: httpx.Client, *desktop_ids: str) -> None:
    """The service and each desktop answer: listing, a command, a screenshot."""
    assert api.get("/healthz").status_code == 200
    listed = {d["id"]: d["status"] for d in api.get("/api/desktops").json()}
    for desktop_id in desktop_ids:
        assert listed.get(desktop_id) == "ready", (desktop_id, listed.get(desktop_id))
        assert run(api, desktop_id, "echo alive")["stdout"] == "alive\n"
        shot = api.get(f"/api/desktops/{desktop_id}/screenshot")
        assert shot.status_code == 200 and shot.content[:4] == b"\x89PNG"


def create(api: httpx.Client, **body) -> dict:
    response = api.post("/api/desktops", json=body)
    assert response.status_code == 201, response.text
    return response.json()
