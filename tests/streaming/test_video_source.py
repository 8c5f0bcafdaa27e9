"""The guest's video source on a real X server: damage-driven capture, real libx264, decoded
back with FFmpeg's H.264 decoder."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from Xlib import X
from Xlib.display import Display

from cubicle.guest.video.capture import DamagedScreen
from cubicle.guest.video.encoder import H264Encoder
from cubicle.guest.video.source import VideoSource
from cubicle.protocol.errors import SandboxError
from cubicle.protocol.frames import EncodedFrame, Subscription
from tests.streaming.h264 import Decoder, close_to, colour_at, nal_types, sps_profile

ROOT = Path(__file__).resolve().parents[2]
RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


async def next_frame(subscription: Subscription, within: float = 5.0) -> EncodedFrame:
    return await asyncio.wait_for(anext(subscription), within)


async def assert_quiet(subscription: Subscription, seconds: float) -> None:
    with pytest.raises(TimeoutError):
        frame = await asyncio.wait_for(anext(subscription), seconds)
        pytest.fail(f"a still screen sent a frame: {frame.keyframe=} {len(frame.data)} bytes")


async def run(x_session, *argv: str) -> None:
    process = x_session.spawn(list(argv))
    assert await asyncio.to_thread(process.wait) == 0


def video_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("video-") and t.is_alive()]


def thread_cpu_seconds(thread: threading.Thread) -> float:
    """User + system CPU of one thread of this process, from /proc (clock-tick resolution)."""
    with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Painter:
    """An override-redirect window on the test's own X connection, filled with a colour."""

    def __init__(self, display: str, x: int, y: int, width: int, height: int) -> None:
        self.display = Display(display)
        root = self.display.screen().root
        self.window = root.create_window(
            x, y, width, height, 0, X.CopyFromParent, override_redirect=True, background_pixel=0
        )

    def fill(self, rgb: tuple[int, int, int]) -> None:
        red, green, blue = rgb
        self.window.change_attributes(background_pixel=(red << 16) | (green << 8) | blue)
        self.window.map()
        self.window.clear_area()
        self.display.sync()

    def close(self) -> None:
        self.window.destroy()
        self.display.close()


@pytest.fixture
async def source(x_session) -> AsyncIterator[VideoSource]:
    video = VideoSource(x_session.display)
    try:
        yield video
    finally:
        await video.stop()
        assert not video_threads()


@pytest.fixture
def painter(x_session) -> Iterator[Painter]:
    window = Painter(x_session.display, 100, 100, 400, 300)
    try:
        yield window
    finally:
        window.close()


async def test_first_frame_is_a_constrained_baseline_idr_with_headers(source):
    async with source.subscribe() as frames:
        first = await next_frame(frames)
    assert first.keyframe and (first.width, first.height) == (1280, 800)
    types = nal_types(first.data)
    assert first.data.startswith(b"\x00\x00\x00\x01")
    assert types[:2] == [7, 8] and 5 in types, types  # SPS, PPS, then IDR slices
    assert set(types) <= {7, 8, 6, 5}, types  # 6: x264's SEI with its settings
    profile, constraints, _level = sps_profile(first.data)
    assert profile == 66 and constraints & 0x40, (profile, constraints)  # constraint_set1
    picture = Decoder().decode(first)
    assert (picture.width, picture.height) == (1280, 800)
    assert picture.key_frame


async def test_still_screen_sends_nothing_and_a_change_arrives_at_once(x_session, source):
    await run(x_session, "xsetroot", "-solid", "#000080")
    decoder = Decoder()
    async with source.subscribe() as frames:
        decoder.decode(await next_frame(frames))
        await assert_quiet(frames, 1.0)

        await run(x_session, "xsetroot", "-solid", "red")
        drawn = time.monotonic()
        frame = await next_frame(frames, within=2.0)
        latency = time.monotonic() - drawn
        print(f"\nroot repaint → frame in {latency * 1000:.0f} ms, {len(frame.data)} bytes")
        assert latency < 0.25
        assert not frame.keyframe
        picture = decoder.decode(frame)
        while True:  # the repaint may span more than one frame; take the last
            try:
                picture = decoder.decode(await next_frame(frames, within=0.3))
            except TimeoutError:
                break
        assert close_to(colour_at(picture, 1270, 790), RED), colour_at(picture, 1270, 790)
        await assert_quiet(frames, 0.5)


async def test_a_new_window_shows_up_in_the_video(x_session, source, painter):
    decoder = Decoder()
    async with source.subscribe() as frames:
        decoder.decode(await next_frame(frames))
        painter.fill(GREEN)
        drawn = time.monotonic()
        frame = await next_frame(frames, within=2.0)
        assert time.monotonic() - drawn < 0.25
        picture = decoder.decode(frame)
        assert close_to(colour_at(picture, 300, 250), GREEN), colour_at(picture, 300, 250)


async def test_small_changes_land_in_place_and_leave_the_rest_alone(x_session, source, painter):
    # Only the rows X reports damaged are grabbed and converted; the rest stays as it was.
    await run(x_session, "xsetroot", "-solid", "#000080")
    strip = Painter(x_session.display, 600, 701, 200, 9)
    decoder = Decoder()
    try:
        async with source.subscribe() as frames:
            picture = decoder.decode(await next_frame(frames))
            for window, colour in ((painter, GREEN), (strip, BLUE)):
                window.fill(colour)
                while True:  # until the screen is still again
                    try:
                        picture = decoder.decode(await next_frame(frames, within=0.5))
                    except TimeoutError:
                        break
    finally:
        strip.close()
    assert close_to(colour_at(picture, 300, 250), GREEN), colour_at(picture, 300, 250)
    assert close_to(colour_at(picture, 700, 705), BLUE), colour_at(picture, 700, 705)
    for x, y in ((50, 50), (700, 697), (700, 712), (1270, 790)):
        assert close_to(colour_at(picture, x, y), (0, 0, 128)), ((x, y), colour_at(picture, x, y))


def test_a_grab_after_a_small_change_takes_only_its_rows(x_session):
    screen = DamagedScreen(x_session.display)
    window = Painter(x_session.display, 100, 301, 50, 19)
    try:
        screen.take_damage(sync=True)  # what was drawn before (the whole screen at first)
        screen.grab()  # empties the damage region
        window.fill(GREEN)
        assert screen.take_damage(sync=True)
        rows, pixels = screen.grab_damaged()
        assert rows == range(301, 320)
        assert len(pixels) == len(rows) * screen.width * 4
        at = (5 * screen.width + 120) * 4
        assert pixels[at : at + 3] == bytes((0, 255, 0))  # BGRA
        assert not screen.take_damage(sync=True)
        assert screen.grab_damaged()[0] == range(screen.height)  # no damage: all rows
    finally:
        window.close()
        screen.close()


async def test_a_keyframe_request_yields_an_idr_on_a_still_screen(source):
    async with source.subscribe() as frames:
        first = await next_frame(frames)
        await assert_quiet(frames, 0.3)
        source.request_keyframe()
        again = await next_frame(frames, within=1.0)
    assert again.keyframe and again.pts_us > first.pts_us
    assert nal_types(again.data)[:2] == [7, 8] and 5 in nal_types(again.data)
    assert Decoder().decode(again).key_frame  # decodable on its own


async def test_subscribers_share_one_encoder_that_stops_when_the_last_leaves(source):
    one = source.subscribe()
    await next_frame(one)
    two = source.subscribe()
    joined = await next_frame(two)  # a still screen, yet the newcomer starts at a keyframe
    assert joined.keyframe
    stats = source.stats()
    assert (stats.subscribers, stats.encoders_started, stats.encoder_running) == (2, 1, True)
    (worker,) = video_threads()

    one.close()
    assert source.stats().encoder_running
    two.close()
    await asyncio.to_thread(worker.join, 2.0)
    assert not source.stats().encoder_running and not video_threads()

    async with source.subscribe() as three:
        assert (await next_frame(three)).keyframe
    assert source.stats().encoders_started == 2


async def test_a_slow_subscriber_skips_to_a_keyframe_and_holds_up_nobody(x_session):
    source = VideoSource(x_session.display, max_queue=4)
    try:
        fast, slow = source.subscribe(fps=30), source.subscribe(fps=30)
        fast_frames = [await next_frame(fast)]
        painter = paint_elsewhere(x_session, 1.0)
        while True:  # every frame until the painting is over and the video falls quiet
            try:
                fast_frames.append(await next_frame(fast, within=0.3))
            except TimeoutError:
                if painter.poll() is not None:
                    break
        assert fast.dropped == 0 and len(fast_frames) > 10
        decoder = Decoder()
        for frame in fast_frames:
            decoder.decode(frame)

        # The slow one lost its backlog when it fell behind, and the source was asked for a
        # keyframe at once: what it reads now starts there and decodes, past the stale start.
        assert slow.dropped > 0
        slow_frames = [await next_frame(slow, within=1.0)]
        while True:
            try:
                slow_frames.append(await next_frame(slow, within=0.5))
            except TimeoutError:
                break
        assert slow_frames[0].keyframe and slow_frames[0].pts_us > fast_frames[3].pts_us
        assert [f.pts_us for f in slow_frames] == sorted({f.pts_us for f in slow_frames})
        decoder = Decoder()
        for frame in slow_frames:
            decoder.decode(frame)
    finally:
        await source.stop()


def paint_elsewhere(x_session, seconds: float) -> subprocess.Popen:
    """Moving content from another process for `seconds`."""
    argv = [sys.executable, "-m", "tests.streaming.painter", x_session.display, str(seconds)]
    return x_session.spawn(argv, cwd=ROOT)


async def test_cpu_on_a_still_screen_is_negligible_and_moving_content_keeps_up(x_session, source):
    async with source.subscribe(fps=30) as frames:
        await next_frame(frames)
        await asyncio.sleep(0.3)
        (worker,) = video_threads()
        before_thread, before_stats = thread_cpu_seconds(worker), source.stats()
        await assert_quiet(frames, 2.0)
        idle_cpu = thread_cpu_seconds(worker) - before_thread
        after = source.stats()
        print(
            f"\nstill screen: capture thread {idle_cpu / 2 * 100:.2f} % of a core "
            f"({(after.cpu_seconds - before_stats.cpu_seconds) / 2 * 100:.2f} % by its own "
            f"clock), {after.frames_captured - before_stats.frames_captured} grabs"
        )
        assert idle_cpu / 2 < 0.10
        assert after.frames_captured == before_stats.frames_captured

        before_thread, before_process, before = (
            thread_cpu_seconds(worker),
            time.process_time(),
            source.stats(),
        )
        began = time.monotonic()
        painter = paint_elsewhere(x_session, 2.0)
        arrivals = []
        while True:
            try:
                await next_frame(frames, within=0.3)
                arrivals.append(time.monotonic())
            except TimeoutError:
                if painter.poll() is not None:
                    break
        elapsed = time.monotonic() - began
        after = source.stats()
        fps = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
        thread_cpu = (thread_cpu_seconds(worker) - before_thread) / elapsed
        process_cpu = (time.process_time() - before_process) / elapsed
        encoded = after.frames_encoded - before.frames_encoded
        encode_ms = (after.encode_seconds - before.encode_seconds) / encoded * 1000
        print(
            f"moving content at fps=30: {fps:.1f} frames/s; CPU while it moved: capture thread "
            f"{thread_cpu * 100:.0f} % of a core, test process with x264's threads "
            f"{process_cpu * 100:.0f} %; convert+encode {encode_ms:.1f} ms a frame on average"
        )
        assert 10 <= fps <= 31 * 1.1


async def test_stop_ends_subscriptions_and_is_idempotent(x_session):
    source = VideoSource(x_session.display)
    frames = source.subscribe()
    await next_frame(frames)
    await source.stop()
    await source.stop()
    with pytest.raises(StopAsyncIteration):
        await anext(frames)
    with pytest.raises(SandboxError):
        source.subscribe()
    assert not video_threads()


async def test_an_unreachable_display_fails_the_subscription_with_a_sandbox_error():
    source = VideoSource(":4093")
    try:
        with pytest.raises(SandboxError, match="X display :4093"):
            await next_frame(source.subscribe())
        assert source.stats().subscribers == 0
    finally:
        await source.stop()
    assert not source.stats().encoder_running and not video_threads()


def test_odd_sizes_are_cropped_to_even_and_rows_land_where_they_belong():
    width, height = 321, 181
    rows = bytearray()
    for y in range(height):  # top half blue, bottom half red, BGRA
        rows += (b"\xff\x00\x00\x00" if y < height // 2 else b"\x00\x00\xff\x00") * width
    encoder = H264Encoder(width, height)
    try:
        frame = encoder.encode(bytes(rows), 0, keyframe=True)
    finally:
        encoder.close()
    assert (frame.width, frame.height) == (320, 180) and frame.keyframe
    picture = Decoder().decode(frame)
    assert (picture.width, picture.height) == (320, 180)
    assert close_to(colour_at(picture, 300, 20), BLUE), colour_at(picture, 300, 20)
    assert close_to(colour_at(picture, 300, 160), RED), colour_at(picture, 300, 160)


@pytest.mark.parametrize("band", [range(0, 7), range(100, 136), range(101, 137), range(795, 800)])
def test_converting_only_the_changed_rows_encodes_what_converting_all_would(band):
    # The same two pictures through two encoders: one told which rows changed, one not.
    # libx264 is deterministic, so the same YUV input gives the same bytes.
    width, height = 320, 800
    before = bytes((x * 7 + y * 3) % 251 for y in range(height) for x in range(width * 4))
    after = bytearray(before)
    for y in band:
        after[y * width * 4 : (y + 1) * width * 4] = bytes(
            (x * 13 + y) % 256 for x in range(width * 4)
        )
    told, untold = H264Encoder(width, height), H264Encoder(width, height)
    try:
        for encoder in (told, untold):
            encoder.encode(before, 0, keyframe=True)
        changed = told.encode(bytes(after), 1, keyframe=False, rows=band)
        whole = untold.encode(bytes(after), 1, keyframe=False, rows=None)
        nothing = told.encode(bytes(after), 2, keyframe=False, rows=range(0))
        again = untold.encode(bytes(after), 2, keyframe=False)
    finally:
        told.close()
        untold.close()
    assert changed.data == whole.data
    assert nothing.data == again.data
