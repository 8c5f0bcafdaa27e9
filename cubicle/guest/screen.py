"""Screen capture, image encoding and change detection inside the guest.

Capture uses mss (XShmGetImage through XCB) on a thread of its own, so a screenshot never
waits behind input or window calls. The X server's software cursor is not part of a
capture; `cursor=True` draws the current cursor image (XFixes) onto the picture, as the
live video does (`cubicle.guest.video.pointer`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import io
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image
from Xlib import display as xdisplay

from cubicle.guest import memory, png
from cubicle.guest.video.capture import DamagedScreen
from cubicle.guest.video.pointer import Pointer, blend, read_pointer
from cubicle.protocol.models import ImageFormat

IDLE_CORES = 0.02
"""CPU the desktop's programs use or wait for, in cores, at or below which they are idle:
a millisecond in 50 (the X server answering the settle's own looks costs a tenth of that)."""
BUSY_CORES = 0.1
"""CPU the desktop's programs use or wait for, in cores, above which the screen is not
settled."""

CONTENT_TYPES: dict[str, str] = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


@dataclass(frozen=True)
class Frame:
    """One raw capture of the whole screen."""

    bgra: bytes
    """Pixels, 4 bytes each (B, G, R, unused), row after row."""
    width: int
    """Screen pixels."""
    height: int
    """Screen pixels."""
    captured_at: float
    """`time.monotonic()` seconds when the capture finished."""
    number: int
    """Counts the captures of this screen from 1: two pictures with the same number show
    the same capture (nothing was drawn between them)."""


@dataclass(frozen=True)
class Encoded:
    """An encoded screenshot and how its pixels map back to the screen."""

    data: bytes
    content_type: str
    width: int
    """Image pixels."""
    height: int
    """Image pixels."""
    scale: float
    """Screen pixels per image pixel: screen_x = image_x × scale."""
    cached: bool = False
    """The screen had not changed since this encoding was made, so it was reused."""
    cursor_at: tuple[int, int] | None = None
    """Where the pointer drawn into the picture is (its hotspot), in screen pixels; None
    when the pointer is not drawn."""
    capture: int = 0
    """The number of the capture this picture was made from (`Frame.number`)."""


class ScreenCapture:
    """Grabs and encodes the screen of one X display on a dedicated thread.

    X DAMAGE says whether anything was drawn since the last grab. When nothing was, the
    last grab is the screen, and a request seen before is answered from its encoding of it:
    agents tend to look at a settled screen more than once.
    """

    def __init__(self, display: str) -> None:
        self._display = display
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture")
        self._deflate = ThreadPoolExecutor(max_workers=2, thread_name_prefix="png")
        self._screen: DamagedScreen | None = None
        self._xlib: xdisplay.Display | None = None
        self._last: Frame | None = None
        self._encoded: dict[tuple, Encoded] = {}
        """Encodings of `_last` made so far, by the request they answered."""
        self._idle_trim = memory.IdleTrim(self._executor)
        """Frees the heap the frames used once the screen has not been looked at a while."""
        self._closed = False

    # --- runs on the capture thread -------------------------------------------------------

    def _grab_sync(self) -> Frame:
        if self._screen is None:
            self._screen = DamagedScreen(self._display)
        self._screen.take_damage()
        pixels = self._screen.grab()
        number = self._last.number + 1 if self._last is not None else 1
        frame = Frame(
            bytes(pixels), self._screen.width, self._screen.height, time.monotonic(), number
        )
        self._last = frame
        self._encoded.clear()
        return frame

    def _current_sync(self) -> tuple[Frame, bool]:
        """The screen now, and whether it is the previous grab (nothing drawn since)."""
        if self._screen is None or self._last is None or self._screen.take_damage(sync=True):
            return self._grab_sync(), False
        return self._last, True

    def _cursor_sync(self) -> Pointer:
        if self._xlib is None:
            self._xlib = xdisplay.Display(self._display)
            self._xlib.xfixes_query_version()
        return read_pointer(self._xlib)

    def _screenshot_sync(
        self,
        fmt: ImageFormat,
        quality: int,
        max_width: int | None,
        max_height: int | None,
        cursor: bool,
    ) -> Encoded:
        frame, unchanged = self._current_sync()
        request = (fmt, quality, max_width, max_height)
        if unchanged and not cursor and request in self._encoded:
            return dataclasses.replace(self._encoded[request], cached=True)
        encoded = self._encode_sync(frame, fmt, quality, max_width, max_height, cursor)
        if not cursor:  # the pointer moves without damage: never reuse a picture of it
            self._encoded[request] = encoded
        return encoded

    def _encode_sync(
        self,
        frame: Frame,
        fmt: ImageFormat,
        quality: int,
        max_width: int | None,
        max_height: int | None,
        cursor: bool,
    ) -> Encoded:
        scale = max(
            frame.width / max_width if max_width else 1.0,
            frame.height / max_height if max_height else 1.0,
            1.0,
        )
        if fmt == "png" and scale == 1.0 and not cursor:
            bgrx = np.frombuffer(frame.bgra, np.uint8).reshape(frame.height, frame.width, 4)
            data = png.encode_rgb(bgrx[:, :, 2::-1], self._deflate)
            size = (frame.width, frame.height)
            return Encoded(data, CONTENT_TYPES[fmt], *size, scale, capture=frame.number)
        pixels: bytes | bytearray = frame.bgra
        cursor_at = None
        if cursor:  # drawn as the live video draws it (`cubicle.guest.video.pointer.blend`)
            pointer = self._cursor_sync()
            pixels = bytearray(frame.bgra)
            shape = (frame.height, frame.width, 4)
            blend(np.frombuffer(pixels, np.uint8).reshape(shape), 0, 0, pointer)
            cursor_at = (pointer.x, pointer.y)
        image = Image.frombuffer("RGB", (frame.width, frame.height), pixels, "raw", "BGRX", 0, 1)
        if scale > 1.0:
            size = (max(1, round(frame.width / scale)), max(1, round(frame.height / scale)))
            image = image.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
        if fmt == "png":
            data = png.encode_rgb(np.asarray(image), self._deflate)
        else:
            buffer = io.BytesIO()
            if fmt == "jpeg":
                image.save(buffer, "JPEG", quality=quality)
            else:
                image.save(buffer, "WEBP", quality=quality, method=0)
            data = buffer.getvalue()
        size = (image.width, image.height)
        return Encoded(
            data, CONTENT_TYPES[fmt], *size, scale, cursor_at=cursor_at, capture=frame.number
        )

    # --- the async surface ----------------------------------------------------------------

    async def grab(self) -> Frame:
        """Capture the whole screen."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._grab_sync)
        finally:
            self._idle_trim.touch()

    async def screenshot(
        self,
        fmt: ImageFormat = "png",
        *,
        quality: int = 80,
        max_width: int | None = None,
        max_height: int | None = None,
        cursor: bool = False,
    ) -> Encoded:
        """Capture and encode, shrinking (never enlarging) to fit max_width × max_height."""

        def work() -> Encoded:
            return self._screenshot_sync(fmt, quality, max_width, max_height, cursor)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        finally:
            self._idle_trim.touch()

    def _changed_sync(self) -> bool:
        """Whether anything was drawn since the last look (the first look grabs)."""
        if self._screen is None or self._last is None:
            self._grab_sync()
            return True
        if self._screen.take_damage(sync=True):
            self._grab_sync()  # empties the damage region again, keeps the cache honest
            return True
        return False

    def _look_sync(
        self, busy_cpu_s: Callable[[], float] | None, wanting: Callable[[], int] | None
    ) -> tuple[bool, float | None, int]:
        """The CPU reading, then whether anything was drawn since the last look (in this
        order, so the X server is not still answering the previous look when its state is
        read): (drawn, CPU seconds, programs wanting a CPU)."""
        cpu = busy_cpu_s() if busy_cpu_s is not None else None
        want = wanting() if wanting is not None else 0
        return self._changed_sync(), cpu, want

    async def wait_for_settle(
        self,
        quiet_ms: int,
        timeout_ms: int,
        busy_cpu_s: Callable[[], float] | None = None,
        *,
        idle_ms: int | None = None,
        wanting: Callable[[], int] | None = None,
    ) -> bool:
        """Return True once the last `quiet_ms` milliseconds were quiet: nothing drawn and,
        with `busy_cpu_s` (seconds of CPU the desktop's programs have used or waited for so
        far), those programs wanting at most `BUSY_CORES` on average over that time: an app
        building a dialog can compute for half a second before it draws anything. Returns
        False if it was still busy after `timeout_ms` milliseconds.

        With `idle_ms` (shorter than `quiet_ms`) and `busy_cpu_s`, it returns True sooner:
        once nothing was drawn for `idle_ms` while the programs wanted at most `IDLE_CORES`
        and, with `wanting` (how many of them want a CPU or a disk now), none wants one at
        the last look. A program about to draw an action's effect is running, waiting for a
        core or reading a file until it has drawn it; one that is idle has drawn all it will
        without a new event or timer.

        X DAMAGE says whether anything was drawn, so waiting costs no grabs. The screen and
        the CPU are looked at together every 20 ms (a fifth of `quiet_ms` when that is
        shorter; with `idle_ms`, 10 ms), and once more when `quiet_ms` (or `idle_ms`) without
        drawing will be up before the next look, so a quiet screen is seen as such within a
        look of it.
        """
        loop = asyncio.get_running_loop()
        self._idle_trim.touch()  # the looks below grab what was drawn
        quiet = quiet_ms / 1000
        idle = idle_ms / 1000 if idle_ms and idle_ms < quiet_ms and busy_cpu_s else None
        interval = min(0.01 if idle else 0.02, quiet / 5)
        look = functools.partial(self._look_sync, busy_cpu_s, wanting)
        _, cpu, _ = await loop.run_in_executor(self._executor, look)
        drawn_at = time.monotonic()  # what the action drew so far belongs to the action
        deadline = drawn_at + timeout_ms / 1000
        # (time, CPU reading) of the looks since the latest one at least `quiet` old
        marks = collections.deque([(drawn_at, cpu)])
        while True:
            until = drawn_at + (idle or quiet) - time.monotonic()
            await asyncio.sleep(until if 0 < until < interval else interval)
            changed, cpu, want = await loop.run_in_executor(self._executor, look)
            now = time.monotonic()
            if changed:
                drawn_at = now
            busy = False
            if cpu is not None:
                marks.append((now, cpu))
                while marks[1][0] <= now - quiet:
                    marks.popleft()
                then, cpu_then = marks[0]
                busy = (cpu - cpu_then) / (now - then) > BUSY_CORES
                if idle is not None and now - drawn_at >= idle and not want:
                    older = [mark for mark in marks if mark[0] <= now - idle]
                    if older and (cpu - older[-1][1]) / (now - older[-1][0]) <= IDLE_CORES:
                        return True
            if now - drawn_at >= quiet and not busy:
                return True
            if now >= deadline:
                return False

    def close(self) -> None:
        """Release the X connections and the thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._idle_trim.close()

        def release() -> None:
            if self._screen is not None:
                self._screen.close()
                self._screen = None
            if self._xlib is not None:
                self._xlib.close()
                self._xlib = None

        self._executor.submit(release).result()
        self._executor.shutdown(wait=True)
        self._deflate.shutdown(wait=True)
