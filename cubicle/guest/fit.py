"""Windows larger than the screen are shrunk to fit it as soon as the window manager takes them.

GTK's file chooser opens at 1096×856 by default: on a 1280×800 screen its Save button lies
below the bottom edge, out of reach of any mouse, an agent's included. A person would drag
the window; the guest does what a tidy window manager would. Each new top-level window
whose frame is wider or taller than the work area (the screen less the panel) is moved and
resized to fit it with `_NET_MOVERESIZE_WINDOW`, asked of the window manager as a pager
asks. Windows that fit are left alone, as are those that ask not to be resized.
"""

from __future__ import annotations

import logging
import os
import select
import threading

from Xlib import X, Xatom, Xutil
from Xlib.display import Display
from Xlib.error import BadDrawable, BadWindow
from Xlib.protocol import event

from cubicle.guest.windows import cardinals

log = logging.getLogger("cubicle.guest.fit")

_STATIC_GRAVITY = 10
"""x and y name the client's own top-left corner, not its frame's."""
_MOVE_RESIZE_ALL = (1 << 8) | (1 << 9) | (1 << 10) | (1 << 11)
"""`_NET_MOVERESIZE_WINDOW` flags: x, y, width and height are all given."""
_SOURCE_PAGER = 2 << 12


def fit(display: Display, window_id: int) -> tuple[int, int, int, int] | None:
    """Move and resize window `window_id` into the work area when its frame does not fit;
    the (x, y, width, height) asked for, or None when it fits already (or is gone)."""
    root = display.screen().root
    window = display.create_resource_object("window", window_id)
    try:
        geometry = window.get_geometry()
        extents = cardinals(display, window, "_NET_FRAME_EXTENTS", Xatom.CARDINAL)
        left, right, top, bottom = extents or (0, 0, 0, 0)
        area_x, area_y, area_w, area_h = _work_area(display)
        hints = window.get_wm_normal_hints()
    except (BadWindow, BadDrawable):
        return None
    width, height = geometry.width, geometry.height
    if width + left + right <= area_w and height + top + bottom <= area_h:
        return None
    fitted_w = max(1, min(width, area_w - left - right))
    fitted_h = max(1, min(height, area_h - top - bottom))
    if hints is not None and hints.flags & Xutil.PMinSize:  # it cannot get smaller
        fitted_w, fitted_h = max(fitted_w, hints.min_width), max(fitted_h, hints.min_height)
    x, y = area_x + left, area_y + top
    message = event.ClientMessage(
        window=window,
        client_type=display.intern_atom("_NET_MOVERESIZE_WINDOW"),
        data=(32, [_STATIC_GRAVITY | _MOVE_RESIZE_ALL | _SOURCE_PAGER, x, y, fitted_w, fitted_h]),
    )
    root.send_event(message, event_mask=X.SubstructureRedirectMask | X.SubstructureNotifyMask)
    display.flush()
    return x, y, fitted_w, fitted_h


def _work_area(display: Display) -> tuple[int, int, int, int]:
    area = cardinals(display, display.screen().root, "_NET_WORKAREA", Xatom.CARDINAL)
    if len(area) >= 4:
        return area[0], area[1], area[2], area[3]
    screen = display.screen()
    return 0, 0, screen.width_in_pixels, screen.height_in_pixels


class WindowFitter:
    """Watches the window manager's client list from a thread and connection of its own."""

    def __init__(self, display_name: str | None) -> None:
        self._display_name = display_name
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False

    def start(self) -> None:
        display = Display(self._display_name)
        display.screen().root.change_attributes(event_mask=X.PropertyChangeMask)
        display.flush()
        self._thread = threading.Thread(target=self._run, args=(display,), name="fit")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self, display: Display) -> None:
        clients = display.intern_atom("_NET_CLIENT_LIST")
        seen = set(_clients(display))
        try:
            while not self._stopping:
                if not display.pending_events():
                    select.select([display.fileno(), self._wake_r], [], [])
                    continue
                ev = display.next_event()
                if ev.type != X.PropertyNotify or ev.atom != clients:
                    continue
                now = _clients(display)
                for window_id in now:
                    if window_id not in seen and (asked := fit(display, window_id)):
                        log.info("window %#x did not fit the screen: now %s", window_id, asked)
                seen = set(now)
        except Exception:  # the X server went away with the session
            if not self._stopping:
                log.exception("the window fitter stopped")
        finally:
            display.close()


def _clients(display: Display) -> list[int]:
    return cardinals(display, display.screen().root, "_NET_CLIENT_LIST", Xatom.WINDOW)
