"""`Guest`: everything the guest protocol acts on, for one running desktop session.

The X connection belongs to one thread (`on_x`); pointer actions that only send events may
run on the event loop instead (`on_x_quick`) while no other thread holds the connection.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from cubicle.guest import session as desktop_session
from cubicle.protocol.lanes import desktop_lanes

if TYPE_CHECKING:
    from Xlib.display import Display

    from cubicle.guest.code.kernels import Contexts
    from cubicle.guest.screen import ScreenCapture
    from cubicle.guest.video.source import VideoSource

VERSION = "0.2.0"
"""The guest protocol's version, reported by `GET /health`."""


class Guest:
    """Everything the guest protocol acts on, for one running session."""

    def __init__(self, session: desktop_session.Session, home: Path, max_file_bytes: int):
        from Xlib import display as xdisplay

        from cubicle.guest.clipboard import Clipboard
        from cubicle.guest.fit import WindowFitter
        from cubicle.guest.input import InputController
        from cubicle.guest.system import System

        self.session = session
        self.width, self.height = session.width, session.height
        self.drawn = False
        self.failure: str | None = None
        self._x = ThreadPoolExecutor(max_workers=1, thread_name_prefix="x")
        self._x_lock = threading.Lock()
        """Held by the thread using `display`: the X thread, or the loop for quick input."""
        self.display: Display = self._x.submit(xdisplay.Display, session.display).result()
        self.input = InputController(self.display)
        self.clipboard = Clipboard(session.display)
        self.fitter = WindowFitter(session.display)
        """Shrinks windows larger than the screen (GTK's file chooser) to fit it."""
        self.system = System(home, session.env, max_file_bytes)
        self.lanes = desktop_lanes()
        """Bounded lines for slow calls (screenshots, files, a11y): past them, `Busy`."""

    # The screen and the video load numpy, Pillow, mss and PyAV (10 MB of an idle guest's
    # 37 MB of private memory, and 0.15 CPU-seconds of its start): on first use, not before.

    @functools.cached_property
    def screen(self) -> ScreenCapture:
        """Screenshots and settle detection."""
        from cubicle.guest.screen import ScreenCapture

        return ScreenCapture(self.session.display)

    @functools.cached_property
    def video(self) -> VideoSource:
        """Live H.264 of the screen; its thread runs only while someone reads `/frames`."""
        from cubicle.guest.video.source import VideoSource

        return VideoSource(self.session.display)

    @functools.cached_property
    def code(self) -> Contexts:
        """Code contexts (Jupyter kernels); none runs until code first does."""
        from cubicle.guest.code.kernels import Contexts

        return Contexts(self.system.home, self.system.env)

    async def on_x(self, fn, *args):
        """Run a blocking function that uses `display` on the X thread."""
        return await asyncio.get_running_loop().run_in_executor(self._x, self._holding_x, fn, *args)

    async def on_x_quick(self, fn, *args):
        """Run a call on `display` that never waits for the server (it only sends events)
        right here on the event loop if no other thread uses the connection, else as `on_x`.

        A click so skips two thread hand-offs, about 0.4 ms of a 1.5 ms click here.
        """
        if not self._x_lock.acquire(blocking=False):
            return await self.on_x(fn, *args)
        try:
            return fn(*args)
        finally:
            self._x_lock.release()

    def _holding_x(self, fn, *args):
        with self._x_lock:
            return fn(*args)

    async def input_processed(self) -> None:
        """Return once the X server has processed all the input sent so far.

        Later requests on the input's own connection follow it anyway; a screen grab on
        another connection calls this first. It costs a round trip only after input that
        was sent without one (`InputController.unconfirmed`).
        """
        if self.input.unconfirmed:
            await self.on_x(self.input.sync)

    def start(self) -> None:
        self.clipboard.start()
        self.fitter.start()

    async def stop(self) -> None:
        if "video" in self.__dict__:
            await self.video.stop()
        if "code" in self.__dict__:
            await self.code.stop()
        await self.system.stop()
        self.clipboard.stop()
        self.fitter.stop()
        if "screen" in self.__dict__:
            self.screen.close()
        self._x.submit(self.input.close).result()
        self._x.submit(self.display.close).result()
        self._x.shutdown(wait=True)
