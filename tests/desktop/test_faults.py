"""Faults a desktop or the service survives, each as it happens for real (issue 17).

The guest daemon SIGKILLed from the host (as the OOM killer would), the window manager
killed inside the desktop, and the service's data directory on a small file system that
fills up. Each time: a clear state or error with the reason, nothing hangs, nothing
half-written, and the rest keeps answering. (Xvfb killed: tests/desktop/test_lifecycle.py.)
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from cubicle.server.runtime import cgroups
from tests.agent.board_api import set_board, use_fake_model
from tests.agent.fake_model import FakeModelServer
from tests.conftest import create_desktop, start_service, stop_service, wait_until


def _guest_pid(desktop_id: str) -> int:
    """The guest daemon of a desktop, found on the host: the `cubicle.guest` process in
    that desktop's cgroup."""
    cgroup = cgroups.find(desktop_id)
    assert cgroup is not None, f"desktop {desktop_id} has no cgroup"
    for pid in cgroup.pids():
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"cubicle.guest" in argv:
                return pid
    raise AssertionError(f"no guest daemon found for desktop {desktop_id}")


def test_a_killed_guest_daemon_fails_the_desktop_with_the_reason(api: httpx.Client):
    doomed, other = create_desktop(api), create_desktop(api)
    try:
        os.kill(_guest_pid(doomed["id"]), signal.SIGKILL)

        def failed():
            info = api.get(f"/api/desktops/{doomed['id']}").json()
            return info if info["status"] == "failed" else None

        info = wait_until(failed, 20, what="the desktop to be reported failed")
        assert "exited" in info["reason"], info
        shot = api.get(f"/api/desktops/{doomed['id']}/screenshot")
        assert shot.status_code == 410 and info["reason"] in shot.json()["detail"]
        # The other desktop never noticed.
        cursor = api.get(f"/api/desktops/{other['id']}/cursor")
        assert cursor.status_code == 200
    finally:
        api.delete(f"/api/desktops/{doomed['id']}")
        api.delete(f"/api/desktops/{other['id']}")


def test_a_killed_window_manager_is_started_again_and_reported(api: httpx.Client):
    desktop = create_desktop(api)
    base = f"/api/desktops/{desktop['id']}"
    try:
        before = api.post(f"{base}/exec", json={"command": "pgrep -x xfwm4"}).json()
        assert before["exit_code"] == 0
        killed = api.post(f"{base}/exec", json={"command": "pkill -KILL -x xfwm4"})
        assert killed.status_code == 200

        def reported():
            info = api.get(base).json()
            return info if info["degraded"] else None

        info = wait_until(reported, 15, what="the desktop to report its window manager")
        assert info["status"] == "ready"
        assert info["degraded"] == "xfwm4 exited with status -9: started it again"

        def running_again():
            found = api.post(f"{base}/exec", json={"command": "pgrep -x xfwm4"}).json()
            return found["exit_code"] == 0 and found["stdout"] != before["stdout"]

        wait_until(running_again, 15, what="a new xfwm4")
        # A window manager's job works again: a window opens and is maximized.
        api.post(f"{base}/launch", json={"app": "mousepad"})

        def window():
            found = [w for w in api.get(f"{base}/windows").json() if w["app"] == "Mousepad"]
            return found[0] if found else None

        editor = wait_until(window, 30, what="the editor's window")
        maximized = api.post(f"{base}/windows/{editor['id']}/maximize")
        assert maximized.status_code == 204

        def fills_the_screen():
            now = next(w for w in api.get(f"{base}/windows").json() if w["id"] == editor["id"])
            return now["width"] >= 1200

        wait_until(fills_the_screen, 10, what="the maximized window")
    finally:
        api.delete(base)


def test_a_full_data_disk_gives_clear_errors_and_keeps_the_database_whole(
    fake_model: FakeModelServer,
):
    mount = Path(tempfile.mkdtemp(prefix="cubicle-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m,mode=0755", "tmpfs", mount], check=True)
    service = None
    try:
        data_dir = mount / "data"
        data_dir.mkdir()
        service = start_service(data_dir=data_dir, CUBICLE_WARM_POOL="0")
        api = service.client()
        use_fake_model(api, fake_model)
        set_board(api, concurrency=0)
        desktop = create_desktop(api)
        base = f"/api/desktops/{desktop['id']}"
        kept = [api.post("/api/tasks", json={"text": f"task {n}"}).json()["id"] for n in range(5)]

        filler = mount / "filler"
        subprocess.run(  # fill every byte left
            ["dd", "if=/dev/zero", f"of={filler}", "bs=1M"], capture_output=True, check=False
        )

        batch = api.post("/api/tasks/batch", json={"tasks": [{"text": "x" * 3000}] * 2000})
        assert batch.status_code == 507, batch.text
        assert batch.json()["error"] == "disk_full" and "full" in batch.json()["detail"]
        # Single small tasks may still fit in pages SQLite already has; each is kept whole
        # or refused whole, never a 500.
        for _ in range(200):
            added = api.post("/api/tasks", json={"text": "one more " + "y" * 2000})
            assert added.status_code in (201, 507), added.text
            if added.status_code == 507:
                break
            kept.append(added.json()["id"])
        else:
            raise AssertionError("200 tasks of 2 kB fit on a full disk")
        upload = api.put(f"{base}/files", params={"path": "~/big.bin"}, content=b"x" * 500_000)
        assert upload.status_code == 507, upload.text  # not kept in the page cache, then lost
        assert "host's disk" in upload.json()["detail"]
        # Reading still works, and nothing half-written shows.
        listed = api.get("/api/tasks", params={"status": "queued", "limit": 500}).json()
        assert [t["id"] for t in listed["items"]] == kept and listed["total"] == len(kept)
        assert api.get(f"{base}/cursor").status_code == 200
        assert api.get(f"{base}/files", params={"path": "~"}).status_code == 200

        filler.unlink()
        again = api.post("/api/tasks", json={"text": "after some room was made"})
        assert again.status_code == 201, again.text
        api.close()
        stop_service(service)
        service = None
        with sqlite3.connect(data_dir / "board.sqlite3") as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert db.execute("SELECT COUNT(*) FROM tasks").fetchone()[0] == len(kept) + 1
    finally:
        if service is not None:
            stop_service(service)
        subprocess.run(["umount", "-l", mount], check=False)
        mount.rmdir()


def test_a_call_cut_short_by_the_desktops_deletion_answers_410_with_the_reason(
    api: httpx.Client,
):
    desktop = create_desktop(api)
    base = f"/api/desktops/{desktop['id']}"
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(api.post, f"{base}/actions", json={"type": "wait", "ms": 20_000})
        time.sleep(1.0)  # the wait runs in the guest now
        assert api.delete(base).status_code == 204
        cut = waiting.result(timeout=30)
    assert cut.status_code == 410, cut.text
    body = cut.json()
    assert body["error"] == "desktop_gone" and "killed through the API" in body["detail"]
