"""The `ray` runtime on a real Ray cluster on this machine: a head and two worker nodes, each
offering two desktops. The service runs as users run it (`cubicle serve`, CUBICLE_RUNTIME=ray)
and places desktops through Ray; only the agent's model is scripted.

The tests run in order on one cluster, as an operator would meet it: desktops spread over
both workers and are driven like any other (input, screenshots, exec, a WebRTC viewer); a
create the cluster has no room for waits and fails clearly; a worker dies and takes only
its desktops (and the board task on it) with it; the service restarts and finds the
desktops still running.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from tests.agent.board_api import FINISHED, add, say, set_board, use_fake_model, wait_status
from tests.agent.fake_model import FakeModelServer, Turn
from tests.conftest import Service, start_service, stop_service, wait_until
from tests.desktop.ray_cluster import LocalCluster, local_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

START_TIMEOUT_S = 20
"""The services' CUBICLE_START_TIMEOUT_S: how long a create waits for room in the cluster."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with local_cluster(workers=2, desktops_each=2) as cluster:
        yield cluster


def ray_service(cluster: LocalCluster, restart_of: Service | None = None, **env: str) -> Service:
    settings = {
        "CUBICLE_RUNTIME": "ray",
        "CUBICLE_RAY_ADDRESS": cluster.address,
        "CUBICLE_RAY_NAMESPACE": "cubicle-test",
        "CUBICLE_WARM_POOL": "0",
        "CUBICLE_START_TIMEOUT_S": str(START_TIMEOUT_S),
        **env,
    }
    if restart_of is None:
        return start_service(**settings)
    return start_service(restart_of.data_dir, restart_of.token, **settings)


class State:
    """What the ordered tests hand on to each other."""

    service: Service
    desktops: dict[str, dict]
    """Desktop id → its info, as created."""


@pytest.fixture(scope="module")
def state(cluster: LocalCluster) -> Iterator[type[State]]:
    State.service = ray_service(cluster)
    State.desktops = {}
    try:
        yield State
    finally:
        with State.service.client() as api:
            listed = [d["id"] for d in api.get("/api/desktops").json()]
            for desktop_id in {*State.desktops, *listed}:
                api.delete(f"/api/desktops/{desktop_id}")
        stop_service(State.service)


def on_node(desktops: dict[str, dict], node) -> list[str]:
    return [i for i, d in desktops.items() if d["node"]["id"] == node.node_id]


def sandbox_running(desktop_id: str) -> bool:
    """Whether the desktop's bwrap sandbox still runs on this machine (the nodes' host)."""
    needle = f"cubicle-{desktop_id}".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if args[0].endswith(b"bwrap") and needle in args:
            return True
    return False


def test_the_ray_runtime_without_a_cluster_address_is_a_clear_422(api):
    answer = api.post("/api/desktops", json={"runtime": "ray"})
    assert answer.status_code == 422
    assert "CUBICLE_RAY_ADDRESS" in answer.json()["detail"]
    unknown = api.post("/api/desktops", json={"runtime": "nope"})
    assert unknown.status_code == 422 and "unknown runtime" in unknown.json()["detail"]
    assert api.get("/api/desktops").status_code == 200


def test_node_labels_pin_the_node(cluster: LocalCluster, state):
    with state.service.client() as api:
        for index, worker in enumerate(cluster.workers):
            answer = api.post("/api/desktops", json={"node": {"worker": index}})
            assert answer.status_code == 201, answer.text
            assert answer.json()["node"]["id"] == worker.node_id
            assert api.delete(f"/api/desktops/{answer.json()['id']}").status_code == 204
        bad = api.post("/api/desktops", json={"node": {"no such/label!": 1}})
        assert bad.status_code == 422


def test_four_desktops_spread_over_both_workers(cluster: LocalCluster, state):
    with state.service.client() as api:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: api.post("/api/desktops", json={}), range(4)))
        for answer in answers:
            assert answer.status_code == 201, answer.text
        infos = [answer.json() for answer in answers]
        state.desktops.update({info["id"]: info for info in infos})
        assert {info["runtime"] for info in infos} == {"ray"}
        placed = Counter(info["node"]["id"] for info in infos)
        assert placed == {worker.node_id: 2 for worker in cluster.workers}
        for info in infos:
            seen = api.get(f"/api/desktops/{info['id']}").json()
            assert seen["status"] == "ready"
            assert seen["node"] == info["node"] and seen["node"]["address"]

        labelled = api.post("/api/desktops", json={"runtime": "local", "node": {"gpu": True}})
        assert labelled.status_code == 422 and "node labels" in labelled.json()["detail"]


def test_click_type_screenshot_and_exec_on_a_desktop_of_each_worker(cluster, state):
    with state.service.client() as api:
        for worker in cluster.workers:
            desktop_id = on_node(state.desktops, worker)[0]
            base = f"/api/desktops/{desktop_id}"
            touched = api.post(f"{base}/exec", json={"command": "touch ~/note.txt"})
            assert touched.status_code == 200 and touched.json()["exit_code"] == 0
            note = {"app": "mousepad", "args": ["/home/user/note.txt"]}
            launched = api.post(f"{base}/launch", json=note)
            assert launched.status_code == 200, launched.text
            window = wait_until(
                lambda base=base: next(
                    (w for w in api.get(f"{base}/windows").json() if w["app"] == "Mousepad"),
                    None,
                ),
                30,
                0.2,
                "the editor's window",
            )
            x = window["x"] + window["width"] // 2
            y = window["y"] + window["height"] // 2
            text = f"typed on {worker.node_id[:8]}"
            answer = api.post(
                f"{base}/actions",
                json=[
                    {"type": "click", "x": x, "y": y},
                    {"type": "type", "text": text},
                    {"type": "key", "keys": "ctrl+s"},
                    {"type": "wait_for_settle"},
                ],
            )
            assert answer.status_code == 200, answer.text
            assert api.get(f"{base}/cursor").json() == {"x": x, "y": y}
            saved = wait_until(
                lambda base=base, text=text: (
                    (out := api.post(f"{base}/exec", json={"command": "cat ~/note.txt"}).json())[
                        "stdout"
                    ].strip()
                    == text
                    and out
                ),
                10,
                0.2,
                "the typed text saved to ~/note.txt",
            )
            assert saved["exit_code"] == 0
            shot = api.get(f"{base}/screenshot")
            assert shot.status_code == 200 and shot.content.startswith(b"\x89PNG")
            assert (shot.headers["x-screen-width"], shot.headers["x-screen-height"]) == (
                "1280",
                "800",
            )


def test_a_desktop_on_a_worker_pauses_with_its_memory_only(cluster, state):
    """Paused on its node (its cgroup frozen there), it answers 409 and counts on where it
    stood once resumed; a pause without memory is refused and leaves it running."""
    worker = cluster.workers[0]
    desktop_id = on_node(state.desktops, worker)[0]
    base = f"/api/desktops/{desktop_id}"
    ticker = "n=0; while :; do n=$((n+1)); echo $n > /tmp/n; sleep 0.2; done"

    def count(api) -> int:
        out = api.post(f"{base}/exec", json={"command": "cat /tmp/n"}).json()["stdout"]
        return int(out.strip() or 0)

    with state.service.client() as api:
        started = api.post(
            f"{base}/exec", json={"command": f"setsid sh -c '{ticker}' >/dev/null 2>&1 &"}
        )
        assert started.status_code == 200, started.text
        wait_until(lambda: count(api) > 0, 10, 0.2, "the counter")
        paused = api.post(f"{base}/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json()["status"] == "paused" and paused.json()["paused_memory"] is True
        refused = api.get(f"{base}/screenshot")
        assert refused.status_code == 409 and refused.json()["error"] == "desktop_paused"
        assert sandbox_running(desktop_id)  # frozen, not ended
        resumed = api.post(f"{base}/resume")
        assert resumed.status_code == 200 and resumed.json()["status"] == "ready"
        before = count(api)
        assert before > 0  # the same counter, not one started again
        wait_until(lambda: count(api) > before, 10, 0.2, "the counter going on")
        cold = api.post(f"{base}/pause", json={"keep_memory": False})
        assert cold.status_code == 422 and cold.json()["error"] == "not_supported"
        assert "with its memory only" in cold.json()["detail"]
        assert api.get(f"{base}").json()["status"] == "ready"
        assert api.get(f"{base}/screenshot").status_code == 200
        api.post(f"{base}/exec", json={"command": "pkill -f '[w]hile :; do n=' || true"})


def test_a_port_of_a_desktop_on_each_worker_answers_through_the_service(cluster, state):
    """The port relay rides the desktop's door like every other request: a server in a
    desktop of each worker answers by E2B's headers. Private networks are refused clearly."""
    service = state.service
    with service.client() as api:
        for worker in cluster.workers:
            desktop_id = on_node(state.desktops, worker)[0]
            base = f"/api/desktops/{desktop_id}"
            serve = (
                f"mkdir -p /tmp/w && echo {worker.node_id[:8]} > /tmp/w/index.html && cd /tmp/w "
                "&& (setsid python3 -m http.server 8080 >/dev/null 2>&1 &)"
            )
            assert api.post(f"{base}/exec", json={"command": serve}).json()["exit_code"] == 0
            wait_until(
                lambda base=base: any(p["port"] == 8080 for p in api.get(f"{base}/ports").json()),
                20,
                0.2,
                "http.server in the worker's desktop",
            )
            headers = {
                "E2b-Sandbox-Id": desktop_id,
                "E2b-Sandbox-Port": "8080",
                "X-Access-Token": service.token,
            }
            answer = httpx.get(f"{service.url}/", headers=headers, timeout=30)
            assert answer.status_code == 200 and answer.text.strip() == worker.node_id[:8]
        assert api.post("/api/networks", json={"name": "ray-team"}).status_code == 201
        refused = api.post("/api/desktops", json={"networks": ["ray-team"]})
        assert refused.status_code == 422 and refused.json()["error"] == "not_supported"
        assert api.delete("/api/networks/ray-team").status_code == 204


def test_a_desktop_door_answers_nobody_without_the_desktop_secret(cluster, state):
    """The door listens on the node's address: without the desktop's own secret, or with
    another desktop's, a caller gets 401 and nothing else, and everything keeps working."""
    import ray

    ray.init(address=cluster.address, namespace="cubicle-test", log_to_driver=False)
    try:  # a desktop's actor is named after it, or was a spare placed ahead of it
        actors = [ray.get_actor(name) for name in ray.util.list_named_actors()]
        asked = [actor.describe.remote() for actor in actors]
        answered, _ = ray.wait(asked, num_returns=len(asked), timeout=10)  # a pending spare
        described = ray.get(answered)  # never answers
    finally:
        ray.shutdown()
    doors = {d.spec.id: d.endpoint for d in described if d.spec is not None}
    ids = sorted(state.desktops)
    assert set(ids) <= set(doors)
    door, other = doors[ids[0]], doors[ids[1]]
    assert door.secret and other.secret and door.secret != other.secret
    url = f"http://{door.host}:{door.port}"
    for headers in ({}, {"Authorization": f"Bearer {other.secret}"}, {"Authorization": "x"}):
        for method, path in [("GET", "/screenshot"), ("POST", "/exec"), ("POST", "/actions")]:
            answer = httpx.request(method, url + path, headers=headers, json={"command": "id"})
            assert answer.status_code == 401, (path, headers, answer.text)
            assert b"PNG" not in answer.content and "uid=" not in answer.text
    mine = {"Authorization": f"Bearer {door.secret}"}
    assert httpx.get(f"{url}/health", headers=mine).status_code == 200
    with state.service.client() as api:
        for desktop_id in ids:
            assert api.get(f"/api/desktops/{desktop_id}/cursor").status_code == 200


def test_a_webrtc_viewer_plays_a_desktop_of_each_worker(cluster, state, browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        for worker in cluster.workers:
            desktop_id = on_node(state.desktops, worker)[0]
            page.goto(f"{state.service.url}/view/{desktop_id}?token={state.service.token}")
            expect(page.locator("#transport")).to_have_text("WebRTC", timeout=30_000)
            size = page.eval_on_selector("#screen", "v => [v.videoWidth, v.videoHeight]")
            assert size == [1280, 800]

            def decoded() -> int:
                return page.eval_on_selector(
                    "#screen", "v => v.getVideoPlaybackQuality().totalVideoFrames"
                )

            before = decoded()
            with state.service.client() as api:  # a change on the desktop reaches the page
                api.post(f"/api/desktops/{desktop_id}/launch", json={"app": "terminal"})
            wait_until(lambda before=before: decoded() > before, 20, 0.2, "new frames decoded")
    finally:
        context.close()


def test_a_create_the_cluster_has_no_room_for_waits_then_fails_naming_the_resource(state):
    with state.service.client() as api:
        started = time.monotonic()
        answer = api.post("/api/desktops", json={})
        waited = time.monotonic() - started
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["error"] == "no_node_available"
        assert "cubicle_desktop" in body["detail"] and "taken" in body["detail"]
        assert START_TIMEOUT_S - 1 <= waited < START_TIMEOUT_S + 20
        assert len(api.get("/api/desktops").json()) == 4  # the failed create left nothing
        for desktop_id in state.desktops:
            assert api.get(f"/api/desktops/{desktop_id}/cursor").status_code == 200


def test_a_dead_worker_fails_only_its_desktops_and_interrupts_its_board_task(
    cluster: LocalCluster, state, fake_model: FakeModelServer
):
    doomed, survivor = cluster.workers
    with state.service.client() as api:
        # Room on the doomed worker for the board's task, and nowhere else.
        freed = on_node(state.desktops, doomed)[0]
        assert api.delete(f"/api/desktops/{freed}").status_code == 204
        del state.desktops[freed]
        use_fake_model(api, fake_model)
        set_board(api, concurrency=1, record=False, keep_desktop_s=0)
        fake_model.script([Turn.hang(120, say("Typing.", type="type", text="lost"))])
        task = add(api, "Type on a node that is about to die")
        fake_model.wait_for_requests(1, timeout_s=60)
        task = api.get(f"/api/tasks/{task['id']}").json()
        assert task["status"] == "running"
        task_desktop = api.get(f"/api/desktops/{task['desktop_id']}").json()
        assert task_desktop["node"]["id"] == doomed.node_id

        listed = on_node(state.desktops, doomed)
        victims = [*listed, task["desktop_id"]]
        survivors = on_node(state.desktops, survivor)
        killed_at = time.monotonic()
        cluster.kill_worker(doomed)

        for victim in victims:
            failed = wait_until(
                lambda victim=victim: (
                    (d := api.get(f"/api/desktops/{victim}").json())["status"] == "failed" and d
                ),
                30,
                0.2,
                f"desktop {victim} on the dead node to fail",
            )
            assert doomed.node_id[:12] in failed["reason"], failed["reason"]
            gone = api.post(f"/api/desktops/{victim}/exec", json={"command": "true"})
            assert gone.status_code == 410 and "was lost" in gone.json()["detail"]
        assert time.monotonic() - killed_at < 20  # within seconds, not minutes
        # Only now the agent acts: on a desktop the service knows is lost (released earlier,
        # its action could still land while the dead node's processes wind down).
        fake_model.release()
        for desktop_id in survivors:
            exec_ = api.post(f"/api/desktops/{desktop_id}/exec", json={"command": "echo alive"})
            assert exec_.status_code == 200 and exec_.json()["stdout"] == "alive\n"

        # The task's desktop failed the same way; the board then released it.
        interrupted = wait_status(api, task["id"], *FINISHED)
        assert interrupted["status"] == "interrupted", interrupted
        assert doomed.node_id[:12] in interrupted["result"] and "retry" in interrupted["result"]
        wait_until(lambda: not any(sandbox_running(v) for v in victims), 30, 0.5, "sandboxes gone")
        for victim in on_node(state.desktops, doomed):
            del state.desktops[victim]

        # A replacement node joins; the retry runs there.
        replacement = cluster.add_worker(desktops=2)
        fake_model.reset()
        fake_model.script([say("All good.", type="done", summary="finished on another node")])
        assert api.post(f"/api/tasks/{task['id']}/retry").status_code == 200
        done = wait_status(api, task["id"], *FINISHED, timeout_s=120)
        assert done["status"] == "done" and done["result"] == "finished on another node"
        assert done["desktop_id"] != task["desktop_id"] and done["attempts"] == 2
        assert replacement in cluster.workers  # the only node with room for the retry
        set_board(api, concurrency=0)


def test_a_restarted_service_finds_its_desktops_still_running(cluster, state):
    running = sorted(state.desktops)
    assert len(running) == 2
    with state.service.client() as api:
        before = {d["id"]: d for d in api.get("/api/desktops").json() if d["status"] == "ready"}
    assert sorted(before) == running

    for how in (signal.SIGTERM, signal.SIGKILL):  # a rolling update, then a crash
        state.service.process.send_signal(how)
        state.service.process.wait(timeout=30)
        state.service = ray_service(cluster, restart_of=state.service)
        with state.service.client() as api:
            found = {d["id"]: d for d in api.get("/api/desktops").json()}
            assert sorted(found) == running, how
            for desktop_id in running:
                assert found[desktop_id]["status"] == "ready"
                assert found[desktop_id]["node"] == before[desktop_id]["node"]
                assert found[desktop_id]["created_at"] == before[desktop_id]["created_at"]
                out = api.post(f"/api/desktops/{desktop_id}/exec", json={"command": "hostname"})
                assert out.status_code == 200 and out.json()["stdout"] == f"cubicle-{desktop_id}\n"

    with state.service.client() as api:
        for desktop_id in running:
            assert api.delete(f"/api/desktops/{desktop_id}").status_code == 204
            del state.desktops[desktop_id]
        assert api.get("/api/desktops").json() == []
    wait_until(lambda: not any(sandbox_running(i) for i in running), 30, 0.5, "sandboxes gone")


def test_the_warm_pool_keeps_its_spare_on_a_worker(cluster, state):
    stop_service(state.service)
    state.service = ray_service(cluster, restart_of=state.service, CUBICLE_WARM_POOL="1")
    workers = {worker.node_id for worker in cluster.workers}
    with state.service.client() as api:
        # The spare boots after the service answers; a request before it is ready
        # boots its own desktop, which is right but not what this test is about.
        wait_until(
            lambda: (p := api.get("/api/pool").json())["ready"] == 1 and p,
            START_TIMEOUT_S,
            0.25,
            "the warm spare ready",
        )
        info = api.post("/api/desktops", json={}).json()
        state.desktops[info["id"]] = info
        assert info["from_pool"] is True, (api.get("/api/pool").json(), state.service.log_tail())
        assert info["node"]["id"] in workers
        assert api.get(f"/api/desktops/{info['id']}/cursor").status_code == 200
