"""Files at rest are the service's own: a mount escape as a desktop's host user reads
none of them (the database and its WAL with a model key in it, recordings, runs)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from cubicle.server import at_rest
from cubicle.server.runtime import cgroups
from tests.security.attack import ROOT, still_answering

SECRET = "sk-probe-0123456789abcdef"


@pytest.fixture(scope="module")
def kept(service, api, victim):
    """A model key in the database, and a recording on disk."""
    profile = {"base_url": "http://127.0.0.1:9/v1", "planner_model": "m", "api_key": SECRET}
    assert api.put("/api/board/profiles/probe", json=profile).status_code == 200
    base = f"/api/desktops/{victim['id']}/recording"
    assert api.post(f"{base}/start").status_code == 200
    api.post(f"/api/desktops/{victim['id']}/actions", json={"type": "move", "x": 5, "y": 5})
    assert api.post(f"{base}/stop").status_code == 200
    yield service.data_dir
    api.delete("/api/board/profiles/probe")


def _files(data_dir: Path) -> list[Path]:
    found = []
    for root, dirs, files in os.walk(data_dir):
        dirs[:] = [d for d in dirs if not (root == str(data_dir) and d in at_rest.RUNTIME_OWNED)]
        found += [Path(root, name) for name in dirs + files]
    return found


def test_what_the_service_keeps_is_owner_only(kept):
    assert stat.S_IMODE(kept.stat().st_mode) == (0o711 if ROOT else 0o700)
    names = {path.name for path in _files(kept)}
    assert {"board.sqlite3", "board.sqlite3-wal", "recordings"} <= names
    for path in _files(kept):
        if path.name == "service.log":
            continue  # the test launcher's own log
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    assert SECRET.encode() in b"".join(
        p.read_bytes() for p in kept.glob("board.sqlite3*")
    )  # it is there, to be kept from others


@pytest.mark.root_only
def test_a_desktops_host_user_reads_nothing_of_the_service(kept, service, api, victim):
    pid = cgroups.find(victim["id"]).pids()[-1]
    uid = os.stat(f"/proc/{pid}").st_uid
    assert uid >= 200_000  # a user of its own, not the service's

    def as_desktop(*argv: str) -> subprocess.CompletedProcess:
        run_as = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        return subprocess.run([*run_as, *argv], capture_output=True, text=True, timeout=10)

    for path in [*kept.glob("board.sqlite3*"), *(kept / "recordings").rglob("*")]:
        read = as_desktop("cat", str(path))
        assert read.returncode != 0 and "Permission denied" in read.stderr, path
    assert as_desktop("ls", str(kept)).returncode != 0  # 0711: no listing
    environ = as_desktop("cat", f"/proc/{service.process.pid}/environ")
    assert environ.returncode != 0
    other = [d for d in (kept / "desktops").iterdir() if d.name != victim["id"]]
    for directory in other:
        assert as_desktop("ls", str(directory / "disk")).returncode != 0
    still_answering(api, victim["id"])
