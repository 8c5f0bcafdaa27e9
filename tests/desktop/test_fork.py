"""Named snapshots and forks of local desktops: a copy of the disk each, nothing shared.

(The microVM runtime's snapshots, which keep memory too, are tested in test_microvm.py.)
"""

from __future__ import annotations

import pytest

from cubicle import Desktop, NotFound, ServiceClient
from tests.conftest import create_desktop, wait_until


def _read(api, desktop_id: str, path: str) -> bytes | None:
    answer = api.get(f"/api/desktops/{desktop_id}/files", params={"path": path})
    return answer.content if answer.status_code == 200 else None


def _write(api, desktop_id: str, path: str, data: bytes) -> None:
    answer = api.put(f"/api/desktops/{desktop_id}/files", params={"path": path}, content=data)
    assert answer.status_code in (200, 201, 204), answer.text


def test_a_named_snapshot_starts_desktops_with_a_copy_of_the_disk(api):
    parent = create_desktop(api)
    children: list[str] = []
    try:
        _write(api, parent["id"], "~/notes/plan.txt", b"from the parent")
        taken = api.post(f"/api/desktops/{parent['id']}/snapshot", json={"name": "prepared-l"})
        assert taken.status_code == 201, taken.text
        assert taken.json()["runtime"] == "local" and taken.json()["memory"] is False
        assert taken.json()["parent"] == parent["id"] and taken.json()["size_bytes"] > 0
        assert api.get(f"/api/desktops/{parent['id']}").json()["status"] == "ready"
        again = api.post(f"/api/desktops/{parent['id']}/snapshot", json={"name": "prepared-l"})
        assert again.status_code == 409
        listed = {s["name"]: s for s in api.get("/api/snapshots").json()}
        assert listed["prepared-l"]["parent"] == parent["id"]

        child = create_desktop(api, snapshot="prepared-l")
        children.append(child["id"])
        assert _read(api, child["id"], "~/notes/plan.txt") == b"from the parent"
        _write(api, child["id"], "~/notes/plan.txt", b"the child's own")
        assert _read(api, parent["id"], "~/notes/plan.txt") == b"from the parent"
        shot = api.get(f"/api/desktops/{child['id']}/screenshot")
        assert shot.status_code == 200  # drawn: the old desktop's X lock did not stop it

        assert api.delete("/api/snapshots/prepared-l").status_code == 204
        assert api.delete("/api/snapshots/prepared-l").status_code == 404
        assert "prepared-l" not in {s["name"] for s in api.get("/api/snapshots").json()}
        assert _read(api, child["id"], "~/notes/plan.txt") == b"the child's own"  # its copy
        unknown = api.post("/api/desktops", json={"snapshot": "prepared-l"})
        assert unknown.status_code == 404 and unknown.json()["error"] == "snapshot_not_found"
        bad = api.post(f"/api/desktops/{parent['id']}/snapshot", json={"name": "../x"})
        assert bad.status_code == 422
    finally:
        for desktop_id in [parent["id"], *children]:
            api.delete(f"/api/desktops/{desktop_id}")
        api.delete("/api/snapshots/prepared-l")


def test_fork_three_children_each_with_its_own_copy(api):
    parent = create_desktop(api)
    children: list[str] = []
    try:
        _write(api, parent["id"], "~/shared.txt", b"prepared once")
        answer = api.post(f"/api/desktops/{parent['id']}/fork", json={"count": 3}, timeout=120)
        assert answer.status_code == 201, answer.text
        forked = answer.json()
        children = [d["id"] for d in forked["desktops"]]
        assert forked["errors"] == [] and len(set(children)) == 3
        assert forked["snapshot"] is None  # a local fork keeps no snapshot behind
        assert not [s for s in api.get("/api/snapshots").json() if s["name"].startswith("fork-")]
        for index, child in enumerate(children):
            assert _read(api, child, "~/shared.txt") == b"prepared once"
            _write(api, child, f"~/only-{index}.txt", str(index).encode())
        for index, child in enumerate(children):
            for other in range(3):
                expected = str(other).encode() if other == index else None
                assert _read(api, child, f"~/only-{other}.txt") == expected
            assert _read(api, parent["id"], f"~/only-{index}.txt") is None
        # a fresh identity: each child has its own host name, the parent runs on
        names = {
            api.post(f"/api/desktops/{d}/exec", json={"command": "hostname"}).json()["stdout"]
            for d in [parent["id"], *children]
        }
        assert len(names) == 4
        assert api.get(f"/api/desktops/{parent['id']}/cursor").status_code == 200

        assert api.post(f"/api/desktops/{parent['id']}/fork", json={"count": 0}).status_code == 422
        assert api.post("/api/desktops/nope/fork", json={"count": 1}).status_code == 404
    finally:
        for desktop_id in [parent["id"], *children]:
            api.delete(f"/api/desktops/{desktop_id}")


def test_a_paused_desktop_forks_and_stays_paused(api):
    parent = create_desktop(api)
    children: list[str] = []
    try:
        _write(api, parent["id"], "~/state.txt", b"paused work")
        assert api.post(f"/api/desktops/{parent['id']}/pause").status_code == 200
        answer = api.post(f"/api/desktops/{parent['id']}/fork", json={"count": 1}, timeout=120)
        assert answer.status_code == 201, answer.text
        children = [d["id"] for d in answer.json()["desktops"]]
        assert _read(api, children[0], "~/state.txt") == b"paused work"
        assert api.get(f"/api/desktops/{parent['id']}").json()["status"] == "paused"
        wait_until(lambda: api.post(f"/api/desktops/{parent['id']}/resume").is_success, 5)
    finally:
        for desktop_id in [parent["id"], *children]:
            api.delete(f"/api/desktops/{desktop_id}")


def test_the_sdk_snapshots_forks_and_lists(service):
    connection = {"base_url": service.url, "token": service.token}
    with Desktop.create(**connection) as parent, ServiceClient(**connection) as client:
        parent.files.write("~/from-sdk.txt", "sdk")
        saved = parent.snapshot("sdk-saved")
        assert saved.runtime == "local" and saved.parent == parent.id
        assert "sdk-saved" in [s.name for s in client.snapshots()]
        client.delete_snapshot("sdk-saved")
        with pytest.raises(NotFound):
            client.delete_snapshot("sdk-saved")
        children = parent.fork(2)
        try:
            assert all(isinstance(child, Desktop) for child in children)
            for child in children:
                assert isinstance(child, Desktop)
                assert child.files.read("~/from-sdk.txt") == b"sdk"
        finally:
            for child in children:
                if isinstance(child, Desktop):
                    child.kill()
