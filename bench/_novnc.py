"""The reference products' live view: x11vnc in the desktop, websockify and noVNC on the host.

E2B Desktop, Anthropic's computer-use demo and most of their kin stream a desktop with
x11vnc and show it with noVNC through websockify. Here x11vnc runs inside our sandboxed
desktop (started through the exec API, Debian's build) and listens on a Unix socket in its
runtime directory, which the host reaches as `<data_dir>/desktops/<id>/disk/run/vnc.sock`.
Debian's websockify bridges that socket to a WebSocket on 127.0.0.1 and serves Debian's noVNC (1.3)
from the same port.

x11vnc runs with one of two sets of options (`PROFILES`), beside what every run needs here
(no password prompt banner, no client-side cache, no TCP port, the socket):
- `reference`: what the reference products pass. E2B Desktop's SDK starts
  `x11vnc -bg -display … -forever -wait 50 -shared -rfbport … -nopw`, and Anthropic's
  computer-use demo `x11vnc -display … -forever -shared -wait 50 -timeout 60 -noxrecord
  -noxfixes -noxdamage -rfbport 5900`. Both poll the screen every 50 ms; E2B's keeps X
  DAMAGE hints, the kinder of the two to x11vnc, so it is E2B's that runs.
- `defaults`: x11vnc's own defaults (a poll every 20 ms), quicker than any reference
  product runs it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench import _inside
from bench._cpu import process_group
from bench._service import Service

NOVNC_DIR = Path("/usr/share/novnc")
WEBSOCKIFY = "/usr/bin/websockify"
SOCKET_NAME = "vnc.sock"
PR_SET_PDEATHSIG = 1


PROFILES: dict[str, list[str]] = {
    "reference": ["-forever", "-wait", "50", "-shared"],
    "defaults": ["-forever", "-shared"],
}
"""x11vnc options by profile: the reference products' (E2B Desktop's), or x11vnc's own."""


def x11vnc_argv(display: str, profile: str = "reference") -> list[str]:
    socket_path = f"{_inside.GUEST_RUN}/{SOCKET_NAME}"
    return [
        "x11vnc", "-display", display, *PROFILES[profile], "-nopw",
        "-rfbport", "0", "-unixsock", socket_path, "-ncache", "0",
    ]  # fmt: skip


@dataclass
class VncStack:
    """x11vnc in a desktop and websockify on the host, serving noVNC."""

    x11vnc: _inside.InsideProcess
    websockify: subprocess.Popen[bytes]
    port: int
    websockify_argv: list[str]

    @property
    def page_url(self) -> str:
        """noVNC's own page, connecting at once, at 1:1 scale (no local or remote resize)."""
        return (
            f"http://127.0.0.1:{self.port}/vnc.html?host=127.0.0.1&port={self.port}"
            "&autoconnect=1&resize=off&reconnect=0&path=websockify"
        )

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/websockify"

    def websockify_pids(self) -> set[int]:
        """websockify and the process it forks for each connection."""
        return process_group(self.websockify.pid)


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the benchmark's process dies, however."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(path: Path, what: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not appear within {timeout_s:.0f} s")
        time.sleep(0.05)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"websockify exited with status {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"websockify did not listen within {timeout_s:.0f} s")
        time.sleep(0.05)


@contextlib.contextmanager
def vnc_stack(service: Service, desktop_id: str, profile: str = "reference") -> Iterator[VncStack]:
    """x11vnc (options: `PROFILES[profile]`) + websockify for one desktop; both are stopped
    however the block ends."""
    display = _inside.exec_command(service, desktop_id, "echo $DISPLAY").strip()
    host_socket = _inside.run_dir(service, desktop_id) / SOCKET_NAME
    host_socket.unlink(missing_ok=True)  # a previous stack's
    x11vnc = _inside.start(service, desktop_id, "x11vnc", x11vnc_argv(display, profile))
    websockify: subprocess.Popen[bytes] | None = None
    try:
        _wait_for(host_socket, "x11vnc's socket")
        port = _free_port()
        argv = [
            WEBSOCKIFY, f"--web={NOVNC_DIR}", f"--unix-target={host_socket}",
            f"127.0.0.1:{port}",
        ]  # fmt: skip
        with open(service.data_dir / "websockify.log", "ab") as log:
            websockify = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        _wait_for_port(port, websockify)
        yield VncStack(x11vnc, websockify, port, argv)
    finally:
        if websockify is not None:
            for pid in process_group(websockify.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            try:
                websockify.wait(timeout=5)
            except subprocess.TimeoutExpired:
                for pid in process_group(websockify.pid) | {websockify.pid}:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                websockify.wait()
        _inside.stop(service, x11vnc)
