"""The pointer in the picture: followed without polling, drawn into the video where X says it
is (hotspot and shape included), at little cost, and where `screenshot?cursor=true` draws it."""

from __future__ import annotations

import asyncio
import io
import random
import time
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest
from PIL import Image
from Xlib import X
from Xlib.display import Display
from Xlib.ext import xtest

from cubicle.guest.screen import ScreenCapture
from cubicle.guest.video.encoder import H264Encoder
from cubicle.guest.video.pointer import CursorImage, Pointer, PointerWatch, blend
from cubicle.guest.video.source import VideoSource
from cubicle.protocol.frames import Subscription
from tests.streaming.h264 import Decoder

GREY = 128
LEFT_PTR, XTERM = 68, 152
"""Glyphs of X's cursor font: the arrow and the text cursor."""


class CursorWindows:
    """Two grey override-redirect windows, the left half with the arrow cursor, the right
    half with the text cursor, and XTest to move the pointer over them."""

    def __init__(self, display: str) -> None:
        self.display = Display(display)
        self.display.xfixes_query_version()
        root = self.display.screen().root
        font = self.display.open_font("cursor")
        self.windows = []
        for x, glyph in ((0, LEFT_PTR), (640, XTERM)):
            cursor = font.create_glyph_cursor(
                font, glyph, glyph + 1, (0, 0, 0), (65535, 65535, 65535)
            )
            window = root.create_window(
                x,
                0,
                640,
                800,
                0,
                X.CopyFromParent,
                override_redirect=True,
                background_pixel=(GREY << 16) | (GREY << 8) | GREY,
                cursor=cursor,
            )
            window.map()
            self.windows.append(window)
        self.display.sync()

    def move(self, x: int, y: int) -> None:
        xtest.fake_input(self.display, X.MotionNotify, x=x, y=y)
        self.display.sync()

    def cursor(self):
        """What XFixes says now: the reply with the image, hotspot and position."""
        return self.display.xfixes_get_cursor_image(self.display.screen().root)

    def close(self) -> None:
        for window in self.windows:
            window.destroy()
        self.display.close()


@pytest.fixture
def windows(x_session) -> Iterator[CursorWindows]:
    made = CursorWindows(x_session.display)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
async def source(x_session) -> AsyncIterator[VideoSource]:
    video = VideoSource(x_session.display)
    try:
        yield video
    finally:
        await video.stop()


def expected_box(reply) -> tuple[int, int, int, int]:
    """Where the cursor XFixes describes shows over grey: the box of its pixels that differ
    from grey, in screen pixels, from its image and hotspot."""
    image = np.asarray(reply.cursor_image, dtype="<u4").view(np.uint8)
    image = image.reshape(reply.height, reply.width, 4).astype(int)
    shown = image[:, :, :3] + GREY * (255 - image[:, :, 3:4]) // 255
    rows, cols = np.nonzero((np.abs(shown - GREY) > 48).any(axis=2))
    left, top = reply.x - reply.xhot, reply.y - reply.yhot
    return left + cols.min(), top + rows.min(), left + cols.max(), top + rows.max()


def found_box(rgb: np.ndarray, x: int, y: int, reach: int = 40) -> tuple[int, int, int, int]:
    """The box of the pixels near (x, y) that are not grey, in screen pixels."""
    left, top = max(x - reach, 0), max(y - reach, 0)
    area = rgb[top : y + reach, left : x + reach].astype(int)
    rows, cols = np.nonzero((np.abs(area - GREY) > 48).any(axis=2))
    assert len(rows), f"no pointer near {(x, y)}"
    return left + cols.min(), top + rows.min(), left + cols.max(), top + rows.max()


def near(box, expected, pixels: int = 2) -> bool:
    return all(abs(a - b) <= pixels for a, b in zip(box, expected, strict=True))


async def latest(frames: Subscription, decoder: Decoder, quiet_s: float = 0.15):
    """Decode every frame until none came for `quiet_s`; the last picture, and how many."""
    picture, count = None, 0
    while True:
        try:
            frame = await asyncio.wait_for(anext(frames), quiet_s if picture else 2.0)
        except TimeoutError:
            assert picture is not None, "no frame arrived"
            return picture, count
        picture, count = decoder.decode(frame), count + 1


async def test_the_video_shows_the_pointer_where_it_is_with_its_hotspot(x_session, windows, source):
    decoder = Decoder()
    windows.move(300, 400)
    async with source.subscribe(fps=30) as frames:
        await latest(frames, decoder)
        before = source.stats()
        path = [(100 + 45 * step, 300 + 30 * (step % 3)) for step in range(24)]  # both halves
        shapes = set()
        for x, y in path:
            windows.move(x, y)
            picture, count = await latest(frames, decoder)
            assert count >= 1
            reply = windows.cursor()
            assert (reply.x, reply.y) == (x, y)
            shapes.add((reply.xhot, reply.yhot))
            rgb = picture.to_ndarray(format="rgb24")
            # To the pixel: the arrow's hotspot is a pixel from its corner, the text cursor's
            # in its middle.
            assert near(found_box(rgb, x, y), expected_box(reply), 0), (
                x,
                y,
                reply.xhot,
                reply.yhot,
            )
        after = source.stats()
    # The arrow and the text cursor, whose hotspots differ (tip versus middle).
    assert len(shapes) == 2, shapes
    # Pointer-only motion grabbed nothing: each move was a frame of two small rectangles.
    assert after.frames_captured == before.frames_captured
    assert after.pointer_frames - before.pointer_frames >= len(path)


async def test_a_still_pointer_costs_no_frames(x_session, windows, source):
    decoder = Decoder()
    async with source.subscribe(fps=30) as frames:
        await latest(frames, decoder)
        windows.move(200, 200)
        await latest(frames, decoder)
        windows.move(200, 200)  # no motion: the server sends no event, nothing is encoded
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(frames), 0.5)


async def test_screenshot_with_cursor_agrees_with_the_video(x_session, windows, source):
    capture = ScreenCapture(x_session.display)
    decoder = Decoder()
    try:
        async with source.subscribe(fps=30) as frames:
            for x, y in ((321, 222), (901, 555)):  # arrow, then text cursor
                windows.move(x, y)
                picture, _ = await latest(frames, decoder)
                shot = await capture.screenshot("png", cursor=True)
                assert shot.cursor_at == (x, y)
                still = np.asarray(Image.open(io.BytesIO(shot.data)).convert("RGB"))
                video = picture.to_ndarray(format="rgb24")
                assert near(found_box(video, x, y), found_box(still, x, y), 1)
                assert near(found_box(still, x, y), expected_box(windows.cursor()), 0)
    finally:
        capture.close()


def test_pointer_watch_hears_motion_and_shape_changes_without_polling(x_session, windows):
    watch = PointerWatch(x_session.display)
    try:
        windows.move(100, 100)
        assert _eventually(watch.take_events)
        first = watch.read()
        time.sleep(0.2)
        assert not watch.take_events()  # nothing happened since the read
        windows.move(120, 130)
        assert _eventually(watch.take_events)
        moved = watch.read()
        assert (moved.x, moved.y) == (120, 130) and moved.image is first.image
        windows.move(900, 130)  # over the text cursor's window: a new shape
        assert _eventually(watch.take_events)
        text = watch.read()
        assert text.image.serial != first.image.serial
        assert text.image.hotspot != first.image.hotspot
    finally:
        watch.close()


def _eventually(check, tries: int = 100) -> bool:
    for _ in range(tries):
        if check():
            return True
        time.sleep(0.01)
    return False


# --- without an X server ------------------------------------------------------------------


def _cursor(serial: int, hotspot: tuple[int, int], seed: int) -> CursorImage:
    rng = np.random.default_rng(seed)
    bgra = rng.integers(0, 256, (24, 20, 4), dtype=np.uint8)
    bgra[:, :, 3] = np.where(rng.random((24, 20)) < 0.5, 255, bgra[:, :, 3])
    bgra[:, :, :3] = np.minimum(bgra[:, :, :3], bgra[:, :, 3:4])  # premultiplied
    return CursorImage(serial, hotspot, bgra)


def test_blend_is_premultiplied_over_and_clipped():
    bgra = np.zeros((2, 2, 4), np.uint8)
    bgra[0, 0] = (255, 0, 0, 255)  # opaque blue
    bgra[0, 1] = (0, 64, 0, 128)  # half-transparent dark green, premultiplied
    pointer = Pointer(5, 5, CursorImage(1, (1, 1), bgra))  # its corner at (4, 4)
    screen = np.full((6, 6, 4), 200, np.uint8)
    assert blend(screen, 0, 0, pointer)
    assert tuple(screen[4, 4, :3]) == (255, 0, 0)
    assert tuple(screen[4, 5, :3]) == (100, 64 + 100, 100)  # 200 × 127/255, rounded
    assert tuple(screen[5, 4, :3]) == (200, 200, 200)  # transparent
    assert not blend(screen[:2, :2], 0, 0, pointer)  # nowhere near


@pytest.mark.parametrize("seed", range(6))
def test_a_moving_pointer_encodes_what_converting_all_would(seed):
    # Two encoders see the same still screen and the same pointer moves: one converts only
    # the pointer's old and new rectangles, the other everything. Same YUV, same bytes.
    rng = random.Random(seed)
    width, height = 320, 240
    screen = np.random.default_rng(seed).integers(0, 256, (height, width, 4), np.uint8)
    shapes = [_cursor(1, (3, 4), seed), _cursor(2, (10, 12), seed + 100)]
    told, untold = H264Encoder(width, height), H264Encoder(width, height)
    try:
        start = Pointer(rng.randrange(width), rng.randrange(height), shapes[0])
        for encoder in (told, untold):
            encoder.encode(screen.tobytes(), 0, keyframe=True, pointer=start)
        for pts in range(1, 6):  # edges and corners included, shape changes too
            pointer = Pointer(
                rng.randrange(-25, width + 5), rng.randrange(-25, height + 5), rng.choice(shapes)
            )
            moved = told.encode(
                screen.tobytes(), pts, keyframe=False, rows=range(0), pointer=pointer
            )
            whole = untold.encode(screen.tobytes(), pts, keyframe=False, pointer=pointer)
            assert moved.data == whole.data, (pts, pointer)
        hidden = told.encode(screen.tobytes(), 9, keyframe=False, rows=range(0), pointer=None)
        assert hidden.data == untold.encode(screen.tobytes(), 9, keyframe=False).data
    finally:
        told.close()
        untold.close()
