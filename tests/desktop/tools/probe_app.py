"""The input probe: a GTK 3 window inside a desktop that writes down every input it gets.

Runs inside a desktop under Debian's interpreter (PyGObject), copied there by
`tests.desktop.tools.probe`; it imports nothing of the tests. `python3 probe_app.py LOG`
shows a maximized window titled `cubicle-probe` and appends one JSON line to LOG per event:

    {"e": "ready", "x": 0, "y": 53, "w": 1280, "h": 747}   where its pad is, once focused
    {"e": "area", "x": 0, "y": 53, "w": 1280, "h": 747}    where it is after a move or resize
    {"e": "press", "button": 1, "x": 300, "y": 200, "mods": ["ctrl"]}   screen pixels
    {"e": "release", "button": 1, "x": 300, "y": 200, "mods": ["ctrl"]}
    {"e": "key", "keysym": "a", "char": "A", "mods": ["shift"]}   a key press: the unshifted
                                               name, the character it types
    {"e": "key_up", "keysym": "a", "char": "A", "mods": ["shift"]}
    {"e": "scroll", "direction": "down", "x": 640, "y": 400, "mods": [], "view_y": 3}
    {"e": "motion", "x": 640, "y": 400, "buttons": [1]}

A scroll moves the pad's view by a line per wheel click, as an editor's would: `view_x` and
`view_y` are its offset after the click. Every line also has `t`, the monotonic clock's
seconds when the event was handled.
"""

from __future__ import annotations

import json
import sys
import time

_MODS = ((1 << 0, "shift"), (1 << 2, "ctrl"), (1 << 3, "alt"), (1 << 26, "super"))
_BUTTONS = ((1 << 8, 1), (1 << 9, 2), (1 << 10, 3))
_SCROLL = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}


def main() -> None:
    import gi

    gi.require_version("Gtk", "3.0")
    gi.require_version("Gdk", "3.0")
    from gi.repository import Gdk, GLib, Gtk

    out = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 - lives as long as the program
    view = [0, 0]

    def log(**fields: object) -> None:
        out.write(json.dumps({**fields, "t": round(time.monotonic(), 3)}) + "\n")

    def mods(state: int) -> list[str]:
        return [name for mask, name in _MODS if state & mask]

    win = Gtk.Window(title="cubicle-probe")
    pad = Gtk.EventBox()
    pad.add_events(
        Gdk.EventMask.BUTTON_PRESS_MASK
        | Gdk.EventMask.BUTTON_RELEASE_MASK
        | Gdk.EventMask.POINTER_MOTION_MASK
        | Gdk.EventMask.SCROLL_MASK
    )
    win.add(pad)

    def on_button(_: object, event: Gdk.EventButton) -> bool:
        if event.type not in (Gdk.EventType.BUTTON_PRESS, Gdk.EventType.BUTTON_RELEASE):
            return False  # GTK's synthetic double- and triple-press events
        kind = "press" if event.type == Gdk.EventType.BUTTON_PRESS else "release"
        x, y = round(event.x_root), round(event.y_root)
        log(e=kind, button=event.button, x=x, y=y, mods=mods(int(event.state)))
        return True

    def on_scroll(_: object, event: Gdk.EventScroll) -> bool:
        direction = event.direction.value_nick
        dx, dy = _SCROLL.get(direction, (0, 0))
        view[0] += dx
        view[1] += dy
        x, y = round(event.x_root), round(event.y_root)
        state = mods(int(event.state))
        log(e="scroll", direction=direction, x=x, y=y, mods=state, view_x=view[0], view_y=view[1])
        return True

    def on_motion(_: object, event: Gdk.EventMotion) -> bool:
        held = [number for mask, number in _BUTTONS if int(event.state) & mask]
        log(e="motion", x=round(event.x_root), y=round(event.y_root), buttons=held)
        return True

    def on_key(_: object, event: Gdk.EventKey) -> bool:
        name = Gdk.keyval_name(Gdk.keyval_to_lower(event.keyval))
        kind = "key" if event.type == Gdk.EventType.KEY_PRESS else "key_up"
        code = Gdk.keyval_to_unicode(event.keyval)
        char = chr(code) if code >= 0x20 else ""
        log(e=kind, keysym=name, char=char, mods=mods(int(event.state)))
        return True

    def area(kind: str) -> None:
        if pad.get_window() is not None:
            origin = pad.get_window().get_origin()
            alloc = pad.get_allocation()
            log(e=kind, x=origin[1], y=origin[2], w=alloc.width, h=alloc.height)

    def on_active(*_: object) -> None:
        if win.is_active():
            area("ready")

    pad.connect("button-press-event", on_button)
    pad.connect("button-release-event", on_button)
    pad.connect("scroll-event", on_scroll)
    pad.connect("motion-notify-event", on_motion)
    win.connect("key-press-event", on_key)
    win.connect("key-release-event", on_key)
    pad.connect("size-allocate", lambda *_: GLib.idle_add(lambda: area("area")))
    win.connect("notify::is-active", on_active)
    win.connect("destroy", Gtk.main_quit)
    win.maximize()
    win.show_all()
    for widget in (win, pad):
        widget.get_window().set_event_compression(False)  # every motion event
    Gtk.main()


if __name__ == "__main__":
    main()
