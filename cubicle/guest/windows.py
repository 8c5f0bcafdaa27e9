"""Top-level windows through EWMH: list them, find the focused one, act on them.

Every function takes an open `Xlib.display.Display` that belongs to the calling thread;
python-xlib connections are not thread-safe, so the guest calls these from one worker thread.
The window manager does the real work: these functions read the properties it keeps on the
root window and ask it for changes with client messages, as a pager or taskbar does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

from Xlib import X, Xatom
from Xlib.display import Display
from Xlib.error import BadDrawable, BadWindow, CatchError
from Xlib.protocol import event
from Xlib.xobject.drawable import Window

from cubicle.protocol.errors import DesktopUnavailable, InvalidRequest, WindowNotFound
from cubicle.protocol.models import WindowInfo

_SOURCE_PAGER = 2
"""EWMH source indication for requests made on the user's behalf (pagers, taskbars)."""
_STATE_ADD = 1
"""`_NET_WM_STATE` action: add the listed states."""
_ICONIC_STATE = 3
"""ICCCM `IconicState`, asked for with `WM_CHANGE_STATE`."""
_SHELL_TYPES = ("_NET_WM_WINDOW_TYPE_DESKTOP", "_NET_WM_WINDOW_TYPE_DOCK")
"""Window types of the desktop background and of panels, left out of listings by default."""
_POLL_INTERVAL_S = 0.05
"""Seconds between two looks at the window list while waiting for a window."""


def list_windows(display: Display, *, include_shell: bool = False) -> list[WindowInfo]:
    """Describe the windows the window manager manages, bottom to top in mapping order.

    The desktop background and panels are left out unless `include_shell` is true. A window
    that closes while it is being read is skipped. Raises `DesktopUnavailable` when no
    EWMH window manager runs on the display.
    """
    root = display.screen().root
    active = active_window(display)
    shell_types = {display.intern_atom(name) for name in _SHELL_TYPES}
    windows: list[WindowInfo] = []
    for window_id in _client_ids(display):
        window = display.create_resource_object("window", window_id)
        try:
            types = set(_atoms(display, window, "_NET_WM_WINDOW_TYPE"))
            if types & shell_types and not include_shell:
                continue
            windows.append(_describe(display, root, window, focused=window_id == active))
        except (BadWindow, BadDrawable):
            continue
    return windows


def active_window(display: Display) -> int | None:
    """The id of the focused window as the window manager reports it; None when none is."""
    _require_window_manager(display)
    root = display.screen().root
    value = cardinals(display, root, "_NET_ACTIVE_WINDOW", Xatom.WINDOW)
    if not value or value[0] == X.NONE:
        return None
    return int(value[0])


def window_op(
    display: Display,
    window_id: int,
    op: Literal["activate", "close", "maximize", "minimize"],
) -> None:
    """Ask the window manager to activate, close, maximize or minimize a window.

    `activate` also brings a minimized window back. The request is on its way to the
    window manager when this returns; the change itself lands a few milliseconds later.
    Raises `WindowNotFound` when `window_id` is not a managed window.
    """
    if window_id not in _client_ids(display):
        raise WindowNotFound(
            f"No window with id {window_id} on this desktop; list the open windows with "
            "GET /windows and use one of their ids."
        )
    window = display.create_resource_object("window", window_id)
    atom = display.intern_atom
    match op:
        case "activate":
            if _is_minimized(display, window):
                _map(display, window, window_id)
            current = active_window(display) or X.NONE
            source = _SOURCE_PAGER
            _client_message(display, window, "_NET_ACTIVE_WINDOW", source, X.CurrentTime, current)
        case "close":
            _client_message(display, window, "_NET_CLOSE_WINDOW", X.CurrentTime, _SOURCE_PAGER)
        case "maximize":
            vert, horz = atom("_NET_WM_STATE_MAXIMIZED_VERT"), atom("_NET_WM_STATE_MAXIMIZED_HORZ")
            _client_message(display, window, "_NET_WM_STATE", _STATE_ADD, vert, horz, _SOURCE_PAGER)
        case "minimize":
            _client_message(display, window, "WM_CHANGE_STATE", _ICONIC_STATE)
        case _:
            raise InvalidRequest(
                f"Unknown window operation {op!r}; use activate, close, maximize or minimize."
            )
    display.sync()


def wait_for_window(
    display: Display,
    predicate: Callable[[WindowInfo], bool],
    timeout_s: float,
    *,
    include_shell: bool = False,
) -> WindowInfo:
    """Poll the window list until a window satisfies `predicate`; return the first that does.

    Polls every 50 milliseconds for at most `timeout_s` seconds, also while the window
    manager is still starting. Raises `WindowNotFound` on timeout.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            for window in list_windows(display, include_shell=include_shell):
                if predicate(window):
                    return window
            waiting_for = "no window matched"
        except DesktopUnavailable as exc:
            waiting_for = exc.message
        if time.monotonic() >= deadline:
            raise WindowNotFound(
                f"No window appeared within {timeout_s:g} s ({waiting_for}); check that the "
                "application started and list the open windows with GET /windows."
            )
        time.sleep(_POLL_INTERVAL_S)


def _describe(display: Display, root: Window, window: Window, *, focused: bool) -> WindowInfo:
    geometry = window.get_geometry()
    origin = root.translate_coords(window, 0, 0)
    pid = cardinals(display, window, "_NET_WM_PID", Xatom.CARDINAL)
    return WindowInfo(
        id=window.id,
        title=_title(display, window),
        app=_app(window),
        pid=int(pid[0]) if pid else None,
        x=origin.x,
        y=origin.y,
        width=geometry.width,
        height=geometry.height,
        focused=focused,
        minimized=_is_minimized(display, window),
    )


def _title(display: Display, window: Window) -> str:
    utf8 = display.intern_atom("UTF8_STRING")
    net_name = window.get_full_property(display.intern_atom("_NET_WM_NAME"), utf8)
    if net_name is not None and net_name.format == 8:
        return net_name.value.decode("utf-8", errors="replace")
    name = window.get_full_property(Xatom.WM_NAME, X.AnyPropertyType)
    if name is None or name.format != 8:
        return ""
    encoding = "utf-8" if name.property_type == utf8 else "latin-1"
    return name.value.decode(encoding, errors="replace")


def _app(window: Window) -> str:
    """The class part of WM_CLASS (`instance\\0class\\0`), empty when the window sets none."""
    wm_class = window.get_full_property(Xatom.WM_CLASS, Xatom.STRING)
    if wm_class is None or wm_class.format != 8:
        return ""
    parts = wm_class.value.split(b"\0")
    return parts[1].decode("latin-1") if len(parts) > 1 else ""


def _is_minimized(display: Display, window: Window) -> bool:
    return display.intern_atom("_NET_WM_STATE_HIDDEN") in _atoms(display, window, "_NET_WM_STATE")


def _client_ids(display: Display) -> list[int]:
    _require_window_manager(display)
    root = display.screen().root
    return [int(w) for w in cardinals(display, root, "_NET_CLIENT_LIST", Xatom.WINDOW)]


def _require_window_manager(display: Display) -> None:
    root = display.screen().root
    if not cardinals(display, root, "_NET_SUPPORTING_WM_CHECK", Xatom.WINDOW):
        raise DesktopUnavailable(
            "No EWMH window manager runs on this desktop yet; wait until GET /health reports "
            "window_manager, then try again."
        )


def _atoms(display: Display, window: Window, name: str) -> list[int]:
    return cardinals(display, window, name, Xatom.ATOM)


def cardinals(display: Display, window: Window, name: str, type_: int) -> list[int]:
    """A 32-bit list property of `type_`; empty when the window does not set it."""
    prop = window.get_full_property(display.intern_atom(name), type_)
    if prop is None or prop.format != 32:
        return []
    return list(prop.value)


def _map(display: Display, window: Window, window_id: int) -> None:
    """Map a minimized window: ICCCM's way for a client to leave the iconic state."""
    catcher = CatchError(BadWindow)
    window.map(onerror=catcher)
    display.sync()
    if catcher.get_error() is not None:
        raise WindowNotFound(
            f"Window {window_id} closed while it was being activated; list the open windows "
            "with GET /windows."
        )


def _client_message(display: Display, window: Window, type_name: str, *data: int) -> None:
    """Send an EWMH/ICCCM request about `window` to the window manager via the root window."""
    message = event.ClientMessage(
        window=window,
        client_type=display.intern_atom(type_name),
        data=(32, [*data, *([0] * (5 - len(data)))]),
    )
    mask = X.SubstructureRedirectMask | X.SubstructureNotifyMask
    display.screen().root.send_event(message, event_mask=mask)
