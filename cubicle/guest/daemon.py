"""The guest daemon: owns one desktop session and serves the guest protocol.

Started inside the sandbox as `python -m cubicle.guest`. It starts the session, serves HTTP
as soon as the X server is up (on a Unix socket, or on TCP for runtimes whose guest lives on
another kernel or host; with `--secret-file`, every request must carry that secret as a
bearer token), and reports its progress as `GuestEvent` JSON lines on a status file
descriptor when it has one.

It imports nothing of the control plane: only `cubicle.protocol`, the guest's own modules
(capture and encode in `cubicle.guest.video`), the standard library and third-party packages.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import functools
import gc
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cubicle.guest import session as desktop_session

if TYPE_CHECKING:
    from cubicle.protocol.models import GuestEvent

log = logging.getLogger("cubicle.guest")

_PR_SET_DUMPABLE = 4
_KEEP_ALIVE_S = 3600
"""Seconds an idle connection from the service stays open."""


class StatusPipe:
    """`GuestEvent` lines to the host about the desktop's progress; silent without a pipe."""

    def __init__(self, fd: int | None) -> None:
        if fd is not None:
            os.set_inheritable(fd, False)  # the desktop's programs must not write to the host
        self._file = os.fdopen(fd, "w", buffering=1) if fd is not None else None

    def event(self, event: GuestEvent) -> None:
        if self._file is None:
            return
        try:
            self._file.write(event.model_dump_json(exclude_none=True) + "\n")
        except BrokenPipeError:
            self._file = None

    def stage(self, name: str) -> None:
        from cubicle.protocol.models import GuestEvent  # after the X server started

        self.event(GuestEvent(event=name))


@dataclass(frozen=True)
class Listen:
    """Where the daemon serves: a Unix socket path, a TCP host and port, or a listening
    socket its runtime made and passed in (the `local` runtime's way: then nothing inside
    the sandbox can take the socket's place)."""

    uds: str | None = None
    host: str | None = None
    port: int | None = None
    fd: int | None = None

    @classmethod
    def parse(cls, text: str) -> Listen:
        """`unix:/run/guest.sock`, `tcp:0.0.0.0:8300` or `fd:3` (a bare path is a socket)."""
        kind, _, rest = text.partition(":")
        if kind == "fd":
            if not rest.isdigit():
                raise argparse.ArgumentTypeError(f"{text!r}: use fd:NUMBER")
            return cls(fd=int(rest))
        if kind == "tcp":
            host, _, port = rest.rpartition(":")
            if not host or not port.isdigit():
                raise argparse.ArgumentTypeError(f"{text!r}: use tcp:HOST:PORT")
            return cls(host=host, port=int(port))
        if kind == "unix" and rest:
            return cls(uds=rest)
        if text.startswith("/"):
            return cls(uds=text)
        raise argparse.ArgumentTypeError(f"{text!r}: use unix:PATH or tcp:HOST:PORT")


def _base_env(home: Path, extra: list[str]) -> dict[str, str]:
    """The desktop programs' environment: the session's own, then the runtime's `--env`
    (a secret's placeholder, the trust bundle's variables)."""
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
        "CUBICLE_CHROMIUM_FLAGS": desktop_session.CHROMIUM_FLAGS,
    } | dict(item.split("=", 1) for item in extra)


def _read_secret(path: str | None) -> str | None:
    """The per-desktop secret, read once; the file is the runtime's, never the desktop's."""
    if path is None:
        return None
    secret = Path(path).read_text().strip()
    if not secret:
        raise SystemExit(f"the secret file {path} is empty")
    return secret


async def serve(args: argparse.Namespace) -> int:
    status = StatusPipe(args.status_fd)
    secret = _read_secret(args.secret_file)
    home = Path(args.home)
    env = _base_env(home, args.env)
    session = desktop_session.start(args.width, args.height, env, progress=status.stage)
    if "CUBICLE_EXTRA_CA" in env:  # while X starts: before any browser can
        desktop_session.trust_in_browsers(home, Path(env["CUBICLE_EXTRA_CA"]))
    # Watch for the drawn desktop from now on, on a thread, while the heavy imports
    # (uvicorn, Starlette, mss, Pillow, PyAV) run here: XFCE is on the critical path of
    # every create, the HTTP stack is not.
    loop = asyncio.get_running_loop()
    drawn = loop.run_in_executor(
        None,
        functools.partial(
            desktop_session.wait_until_drawn, session, args.ready_timeout, progress=status.stage
        ),
    )
    import uvicorn

    from cubicle.guest.app import create_app
    from cubicle.guest.core import Guest
    from cubicle.guest.relay import Relays, SecretCheck, relay_protocol
    from cubicle.protocol.models import GuestEvent, Screen

    os.environ.update(
        DISPLAY=session.display,
        DBUS_SESSION_BUS_ADDRESS=session.env["DBUS_SESSION_BUS_ADDRESS"],
    )
    guest = Guest(session, home, args.max_file_bytes)
    guest.start()
    listen: Listen = args.listen
    check = None
    if secret is not None:
        check = SecretCheck(secret, Path(args.secret_file) if args.secret_file else None)
    relays = Relays()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(guest, check=check),
            http=relay_protocol(check, relays),
            fd=listen.fd,
            uds=listen.uds,
            host=listen.host or "127.0.0.1",
            port=listen.port or 0,
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
        screen = Screen(width=session.width, height=session.height)
        status.event(GuestEvent(event="ready", screen=screen))
        # What start-up made (modules, the app, the session) lives as long as the daemon:
        # kept out of the collector's full passes, which walked it all with the loop
        # stopped (as the service's did: see `cubicle.server.app`).
        gc.freeze()
        while not serving.done():
            if dead := session.dead_process():
                guest.failure = dead
                status.event(GuestEvent(event="failed", reason=dead))
                server.should_exit = True
                break
            if session.dead_components():  # the desktop goes on, degraded: say so, revive
                for note in await asyncio.to_thread(session.revive):
                    log.warning("%s", note)
                    status.event(GuestEvent(event="degraded", reason=note))
            await asyncio.sleep(0.2)
        await serving
    except Exception as exc:  # the host must hear why the desktop did not come up
        status.event(GuestEvent(event="failed", reason=str(exc)))
        server.should_exit = True
        await serving
        return 1
    finally:
        await relays.close()
        await guest.stop()
        session.stop()
    return 1 if guest.failure else 0


def _undumpable() -> None:
    """Keep the desktop's programs (same user) from tracing this daemon or reading its
    memory and descriptors through /proc: it holds the host's socket and status pipe."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: errno %d", ctypes.get_errno())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cubicle.guest")
    parser.add_argument(
        "--listen",
        type=Listen.parse,
        required=True,
        help="where to serve: unix:PATH, tcp:HOST:PORT, or fd:N (a listening socket)",
    )
    parser.add_argument(
        "--secret-file", help="a file holding the bearer token every request must carry"
    )
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--home", default=os.path.expanduser("~"))
    parser.add_argument("--status-fd", type=int, default=None)
    parser.add_argument("--max-file-bytes", type=int, default=100 * 1024 * 1024)
    parser.add_argument("--ready-timeout", type=float, default=30.0)
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for the desktop's programs"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="guest %(levelname)s %(message)s")
    _undumpable()
    if args.listen.fd is not None:
        os.set_inheritable(args.listen.fd, False)  # the desktop's programs must not get it
    # Plain asyncio, not uvloop: uvloop's subprocesses inherit the daemon's descriptors
    # (the status pipe, the log), which a command in the desktop must never hold.
    return asyncio.run(serve(args))
