"""Knowing when the screen changed (X DAMAGE) and grabbing it (mss, XShmGetImage).

The X server tells us about damage, so a static screen costs nothing: no polling, no
grabs. A `DamageNotify` arrives whenever the bounding box of the damage region grows (from
empty, first), carrying that box; a grab first empties the region (`DamageSubtract`, one
round trip) and then copies the pixels, so anything drawn during or after the copy raises
a new notify. The boxes say which rows changed, so a small change (a key typed, a cursor
blinking) costs a grab of those rows rather than of the whole screen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import mss
from mss.exception import ScreenShotError
from Xlib import display as xdisplay
from Xlib import error as xerror
from Xlib.ext import damage

from cubicle.protocol.errors import SandboxError


@contextlib.contextmanager
def _x_errors(doing: str) -> Iterator[None]:
    """Turn the X libraries' errors into the one error the guest reports."""
    try:
        yield
    except (xerror.DisplayError, xerror.ConnectionClosedError, xerror.XError) as exc:
        raise SandboxError(f"screen capture failed while {doing}: {exc}") from exc
    except (ScreenShotError, OSError) as exc:
        raise SandboxError(f"screen capture failed while {doing}: {exc}") from exc


class DamagedScreen:
    """The root window of one X display: whether it changed, and its pixels.

    Owns two X connections (Xlib for DAMAGE, XCB for mss); use it from one thread only.
    """

    def __init__(self, display: str) -> None:
        self._x: xdisplay.Display | None = None
        self._mss: mss.MSS | None = None
        try:
            with _x_errors(f"connecting to X display {display}"):
                self._x = xdisplay.Display(display)
                if not self._x.has_extension(damage.extname):
                    raise SandboxError(f"X display {display} lacks the DAMAGE extension")
                self._x.damage_query_version()
                self._notify_type: int = self._x.extension_event.DamageNotify
                self._damage = self._x.screen().root.damage_create(damage.DamageReportBoundingBox)
                self._x.sync()
                self._mss = mss.MSS(display=display)
                self._monitor = dict(self._mss.monitors[0])
        except BaseException:
            self.close()
            raise
        self.width: int = self._monitor["width"]
        """Screen pixels."""
        self.height: int = self._monitor["height"]
        """Screen pixels."""
        self._damaged: tuple[int, int] | None = None
        """First and end row of what the notifies read since the last grab reported."""

    def fileno(self) -> int:
        """The X connection to wait on (readable when a damage event may have arrived)."""
        assert self._x is not None
        return self._x.fileno()

    def take_damage(self, *, sync: bool = False) -> bool:
        """Whether the screen changed since the last grab; reads pending events (and keeps
        the rows they say changed, for `grab_damaged()`).

        With `sync`, one round trip first makes sure every notify the server sent before
        this call has arrived (otherwise a change made a moment ago may still be in flight).
        """
        assert self._x is not None
        changed = False
        with _x_errors("reading damage events"):
            if sync:
                self._x.sync()
            while self._x.pending_events():
                event = self._x.next_event()
                if event.type & 0x7F == self._notify_type:  # the class is a per-display clone
                    changed = True
                    self._add_damage(event.area.y, event.area.y + event.area.height)
        return changed

    def _add_damage(self, top: int, end: int) -> None:
        top, end = max(top, 0), min(end, self.height)
        if top >= end:
            return
        if self._damaged is not None:
            top, end = min(top, self._damaged[0]), max(end, self._damaged[1])
        self._damaged = (top, end)

    def grab(self) -> bytearray:
        """The whole screen as BGRA pixels, `width × 4` bytes per row, no padding."""
        return self._grab(range(self.height))

    def grab_damaged(self) -> tuple[range, bytearray]:
        """The rows that notifies read since the last grab said changed, whole width, and
        their BGRA pixels; all rows if none did. Later notifies (drawing after the ones
        read, or after this grab) are read by the next `take_damage()`.
        """
        rows = range(*self._damaged) if self._damaged is not None else range(self.height)
        return rows, self._grab(rows)

    def _grab(self, rows: range) -> bytearray:
        assert self._x is not None and self._mss is not None
        self._damaged = None
        band = {**self._monitor, "top": self._monitor["top"] + rows.start, "height": len(rows)}
        with _x_errors("grabbing the screen"):
            self._x.damage_subtract(self._damage)
            self._x.sync()  # the server emptied the region before the copy starts
            return self._mss.grab(band).raw

    def close(self) -> None:
        """Release both X connections; idempotent, quiet when the server is already gone."""
        grabber, self._mss = self._mss, None
        if grabber is not None:
            grabber.close()
        x, self._x = self._x, None
        if x is not None:
            with contextlib.suppress(xerror.ConnectionClosedError, OSError):
                x.close()
