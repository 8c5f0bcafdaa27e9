"""Start the desktop session inside a sandbox: Xvfb, a D-Bus session bus, XFCE.

The session is the X server plus the programs that make it an XFCE desktop: the settings
daemon, the xfwm4 window manager, the panel and xfdesktop. They start in parallel as soon
as the X server accepts connections, and `wait_until_drawn` returns once the window
manager owns its selection and the panel and desktop windows are mapped and painted.

Nothing here knows about sandboxes: the same code runs in a bubblewrap sandbox, a microVM
or a pod, and in tests on a bare host.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from Xlib import X, Xatom
from Xlib import display as xdisplay
from Xlib import error as xerror

log = logging.getLogger(__name__)

CHROMIUM_FLAGS = (
    "--no-first-run --no-default-browser-check --disable-background-networking "
    "--disable-component-update --disable-sync --password-store=basic --test-type "
    "--remote-debugging-port=0"
)
"""`CUBICLE_CHROMIUM_FLAGS` in every program the session starts, which the local runtime's
line in /etc/chromium.d hands to Debian's chromium wrapper: a quiet browser that calls no
one at start, with DevTools on a port of the sandbox's loopback (written to the profile's
`DevToolsActivePort`), reached from outside only through the service."""

if TYPE_CHECKING:
    from cubicle.protocol.errors import SandboxStartError


def _start_error(message: str) -> SandboxStartError:
    """A `SandboxStartError`; its module loads pydantic, which waits until X has started."""
    from cubicle.protocol.errors import SandboxStartError

    return SandboxStartError(message)


XFCE_COMPONENTS: tuple[tuple[str, ...], ...] = (
    ("xfsettingsd", "--no-daemon"),
    ("xfwm4", "--compositor=off"),
    ("xfce4-panel",),
    ("xfdesktop",),
)
"""The programs that make the XFCE desktop, started in this order without waiting."""
MAX_RESTARTS = 5
"""Times one XFCE component is started again after it exited, before the guest gives up
on it (the desktop then stays degraded, with the reason)."""


@dataclass
class Session:
    """A running X session and the processes that belong to it."""

    display: str
    width: int
    height: int
    env: dict[str, str]
    """Environment for every program started on this desktop."""
    xvfb: subprocess.Popen
    processes: list[subprocess.Popen] = field(default_factory=list)

    def dead_process(self, *, essential_only: bool = True) -> str | None:
        """Name and status of the first process that exited, else None.

        Essential are the X server and the session bus: without them there is no desktop.
        The XFCE components may restart themselves and are watched only during start-up.
        """
        watched = [self.xvfb, *self.processes]
        for proc in watched[:2] if essential_only else watched:
            code = proc.poll()
            if code is not None:
                name = os.path.basename(str(proc.args[0]))
                return f"{name} exited with status {code}"
        return None

    restarts: dict[str, int] = field(default_factory=dict)
    """How many times each XFCE component was started again after it exited."""

    def dead_components(self) -> bool:
        """Whether an XFCE component (window manager, panel, desktop, settings) exited."""
        return any(proc.poll() is not None for proc in self.processes[1:])

    def revive(self) -> list[str]:
        """Start again every XFCE component that exited, up to `MAX_RESTARTS` times each;
        what happened, one line per component (blocking: a fork and exec each)."""
        notes = []
        for index, proc in enumerate(self.processes[1:], start=1):
            code = proc.poll()
            if code is None:
                continue
            name = os.path.basename(str(proc.args[0]))
            count = self.restarts.get(name, 0)
            if count >= MAX_RESTARTS:
                continue
            self.restarts[name] = count + 1
            if count + 1 == MAX_RESTARTS:
                note = f"{name} exited with status {code} again: not restarted any more"
            else:
                note = f"{name} exited with status {code}: started it again"
            self.processes[index] = _start_component(list(proc.args), self.env)
            notes.append(note)
        return notes

    def stop(self) -> None:
        """Terminate every session process, the X server last."""
        for proc in [*reversed(self.processes), self.xvfb]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*self.processes, self.xvfb]:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_xvfb(width: int, height: int, display_number: int = 0) -> tuple[subprocess.Popen, str]:
    """Start Xvfb and return once it accepts connections (it tells us through -displayfd)."""
    read_fd, write_fd = os.pipe()
    argv = [
        "Xvfb",
        f":{display_number}",
        "-screen",
        "0",
        f"{width}x{height}x24",
        "-nolisten",
        "tcp",
        "-dpi",
        "96",
        "-br",  # black root until xfdesktop paints, so painting can be detected
        "-s",
        "0",  # no screen saver blanking
        "-dpms",  # and no monitor power saving
        # No GLX: it loads Mesa's software renderer (LLVM) into every X server, about 11 MB
        # of private memory and 30 ms of relocations each; GTK runs with GL off, Chromium
        # renders with its own SwiftShader.
        "-extension",
        "GLX",
        "-displayfd",
        str(write_fd),
    ]
    xvfb = subprocess.Popen(
        argv, pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        number = pipe.readline().strip()
    if not number:
        xvfb.wait(timeout=5)
        message = xvfb.stderr.read().decode(errors="replace").strip().splitlines()[-3:]
        raise _start_error(f"Xvfb did not start: {' / '.join(message) or 'no output'}")
    xvfb.stderr.close()
    return xvfb, f":{number}"


def start_session_bus(env: dict[str, str]) -> subprocess.Popen:
    """Start a private D-Bus session bus; sets DBUS_SESSION_BUS_ADDRESS in `env`."""
    read_fd, write_fd = os.pipe()
    bus = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--nopidfile", f"--print-address={write_fd}"],
        pass_fds=(write_fd,),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        address = pipe.readline().strip()
    if not address:
        raise _start_error("dbus-daemon did not start: is the dbus package installed?")
    env["DBUS_SESSION_BUS_ADDRESS"] = address
    return bus


def session_env(base: dict[str, str], display: str) -> dict[str, str]:
    """The environment desktop programs run with: accessibility on, XFCE as the desktop."""
    env = dict(base)
    env.update(
        DISPLAY=display,
        XDG_CURRENT_DESKTOP="XFCE",
        XDG_SESSION_TYPE="x11",
        DESKTOP_SESSION="xfce",
        GTK_MODULES="gail:atk-bridge",
        QT_LINUX_ACCESSIBILITY_ALWAYS_ON="1",
        ACCESSIBILITY_ENABLED="1",
        # GTK probes OpenGL in every process until one has recorded the result on the
        # root window; XFCE's parts start together, so each loaded Mesa's software
        # renderer (LLVM): the window manager took 2.8 s instead of 0.5 s, ~10 MB each.
        GDK_GL="disable",
        GSETTINGS_BACKEND="keyfile",  # no dconf service: settings live in ~/.config/glib-2.0
    )
    env.pop("NO_AT_BRIDGE", None)  # it would hide apps from the accessibility tree
    return env


def start(
    width: int,
    height: int,
    base_env: dict[str, str],
    *,
    progress: Callable[[str], None] = lambda _: None,
) -> Session:
    """Start Xvfb, the session bus and the XFCE components; returns without waiting for paint."""
    xvfb, display = start_xvfb(width, height)
    progress("x_server")
    env = session_env(base_env, display)
    session = Session(display=display, width=width, height=height, env=env, xvfb=xvfb)
    try:
        session.processes.append(start_session_bus(env))
        for argv in XFCE_COMPONENTS:
            session.processes.append(_start_component(list(argv), env))
    except Exception:
        session.stop()
        raise
    return session


def trust_in_browsers(home: Path, ca: Path) -> None:
    """Add `ca` to the NSS database Chromium (and Firefox's NSS tools) read in `home`,
    made empty if absent. Without Debian's `certutil` (libnss3-tools), a warning: the
    desktop's command-line clients trust it through the system bundle all the same."""
    database = home / ".pki" / "nssdb"
    try:
        database.mkdir(mode=0o700, parents=True, exist_ok=True)
        where = f"sql:{database}"
        if not (database / "cert9.db").exists():
            subprocess.run(
                ["certutil", "-N", "-d", where, "--empty-password"],
                check=True, capture_output=True, timeout=20,
            )  # fmt: skip
        name = "Cubicle egress proxy"
        subprocess.run(
            ["certutil", "-A", "-d", where, "-n", name, "-t", "C,,", "-i", str(ca)],
            check=True, capture_output=True, timeout=20,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("Chromium will not trust the egress proxy's CA: certutil failed: %s", exc)


def _start_component(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    quiet = subprocess.DEVNULL
    return subprocess.Popen(argv, env=env, stdin=quiet, stdout=quiet, stderr=quiet)


def _window_types(conn: xdisplay.Display, window_ids: list[int]) -> set[str]:
    type_atom = conn.intern_atom("_NET_WM_WINDOW_TYPE")
    found: set[str] = set()
    for wid in window_ids:
        try:
            window = conn.create_resource_object("window", wid)
            if window.get_attributes().map_state != X.IsViewable:
                continue
            prop = window.get_full_property(type_atom, Xatom.ATOM)
        except xerror.XError:
            continue
        for atom in prop.value if prop else ():
            found.add(conn.get_atom_name(atom))
    return found


def wait_until_drawn(
    session: Session,
    timeout_s: float = 20.0,
    *,
    progress: Callable[[str], None] = lambda _: None,
) -> None:
    """Block until the window manager runs and the panel and desktop are mapped and painted.

    Raises SandboxStartError with the reason when a component dies or time runs out.
    """
    conn = xdisplay.Display(session.display)
    try:
        root = conn.screen().root
        wm_selection = conn.intern_atom("WM_S0")
        client_list = conn.intern_atom("_NET_CLIENT_LIST")
        deadline = time.monotonic() + timeout_s
        stage = "window_manager"
        while True:
            dead = session.dead_process(essential_only=False)
            if dead:
                raise _start_error(f"desktop session failed to start: {dead}")
            if stage == "window_manager" and conn.get_selection_owner(wm_selection) != X.NONE:
                progress("window_manager")
                stage = "shell"
            if stage == "shell":
                prop = root.get_full_property(client_list, Xatom.WINDOW)
                types = _window_types(conn, list(prop.value) if prop else [])
                if {"_NET_WM_WINDOW_TYPE_DOCK", "_NET_WM_WINDOW_TYPE_DESKTOP"} <= types:
                    progress("shell_mapped")
                    stage = "paint"
            if stage == "paint" and _looks_painted(conn, session.width, session.height):
                progress("desktop_drawn")
                return
            if time.monotonic() > deadline:
                raise _start_error(
                    f"desktop not drawn after {timeout_s:.0f} s (stuck at stage {stage!r})"
                )
            time.sleep(0.01)
    finally:
        conn.close()


def _looks_painted(conn: xdisplay.Display, width: int, height: int) -> bool:
    """True when both the panel strip and the desktop area show more than one flat colour."""
    root = conn.screen().root
    strip = root.get_image(0, 0, width, 24, X.ZPixmap, 0xFFFFFFFF).data
    middle = root.get_image(0, height // 2, width, 1, X.ZPixmap, 0xFFFFFFFF).data
    black = bytes(len(middle))
    return len(set(strip[i : i + 3] for i in range(0, len(strip), 4 * 7))) > 1 and middle != black
