"""Named snapshots and forks of local desktops: a disk of their own each, nothing shared
(copied, or cloned where the data directory's filesystem makes reflinks).

(The microVM runtime's snapshots, which keep memory too, are tested in test_microvm.py.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from cubicle import Desktop, NotFound, ServiceClient
from cubicle.server.runtime import disk
from tests.conftest import create_desktop, start_service, stop_service, wait_until


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


def _apps(api, desktop_id: str) -> list[tuple[str, str]]:
    windows = api.get(f"/api/desktops/{desktop_id}/windows").json()
    return sorted((w["app"], w["title"].lstrip("*")) for w in windows)


def test_a_fork_opens_again_the_apps_its_parent_had_open(api):
    """Memory cannot move between local desktops, so a child starts its desktop afresh and
    opens what its parent had open, files and all; the note that says so is gone after."""
    parent = create_desktop(api)
    base = f"/api/desktops/{parent['id']}"
    children: list[str] = []
    try:
        _write(api, parent["id"], "~/plan.txt", b"saved before the fork")
        api.post(f"{base}/launch", json={"app": "mousepad", "args": ["/home/user/plan.txt"]})
        api.post(f"{base}/launch", json={"app": "terminal"})
        wanted = wait_until(lambda: len(a := _apps(api, parent["id"])) == 2 and a, 20)
        forked = api.post(f"{base}/fork", json={"count": 2}, timeout=120)
        assert forked.status_code == 201, forked.text
        children = [d["id"] for d in forked.json()["desktops"]]
        for child in children:
            wait_until(lambda c=child: _apps(api, c) == wanted, 30, what="the apps reopened")
            assert _read(api, child, "~/.cache/cubicle/reopen.json") is None
        assert _apps(api, parent["id"]) == wanted  # the parent's own windows, untouched
        assert _read(api, parent["id"], "~/.cache/cubicle/reopen.json") is None
    finally:
        for desktop_id in [parent["id"], *children]:
            api.delete(f"/api/desktops/{desktop_id}")


@pytest.fixture
def xfs_data_dir():
    """A data directory on XFS (reflinks), in a loop-mounted image of its own (under a
    folder desktops' users may pass through, as a data directory's parents must be)."""
    root = Path(tempfile.mkdtemp(prefix="cubicle-xfs-"))
    image, mount = root / "xfs.img", root / "xfs"
    try:
        root.chmod(0o711)
        with open(image, "wb") as f:
            f.truncate(4 << 30)
        subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
        mount.mkdir()
        subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
        mount.chmod(0o711)
        yield mount / "data"
    finally:
        disk.sweep(mount / "data" / "desktops")
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(root, ignore_errors=True)


def _used_mb(path) -> float:
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize / 1e6


def test_on_a_reflink_filesystem_forks_share_the_disk_until_written(xfs_data_dir):
    """Where the data directory's filesystem clones extents (XFS, btrfs), a snapshot and
    its children share the parent's blocks: three forks of a desktop holding 96 MB take a
    few MB more, not 288 (each child still reads and writes its own disk)."""
    xfs_data_dir.mkdir()
    service = start_service(data_dir=xfs_data_dir, CUBICLE_WARM_POOL="0")
    try:
        with service.client() as api:
            parent = create_desktop(api)
            base = f"/api/desktops/{parent['id']}"
            made = api.post(
                f"{base}/exec",
                json={"command": "head -c 96M /dev/urandom > ~/big && sha256sum < ~/big"},
            )
            assert made.status_code == 200 and made.json()["exit_code"] == 0, made.text
            digest = made.json()["stdout"]
            os.sync()  # the parent's 96 MB, from the host's page cache into its image
            before = _used_mb(xfs_data_dir)
            forked = api.post(f"{base}/fork", json={"count": 3}, timeout=300)
            assert forked.status_code == 201, forked.text
            children = [d["id"] for d in forked.json()["desktops"]]
            assert len(children) == 3 and forked.json()["errors"] == []
            grown = _used_mb(xfs_data_dir) - before
            assert grown < 48, f"the forks took {grown:.0f} MB: copied, not cloned"
            for child in children:
                read = api.post(
                    f"/api/desktops/{child}/exec", json={"command": "sha256sum < ~/big"}
                )
                assert read.json()["stdout"] == digest
            api.post(
                f"/api/desktops/{children[0]}/exec",
                json={"command": "head -c 1M /dev/zero | dd of=$HOME/big conv=notrunc"},
            )
            again = api.post(f"{base}/exec", json={"command": "sha256sum < ~/big"})
            assert again.json()["stdout"] == digest  # the parent's blocks are its own
            for desktop_id in [parent["id"], *children]:
                assert api.delete(f"/api/desktops/{desktop_id}").status_code == 204
    finally:
        stop_service(service)
