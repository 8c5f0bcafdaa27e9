"""The desktop's pointer as people see it: where it is, what it looks like, drawn onto pixels.

X keeps the pointer out of every capture (Xvfb draws a software cursor that `GetImage`
leaves out), so the picture and the video draw it themselves from what XFixes says: the
current cursor image (premultiplied ARGB, its hotspot, a serial that changes with the
shape) and its position.

`PointerWatch` follows the pointer of one display on an X connection of its own, without
polling: XInput 2 raw motion events on the root window say it moved (whoever moved it:
XTest, a person, any device) and XFixes cursor notifies say its shape changed (a text
cursor over an entry, a resize arrow at a window's edge). Reading it then costs one round
trip (`QueryPointer`), and a second one only when the shape changed (`GetCursorImage`).

`blend()` draws a pointer onto BGRA pixels, premultiplied alpha "over", clipped to them;
the screenshot's `cursor=true` and the live video both use it, so they agree pixel for
pixel on where the pointer is and how it looks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
from Xlib import display as xdisplay
from Xlib import error as xerror
from Xlib.ext import xfixes, xinput

from cubicle.protocol.errors import SandboxError

_GENERIC_EVENT = 35
"""X's GenericEvent, which carries XInput 2 events."""


@dataclass(frozen=True, eq=False)
class CursorImage:
    """One cursor shape."""

    serial: int
    """XFixes' number for this shape: another number, another shape."""
    hotspot: tuple[int, int]
    """The pixel of the image that sits at the pointer's position (x, y from its corner)."""
    bgra: np.ndarray = field(repr=False)
    """(height, width, 4) uint8: blue, green, red premultiplied by alpha, then alpha."""

    @property
    def width(self) -> int:
        return self.bgra.shape[1]

    @property
    def height(self) -> int:
        return self.bgra.shape[0]


@dataclass(frozen=True)
class Pointer:
    """The pointer at one moment."""

    x: int
    """Screen pixels from the left edge (the hotspot's position)."""
    y: int
    """Screen pixels from the top edge."""
    image: CursorImage

    @property
    def box(self) -> tuple[int, int, int, int]:
        """Where the image lands: (left, top, right, bottom) in screen pixels, right and
        bottom excluded; may reach past the screen's edges."""
        left, top = self.x - self.image.hotspot[0], self.y - self.image.hotspot[1]
        return left, top, left + self.image.width, top + self.image.height


def cursor_image(reply) -> CursorImage:
    """A `CursorImage` from an XFixes `GetCursorImage` reply."""
    argb = np.asarray(reply.cursor_image, dtype="<u4")
    bgra = argb.view(np.uint8).reshape(reply.height, reply.width, 4)  # little-endian ARGB
    return CursorImage(reply.cursor_serial, (reply.xhot, reply.yhot), bgra)


def read_pointer(x: xdisplay.Display) -> Pointer:
    """The pointer now, image included, on a connection that queried XFixes' version."""
    with _x_errors("reading the pointer"):
        reply = x.xfixes_get_cursor_image(x.screen().root)
    return Pointer(reply.x, reply.y, cursor_image(reply))


def blend(pixels: np.ndarray, left: int, top: int, pointer: Pointer) -> bool:
    """Draw `pointer` onto `pixels`, a writable (rows, columns, 4) BGRA view of the screen
    whose first pixel is screen pixel (`left`, `top`). Returns whether any of it landed."""
    box_left, box_top, box_right, box_bottom = pointer.box
    height, width = pixels.shape[:2]
    x0, y0 = max(box_left, left), max(box_top, top)
    x1, y1 = min(box_right, left + width), min(box_bottom, top + height)
    if x0 >= x1 or y0 >= y1:
        return False
    source = pointer.image.bgra[y0 - box_top : y1 - box_top, x0 - box_left : x1 - box_left]
    target = pixels[y0 - top : y1 - top, x0 - left : x1 - left, :3]
    keep = 255 - source[:, :, 3:4].astype(np.uint16)
    mixed = source[:, :, :3] + (target * keep + 127) // 255
    np.minimum(mixed, 255, out=mixed)
    target[...] = mixed
    return True


@contextlib.contextmanager
def _x_errors(doing: str):
    try:
        yield
    except (xerror.DisplayError, xerror.ConnectionClosedError, xerror.XError, OSError) as exc:
        raise SandboxError(f"following the pointer failed while {doing}: {exc}") from exc


class PointerWatch:
    """Follows the pointer of one X display; use it from one thread only."""

    def __init__(self, display: str) -> None:
        self._x: xdisplay.Display | None = None
        try:
            with _x_errors(f"connecting to X display {display}"):
                self._x = xdisplay.Display(display)
                for name in (xinput.extname, xfixes.extname):
                    if not self._x.has_extension(name):
                        raise SandboxError(f"X display {display} lacks the {name} extension")
                self._x.xinput_query_version()
                self._x.xfixes_query_version()
                root = self._x.screen().root
                root.xinput_select_events([(xinput.AllMasterDevices, xinput.RawMotionMask)])
                self._x.xfixes_select_cursor_input(root, xfixes.XFixesDisplayCursorNotifyMask)
                self._xinput = self._x.query_extension(xinput.extname).major_opcode
                self._cursor_notify = self._x.extension_event.DisplayCursorNotify[0]
                self._x.sync()
        except BaseException:
            self.close()
            raise
        self._image: CursorImage | None = None
        self._shape_changed = True
        self._moved = True

    def fileno(self) -> int:
        """The X connection to wait on: readable when the pointer may have changed."""
        assert self._x is not None
        return self._x.fileno()

    def take_events(self) -> bool:
        """Whether the pointer moved or changed shape since the last `read()`; reads what
        the server sent so far."""
        assert self._x is not None
        with _x_errors("reading pointer events"):
            while self._x.pending_events():
                event = self._x.next_event()
                kind = event.type & 0x7F
                if kind == _GENERIC_EVENT and getattr(event, "extension", None) == self._xinput:
                    self._moved = True
                elif kind == self._cursor_notify:
                    self._shape_changed = True
        return self._moved or self._shape_changed

    def read(self) -> Pointer:
        """The pointer now: one round trip, two when its shape changed since last time."""
        assert self._x is not None
        self._moved = False
        if self._shape_changed or self._image is None:
            self._shape_changed = False
            pointer = read_pointer(self._x)
            self._image = pointer.image
            return pointer
        with _x_errors("asking where the pointer is"):
            where = self._x.screen().root.query_pointer()
        return Pointer(where.root_x, where.root_y, self._image)

    def close(self) -> None:
        """Drop the X connection; idempotent, quiet when the server is already gone."""
        x, self._x = self._x, None
        if x is not None:
            with contextlib.suppress(xerror.ConnectionClosedError, OSError):
                x.close()
