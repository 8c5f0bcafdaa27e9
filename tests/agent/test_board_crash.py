"""The service SIGKILLed in the middle of a recorded board run (issue 17): the task comes
back `interrupted` and a retry finishes it, and the run's video, written as fragmented MP4,
still plays up to its last second, listed as an `interrupted` recording."""

from __future__ import annotations

import io
import signal
import time

import av

from tests.agent.board_api import FINISHED, add, say, set_board, use_fake_model, wait_status
from tests.agent.fake_model import FakeModelServer, Turn
from tests.conftest import start_service, stop_service, wait_until


def _pictures(data: bytes) -> list[av.VideoFrame]:
    with av.open(io.BytesIO(data)) as container:
        return list(container.decode(video=0))


def test_a_crash_mid_recording_leaves_a_playable_video_and_a_retryable_task(
    fake_model: FakeModelServer,
):
    service = start_service()
    api = service.client()
    try:
        use_fake_model(api, fake_model)
        set_board(api, concurrency=1, record=True)
        fake_model.script([
            say("Let it draw.", type="key", keys="super"),
            say("Close the menu.", type="key", keys="Escape"),
            Turn.hang(120, say("Lost.", type="wait", seconds=1)),
        ])  # fmt: skip
        task = add(api, "Survive a crash while recorded")
        fake_model.wait_for_requests(3, timeout_s=90)
        running = api.get(f"/api/tasks/{task['id']}").json()
        desktop_id, recording_id = running["desktop_id"], running["recording_id"]
        assert desktop_id and recording_id, running

        def recorded_a_while():
            listed = api.get(f"/api/desktops/{desktop_id}/recordings").json()
            return any(r["id"] == recording_id and r["frames"] >= 2 for r in listed)

        wait_until(recorded_a_while, 60, 0.2, "the recording to hold some frames")
        time.sleep(3)  # a still screen: past the keyframe that cuts a fragment, and a log save
        service.process.send_signal(signal.SIGKILL)
        service.process.wait()
        api.close()

        part = service.data_dir / "recordings" / desktop_id / f"{recording_id}.mp4.part"
        assert part.is_file(), "the recording's file is gone"
        written = _pictures(part.read_bytes())
        assert written and {(p.width, p.height) for p in written} == {(1280, 800)}

        fake_model.reset()
        fake_model.script([say("All good.", type="done", summary="finished after the crash")])
        service = start_service(data_dir=service.data_dir, token=service.token)
        api = service.client()
        interrupted = api.get(f"/api/tasks/{task['id']}").json()
        assert interrupted["status"] == "interrupted" and "retry" in interrupted["result"]

        listed = api.get(f"/api/desktops/{desktop_id}/recordings").json()
        info = next(r for r in listed if r["id"] == recording_id)
        assert info["status"] == "interrupted" and "stopped while recording" in info["reason"]
        assert info["frames"] == len(written) and info["duration_ms"] > 1000
        video = api.get(f"/api/desktops/{desktop_id}/recordings/{recording_id}.mp4")
        assert video.status_code == 200
        assert len(_pictures(video.content)) == len(written)
        log = api.get(f"/api/desktops/{desktop_id}/recordings/{recording_id}/actions").json()
        assert log["recording"]["status"] == "interrupted"
        typed = [entry["action"] for entry in log["actions"] if entry["action"]["type"] == "key"]
        assert [action["keys"] for action in typed][:1] == ["super"]

        retried = api.post(f"/api/tasks/{task['id']}/retry")
        assert retried.status_code == 200 and retried.json()["status"] == "queued"
        done = wait_status(api, task["id"], *FINISHED, timeout_s=90)
        assert done["status"] == "done" and done["attempts"] == 2
        wait_until(lambda: not part.exists(), 5, what="no .part file left")
    finally:
        api.close()
        stop_service(service)
