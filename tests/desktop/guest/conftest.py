"""A real X session on the host for testing guest modules without a sandbox around them.

Xvfb, a D-Bus session bus and the xfwm4 window manager: the same programs a desktop runs,
started here directly so guest code can be tested piece by piece.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from Xlib import X
from Xlib.display import Display


@dataclass
class XSession:
    display: str
    """Value for DISPLAY, e.g. `:7`."""
    env: dict[str, str]
    """Environment for programs that should run inside this session."""
    width: int = 1280
    height: int = 800
    processes: list[subprocess.Popen] = field(default_factory=list)

    def spawn(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start a program on this display; it is killed when the session ends.

        Output goes nowhere unless `stdout`/`stderr` are given.
        """
        kwargs.setdefault("stdout", subprocess.DEVNULL)
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        proc = subprocess.Popen(argv, env=self.env, **kwargs)
        self.processes.append(proc)
        return proc


def _start_xvfb(width: int, height: int) -> tuple[subprocess.Popen, str]:
    read_fd, write_fd = os.pipe()
    xvfb = subprocess.Popen(
        [
            "Xvfb",
            "-screen",
            "0",
            f"{width}x{height}x24",
            "-nolisten",
            "tcp",
            "-noreset",  # else the server resets when its first client (dbus-launch) leaves
            "-displayfd",
            str(write_fd),
        ],
        pass_fds=(write_fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        number = pipe.readline().strip()
    if not number:
        xvfb.kill()
        raise RuntimeError("Xvfb did not report a display number")
    return xvfb, f":{number}"


def _start_window_manager(session: XSession, timeout: float = 10.0) -> None:
    """Start xfwm4 and return once it focuses newly mapped windows.

    Owning the WM_S0 selection is not enough: xfwm4 takes it early in its start-up, and a
    window mapped before its event loop runs is adopted without focus. So a throwaway window
    is mapped (again, until it works) and must become `_NET_ACTIVE_WINDOW`.
    """
    wm = session.spawn(["xfwm4", "--compositor=off"])
    display = Display(session.display)
    root = display.screen().root
    active = display.intern_atom("_NET_ACTIVE_WINDOW")
    deadline = time.monotonic() + timeout
    try:
        while True:
            window = root.create_window(0, 0, 50, 50, 0, X.CopyFromParent)
            window.map()
            display.sync()
            attempt_ends = min(deadline, time.monotonic() + 0.25)
            while time.monotonic() < attempt_ends:
                prop = root.get_full_property(active, X.AnyPropertyType)
                if prop is not None and window.id in prop.value:
                    window.destroy()
                    display.sync()
                    return
                time.sleep(0.01)
            window.destroy()
            if wm.poll() is not None:
                raise RuntimeError(f"xfwm4 exited with status {wm.returncode}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"xfwm4 did not focus a new window within {timeout} s")
    finally:
        display.close()


@pytest.fixture(scope="module")
def x_session() -> Iterator[XSession]:
    """Xvfb 1280×800 + a session bus + xfwm4, torn down after the module."""
    if shutil.which("Xvfb") is None:
        pytest.fail("Xvfb is not installed: run `make setup` (or scripts/bootstrap.sh)")
    xvfb, display = _start_xvfb(1280, 800)
    home = tempfile.mkdtemp(prefix="cubicle-xsession-")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "DISPLAY": display,
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": home,
        "NO_AT_BRIDGE": "0",
    }
    bus = subprocess.run(
        ["dbus-launch", "--sh-syntax"], env=env, capture_output=True, text=True, check=True
    )
    for line in bus.stdout.splitlines():
        if line.startswith("DBUS_SESSION_BUS_ADDRESS="):
            env["DBUS_SESSION_BUS_ADDRESS"] = line.split("=", 1)[1].rstrip(";").strip("'")
        if line.startswith("DBUS_SESSION_BUS_PID="):
            bus_pid = int(line.split("=", 1)[1].rstrip(";"))
    session = XSession(display=display, env=env)
    try:
        _start_window_manager(session)
        yield session
    finally:
        for proc in session.processes:
            proc.kill()
            proc.wait()
        os.kill(bus_pid, 9)
        xvfb.kill()
        xvfb.wait()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def display(x_session: XSession) -> Iterator[Display]:
    """A python-xlib connection to the session, shared by one module's tests."""
    connection = Display(x_session.display)
    yield connection
    connection.close()
