"""The guest daemon: owns one desktop session and serves the guest protocol on a socket.

Started inside the sandbox as `python -m desktop.guest`. It starts the session, serves
HTTP on a Unix socket as soon as the X server is up, and reports progress as JSON lines on
a status file descriptor: `{"event": "x_server"}` … `{"event": "ready", "screen": …}`, or
`{"event": "failed", "reason": …}` when the X server or the session bus dies.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from desktop.guest import session as desktop_session

if TYPE_CHECKING:
    from Xlib.display import Display

log = logging.getLogger("cubicle.guest")

VERSION = "0.1.0"
_KEEP_ALIVE_S = 3600
"""Seconds an idle connection from the service stays open."""


class StatusPipe:
    """JSON lines to the host about the desktop's progress; silent when there is no pipe."""

    def __init__(self, fd: int | None) -> None:
        if fd is not None:
            os.set_inheritable(fd, False)  # the desktop's programs must not write to the host
        self._file = os.fdopen(fd, "w", buffering=1) if fd is not None else None

    def event(self, name: str, **fields: Any) -> None:
        if self._file is None:
            return
        try:
            self._file.write(json.dumps({"event": name, **fields}) + "\n")
        except BrokenPipeError:
            self._file = None


class Guest:
    """Everything the guest protocol acts on, for one running session."""

    def __init__(self, session: desktop_session.Session, home: Path, max_file_bytes: int):
        from Xlib import display as xdisplay

        from desktop.guest.clipboard import Clipboard
        from desktop.guest.fit import WindowFitter
        from desktop.guest.input import InputController
        from desktop.guest.screen import ScreenCapture
        from desktop.guest.system import System
        from streaming.source import VideoSource

        self.session = session
        self.width, self.height = session.width, session.height
        self.drawn = False
        self.failure: str | None = None
        self._x = ThreadPoolExecutor(max_workers=1, thread_name_prefix="x")
        self._x_lock = threading.Lock()
        """Held by the thread using `display`: the X thread, or the loop for quick input."""
        self.display: Display = self._x.submit(xdisplay.Display, session.display).result()
        self.input = InputController(self.display)
        self.screen = ScreenCapture(session.display)
        self.clipboard = Clipboard(session.display)
        self.fitter = WindowFitter(session.display)
        """Shrinks windows larger than the screen (GTK's file chooser) to fit it."""
        self.system = System(home, session.env, max_file_bytes)
        self.video = VideoSource(session.display)
        """Live H.264 of the screen; its thread runs only while someone reads `/frames`."""

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
        await self.video.stop()
        await self.system.stop()
        self.clipboard.stop()
        self.fitter.stop()
        self.screen.close()
        self._x.submit(self.input.close).result()
        self._x.submit(self.display.close).result()
        self._x.shutdown(wait=True)


def _base_env(home: Path) -> dict[str, str]:
    runtime_dir = Path(os.environ.get("XDG_RUNTIME_DIR", "/tmp/runtime-user"))
    runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "USER": os.environ.get("USER", "user"),
        "LOGNAME": os.environ.get("USER", "user"),
        "SHELL": "/bin/bash",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "TERM": "xterm-256color",
        "XDG_RUNTIME_DIR": str(runtime_dir),
    }


async def serve(args: argparse.Namespace) -> int:
    status = StatusPipe(args.status_fd)
    home = Path(args.home)
    session = desktop_session.start(
        args.width, args.height, _base_env(home), progress=lambda stage: status.event(stage)
    )
    # Watch for the drawn desktop from now on, on a thread, while the heavy imports
    # (uvicorn, FastAPI, mss, Pillow, PyAV) run here: XFCE is on the critical path of every
    # create, the HTTP stack is not.
    loop = asyncio.get_running_loop()
    drawn = loop.run_in_executor(
        None,
        functools.partial(
            desktop_session.wait_until_drawn, session, args.ready_timeout, progress=status.event
        ),
    )
    import uvicorn

    from desktop.guest.app import create_app

    os.environ.update(
        DISPLAY=session.display,
        DBUS_SESSION_BUS_ADDRESS=session.env["DBUS_SESSION_BUS_ADDRESS"],
    )
    guest = Guest(session, home, args.max_file_bytes)
    guest.start()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(guest),
            uds=args.socket,
            # The service is the only client: its keep-alive connections stay open while
            # an agent thinks (uvicorn's default closes them after 5 idle seconds).
            timeout_keep_alive=_KEEP_ALIVE_S,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
    )
    server.install_signal_handlers = lambda: None
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    serving = asyncio.create_task(server.serve())
    try:
        await drawn
        guest.drawn = True
        while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.005)
        status.event("ready", screen={"width": session.width, "height": session.height})
        while not serving.done():
            if dead := session.dead_process():
                guest.failure = dead
                status.event("failed", reason=dead)
                server.should_exit = True
                break
            await asyncio.sleep(0.2)
        await serving
    except Exception as exc:  # the host must hear why the desktop did not come up
        status.event("failed", reason=str(exc))
        server.should_exit = True
        await serving
        return 1
    finally:
        await guest.stop()
        session.stop()
    return 1 if guest.failure else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m desktop.guest")
    parser.add_argument("--socket", required=True, help="Unix socket path to serve on")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--home", default=os.path.expanduser("~"))
    parser.add_argument("--status-fd", type=int, default=None)
    parser.add_argument("--max-file-bytes", type=int, default=100 * 1024 * 1024)
    parser.add_argument("--ready-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="guest %(levelname)s %(message)s")
    # Plain asyncio, not uvloop: uvloop's subprocesses inherit the daemon's descriptors
    # (the status pipe, the log), which a command in the desktop must never hold.
    return asyncio.run(serve(args))
