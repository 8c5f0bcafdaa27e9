"""The escape suite again, as a user who is not root, with a service of that user's own.

Root delegates a cgroup to the user (as systemd's `Delegate=yes` does: the directories and
their `cgroup.procs` become the user's) and starts pytest as that user inside it, through
`setpriv`; that pytest starts its own service, which finds its cgroup writable and puts
its desktops' cgroups below it. The parts that need root (other users, network
namespaces, the browser) are left out there (`-m "not root_only"`). Without a delegated
cgroup, the same user's service refuses to start desktops and says what is missing,
unless the operator opted out (`CUBICLE_UNSAFE_NO_LIMITS=1`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cubicle.server.launcher import ServiceProcess
from cubicle.server.runtime import cgroups

pytestmark = pytest.mark.root_only
NAME = "cubicle-escape"
"""The dedicated user (a system user, made once): fusermount3 wants a name for its uid."""
REPO = Path(__file__).resolve().parents[2]


def _user() -> int:
    try:
        return pwd.getpwnam(NAME).pw_uid
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
            check=True,
            timeout=30,
        )
        return pwd.getpwnam(NAME).pw_uid


USER = _user() if os.geteuid() == 0 else -1
AS_USER = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", "--"]


@pytest.fixture
def home() -> Iterator[Path]:
    """A home (and data, and temporary) directory the user owns."""
    path = Path(tempfile.mkdtemp(prefix="cubicle-nonroot-"))
    os.chown(path, USER, USER)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _user_env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "USER": NAME,
        "LOGNAME": NAME,
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


@pytest.fixture
def delegated() -> Iterator[list[Path]]:
    """One cgroup per v1 controller (or one v2 cgroup) below this process's, the user's."""
    own = cgroups.own_cgroups()
    name = f"cubsec-nonroot-{os.getpid()}"
    if (cgroups.ROOT / "cgroup.controllers").is_file():
        paths = [cgroups.ROOT / own[""].lstrip("/") / name]
    else:
        paths = [cgroups.ROOT / c / own.get(c, "/").lstrip("/") / name for c in cgroups.CONTROLLERS]
    for path in paths:
        path.mkdir()
        for owned in (path, path / "cgroup.procs", path / "cgroup.subtree_control"):
            if owned.exists():
                os.chown(owned, USER, USER)
    yield paths
    for path in paths:
        for child in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):
            if child.is_dir():
                child.rmdir()
        path.rmdir()


@pytest.mark.timeout(500)
def test_the_suite_holds_for_a_service_that_is_not_root(home, delegated):
    joins = " ".join(f"'{path / 'cgroup.procs'}'" for path in delegated)
    pytest_argv = [
        sys.executable, "-m", "pytest", "tests/security", "-m", "not root_only",
        "-p", "no:cacheprovider", "-q", "-x", "--basetemp", str(home / "pytest"),
    ]  # fmt: skip
    done = subprocess.run(
        [
            "/bin/sh",
            "-c",
            f'for f in {joins}; do echo $$ > "$f"; done; exec "$@"',
            "sh",
            *AS_USER,
            *pytest_argv,
        ],
        cwd=REPO,
        env=_user_env(home),
        capture_output=True,
        text=True,
        timeout=480,
    )
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    assert done.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail.splitlines()[-1], tail


def test_without_a_delegated_cgroup_desktops_refuse_to_start_unless_told(home):
    env = {**_user_env(home), "CUBICLE_WARM_POOL": "0"}
    strict = ServiceProcess.start(data_dir=home, env=env, prefix=AS_USER)
    try:
        with strict.client() as api:
            refused = api.post("/api/desktops", json={})
        assert refused.status_code == 500
        detail = refused.json()["detail"]
        assert "cannot enforce" in detail and "delegate" in detail, detail
        assert "CUBICLE_UNSAFE_NO_LIMITS" in detail
    finally:
        strict.stop()
    unsafe_dir = home / "unsafe"
    unsafe_dir.mkdir()
    os.chown(unsafe_dir, USER, USER)
    env["CUBICLE_UNSAFE_NO_LIMITS"] = "1"
    unsafe = ServiceProcess.start(data_dir=unsafe_dir, env=env, prefix=AS_USER)
    try:
        with unsafe.client() as api:
            started = api.post("/api/desktops", json={})
            assert started.status_code == 201, started.text
            api.delete(f"/api/desktops/{started.json()['id']}")
        assert "UNSAFE" in unsafe.log_tail(40)
    finally:
        unsafe.stop()
