"""The warm pool follows demand: the board's concurrency plus a margin for API users, booted
at low priority, bounded by CUBICLE_MAX_DESKTOPS and by memory, and off when asked.

Real services, real desktops; only the board's model is scripted (`fake_model`). Spares
boot at nice 19 by default, which on a host kept busy by something else means they wait:
the tests of what the pool keeps run with `CUBICLE_WARM_POOL_NICE=0`, so that they do not
depend on the host's load, and one test checks the default priority itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cubicle.server.runtime import cgroups
from tests.agent.board_api import FINISHED, say, set_board, use_fake_model, wait_status
from tests.agent.fake_model import FakeModelServer
from tests.conftest import Service, create_desktop, start_service, stop_service, wait_until


@pytest.fixture(scope="module")
def pooled() -> Iterator[Service]:
    """A service with the default margin of one spare for API users, booting at nice 0."""
    svc = start_service(CUBICLE_WARM_POOL="1", CUBICLE_WARM_POOL_NICE="0")
    try:
        yield svc
    finally:
        stop_service(svc)


@pytest.fixture(scope="module")
def api(pooled: Service) -> Iterator[httpx.Client]:
    with pooled.client() as client:
        yield client


def _pool(api: httpx.Client) -> dict:
    response = api.get("/api/pool")
    assert response.status_code == 200, response.text
    return response.json()


def _pool_drawn(api: httpx.Client, timeout_s: float = 120) -> dict:
    """The pool once every spare it keeps is drawn."""
    return wait_until(
        lambda: (p := _pool(api))["ready"] == p["target"] and p["booting"] == 0 and p,
        timeout_s,
        0.2,
        "every spare of the warm pool to be drawn",
    )


def _spare_ids(svc: Service, api: httpx.Client) -> list[str]:
    """Desktops of this service nobody was handed: sandbox directories not listed."""
    listed = {d["id"] for d in api.get("/api/desktops").json()}
    found = (svc.data_dir / "desktops").iterdir()  # `.spare-…`: a disk, not a desktop
    return [p.name for p in found if p.name not in listed and not p.name.startswith(".")]


def _pids(desktop_id: str) -> list[str]:
    cgroup = cgroups.find(desktop_id)
    try:
        return [str(pid) for pid in cgroup.pids()] if cgroup else []
    except FileNotFoundError:
        return []


def _nice_values(desktop_id: str) -> set[int]:
    """The nice value of every thread of a desktop, from its pids cgroup."""
    found = set()
    for pid in _pids(desktop_id):
        for task in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                found.add(int(task.read_text().rsplit(")", 1)[1].split()[16]))
            except (OSError, IndexError):
                continue
    return found


def _group_nices(desktop_id: str) -> set[int]:
    """The nice of the session groups (`sched_autogroup`) inside the sandbox: those of its
    processes started by another of its processes (bwrap's own monitor is left out)."""
    pids = _pids(desktop_id)
    found = set()
    for pid in pids:
        try:
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            if parent in pids:
                found.add(int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def test_the_pool_keeps_the_boards_concurrency_plus_a_margin_and_follows_it(api: httpx.Client):
    set_board(api, concurrency=3)
    pool = _pool_drawn(api)
    assert pool["enabled"] and pool["wanted"] == {"board": 3}
    assert pool["target"] == 4 and pool["ready"] == 4
    assert pool["kinds"] == [
        {"resolution": [1280, 800], "network": False, "runtime": "local", "target": 4,
         "ready": 4, "booting": 0},
    ]  # fmt: skip
    assert api.get("/api/desktops").json() == []  # spares are not listed

    set_board(api, concurrency=1)  # fewer tasks at once: the spares beyond are stopped
    pool = wait_until(
        lambda: (p := _pool(api))["ready"] == 2 and p["booting"] == 0 and p,
        30,
        0.2,
        "the pool to shrink to the board's concurrency plus one",
    )
    assert pool["target"] == 2 and pool["wanted"] == {"board": 1}


def test_two_board_tasks_started_together_both_start_on_warm_desktops(
    api: httpx.Client, fake_model: FakeModelServer
):
    use_fake_model(api, fake_model)
    fake_model.script([say("Nothing to do.", type="done", summary="done") for _ in range(2)])
    set_board(api, concurrency=2, record=False, keep_desktop_s=60)
    _pool_drawn(api)

    added = api.post("/api/tasks/batch", json={"tasks": [{"text": "one"}, {"text": "two"}]})
    assert added.status_code == 201, added.text
    tasks = [wait_status(api, t["id"], *FINISHED) for t in added.json()["tasks"]]
    assert [t["status"] for t in tasks] == ["done", "done"], tasks
    desktops = [api.get(f"/api/desktops/{t['desktop_id']}").json() for t in tasks]
    assert len({d["id"] for d in desktops}) == 2
    assert [d["from_pool"] for d in desktops] == [True, True], desktops
    for desktop in desktops:
        api.delete(f"/api/desktops/{desktop['id']}")
    set_board(api, concurrency=0)


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a niced process back needs root")
@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no sched_autogroup")
def test_spares_boot_at_nice_19_and_run_at_normal_priority_once_taken():
    svc = start_service(CUBICLE_WARM_POOL="1")  # the default niceness, 19
    try:
        with svc.client() as client:
            spare = wait_until(
                lambda: (
                    len(s := _spare_ids(svc, client)) == 1
                    and _group_nices(s[0]) == {19}
                    and _nice_values(s[0]) == {19}
                    and s[0]
                ),
                60,
                0.05,
                "a spare booting with every thread and its session group at nice 19",
            )
            info = create_desktop(client)  # takes it, drawn or not, and raises it
            assert info["from_pool"] and info["id"] == spare
            wait_until(
                lambda: _nice_values(spare) == {0} and _group_nices(spare) == {0},
                10,
                0.05,
                "the desktop at nice 0",
            )
            shot = client.get(f"/api/desktops/{spare}/screenshot")
            assert shot.status_code == 200 and shot.content.startswith(b"\x89PNG")
            assert _nice_values(spare) == {0}  # what it started since runs at nice 0 too
    finally:
        stop_service(svc)


def test_the_pool_stays_under_the_desktop_limit_and_gives_way_to_creates():
    svc = start_service(CUBICLE_WARM_POOL="1", CUBICLE_MAX_DESKTOPS="2", CUBICLE_WARM_POOL_NICE="0")
    try:
        with svc.client() as client:
            set_board(client, concurrency=3)
            pool = wait_until(
                lambda: (p := _pool(client))["ready"] == 2 and p["held_back"] and p,
                120,
                0.2,
                "two spares drawn and the pool held back",
            )
            assert pool["target"] == 4
            assert "CUBICLE_MAX_DESKTOPS" in pool["held_back"]
            first = create_desktop(client)
            assert first["from_pool"]
            # A kind the pool does not keep: a spare makes room for it.
            odd = create_desktop(client, resolution=[1024, 768])
            assert not odd["from_pool"] and odd["screen"] == {"width": 1024, "height": 768}
            assert _pool(client)["ready"] + _pool(client)["booting"] == 0
            refused = client.post("/api/desktops", json={})
            assert refused.status_code == 429
    finally:
        stop_service(svc)


def test_no_spare_boots_while_memory_is_short_or_the_pool_is_off():
    short = start_service(CUBICLE_WARM_POOL="1", CUBICLE_WARM_POOL_RESERVE_MB="100000000")
    off = start_service(CUBICLE_WARM_POOL="0")
    try:
        with short.client() as client:
            pool = wait_until(lambda: (p := _pool(client))["held_back"] and p, 30, 0.2, "held back")
            assert "MemAvailable" in pool["held_back"]
            assert pool["enabled"] and pool["ready"] == 0 and pool["booting"] == 0
        with off.client() as client:
            set_board(client, concurrency=2)
            pool = _pool(client)
            assert not pool["enabled"] and pool["target"] == 0 and pool["ready"] == 0
            info = create_desktop(client)
            assert not info["from_pool"] and info["status"] == "ready"
            assert _pool(client)["booting"] == 0
    finally:
        stop_service(short)
        stop_service(off)
