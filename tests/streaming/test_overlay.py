"""The action overlay: which marks a batch of actions makes, and a recording that burns them
into its frames (decoded back with FFmpeg)."""

from __future__ import annotations

import asyncio
import time

import av
import numpy as np
import pytest

from cubicle.protocol import actions as a
from cubicle.server.live.hub import FrameHub
from cubicle.server.live.overlay import Caption, Marker, OverlayMessage, Ripple, ScrollMark, Trail
from cubicle.server.live.recording import Recorder
from tests.streaming.test_recorder import StillScreen

pytestmark = pytest.mark.fast

MAGENTA = np.array((230, 40, 120))
"""The agent's colour (`cubicle.server.live.burnin.COLOURS["api"]`)."""


def test_clicks_drags_scrolls_and_keys_become_marks():
    marker = Marker()
    assert marker.marks([a.Click()]) == []  # where the pointer is: not known yet
    marks = marker.marks(
        [
            a.Move(x=10, y=20),
            a.Click(button="right", count=2),  # at the pointer
            a.Drag(path=[(1, 2), (30, 40), (50, 60)]),
            a.Scroll(dy=3),  # at the drag's end
            a.Type(text="héllo"),
            a.Key(keys="ctrl+s", repeat=2),
            a.Wait(ms=1),
        ]
    )
    assert marks == [
        Ripple(x=10, y=20, button="right", count=2),
        Trail(points=[(1, 2), (30, 40), (50, 60)]),
        ScrollMark(x=50, y=60, dx=0, dy=3),
        Caption(kind="text", text="héllo"),
        Caption(kind="keys", text="ctrl+s ×2"),
    ]


def test_a_persons_press_moves_and_release_are_a_ripple_then_a_path():
    marker = Marker()
    pressed = marker.marks([a.KeyDown(key="Control_L"), a.MouseDown(x=100, y=100)])
    assert pressed == [Ripple(x=100, y=100, modifiers=["Ctrl"])]
    assert marker.marks([a.Move(x=120, y=110)]) == []
    assert marker.marks([a.Move(x=140, y=130), a.MouseUp(x=150, y=130)]) == [
        Trail(points=[(100, 100), (120, 110), (140, 130), (150, 130)])
    ]
    assert marker.marks([a.KeyUp(key="Control_L"), a.MouseDown(), a.MouseUp()]) == [
        Ripple(x=150, y=130)  # a press and release in place: no path
    ]
    assert marker.marks([a.KeyDown(key="Shift_L"), a.Key(keys="Tab")]) == [
        Caption(kind="keys", text="Shift+Tab")
    ]


def test_long_typed_text_is_cut():
    (caption,) = Marker().marks([a.Type(text="x" * 1000)])
    assert len(caption.text) == 201 and caption.text.endswith("…")


def magenta_near(picture: av.VideoFrame, x: int, y: int, reach: int = 45) -> int:
    rgb = picture.to_ndarray(format="rgb24")[max(y - reach, 0) : y + reach, max(x - reach, 0) :]
    rgb = rgb[:, : 2 * reach].astype(int)
    return int((np.abs(rgb - MAGENTA).sum(axis=2) < 90).sum())


async def test_an_overlay_recording_draws_a_click_spreading_on_a_still_screen(tmp_path):
    hub = FrameHub(StillScreen(320, 240))
    try:
        recorder = Recorder(hub, tmp_path, "desk", overlay=True)
        recorder.start()
        await asyncio.sleep(0.5)
        click = a.Click(x=160, y=120)
        message = OverlayMessage(source="api", marks=Marker().marks([click]))
        recorder.log([click], hub.clock_us(time.monotonic()), "api", message)
        await asyncio.sleep(1.5)
        info = await recorder.stop()
    finally:
        await hub.stop()
    assert info.status == "finished" and info.overlay, info.reason
    offset = recorder.action_log().actions[0].offset_ms / 1000
    shown = []  # (seconds into the video, magenta pixels near the click)
    with av.open(str(recorder.video_path)) as container:
        stream = container.streams.video[0]
        for picture in container.decode(stream):
            shown.append((float(picture.pts * stream.time_base), magenta_near(picture, 160, 120)))
    before = [count for at, count in shown if at < offset - 0.05]
    during = [count for at, count in shown if offset + 0.05 <= at < offset + 0.6]
    after = [count for at, count in shown if at > offset + 0.8]  # a clean frame once it ended
    assert before and max(before) == 0, shown
    # The screen stood still, yet the ripple spread over frames of their own: ~20 a second.
    assert len(during) >= 8 and min(during) > 20, shown
    assert after and after[-1] == 0, shown
