"""Pause and resume: a paused desktop keeps its programs, windows and memory exactly as they
were, runs nothing meanwhile, answers its calls with a clear 409, and picks up where it
stopped when resumed, ten times in a row. In both runtimes (cgroup freezer, QEMU `stop`)."""

from __future__ import annotations

import io
import time
from pathlib import Path

from PIL import Image, ImageChops

from cubicle.server.runtime import cgroups
from tests.conftest import (
    TICKER,
    create_desktop,
    editable_text,
    patience,
    start_service,
    stop_service,
    wait_until,
)

BOTH_RUNTIMES = True

UNSAVED = "paused, not saved: héllo ✓"


def _exec(api, desktop_id: str, command: str) -> str:
    response = api.post(
        f"/api/desktops/{desktop_id}/exec", json={"command": command, "timeout_s": 60}
    )
    assert response.status_code == 200, response.text
    return response.json()["stdout"]


def _tick(api, desktop_id: str) -> tuple[int, int]:
    pid, count = _exec(api, desktop_id, "cat /tmp/tick").split()
    return int(pid), int(count)


def _act(api, desktop_id: str, *actions: dict) -> None:
    response = api.post(f"/api/desktops/{desktop_id}/actions", json=list(actions))
    assert response.status_code == 200, response.text


def _editor_text(api, desktop_id: str) -> str:
    """What the editor holds, as a person would copy it: select all, copy, read (once the
    clipboard changed: the editor takes it a moment after the keys)."""
    clipboard = f"/api/desktops/{desktop_id}/clipboard"
    assert api.put(clipboard, json={"text": "-"}).status_code == 204
    _act(api, desktop_id, {"type": "key", "keys": "ctrl+a"}, {"type": "key", "keys": "ctrl+c"})
    return wait_until(lambda: (t := api.get(clipboard).json()["text"]) != "-" and t, 5)


def _windows(api, desktop_id: str) -> list[tuple[str, str]]:
    answer = api.get(f"/api/desktops/{desktop_id}/windows").json()
    return sorted((w["app"], w["title"]) for w in answer)


def _open(api, desktop: dict, app: str, window_app: str) -> dict:
    base = f"/api/desktops/{desktop['id']}"
    api.post(f"{base}/launch", json={"app": app})
    return wait_until(
        lambda: [w for w in api.get(f"{base}/windows").json() if w["app"] == window_app],
        patience(desktop, 10),
        what=f"a {app} window",
    )[0]


def _screen(api, desktop_id: str) -> Image.Image:
    shot = api.get(f"/api/desktops/{desktop_id}/screenshot")
    assert shot.status_code == 200, shot.text
    return Image.open(io.BytesIO(shot.content)).convert("RGB")


def _changed_share(a: Image.Image, b: Image.Image) -> float:
    """The share of pixels that differ (a text cursor blinks: a few hundred of a million)."""
    box = ImageChops.difference(a, b).convert("L").point(lambda v: 255 if v > 16 else 0)
    return sum(box.histogram()[255:]) / (a.width * a.height)


def _type_line(api, desktop_id: str, window: dict, line: str) -> None:
    _act(
        api,
        desktop_id,
        {"type": "click", "x": window["x"] + window["width"] // 2, "y": window["y"] + 120},
        {"type": "type", "text": line},
        {"type": "key", "keys": "Return"},
    )


def test_ten_pauses_lose_nothing(api, desktop):
    """A file, a process counting in memory, an editor's unsaved text and a shell's
    variable and history: all there after ten pauses, the screen as it was."""
    desktop_id = desktop["id"]
    base = f"/api/desktops/{desktop_id}"
    assert api.put(f"{base}/files", params={"path": "~/kept.txt"}, content=b"kept").is_success
    api.put(f"{base}/files", params={"path": "~/ticker.py"}, content=TICKER.encode())
    _exec(api, desktop_id, "setsid python3 ~/ticker.py >/dev/null 2>&1 < /dev/null &")
    wait = patience(desktop, 10)
    wait_until(lambda: _exec(api, desktop_id, "cat /tmp/tick 2>/dev/null"), wait, what="ticks")
    shell = _open(api, desktop, "terminal", "Xfce4-terminal")
    _act(api, desktop_id, {"type": "wait_for_settle", "quiet_ms": 300})
    _type_line(api, desktop_id, shell, "KEPT=only-in-this-shell; echo typed-before-pausing")
    editor = _open(api, desktop, "mousepad", "Mousepad")
    _act(
        api,
        desktop_id,
        {"type": "wait_for_settle", "quiet_ms": 300},
        {"type": "click", "x": editor["x"] + 200, "y": editor["y"] + 200},
        {"type": "type", "text": UNSAVED},
    )
    assert _editor_text(api, desktop_id) == UNSAVED
    wait_until(lambda: editable_text(api, desktop_id) == UNSAVED, wait, what="a11y text")
    _act(api, desktop_id, {"type": "wait_for_settle", "quiet_ms": 500})
    screen = _screen(api, desktop_id)
    windows = _windows(api, desktop_id)
    ticker_pid, _ = _tick(api, desktop_id)

    for _ in range(10):
        before = _tick(api, desktop_id)
        paused = api.post(f"{base}/pause", json={})
        assert paused.status_code == 200, paused.text
        assert paused.json()["status"] == "paused"
        assert paused.json()["paused_at"] is not None
        resumed = api.post(f"{base}/resume")
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["status"] == "ready"
        after = wait_until(lambda b=before: (t := _tick(api, desktop_id))[1] > b[1] and t, wait)
        assert after[0] == ticker_pid  # the same process, counting on from where it was

    assert _windows(api, desktop_id) == windows
    assert _changed_share(screen, _screen(api, desktop_id)) < 0.002  # cursors may blink
    assert editable_text(api, desktop_id) == UNSAVED
    assert _editor_text(api, desktop_id) == UNSAVED
    assert api.get(f"{base}/files", params={"path": "~/kept.txt"}).content == b"kept"
    # The ticker never started again: one process, the one from before the first pause.
    assert _exec(api, desktop_id, "pgrep -f '[t]icker.py'").split() == [str(ticker_pid)]
    # The same shell: its variable and its history, never written to a file meanwhile.
    _type_line(api, desktop_id, shell, 'echo "$KEPT" > ~/var.txt; history > ~/history.txt')
    wait_until(lambda: _exec(api, desktop_id, "cat ~/var.txt 2>/dev/null"), wait, what="var")
    assert _exec(api, desktop_id, "cat ~/var.txt") == "only-in-this-shell\n"
    history = _exec(api, desktop_id, "cat ~/history.txt")
    assert "KEPT=only-in-this-shell; echo typed-before-pausing" in history


def test_a_paused_desktop_runs_nothing_and_says_so(api, desktop):
    desktop_id = desktop["id"]
    base = f"/api/desktops/{desktop_id}"
    _exec(api, desktop_id, "pgrep -f '[t]icker.py' >/dev/null || setsid python3 ~/ticker.py &")
    wait_until(lambda: _exec(api, desktop_id, "cat /tmp/tick 2>/dev/null"), patience(desktop, 10))
    assert api.post(f"{base}/pause").status_code == 200
    try:
        for method, path in [("GET", "/screenshot"), ("POST", "/exec"), ("GET", "/cursor")]:
            answer = api.request(method, base + path, json={"command": "true"})
            assert answer.status_code == 409, (path, answer.text)
            assert answer.json()["error"] == "desktop_paused"
            assert "/resume" in answer.json()["detail"]
        again = api.post(f"{base}/pause")
        assert again.status_code == 409 and "already paused" in again.json()["detail"]
        listed = {d["id"]: d for d in api.get("/api/desktops").json()}
        assert listed[desktop_id]["status"] == "paused"
        assert listed[desktop_id]["expires_at"] is None  # the idle timeout waits
        cold = api.post(f"{base}/pause", json={"keep_memory": False})
        assert cold.status_code == 409 and "already paused" in cold.json()["detail"]
    finally:
        assert api.post(f"{base}/resume").status_code == 200
    count = _tick(api, desktop_id)[1]
    wait_until(lambda: _tick(api, desktop_id)[1] > count, patience(desktop, 10))
    # resuming a desktop that runs changes nothing
    assert api.post(f"{base}/resume").json()["status"] == "ready"


def _cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


def test_a_paused_desktop_uses_no_cpu_and_others_keep_answering(api):
    spinning = create_desktop(api)
    other = create_desktop(api)
    try:
        base = f"/api/desktops/{spinning['id']}"
        _exec(api, spinning["id"], "setsid sh -c 'while :; do :; done' >/dev/null 2>&1 &")
        group = cgroups.find(spinning["id"])
        assert group is not None
        time.sleep(0.5)
        start = _cpu_ticks(group.pids())
        time.sleep(0.5)
        assert _cpu_ticks(group.pids()) - start > 10  # the loop spins: > 0.1 s of CPU

        assert api.post(f"{base}/pause").status_code == 200
        frozen = _cpu_ticks(group.pids())
        time.sleep(1.0)
        assert _cpu_ticks(group.pids()) - frozen <= 1  # nothing ran for a whole second
        assert api.get(f"/api/desktops/{other['id']}/cursor").status_code == 200
        assert api.get("/healthz").status_code == 200

        # killing a paused desktop ends everything in it
        pids = group.pids()
        assert api.delete(base).status_code == 204
        wait_until(lambda: not any(_alive(pid) for pid in pids), 10, what="its processes")
    finally:
        api.delete(f"/api/desktops/{spinning['id']}")
        api.delete(f"/api/desktops/{other['id']}")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_pausing_unknown_desktops(api):
    assert api.post("/api/desktops/nope/pause").status_code == 404
    assert api.post("/api/desktops/nope/resume").status_code == 404
    bad = api.post("/api/desktops/nope/pause", json={"keep_memory": "sometimes"})
    assert bad.status_code == 422


def test_paused_without_memory_keeps_the_disk_and_boots_again(api, service):
    """Three times: the disk is kept, the programs end, the desktop holds no memory while
    paused, and it is drawn again on resume."""
    desktop = create_desktop(api)
    base = f"/api/desktops/{desktop['id']}"
    try:
        api.put(f"{base}/files", params={"path": "~/kept.txt"}, content=b"on the disk")
        api.put(f"{base}/files", params={"path": "~/ticker.py"}, content=TICKER.encode())
        api.post(f"{base}/launch", json={"app": "mousepad", "args": ["/home/user/kept.txt"]})
        wait_until(lambda: _windows(api, desktop["id"]), 20, what="the editor")
        for _ in range(3):
            _exec(api, desktop["id"], "setsid python3 ~/ticker.py >/dev/null 2>&1 < /dev/null &")
            wait_until(lambda: _exec(api, desktop["id"], "cat /tmp/tick 2>/dev/null"), 10)
            paused = api.post(f"{base}/pause", json={"keep_memory": False})
            assert paused.status_code == 200, paused.text
            assert paused.json()["status"] == "paused" and paused.json()["paused_memory"] is False
            assert cgroups.find(desktop["id"]) is None  # no process, no memory held
            assert api.get(f"{base}/screenshot").json()["error"] == "desktop_paused"
            snap = api.post(f"{base}/snapshot", json={"name": "cold-x"})
            assert snap.status_code == 409 and "without its memory" in snap.json()["detail"]
            resumed = api.post(f"{base}/resume")
            assert resumed.status_code == 200, resumed.text
            assert resumed.json()["status"] == "ready" and resumed.json()["paused_memory"] is None
            assert api.get(f"{base}/screenshot").status_code == 200  # drawn again
            assert api.get(f"{base}/files", params={"path": "~/kept.txt"}).content == (
                b"on the disk"
            )
            assert _exec(api, desktop["id"], "pgrep -f '[t]icker.py' || echo none") == "none\n"
            # the editor it had open, opened again on its file
            wait_until(
                lambda: [t for a, t in _windows(api, desktop["id"]) if "kept.txt" in t],
                20,
                what="the editor opened again",
            )
            assert [a for a, _ in _windows(api, desktop["id"])] == ["Mousepad"]
        # killed while paused so: its kept disk goes too
        assert api.post(f"{base}/pause", json={"keep_memory": False}).status_code == 200
        assert list((service.data_dir / "parked").glob("*.img"))
    finally:
        api.delete(base)
    assert not list((service.data_dir / "parked").glob("*.img"))


def _status(api, desktop_id: str) -> dict:
    return api.get(f"/api/desktops/{desktop_id}").json()


def test_lifecycle_pauses_at_the_timeout_resumes_on_use_and_ends_on_time():
    """One service whose paused desktops are kept 12 s: a desktop that pauses at its idle
    timeout and resumes when used, one that pauses and is stopped once kept too long, and
    one stopped at its longest life though in use."""
    service = start_service(CUBICLE_PAUSED_RETENTION_S="12", CUBICLE_WARM_POOL="0")
    try:
        with service.client() as api:
            resumes = create_desktop(
                api, timeout_s=10, lifecycle={"on_timeout": "pause", "auto_resume": True}
            )
            kept = create_desktop(
                api, timeout_s=10, lifecycle={"on_timeout": "pause", "keep_memory": False}
            )
            short = create_desktop(api, timeout_s=600, lifecycle={"max_lifetime_s": 10})
            assert resumes["lifecycle"] == {
                "on_timeout": "pause",
                "keep_memory": True,
                "auto_resume": True,
                "max_lifetime_s": None,
            }
            base = f"/api/desktops/{resumes['id']}"
            api.put(f"{base}/files", params={"path": "~/kept.txt"}, content=b"kept")
            wait_until(lambda: _status(api, resumes["id"])["status"] == "paused", 30)
            assert _status(api, kept["id"])["status"] in ("ready", "paused")
            # a call that reaches inside resumes it, and answers
            answer = api.get(f"{base}/files", params={"path": "~/kept.txt"})
            assert answer.status_code == 200 and answer.content == b"kept"
            assert _status(api, resumes["id"])["status"] == "ready"

            # without auto_resume a call is refused and the desktop stays paused
            wait_until(lambda: _status(api, kept["id"])["status"] == "paused", 30)
            assert _status(api, kept["id"])["paused_memory"] is False  # its disk only
            refused = api.get(f"/api/desktops/{kept['id']}/cursor")
            assert refused.status_code == 409 and refused.json()["error"] == "desktop_paused"
            stopped = wait_until(
                lambda: (d := _status(api, kept["id"]))["status"] == "stopped" and d, 30
            )
            assert "paused for more than 12 s" in stopped["reason"]

            ended = wait_until(
                lambda: (d := _status(api, short["id"]))["status"] == "stopped" and d, 30
            )
            assert "max_lifetime_s (10 s)" in ended["reason"]
            bad = api.post("/api/desktops", json={"lifecycle": {"on_timeout": "sleep"}})
            assert bad.status_code == 422
    finally:
        stop_service(service)


def test_a_paused_desktop_outlives_a_restart_of_the_service():
    first = start_service(CUBICLE_WARM_POOL="0")
    data_dir, token = first.data_dir, first.token
    try:
        with first.client() as api:
            paused = create_desktop(api)
            running = create_desktop(api)
            base = f"/api/desktops/{paused['id']}"
            api.put(f"{base}/files", params={"path": "~/work.txt"}, content=b"before restart")
            assert api.post(f"{base}/pause").status_code == 200  # with its memory
    finally:
        stop_service(first)
    second = start_service(data_dir=data_dir, token=token, CUBICLE_WARM_POOL="0")
    try:
        with second.client() as api:
            listed = {d["id"]: d for d in api.get("/api/desktops").json()}
            assert running["id"] not in listed  # a running desktop ends with its service
            found = listed[paused["id"]]
            # the memory could not outlive the service: the disk did
            assert found["status"] == "paused" and found["paused_memory"] is False
            resumed = api.post(f"/api/desktops/{paused['id']}/resume")
            assert resumed.status_code == 200, resumed.text
            again = api.get(f"/api/desktops/{paused['id']}/files", params={"path": "~/work.txt"})
            assert again.content == b"before restart"
            assert api.get(f"/api/desktops/{paused['id']}/screenshot").status_code == 200
            assert api.delete(f"/api/desktops/{paused['id']}").status_code == 204
        assert not list((data_dir / "parked").glob("*"))
    finally:
        stop_service(second)
