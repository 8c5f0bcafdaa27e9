"""Faults and shutdown: a dead X server marks its desktop failed, and stopping the service
leaves nothing of its desktops behind."""

from __future__ import annotations

import signal
from pathlib import Path

from cubicle.server.runtime import cgroups
from tests.conftest import create_desktop, start_service, stop_service, wait_until


def test_killed_xvfb_turns_the_desktop_failed_and_calls_answer_410(api):
    info = create_desktop(api)
    base = f"/api/desktops/{info['id']}"
    try:
        api.post(f"{base}/exec", json={"command": "pkill -KILL -x Xvfb", "timeout_s": 5})
        failed = wait_until(
            lambda: (d := api.get(base).json())["status"] == "failed" and d,
            what="the desktop to be marked failed",
        )
        assert "Xvfb" in failed["reason"]
        for method, path in [("GET", "/screenshot"), ("POST", "/exec"), ("GET", "/cursor")]:
            response = api.request(method, base + path, json={"command": "true"})
            assert response.status_code == 410, (path, response.text)
            assert "Xvfb" in response.json()["detail"]
        assert api.get("/api/desktops").status_code == 200
    finally:
        api.delete(base)


def _bwraps_of(data_dir) -> list[str]:
    """Command lines of the bwrap processes whose mounts come from `data_dir`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args[0].endswith("bwrap") and any(str(data_dir) in arg for arg in args):
            found.append(" ".join(args))
    return found


def _sandbox_pids(desktop_id: str) -> list[int]:
    """Every host process of a desktop, from its pids cgroup."""
    cgroup = cgroups.find(desktop_id)
    return cgroup.pids() if cgroup else []


def _running(pid: int) -> bool:
    """True for a live process; a zombie waiting for the host's init to reap it is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_stopping_the_service_stops_every_desktop():
    svc = start_service()
    try:
        with svc.client() as client:
            ids = [create_desktop(client)["id"] for _ in range(2)]
        sandbox_dirs = [svc.data_dir / "desktops" / i for i in ids]
        assert all(d.is_dir() for d in sandbox_dirs)
        # bwrap runs as two processes per sandbox: the monitor and the namespace's init;
        # the warm pool's spare desktop may be among them.
        hostnames = {arg.split("--hostname ")[1].split()[0] for arg in _bwraps_of(svc.data_dir)}
        assert {f"cubicle-{i}" for i in ids} <= hostnames
        pids = [pid for i in ids for pid in _sandbox_pids(i)]
        assert len(pids) > 2 * 5  # Xvfb, the bus, XFCE's parts and the guest, per desktop
    finally:
        stop_service(svc)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status tells why.
    assert svc.process.returncode in (0, -signal.SIGTERM)
    assert _bwraps_of(svc.data_dir) == []
    assert [pid for pid in pids if _running(pid)] == []
    assert not any(d.exists() for d in sandbox_dirs)


def test_warm_pool_hands_out_drawn_desktops_and_keeps_them_unlisted():
    svc = start_service(CUBICLE_WARM_POOL="1")
    try:
        with svc.client() as client:
            # The pool starts booting with the service: a create joins that boot.
            first, second = create_desktop(client), create_desktop(client)
            assert first["from_pool"] and second["from_pool"]
            for info in (first, second):
                assert info["status"] == "ready"
                shot = client.get(f"/api/desktops/{info['id']}/screenshot")
                assert shot.status_code == 200
            listed = [d["id"] for d in client.get("/api/desktops").json()]
            assert sorted(listed) == sorted([first["id"], second["id"]])
            odd = create_desktop(client, resolution=[1024, 768])
            assert not odd["from_pool"] and odd["screen"] == {"width": 1024, "height": 768}
    finally:
        stop_service(svc)
    assert _bwraps_of(svc.data_dir) == []
