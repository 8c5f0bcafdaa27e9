"""The pointer in the video of a real desktop, through the service: a recording of nothing
but pointer moves has a frame per move showing the pointer where the API put it, where the
desktop's own `screenshot?cursor=true` draws it."""

from __future__ import annotations

import asyncio
import io
import time

import av
import numpy as np

from cubicle import AsyncDesktop
from tests.streaming.pointer_pixels import differs, near, pointer_box, screenshots


def test_a_recording_of_pointer_moves_shows_the_pointer_at_each_spot(api, desktop):
    base = f"/api/desktops/{desktop['id']}"
    path = [(420 + 60 * step, 330 + 40 * (step % 3)) for step in range(8)]
    assert api.post(f"{base}/actions", json={"type": "move", "x": 300, "y": 300}).is_success
    assert api.post(f"{base}/recording/start").status_code == 200
    time.sleep(0.4)
    expected = []
    for x, y in path:
        assert api.post(f"{base}/actions", json={"type": "move", "x": x, "y": y}).is_success
        plain, drawn, at = screenshots(api, desktop["id"])
        assert at == (x, y)
        expected.append((plain, pointer_box(plain, drawn, x, y)))
        time.sleep(0.15)
    info = api.post(f"{base}/recording/stop").json()
    assert info["status"] == "finished", info
    log = api.get(f"{base}/recordings/{info['id']}/actions").json()
    offsets = [e["offset_ms"] / 1000 for e in log["actions"] if e["action"]["type"] == "move"]
    assert len(offsets) == len(path)  # the move before the recording is not in its log

    video = api.get(f"{base}/recordings/{info['id']}.mp4")
    assert video.status_code == 200
    pictures = []  # (seconds into the video, RGB)
    with av.open(io.BytesIO(video.content)) as container:
        stream = container.streams.video[0]
        for picture in container.decode(stream):
            rgb = picture.to_ndarray(format="rgb24").astype(int)
            pictures.append((float(picture.pts * stream.time_base), rgb))
    # Nothing but the pointer moved, yet every move made a frame of its own.
    assert len(pictures) >= len(path) + 1, [at for at, _ in pictures]
    for index, ((x, y), (plain, box)) in enumerate(zip(path, expected, strict=True)):
        until = offsets[index + 1] if index + 1 < len(offsets) else float("inf")
        shown = [rgb for at, rgb in pictures if offsets[index] <= at < until]
        assert shown, f"no frame between move {index} and the next"
        found = differs(shown[-1], plain, x, y, 150)
        assert near(found, box, 3), (index, (x, y), found, box)


MAGENTA = np.array((230, 40, 120))
"""The agent's colour in the overlay (`cubicle.server.live.burnin.COLOURS["api"]`)."""


def magenta_near(rgb: np.ndarray, x: int, y: int, reach: int = 45) -> int:
    area = rgb[y - reach : y + reach, x - reach : x + reach]
    return int((np.abs(area - MAGENTA).sum(axis=2) < 90).sum())


async def test_an_overlay_recording_shows_the_agents_click_in_the_mp4(service, api, desktop):
    base = f"/api/desktops/{desktop['id']}"
    bad = api.post(f"{base}/recording/start", json={"overlay": True, "burn": 1})
    assert bad.status_code == 422 and "burn" in bad.text
    d = await AsyncDesktop.connect(desktop["id"], base_url=service.url, token=service.token)
    try:  # the module's desktop: close the connection, keep the desktop
        started = await d.start_recording(overlay=True)
        assert started.overlay and started.status == "recording"
        await asyncio.sleep(0.5)
        await d.left_click(700, 450)
        await asyncio.sleep(1.5)
        stopped = await d.stop_recording()
        assert stopped.status == "finished" and stopped.overlay, stopped.reason
        log = await d.recording_actions(started.id)
        (click,) = [e.offset_ms / 1000 for e in log.actions if e.action.type == "click"]
        data = await d.recording_video(started.id)
    finally:
        await d.close()
    marks = []
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        for picture in container.decode(stream):
            rgb = picture.to_ndarray(format="rgb24").astype(int)
            marks.append((float(picture.pts * stream.time_base), magenta_near(rgb, 700, 450)))
    assert max(count for at, count in marks if at < click - 0.05) == 0, marks
    assert min(count for at, count in marks if click + 0.1 <= at < click + 0.5) > 20, marks
    assert marks[-1][1] == 0, marks  # the ripple is gone by the end
