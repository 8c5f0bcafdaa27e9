"""Recording the hub's packets to MP4, without re-encoding, with an action log."""

from __future__ import annotations

import asyncio
import time

import av
import pytest

from cubicle.protocol import actions as a
from cubicle.server.live.hub import FrameHub
from cubicle.server.live.recording import Recorder, read_log
from tests.streaming.pattern_source import PatternFrames

pytestmark = pytest.mark.fast


@pytest.fixture
async def hub():
    hub = FrameHub(PatternFrames(320, 240, fps=30))
    yield hub
    await hub.stop()


def probe(path) -> tuple[int, int, float, int]:
    """(width, height, seconds, decoded frames) of a video file, read back by FFmpeg."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        seconds = float(stream.duration * stream.time_base)
        return stream.width, stream.height, seconds, frames


async def test_a_recording_decodes_at_its_size_and_length_with_action_offsets(hub, tmp_path):
    recorder = Recorder(hub, tmp_path, "desk")
    recorder.start()
    started = time.monotonic()
    await asyncio.sleep(1.0)
    click = a.Click(x=10, y=20)
    recorder.log([click], hub.clock_us(time.monotonic()), "api")
    await asyncio.sleep(1.5)
    typed = a.Type(text="hi")
    recorder.log([typed], hub.clock_us(time.monotonic()), "viewer")
    await asyncio.sleep(0.5)
    info = await recorder.stop()
    elapsed = time.monotonic() - started
    assert info.status == "finished", info.reason
    assert await recorder.stop() == info  # idempotent

    width, height, seconds, frames = probe(recorder.video_path)
    assert (width, height) == (320, 240) == (info.width, info.height)
    assert abs(seconds - elapsed) < 0.2 and abs(info.duration_ms / 1000 - seconds) < 0.1
    assert frames == info.frames and frames > 60

    log = read_log(recorder.log_path)
    assert log.recording == info
    offsets = {entry.action.type: entry.offset_ms for entry in log.actions}
    assert abs(offsets["click"] - 1000) < 250 and abs(offsets["type"] - 2500) < 250
    assert [e.source for e in log.actions] == ["api", "viewer"]


class StillScreen(PatternFrames):
    """Sends its first frame, then nothing until asked for a keyframe."""

    async def _frames(self):
        async for frame in super()._frames():
            if frame.keyframe:
                yield frame


async def test_a_still_screen_still_records_for_as_long_as_asked(tmp_path):
    hub = FrameHub(StillScreen(320, 240))
    try:
        recorder = Recorder(hub, tmp_path, "desk")
        recorder.start()
        await asyncio.sleep(2.0)
        info = await recorder.stop()
    finally:
        await hub.stop()
    assert info.status == "finished"
    _, _, seconds, frames = probe(recorder.video_path)
    assert frames >= 1 and abs(seconds - 2.0) < 0.4


async def test_a_recording_without_video_fails_with_a_reason(tmp_path, monkeypatch):
    class Silent(PatternFrames):
        async def _frames(self):
            await asyncio.Event().wait()
            yield  # never reached

    monkeypatch.setattr("cubicle.server.live.recording.FIRST_FRAME_TIMEOUT_S", 0.3)
    hub = FrameHub(Silent())
    try:
        recorder = Recorder(hub, tmp_path, "desk")
        recorder.start()
        info = await recorder.stop()
    finally:
        await hub.stop()
    assert info.status == "failed" and "no video arrived" in info.reason
    assert not recorder.video_path.exists() and not list(tmp_path.glob("*.part"))


async def test_a_recording_ends_with_a_frame_of_the_screen_at_the_stop(tmp_path):
    # Browsers end a video at its last frame's start: a still screen's last frame must be
    # one taken at the stop, or the video would end at the last change.
    hub = FrameHub(StillScreen(320, 240))
    try:
        recorder = Recorder(hub, tmp_path, "desk")
        recorder.start()
        await asyncio.sleep(1.5)
        info = await recorder.stop()
    finally:
        await hub.stop()
    with av.open(str(recorder.video_path)) as container:
        stream = container.streams.video[0]
        starts = [float(p.pts * stream.time_base) for p in container.decode(stream)]
    assert info.status == "finished" and len(starts) >= 2
    assert starts[-1] >= 1.4 and abs(info.duration_ms / 1000 - starts[-1]) < 0.1, starts
