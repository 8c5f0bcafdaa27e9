"""XTest input on a real Xvfb, checked by what a real GTK 3 window receives.

A small GTK program (run with the system interpreter, which has PyGObject) shows an entry, a
text view and an event pad, and reports as JSON lines on stdout what it receives: focus,
button, motion and scroll events with root coordinates, key presses, and on request the text
of its widgets.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from Xlib import X
from Xlib.display import Display

from cubicle.guest.dispatch import validate
from cubicle.guest.input import InputController
from cubicle.protocol.actions import Click, Drag, Move
from cubicle.protocol.errors import InvalidRequest, OffScreen, UnknownKey

from .conftest import XSession

PROBE = r"""
import json, os, sys
import gi
gi.require_version("Gtk", "3.0")
gi.require_version("Gdk", "3.0")
from gi.repository import Gdk, GLib, Gtk

def emit(**fields):
    print(json.dumps(fields), flush=True)

win = Gtk.Window(title="cubicle input probe")
win.set_default_size(600, 560)
win.move(200, 100)
box = Gtk.Box(orientation=Gtk.Orientation.VERTICAL, spacing=8)
entry = Gtk.Entry()
view = Gtk.TextView()
view.set_size_request(-1, 150)
pad = Gtk.EventBox()
pad.set_size_request(-1, 300)
pad.add_events(
    Gdk.EventMask.BUTTON_PRESS_MASK | Gdk.EventMask.BUTTON_RELEASE_MASK
    | Gdk.EventMask.POINTER_MOTION_MASK | Gdk.EventMask.SCROLL_MASK
)
for widget in (entry, view, pad):
    box.pack_start(widget, False, False, 0)
win.add(box)
widgets = {"entry": entry, "view": view, "pad": pad}

def rects():
    ox, oy = win.get_window().get_origin()[1:]
    found = {}
    for name, widget in widgets.items():
        x, y = widget.translate_coordinates(win, 0, 0)
        alloc = widget.get_allocation()
        found[name] = [ox + x, oy + y, alloc.width, alloc.height]
    return found

def on_button(widget, event):
    emit(ev="button", type=event.type.value_name, button=event.button,
         x=round(event.x_root), y=round(event.y_root), state=int(event.state))
    return False

def on_motion(widget, event):
    emit(ev="motion", x=round(event.x_root), y=round(event.y_root), state=int(event.state))
    return False

def on_scroll(widget, event):
    emit(ev="scroll", direction=event.direction.value_nick,
         x=round(event.x_root), y=round(event.y_root))
    return True

def on_key(widget, event):
    emit(ev="key", key=Gdk.keyval_name(event.keyval), state=int(event.state))
    return False

pad.connect("button-press-event", on_button)
pad.connect("button-release-event", on_button)
pad.connect("motion-notify-event", on_motion)
pad.connect("scroll-event", on_scroll)
win.connect("key-press-event", on_key)
for name, widget in (("entry", entry), ("view", view)):
    widget.connect("focus-in-event", lambda w, e, name=name: emit(ev="focus", widget=name))

def on_active(*_):
    if win.is_active():
        emit(ev="ready", rects=rects())

win.connect("notify::is-active", on_active)
win.connect("destroy", Gtk.main_quit)

pending = b""

def on_stdin(fd, condition):
    global pending
    chunk = os.read(fd, 65536)
    if not chunk:
        Gtk.main_quit()
        return False
    pending += chunk
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        words = line.decode().split()
        if words[0] == "text":
            buffer = view.get_buffer()
            emit(ev="text", id=words[1], entry=entry.get_text(),
                 view=buffer.get_text(buffer.get_start_iter(), buffer.get_end_iter(), True))
        elif words[0] == "clear":
            entry.set_text("")
            view.get_buffer().set_text("")
            widgets[words[2]].grab_focus()
            emit(ev="cleared", id=words[1])
    return True

GLib.io_add_watch(0, GLib.PRIORITY_DEFAULT, GLib.IO_IN | GLib.IO_HUP, on_stdin)
win.show_all()
for widget in (win, pad):
    widget.get_window().set_event_compression(False)  # report every motion event
Gtk.main()
"""

GDK_SHIFT_MASK, GDK_CONTROL_MASK, GDK_BUTTON1_MASK = 1 << 0, 1 << 2, 1 << 8
TIMEOUT = 10.0
"""Seconds to wait for the probe to see something before failing."""


class Probe:
    """The running GTK program and the events it reported."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.events: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._requests = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.events.append(json.loads(line))
                self._changed.notify_all()

    def mark(self) -> int:
        with self._changed:
            return len(self.events)

    def since(self, mark: int, ev: str) -> list[dict[str, Any]]:
        with self._changed:
            return [event for event in self.events[mark:] if event["ev"] == ev]

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], since: int = 0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT
        with self._changed:
            while True:
                for event in self.events[since:]:
                    if predicate(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"probe never reported it; saw {self.events[since:]}")
                self._changed.wait(left)

    def _request(self, *words: str) -> dict[str, Any]:
        self._requests += 1
        request = str(self._requests)
        mark = self.mark()
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join([words[0], request, *words[1:]]) + "\n")
        self.proc.stdin.flush()
        return self.wait_for(lambda event: event.get("id") == request, mark)

    def clear(self, focus: str) -> None:
        """Empty both text widgets and focus `focus` ("entry" or "view")."""
        self._request("clear", focus)

    def text(self, widget: str) -> str:
        return self._request("text")[widget]

    def wait_text(self, widget: str, expected: str) -> None:
        """Poll the widget's text until it equals `expected`, failing after `TIMEOUT`."""
        deadline = time.monotonic() + TIMEOUT
        while (text := self.text(widget)) != expected and time.monotonic() < deadline:
            time.sleep(0.02)
        assert text == expected

    def center(self, widget: str, dx: int = 0, dy: int = 0) -> tuple[int, int]:
        x, y, width, height = self.rects[widget]
        return x + width // 2 + dx, y + height // 2 + dy

    @property
    def rects(self) -> dict[str, list[int]]:
        return self.wait_for(lambda event: event["ev"] == "ready")["rects"]


@pytest.fixture(scope="module")
def controller(display: Display) -> Iterator[InputController]:
    controller = InputController(display)
    yield controller
    controller.close()


@pytest.fixture(scope="module")
def probe(x_session: XSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probe]:
    folder = tmp_path_factory.mktemp("probe")
    script = folder / "probe.py"
    script.write_text(PROBE)
    with (folder / "stderr.txt").open("w") as stderr:
        proc = x_session.spawn(
            ["/usr/bin/python3", str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    probe = Probe(proc)
    try:
        probe.rects  # noqa: B018 - waits until the window is mapped and focused
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nstderr: {Path(stderr.name).read_text()}") from None
    yield probe
    proc.terminate()
    proc.wait(timeout=TIMEOUT)


@pytest.fixture(autouse=True)
def nothing_held(display: Display, controller: InputController) -> Iterator[None]:
    """After each test no key and no button may be left down on the X server."""
    yield
    keys_down = any(display.query_keymap())
    buttons_down = display.screen().root.query_pointer().mask & 0x1F00
    controller.release_all()  # so one failure does not spill into the next test
    assert not keys_down, "a key is still down"
    assert not buttons_down, "a button is still down"


def test_screen_size_and_cursor_position(controller: InputController) -> None:
    assert controller.screen_size() == (1280, 800)
    controller.move(123, 456)
    assert controller.cursor_position() == (123, 456)
    controller.move(1279, 799)
    assert controller.cursor_position() == (1279, 799)


def test_points_are_checked_against_the_live_screen_size(controller: InputController) -> None:
    assert controller.current_size() == (1280, 800)
    batch = [Move(x=10, y=20), Click(x=1280, y=0)]
    with pytest.raises(OffScreen, match="off the 1280×800 screen; x must be 0–1279"):
        validate(batch, *controller.current_size())
    with pytest.raises(OffScreen, match="action 0 \\(drag\\)"):
        validate([Drag(path=[(100, 100), (100, 900)])], *controller.current_size())
    with pytest.raises(OffScreen, match="give both x and y"):
        validate([Click(x=5)], *controller.current_size())
    with pytest.raises(UnknownKey):
        validate([Click(x=5, y=5, modifiers=["ctrl", "hyperx"])], *controller.current_size())
    validate([Move(x=1279, y=799)], *controller.current_size())


def test_bad_arguments_send_nothing(controller: InputController) -> None:
    controller.move(10, 20)
    with pytest.raises(InvalidRequest, match="use left, right, middle, back or forward"):
        controller.click(50, 50, button="side")
    with pytest.raises(InvalidRequest, match="both x and y"):
        controller.click(50, None)
    with pytest.raises(UnknownKey):
        controller.click(50, 50, modifiers=["ctrl", "hyperx"])
    assert controller.cursor_position() == (10, 20)


def test_types_ascii(controller: InputController, probe: Probe) -> None:
    probe.clear("entry")
    text = "Hello, World! 0123456789 ~`@#$%^&*()_+-=[]{}|\\;:'\",./<>? The END"
    controller.type_text(text)
    probe.wait_text("entry", text)


def test_types_unicode(controller: InputController, probe: Probe) -> None:
    probe.clear("view")
    controller.type_text("héllo ✓ 你好 Ω")
    probe.wait_text("view", "héllo ✓ 你好 Ω")


def test_types_long_text_reusing_spare_keycodes(controller: InputController, probe: Probe) -> None:
    greek = "".join(map(chr, range(0x3B1, 0x3CA)))  # α..ω, 25
    cyrillic = "".join(map(chr, range(0x430, 0x450)))  # а..я, 32
    cjk = "你好世界中文输入法测试汉字"  # 13
    symbols = "✓✗→←↑↓≤≥≠∞∑∏√∫≈±÷×€£¥©®™§¶•…"  # mixes Latin-1 with others
    arabic_hebrew = "مرحباשלום"
    upper = greek.upper() + cyrillic.upper()[:10]
    words = [greek, "Mixed ASCII\t", cyrillic, "\n", cjk, symbols, upper, arabic_hebrew]
    text = " ".join(words) + "\n" + "".join(reversed(greek + cjk)) + " 😀 end"
    outside_latin1 = {char for char in text if ord(char) > 0xFF}
    assert len(outside_latin1) > 100
    probe.clear("view")
    controller.type_text(text)
    probe.wait_text("view", text)


def test_the_focused_gtk_client_answers_pings(controller: InputController, probe: Probe) -> None:
    """Spare keycodes are refilled after this round trip, not after a guessed delay."""
    probe.clear("view")
    assert controller._await_focused_client()


def test_calls_in_a_row_reuse_spare_keycodes_safely(
    controller: InputController, probe: Probe
) -> None:
    kana = "".join(map(chr, range(0x3042, 0x3062)))  # あ..ぢ, 32 characters
    hangul = "".join(map(chr, range(0xAC00, 0xAC40, 2)))  # 32 syllables
    probe.clear("view")
    for part in [kana, hangul, kana[::-1], "ok"]:
        controller.type_text(part)  # each call refills keycodes the previous one just used
    probe.wait_text("view", kana + hangul + kana[::-1] + "ok")


def test_ctrl_a_then_typing_replaces_text(controller: InputController, probe: Probe) -> None:
    probe.clear("entry")
    controller.type_text("old text")
    probe.wait_text("entry", "old text")
    controller.press("ctrl+a")
    controller.type_text("new")
    probe.wait_text("entry", "new")


def test_press_repeat_and_keys_outside_the_keymap(
    controller: InputController, probe: Probe
) -> None:
    probe.clear("entry")
    controller.type_text("abcd")
    controller.press("backspace", repeat=2)
    controller.press("ö")  # not on a US keymap: goes through a spare keycode
    controller.press("plus")  # second level of the = key: needs Shift
    probe.wait_text("entry", "abö+")


def test_bad_combo_sends_nothing(controller: InputController, probe: Probe) -> None:
    probe.clear("entry")
    controller.type_text("keep")
    probe.wait_text("entry", "keep")
    mark = probe.mark()
    with pytest.raises(UnknownKey, match=re.escape("unknown key 'entr' in 'ctrl+entr'")):
        controller.press("ctrl+entr")
    with pytest.raises(UnknownKey, match="U\\+0007"):
        controller.type_text("x\a")
    controller.type_text(".")
    probe.wait_text("entry", "keep.")
    assert [event["key"] for event in probe.since(mark, "key")] == ["period"]


def test_key_down_shift_changes_typed_case(controller: InputController, probe: Probe) -> None:
    probe.clear("entry")
    controller.key_down("shift")
    controller.type_text("abc")
    controller.key_up("shift")
    controller.type_text("d")
    probe.wait_text("entry", "ABCd")


def test_caps_lock_does_not_change_typed_text(
    controller: InputController, probe: Probe, display: Display
) -> None:
    probe.clear("entry")
    controller.press("capslock")
    try:
        controller.type_text("Hello ωΩ é")
        probe.wait_text("entry", "Hello ωΩ é")
        assert display.screen().root.query_pointer().mask & X.LockMask  # still on
        controller.press("a")  # a key press, unlike typing, follows Caps Lock
        probe.wait_text("entry", "Hello ωΩ éA")
    finally:
        controller.press("capslock")
    assert not display.screen().root.query_pointer().mask & X.LockMask


def test_click_at_coordinates(controller: InputController, probe: Probe) -> None:
    x, y = probe.center("pad", -200, -100)
    mark = probe.mark()
    controller.click(x, y)
    release = probe.wait_for(lambda e: e.get("type") == "GDK_BUTTON_RELEASE", mark)
    assert probe.since(mark, "button") == [
        {"ev": "button", "type": "GDK_BUTTON_PRESS", "button": 1, "x": x, "y": y, "state": 0},
        release,
    ]
    assert (release["button"], release["x"], release["y"]) == (1, x, y)


PRESS, DOUBLE, TRIPLE = "GDK_BUTTON_PRESS", "GDK_2BUTTON_PRESS", "GDK_3BUTTON_PRESS"


@pytest.mark.parametrize(
    ("count", "dx", "presses"),
    [
        # GTK reports every press, then the synthesized double/triple one after it
        (2, -100, [PRESS, PRESS, DOUBLE]),
        (3, 0, [PRESS, PRESS, DOUBLE, PRESS, TRIPLE]),
    ],
)
def test_double_and_triple_click(
    controller: InputController, probe: Probe, count: int, dx: int, presses: list[str]
) -> None:
    x, y = probe.center("pad", dx, -60)
    mark = probe.mark()
    controller.click(x, y, count=count)
    probe.wait_for(lambda e: e.get("type") == presses[-1], mark)
    probe.wait_for(lambda e: len(_releases(probe, mark)) == count, mark)
    events = probe.since(mark, "button")
    assert [e["type"] for e in events if e["type"] != "GDK_BUTTON_RELEASE"] == presses
    assert {(e["button"], e["x"], e["y"]) for e in events} == {(1, x, y)}


def _releases(probe: Probe, mark: int) -> list[dict[str, Any]]:
    return [e for e in probe.since(mark, "button") if e["type"] == "GDK_BUTTON_RELEASE"]


@pytest.mark.parametrize(("button", "number", "dx"), [("right", 3, 100), ("middle", 2, 200)])
def test_right_and_middle_buttons(
    controller: InputController, probe: Probe, button: str, number: int, dx: int
) -> None:
    x, y = probe.center("pad", dx, -60)
    mark = probe.mark()
    controller.click(x, y, button=button)
    event = probe.wait_for(lambda e: e["ev"] == "button", mark)
    assert (event["type"], event["button"], event["x"], event["y"]) == (
        "GDK_BUTTON_PRESS",
        number,
        x,
        y,
    )
    probe.wait_for(lambda e: e.get("type") == "GDK_BUTTON_RELEASE", mark)


def test_click_with_modifiers_held(controller: InputController, probe: Probe) -> None:
    x, y = probe.center("pad", -200, 0)
    mark = probe.mark()
    controller.click(x, y, modifiers=["ctrl", "shift"])
    press = probe.wait_for(lambda e: e["ev"] == "button", mark)
    assert press["state"] & GDK_CONTROL_MASK and press["state"] & GDK_SHIFT_MASK


def test_scroll_directions(controller: InputController, probe: Probe) -> None:
    x, y = probe.center("pad")
    for dx, dy, expected in [
        (0, 3, ["down"] * 3),
        (0, -2, ["up"] * 2),
        (2, 0, ["right"] * 2),
        (-1, 0, ["left"]),
    ]:
        mark = probe.mark()
        controller.scroll(x, y, dx=dx, dy=dy)
        deadline = time.monotonic() + TIMEOUT
        while len(probe.since(mark, "scroll")) < len(expected) and time.monotonic() < deadline:
            time.sleep(0.01)
        scrolls = probe.since(mark, "scroll")
        assert [e["direction"] for e in scrolls] == expected
        assert all((e["x"], e["y"]) == (x, y) for e in scrolls)


def test_drag_presses_moves_and_releases(controller: InputController, probe: Probe) -> None:
    start, middle = probe.center("pad", -250, -50), probe.center("pad", 0, 80)
    end = probe.center("pad", 250, -50)
    mark = probe.mark()
    controller.drag([start, middle, end])
    release = probe.wait_for(lambda e: e.get("type") == "GDK_BUTTON_RELEASE", mark)
    buttons = probe.since(mark, "button")
    assert [(e["type"], e["x"], e["y"]) for e in buttons] == [
        ("GDK_BUTTON_PRESS", *start),
        ("GDK_BUTTON_RELEASE", *end),
    ]
    assert release["button"] == 1
    motions = [e for e in probe.since(mark, "motion") if e["state"] & GDK_BUTTON1_MASK]
    assert len(motions) >= 10  # the probe turned off GTK's merging of motion events
    assert (motions[-1]["x"], motions[-1]["y"]) == end
    assert middle in [(e["x"], e["y"]) for e in motions]


def test_button_down_move_button_up(controller: InputController, probe: Probe) -> None:
    x, y = probe.center("pad", 0, 100)
    mark = probe.mark()
    controller.move(x, y)
    controller.button_down("left")
    controller.move(x + 30, y)
    controller.button_up("left")
    probe.wait_for(lambda e: e.get("type") == "GDK_BUTTON_RELEASE", mark)
    held = [e for e in probe.since(mark, "motion") if e["state"] & GDK_BUTTON1_MASK]
    assert (held[-1]["x"], held[-1]["y"]) == (x + 30, y)


def test_release_all(controller: InputController, probe: Probe, display: Display) -> None:
    probe.clear("entry")
    controller.key_down("shift")
    controller.key_down("ctrl")
    controller.move(*probe.center("pad", 150, 100))
    mark = probe.mark()
    controller.button_down("left")
    assert any(display.query_keymap())
    controller.release_all()
    probe.wait_for(lambda e: e.get("type") == "GDK_BUTTON_RELEASE", mark)
    probe.clear("entry")
    controller.type_text("z")
    probe.wait_text("entry", "z")
