"""The task board through its API, on the real service with real desktops; only the model is
scripted (`fake_model`). Queue order, cancel, pause and resume, restart, bulk, bad input."""

from __future__ import annotations

import io
import json
import signal
import time

import av
import httpx

from tests.agent.board_api import (
    FINISHED,
    add,
    desktop_gone,
    say,
    set_board,
    use_fake_model,
    wait_status,
)
from tests.agent.fake_model import FakeModelServer, Turn
from tests.conftest import Service, start_service, stop_service, wait_until


def test_a_task_runs_to_done_on_a_fresh_desktop_and_leaves_a_record(
    board: httpx.Client, fake_model: FakeModelServer
):
    fake_model.script([
        say("The editor is open: write.", type="type", text="from the board"),
        say("Written.", type="done", summary="wrote the line"),
    ])  # fmt: skip
    task = add(board, "Write 'from the board' in the editor", start="mousepad")
    assert task["status"] == "queued" and task["profile"] == "default"

    task = wait_status(board, task["id"], *FINISHED)
    assert task["status"] == "done", task
    assert task["result"] == "wrote the line"
    assert task["attempts"] == 1 and task["steps"] == 2
    steps = board.get(f"/api/tasks/{task['id']}/steps").json()
    assert [s["action"] for s in steps] == ['type "from the board"', 'done "wrote the line"']
    shot = board.get(steps[0]["screenshot"])
    assert shot.status_code == 200 and shot.headers["content-type"] == "image/png"
    run = board.get(f"/api/runs/{task['run_id']}").json()
    assert run["run"]["status"] == "done" and run["run"]["desktop_id"] == task["desktop_id"]

    wait_until(lambda: desktop_gone(board, task["desktop_id"]), 20, what="the desktop released")
    video = board.get(f"/api/desktops/{task['desktop_id']}/recordings/{task['recording_id']}.mp4")
    assert video.status_code == 200
    with av.open(io.BytesIO(video.content)) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.width, stream.codec_context.height) == (1280, 800)


def test_the_queue_runs_in_the_order_people_set(board: httpx.Client, fake_model: FakeModelServer):
    set_board(board, concurrency=0)
    a, b, c = (add(board, f"task {name}") for name in "abc")

    def queue() -> list[str]:
        return [t["text"] for t in board.get("/api/tasks?status=queued").json()["items"]]

    assert queue() == ["task a", "task b", "task c"]
    assert board.post(f"/api/tasks/{c['id']}/move", json={"to": "top"}).status_code == 200
    assert queue() == ["task c", "task a", "task b"]
    assert board.post(f"/api/tasks/{a['id']}/move", json={"after": b["id"]}).status_code == 200
    assert queue() == ["task c", "task b", "task a"]
    edited = board.patch(f"/api/tasks/{b['id']}", json={"text": "task b, edited"})
    assert edited.status_code == 200 and edited.json()["text"] == "task b, edited"
    assert board.delete(f"/api/tasks/{c['id']}").status_code == 204
    assert queue() == ["task b, edited", "task a"]
    assert board.get(f"/api/tasks/{c['id']}").status_code == 404

    fake_model.script([say("Nothing to do.", type="done", summary=f"done {n}") for n in (1, 2)])
    set_board(board, concurrency=1)
    first = wait_status(board, b["id"], *FINISHED)
    second = wait_status(board, a["id"], *FINISHED)
    assert (first["status"], second["status"]) == ("done", "done")
    assert first["started_at"] < second["started_at"]
    assert (first["result"], second["result"]) == ("done 1", "done 2")


def test_cancelling_a_running_task_stops_the_agent_at_once_and_frees_its_desktop(
    board: httpx.Client, fake_model: FakeModelServer
):
    fake_model.script([Turn.hang(60, say("Too late.", type="type", text="never"))])
    task = add(board, "Think for a long time")
    fake_model.wait_for_requests(1, timeout_s=60)
    running = board.get(f"/api/tasks/{task['id']}").json()
    assert running["status"] == "running" and running["desktop_id"]

    started = time.monotonic()
    cancelled = board.post(f"/api/tasks/{task['id']}/cancel")
    took = time.monotonic() - started
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["result"] == "cancelled by a person"
    assert took < 1.0, f"cancelling took {took:.2f} s"
    wait_until(lambda: desktop_gone(board, running["desktop_id"]), 20, what="desktop released")
    run = board.get(f"/api/runs/{running['run_id']}").json()["run"]
    assert run["status"] == "cancelled"
    assert len(fake_model.requests) == 1

    again = board.post(f"/api/tasks/{task['id']}/cancel")
    assert again.status_code == 409


def test_a_paused_agent_drops_its_stale_decision_and_looks_again_after_resume(
    board: httpx.Client, fake_model: FakeModelServer
):
    fake_model.script([
        Turn.hang(60, say("Type.", type="type", text="stale")),
        say("Looked again.", type="done", summary="resumed and finished"),
    ])  # fmt: skip
    task = add(board, "Type something", start="mousepad")
    fake_model.wait_for_requests(1, timeout_s=60)
    paused = board.post(f"/api/tasks/{task['id']}/pause")
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    resumed = board.post(f"/api/tasks/{task['id']}/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "running"
    fake_model.release()  # the answer to what was asked before the pause comes only now

    done = wait_status(board, task["id"], *FINISHED)
    assert done["status"] == "done" and done["result"] == "resumed and finished"
    steps = board.get(f"/api/tasks/{task['id']}/steps").json()
    assert [s["outcome"] for s in steps] == ["done"]
    assert len(fake_model.requests) == 2
    assert "stale" not in "".join(fake_model.requests[1].texts("assistant"))


def test_a_person_can_end_a_paused_task_as_done(board: httpx.Client, fake_model: FakeModelServer):
    fake_model.script([Turn.hang(60, say("Never used.", type="wait", seconds=1))])
    task = add(board, "Wait for a person")
    fake_model.wait_for_requests(1, timeout_s=60)
    assert board.post(f"/api/tasks/{task['id']}/pause").json()["status"] == "paused"
    done = board.post(f"/api/tasks/{task['id']}/done", json={"message": "I did it myself"})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "done"
    assert done.json()["result"] == "marked done by hand: I did it myself"


def test_bad_input_gets_a_clear_4xx(board: httpx.Client):
    empty = board.post("/api/tasks", json={"text": "   "})
    assert empty.status_code == 422 and "text" in empty.text
    unknown = board.post("/api/tasks", json={"text": "x", "profile": "nope"})
    assert unknown.status_code == 422
    assert "unknown profile 'nope'" in unknown.json()["detail"]
    broken = board.post(
        "/api/tasks", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert broken.status_code == 422
    assert board.get("/api/tasks/424242").json()["error"] == "task_not_found"
    assert board.get("/api/tasks?status=sleeping").status_code == 422
    assert board.post("/api/tasks/batch", json={"tasks": []}).status_code == 422
    assert board.delete("/api/tasks").status_code == 422
    set_board(board, concurrency=0)
    queued = add(board, "stay queued")
    two_places = board.post(f"/api/tasks/{queued['id']}/move", json={"to": "top", "before": 1})
    assert two_places.status_code == 422
    assert board.post(f"/api/tasks/{queued['id']}/pause").status_code == 409
    assert board.post(f"/api/tasks/{queued['id']}/retry").status_code == 409
    assert board.put("/api/board/settings", json={"concurrency": -1}).status_code == 422
    assert board.get("/healthz").status_code == 200


def test_a_profile_without_a_model_is_refused_and_keys_are_never_sent_back(board: httpx.Client):
    saved = board.put("/api/board/profiles/half", json={"base_url": "http://x/v1", "api_key": "s3"})
    assert saved.status_code == 200
    view = next(p for p in board.get("/api/board/profiles").json() if p["name"] == "half")
    assert view["api_key_set"] is True and "s3" not in json.dumps(view)
    assert view["ready"] is False and "planner model" in view["problem"]
    refused = board.post("/api/tasks", json={"text": "x", "profile": "half"})
    assert refused.status_code == 422 and "cannot run tasks yet" in refused.json()["detail"]
    assert board.put("/api/board/profiles/bad name!", json={}).status_code == 422
    assert board.delete("/api/board/profiles/half").status_code == 204
    assert board.delete("/api/board/profiles/half").status_code == 404


def test_ten_thousand_tasks_queue_at_once_and_page(board: httpx.Client):
    set_board(board, concurrency=0)
    tasks = [{"text": f"bulk task {n}"} for n in range(10_000)]
    response = board.post("/api/tasks/batch", json={"tasks": tasks})
    assert response.status_code == 201, response.text
    assert response.json()["added"] == 10_000
    assert board.get("/api/tasks/counts").json()["queued"] == 10_000
    last = board.get("/api/tasks", params={"status": "queued", "offset": 9_950, "limit": 50})
    page = last.json()
    assert page["total"] == 10_000 and len(page["items"]) == 50
    assert page["items"][-1]["text"] == "bulk task 9999"
    too_many = board.post("/api/tasks/batch", json={"tasks": [*tasks, {"text": "one more"}]})
    assert too_many.status_code == 422
    assert board.delete("/api/tasks", params={"status": "queued"}).json() == {"deleted": 10_000}


def test_after_a_crash_a_running_task_is_interrupted_and_a_retry_finishes_it(
    fake_model: FakeModelServer,
):
    service = start_service()
    api = service.client()
    try:
        use_fake_model(api, fake_model)
        set_board(api, concurrency=1)
        fake_model.script([Turn.hang(60, say("Lost.", type="wait", seconds=1))])
        task = add(api, "Survive a crash")
        fake_model.wait_for_requests(1, timeout_s=60)
        service.process.send_signal(signal.SIGKILL)
        service.process.wait()

        fake_model.reset()
        fake_model.script([say("All good.", type="done", summary="finished after the crash")])
        service = restart(service)
        api = service.client()
        interrupted = api.get(f"/api/tasks/{task['id']}").json()
        assert interrupted["status"] == "interrupted"
        assert "retry" in interrupted["result"]
        retried = api.post(f"/api/tasks/{task['id']}/retry")
        assert retried.status_code == 200 and retried.json()["status"] == "queued"
        done = wait_status(api, task["id"], *FINISHED)
        assert done["status"] == "done" and done["result"] == "finished after the crash"
        assert done["attempts"] == 2
    finally:
        api.close()
        stop_service(service)


def restart(service: Service) -> Service:
    return start_service(data_dir=service.data_dir, token=service.token)
