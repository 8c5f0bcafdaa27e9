"""Screenshots on a real X server: exact pixels, scaling, and reuse while nothing changes."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from cubicle.guest.cpu import CpuMeter
from cubicle.guest.screen import ScreenCapture


@pytest.fixture
async def capture(x_session):
    screen = ScreenCapture(x_session.display)
    yield screen
    screen.close()


def _paint(x_session, colour: str) -> None:
    subprocess.run(["xsetroot", "-solid", colour], env=x_session.env, check=True)


async def test_png_is_pixel_exact(capture, x_session):
    _paint(x_session, "#123456")
    frame = await capture.grab()
    shot = await capture.screenshot("png")
    image = Image.open(io.BytesIO(shot.data))
    assert image.format == "PNG" and image.size == (1280, 800) and image.mode == "RGB"
    expected = Image.frombuffer("RGB", (1280, 800), frame.bgra, "raw", "BGRX", 0, 1)
    assert image.tobytes() == expected.tobytes()
    assert image.getpixel((640, 400)) == (0x12, 0x34, 0x56)


async def test_scaled_png_and_jpeg_report_their_scale(capture):
    for fmt, pil_format in [("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")]:
        shot = await capture.screenshot(fmt, max_width=320)
        image = Image.open(io.BytesIO(shot.data))
        assert image.format == pil_format
        assert image.size == (320, 200) and (shot.width, shot.height) == (320, 200)
        assert shot.scale == pytest.approx(4.0)


async def test_unchanged_screen_reuses_the_encoding_until_something_is_drawn(capture, x_session):
    _paint(x_session, "#204060")
    first = await capture.screenshot("png")
    again = await capture.screenshot("png")
    assert not first.cached and again.cached
    assert again.data == first.data
    other_format = await capture.screenshot("jpeg")
    assert not other_format.cached  # a different request is encoded anew, then kept too
    assert (await capture.screenshot("jpeg")).cached and (await capture.screenshot("png")).cached
    _paint(x_session, "#a01010")  # no pause: the damage round trip must see it at once
    changed = await capture.screenshot("png")
    assert not changed.cached
    assert Image.open(io.BytesIO(changed.data)).getpixel((10, 700)) == (0xA0, 0x10, 0x10)


async def test_cursor_pictures_are_never_reused(capture):
    first = await capture.screenshot("png", cursor=True)
    second = await capture.screenshot("png", cursor=True)
    assert not first.cached and not second.cached


def _cpu_meter(pid: int):
    """CPU seconds used by `pid` so far; after it exits, what it had used in all."""
    last = 0.0

    def used() -> float:
        nonlocal last
        try:
            fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except FileNotFoundError:
            return last
        last = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return last

    return used


async def test_settle_waits_while_the_desktop_computes_without_drawing(capture, x_session):
    quiet = await capture.wait_for_settle(150, 3000)
    assert quiet
    # A program that computes for ~0.8 s and draws nothing, like an app building a dialog.
    spin = "import time\nend = time.time() + 0.8\nwhile time.time() < end: pass"
    worker = await asyncio.create_subprocess_exec(sys.executable, "-c", spin)
    try:
        started = time.monotonic()
        blind = await capture.wait_for_settle(150, 3000)
        blind_s = time.monotonic() - started
        started = time.monotonic()
        settled = await capture.wait_for_settle(150, 3000, _cpu_meter(worker.pid))
        aware_s = time.monotonic() - started
    finally:
        await worker.wait()
    assert blind and settled
    assert blind_s < 0.5  # the screen alone looks settled at once
    assert aware_s > 0.4  # watching the CPU, it waits for the work to end


async def test_settle_times_out_while_the_screen_keeps_changing(capture, x_session):
    painter = await asyncio.create_subprocess_exec(
        "sh", "-c", "while true; do xsetroot -solid red; xsetroot -solid blue; done",
        env=x_session.env,
    )  # fmt: skip
    try:
        started = time.monotonic()
        assert not await capture.wait_for_settle(200, 800)
        assert 0.7 < time.monotonic() - started < 2.0
    finally:
        painter.kill()
        await painter.wait()


def _session_meter(session: int) -> CpuMeter:
    """The guest's own CPU meter, watching only the processes of one session."""
    return CpuMeter(lambda other: other != session)


async def test_an_idle_desktop_settles_after_idle_ms_not_quiet_ms(capture, x_session):
    sleeper = await asyncio.create_subprocess_exec("sleep", "30", start_new_session=True)
    try:
        assert await capture.wait_for_settle(150, 3000)
        started = time.monotonic()
        meter = _session_meter(sleeper.pid)
        wanting = lambda: meter.wanting  # noqa: E731
        assert await capture.wait_for_settle(400, 3000, meter, idle_ms=50, wanting=wanting)
        idle_s = time.monotonic() - started
        started = time.monotonic()
        assert await capture.wait_for_settle(400, 3000, _session_meter(sleeper.pid))
        quiet_s = time.monotonic() - started
    finally:
        sleeper.kill()
        await sleeper.wait()
    assert idle_s < 0.3 <= 0.4 <= quiet_s


async def test_a_settle_that_ends_on_idle_still_sees_what_the_work_drew(capture, x_session):
    """A program that computes for 0.4 s, then draws: settling early on an idle desktop must
    not return while it computes, so the next screenshot shows what it drew."""
    _paint(x_session, "#000000")
    assert await capture.wait_for_settle(150, 3000)
    work = (
        "import subprocess, time\nend = time.time() + 0.4\nwhile time.time() < end: pass\n"
        "subprocess.run(['xsetroot', '-solid', '#00ff00'])\n"
    )
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", work, env=x_session.env, start_new_session=True
    )
    try:
        started = time.monotonic()
        meter = _session_meter(worker.pid)
        wanting = lambda: meter.wanting  # noqa: E731
        assert await capture.wait_for_settle(150, 5000, meter, idle_ms=50, wanting=wanting)
        waited_s = time.monotonic() - started
        shot = Image.open(io.BytesIO((await capture.screenshot("png")).data))
    finally:
        await worker.wait()
    assert waited_s > 0.35
    assert shot.getpixel((640, 400)) == (0, 255, 0)
