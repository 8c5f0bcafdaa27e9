"""Window listing and window operations against xfwm4 and real GTK applications."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from Xlib.display import Display

from cubicle.guest.windows import active_window, list_windows, wait_for_window, window_op
from cubicle.protocol.errors import WindowNotFound
from cubicle.protocol.models import WindowInfo

from .conftest import XSession

TIMEOUT_S = 10.0
"""Seconds any single window change may take before a test fails."""

PROBE = r"""
import sys
import gi
gi.require_version("Gdk", "3.0")
gi.require_version("Gtk", "3.0")
from gi.repository import GLib
GLib.set_prgname("cubicle-probe")
from gi.repository import Gdk, Gtk
title, x, y, width, height, kind = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
window = Gtk.Window(title=title)
if kind == "dock":
    window.set_type_hint(Gdk.WindowTypeHint.DOCK)
window.set_gravity(Gdk.Gravity.STATIC)  # the position names the client area, not the frame
window.set_default_size(width, height)
window.move(x, y)
window.connect("destroy", Gtk.main_quit)
window.show_all()
Gtk.main()
"""
"""A GTK3 window with a given title, position and size, run by the system Python."""

Probe = Callable[..., tuple[subprocess.Popen, WindowInfo]]


@pytest.fixture
def probe(x_session: XSession, display: Display) -> Iterator[Probe]:
    """Start GTK probe windows and wait until the window manager lists them."""
    started: list[subprocess.Popen] = []

    def start(
        x: int = 100, y: int = 120, width: int = 400, height: int = 300, kind: str = "normal"
    ) -> tuple[subprocess.Popen, WindowInfo]:
        title = f"probe {uuid.uuid4().hex[:8]} héllo ✓"
        argv = ["/usr/bin/python3", "-c", PROBE, title, str(x), str(y), str(width), str(height)]
        proc = x_session.spawn([*argv, kind])
        started.append(proc)
        info = wait_for_window(
            display, lambda w: w.title == title, TIMEOUT_S, include_shell=kind == "dock"
        )
        return proc, info

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _window(display: Display, window_id: int) -> WindowInfo | None:
    return next((w for w in list_windows(display) if w.id == window_id), None)


def _until_gone(display: Display, window_id: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while _window(display, window_id) is not None:
        assert time.monotonic() < deadline, f"window {window_id} is still listed"
        time.sleep(0.05)


def test_lists_a_window_with_title_app_pid_and_geometry(display: Display, probe: Probe) -> None:
    proc, info = probe(x=100, y=120, width=400, height=300)

    assert info.app == "Cubicle-probe"
    assert info.title.endswith("héllo ✓")
    assert info.pid == proc.pid
    assert (info.x, info.y, info.width, info.height) == (100, 120, 400, 300)
    assert not info.minimized


def test_lists_real_applications(x_session: XSession, display: Display) -> None:
    terminal = x_session.spawn(["xfce4-terminal", "--disable-server", "--title", "cubicle-term"])
    mousepad = x_session.spawn(["mousepad"])
    try:
        term = wait_for_window(display, lambda w: w.pid == terminal.pid, TIMEOUT_S)
        editor = wait_for_window(display, lambda w: w.app == "Mousepad", TIMEOUT_S)

        assert term.app == "Xfce4-terminal"
        assert term.title == "cubicle-term"
        assert term.width > 100 and term.height > 100
        assert "Mousepad" in editor.title
        assert editor.pid == mousepad.pid
    finally:
        for proc in (terminal, mousepad):
            proc.kill()
            proc.wait()


def test_activate_moves_the_focus(display: Display, probe: Probe) -> None:
    _, first = probe(x=50, y=60)
    _, second = probe(x=600, y=60)

    for target, other in ((first, second), (second, first), (first, second)):
        window_op(display, target.id, "activate")
        focused = wait_for_window(display, lambda w, t=target: w.id == t.id and w.focused, 5)

        assert active_window(display) == focused.id
        assert not _window(display, other.id).focused


def test_minimize_then_activate_restores(display: Display, probe: Probe) -> None:
    _, info = probe()

    window_op(display, info.id, "minimize")
    wait_for_window(display, lambda w: w.id == info.id and w.minimized, TIMEOUT_S)
    window_op(display, info.id, "activate")
    restored = wait_for_window(
        display, lambda w: w.id == info.id and not w.minimized and w.focused, TIMEOUT_S
    )

    assert active_window(display) == restored.id


def test_maximize_fills_the_screen(x_session: XSession, display: Display, probe: Probe) -> None:
    _, info = probe(width=300, height=200)

    window_op(display, info.id, "maximize")
    big = wait_for_window(display, lambda w: w.id == info.id and w.width > 1000, TIMEOUT_S)

    # The content area: the whole width, the height less the title bar (no panels here).
    assert x_session.width - 12 <= big.width <= x_session.width
    assert x_session.height - 60 <= big.height <= x_session.height
    assert big.x >= 0 and big.y >= 0
    assert big.x + big.width <= x_session.width and big.y + big.height <= x_session.height


def test_close_ends_a_real_application(x_session: XSession, display: Display) -> None:
    mousepad = x_session.spawn(["mousepad"])
    try:
        info = wait_for_window(display, lambda w: w.pid == mousepad.pid, TIMEOUT_S)

        window_op(display, info.id, "close")
        _until_gone(display, info.id)

        assert mousepad.wait(timeout=TIMEOUT_S) == 0
    finally:
        mousepad.kill()
        mousepad.wait()


def test_docks_are_listed_only_with_the_shell(display: Display, probe: Probe) -> None:
    _, dock = probe(x=0, y=0, width=1280, height=30, kind="dock")
    _, normal = probe()

    default_ids = {w.id for w in list_windows(display)}
    shell_ids = {w.id for w in list_windows(display, include_shell=True)}

    assert normal.id in default_ids and dock.id not in default_ids
    assert {normal.id, dock.id} <= shell_ids


def test_unknown_window_id_raises(display: Display) -> None:
    unknown = max([w.id for w in list_windows(display, include_shell=True)], default=0) + 12345

    with pytest.raises(WindowNotFound, match=r"GET /windows") as caught:
        window_op(display, unknown, "activate")
    assert str(unknown) in caught.value.message


def test_wait_for_window_times_out(display: Display) -> None:
    started = time.monotonic()

    with pytest.raises(WindowNotFound, match=r"within 0\.3 s"):
        wait_for_window(display, lambda w: w.title == "no such window", 0.3)
    assert time.monotonic() - started < 2.0
