"""Keyboard and mouse input through the XTEST extension, in-process.

`InputController` turns actions into fake X input events on one open display. Coordinates
are screen pixels from the top-left corner; `dispatch` checks them against `current_size()`
before any event goes out. Moves, clicks, button presses and scrolls return once their
events are sent: the server reads them before anything sent later on the same connection,
and `sync()` waits until it has. Not waiting saves a round trip per click that
costs most of a millisecond here, as the server first serves the clients the click wakes.
Drags and keyboard methods end with a round trip (typing may change the keymap).

Any Unicode text can be typed whatever the keyboard layout: characters the keymap has are
typed with their keycode (plus Shift for the second level); the others are put on spare
keycodes (keycodes without keysyms) a batch at a time. A client translates a key press with
the keymap it fetches when it reads the event, so a spare keycode gets a new keysym only
once the focused client has read the key events typed with the old one: it is asked for a
`_NET_WM_PING` answer, which it gives after reading every event queued before the ping.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from Xlib import X
from Xlib.display import Display
from Xlib.error import CatchError, XError
from Xlib.ext import xtest
from Xlib.protocol.event import ClientMessage

from cubicle.guest.keys import char_keysym, parse_combo, resolve_key
from cubicle.protocol.errors import InvalidRequest, SandboxError

_BUTTONS: dict[str, int] = {"left": 1, "middle": 2, "right": 3, "back": 8, "forward": 9}
_WHEEL_UP, _WHEEL_DOWN, _WHEEL_LEFT, _WHEEL_RIGHT = 4, 5, 6, 7

_REMAP_SETTLE = 0.005
"""Seconds to wait after changing the keymap before typing with it."""
_PING_TIMEOUT = 2.0
"""Seconds to wait for the focused client to answer a ping before giving up on it."""
_REUSE_AFTER = 0.05
"""Seconds a spare keycode rests before reuse when the focused client cannot be pinged."""
_DRAG_STEP_PIXELS = 20
"""Largest distance in screen pixels between two motion events of a drag."""
_DRAG_MAX_STEPS = 10
"""Most motion events between two consecutive points of a drag path."""
_DRAG_STEP_DELAY = 0.008
"""Seconds between motion events of a drag, so applications see a moving pointer."""


@dataclass
class _Keymap:
    """One reading of the server's keyboard and modifier mappings."""

    placed: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Keysym → (keycode, level) of keys typed as they are; level 1 needs Shift."""
    spare: list[int] = field(default_factory=list)
    """Keycodes free for temporary keysyms: empty ones and ones this controller filled."""
    shift: list[int] = field(default_factory=list)
    """Keycodes of the Shift modifier."""
    lock: list[int] = field(default_factory=list)
    """Keycodes of the Lock modifier (Caps Lock)."""


class InputController:
    """Fake keyboard and pointer input on one X display.

    Thread-confined: call every method from the thread that owns `display`. `close()` closes
    the private connection used to ping clients; `display` stays open.
    """

    def __init__(self, display: Display) -> None:
        if not display.has_extension("XTEST"):
            raise SandboxError("the X server lacks the XTEST extension: start it with XTEST")
        self._display = display
        self._root = display.screen().root
        self._held_keys: dict[int, None] = {}
        """Keycodes this controller holds down, in press order."""
        self._held_buttons: dict[int, None] = {}
        self._key_downs: dict[int, tuple[int, int | None]] = {}
        """For `key_down`: keysym → (keycode, Shift keycode pressed along with it)."""
        self._filled: dict[int, int] = {}
        """Spare keycode → the keysym this controller put on it."""
        self._used_at: dict[int, float] = {}
        """Spare keycode → `time.monotonic()` seconds of its last key event."""
        self._pinger: Display | None = None
        self.unconfirmed = False
        """Whether events went out since the last `sync()` without a round trip after them."""
        self._pings = 0
        # The screen size, for the off-screen check without a round trip per action: read
        # once, then kept current by the root window's ConfigureNotify (RandR resizes).
        self._root.change_attributes(event_mask=X.StructureNotifyMask)
        self._size = self.screen_size()

    def close(self) -> None:
        """Close the private ping connection, if one was opened. Idempotent."""
        if self._pinger is not None:
            self._pinger.close()
            self._pinger = None

    # pointer

    def move(self, x: int, y: int) -> None:
        """Move the pointer to (x, y) in screen pixels."""
        self._motion(x, y)
        self._send()

    def button_down(self, button: str) -> None:
        """Press and hold `button` ("left", "right" or "middle") where the pointer is."""
        self._button(_button_number(button), True)
        self._send()

    def button_up(self, button: str) -> None:
        """Release `button` ("left", "right" or "middle") where the pointer is."""
        self._button(_button_number(button), False)
        self._send()

    def click(
        self,
        x: int | None = None,
        y: int | None = None,
        button: str = "left",
        count: int = 1,
        modifiers: list[str] | None = None,
    ) -> None:
        """Click `count` times at (x, y) in screen pixels, or where the pointer is.

        `modifiers` are key names held during the clicks, e.g. `["ctrl"]`. The clicks follow
        each other at once, well within any toolkit's double-click time.
        """
        number = _button_number(button)
        if count < 1:
            raise InvalidRequest(f"click count {count} must be 1 or more")
        point = _point(x, y)
        keysyms = [resolve_key(name) for name in modifiers or []]
        codes = [code for code, _ in self._place(keysyms)]
        if point is not None:
            self._motion(*point)
        pressed = [code for code in codes if code not in self._held_keys]
        for code in pressed:
            self._key(code, True)
        for _ in range(count):
            self._button(number, True)
            self._button(number, False)
        for code in reversed(pressed):
            self._key(code, False)
        self._send()
        self._mark_used(codes)

    def drag(self, path: list[tuple[int, int]], button: str = "left") -> None:
        """Press `button` at the first point, move through the others, release at the last.

        Points are screen pixels. Between two points the pointer moves in steps of at most
        `_DRAG_STEP_PIXELS` (up to `_DRAG_MAX_STEPS`), so applications see motion events.
        """
        number = _button_number(button)
        if not path:
            raise InvalidRequest("a drag needs at least one point")
        self._motion(*path[0])
        self._button(number, True)
        self._display.sync()
        for (x0, y0), (x1, y1) in pairwise(path):
            distance = max(abs(x1 - x0), abs(y1 - y0))
            steps = min(_DRAG_MAX_STEPS, max(1, -(-distance // _DRAG_STEP_PIXELS)))
            for step in range(1, steps + 1):
                time.sleep(_DRAG_STEP_DELAY)
                self._motion(x0 + (x1 - x0) * step // steps, y0 + (y1 - y0) * step // steps)
                self._display.flush()
        time.sleep(_DRAG_STEP_DELAY)
        self._button(number, False)
        self._display.sync()

    def scroll(self, x: int | None, y: int | None, dx: int = 0, dy: int = 0) -> None:
        """Turn the wheel `dy` clicks down (negative: up) and `dx` right (negative: left).

        The pointer first moves to (x, y) in screen pixels when they are given.
        """
        point = _point(x, y)
        if point is not None:
            self._motion(*point)
        vertical = _WHEEL_DOWN if dy > 0 else _WHEEL_UP
        horizontal = _WHEEL_RIGHT if dx > 0 else _WHEEL_LEFT
        for number, clicks in ((vertical, abs(dy)), (horizontal, abs(dx))):
            for _ in range(clicks):
                self._button(number, True)
                self._button(number, False)
        self._send()

    def sync(self) -> None:
        """Wait until the server has processed every event sent so far."""
        self._display.sync()
        self.unconfirmed = False

    def _send(self) -> None:
        """Send the events queued so far without waiting for the server to process them."""
        self._display.flush()
        self.unconfirmed = True

    def cursor_position(self) -> tuple[int, int]:
        """Where the pointer is, in screen pixels."""
        pointer = self._root.query_pointer()
        return pointer.root_x, pointer.root_y

    def screen_size(self) -> tuple[int, int]:
        """Width and height of the screen in pixels, as the server has it now."""
        geometry = self._root.get_geometry()
        return geometry.width, geometry.height

    # keyboard

    def type_text(self, text: str) -> None:
        """Type `text` exactly: any Unicode; newlines press Return and tabs press Tab.

        Keys held with `key_down` (e.g. Shift) stay held and apply to what is typed.
        """
        keysyms = [char_keysym(char) for char in text.replace("\r\n", "\n")]
        if not keysyms:
            return
        keymap = self._read_keymap()
        # Caps Lock would change the case of letters (even of temporary keysyms): switch it
        # off while typing, then back on.
        lock = keymap.lock[:1] if self._root.query_pointer().mask & X.LockMask else []
        for code in lock:
            self._key(code, True)
            self._key(code, False)
        try:
            self._type_chunks(keysyms, keymap)
        finally:
            for code in lock:
                self._key(code, True)
                self._key(code, False)
            self._display.sync()

    def press(self, combo: str, repeat: int = 1) -> None:
        """Press a key or combination such as `ctrl+shift+t` `repeat` times.

        Keys before the last are held in written order, the last is tapped, then the held
        ones are released in reverse. A keysym on the second level of its key gets Shift
        (`ctrl++` is Ctrl+Shift+= on a US layout). Names are checked before any event is sent.
        """
        if repeat < 1:
            raise InvalidRequest(f"repeat {repeat} must be 1 or more")
        keysyms = parse_combo(combo)
        keymap = self._read_keymap()
        placed = self._place(keysyms, keymap)
        codes = [code for code, _ in placed]
        holds = [code for code in codes[:-1] if code not in self._held_keys]
        if any(level == 1 for _, level in placed) and not self._shift_held(keymap, codes):
            holds.insert(0, keymap.shift[0])
        for _ in range(repeat):
            for code in holds:
                self._key(code, True)
            self._key(codes[-1], True)
            self._key(codes[-1], False)
            for code in reversed(holds):
                self._key(code, False)
        self._display.sync()
        self._mark_used(codes)

    def key_down(self, name: str) -> None:
        """Press and hold the key `name` (with Shift when its keysym is on the second level)."""
        keysym = resolve_key(name)
        keymap = self._read_keymap()
        ((code, level),) = self._place([keysym], keymap)
        shift = None
        if level == 1 and not self._shift_held(keymap):
            shift = keymap.shift[0]
            self._key(shift, True)
        self._key(code, True)
        self._key_downs[keysym] = (code, shift)
        self._display.sync()

    def key_up(self, name: str) -> None:
        """Release the key `name`, and the Shift that `key_down` pressed along with it."""
        keysym = resolve_key(name)
        code, shift = self._key_downs.pop(keysym, (None, None))
        if code is None:
            code = self._read_keymap().placed.get(keysym, (None, 0))[0]
        if code is not None:
            self._key(code, False)
            self._mark_used([code])
        if shift is not None:
            self._key(shift, False)
        self._display.sync()

    def release_all(self) -> None:
        """Release every key and button this controller holds down."""
        keys = list(self._held_keys)
        for code in reversed(keys):
            self._key(code, False)
        for number in reversed(list(self._held_buttons)):
            self._button(number, False)
        self._key_downs.clear()
        self._display.sync()
        self._mark_used(keys)

    # events

    def _motion(self, x: int, y: int) -> None:
        xtest.fake_input(self._display, X.MotionNotify, x=x, y=y)

    def _button(self, number: int, down: bool) -> None:
        xtest.fake_input(self._display, X.ButtonPress if down else X.ButtonRelease, number)
        if down:
            self._held_buttons[number] = None
        else:
            self._held_buttons.pop(number, None)

    def _key(self, code: int, down: bool) -> None:
        xtest.fake_input(self._display, X.KeyPress if down else X.KeyRelease, code)
        if down:
            self._held_keys[code] = None
        else:
            self._held_keys.pop(code, None)

    def current_size(self) -> tuple[int, int]:
        """The screen size now, in pixels, from the root's ConfigureNotify events read so far
        (no round trip): the size every point of an action is checked against."""
        while self._display.pending_events():
            event = self._display.next_event()
            if event.type == X.ConfigureNotify and event.window.id == self._root.id:
                self._size = (event.width, event.height)
        return self._size

    # keymap

    def _read_keymap(self) -> _Keymap:
        """Read the keyboard and modifier mappings (two round trips)."""
        info = self._display.display.info
        first = info.min_keycode
        rows = self._display.get_keyboard_mapping(first, info.max_keycode - first + 1)
        modifiers = self._display.get_modifier_mapping()
        keymap = _Keymap(
            shift=[code for code in modifiers[X.ShiftMapIndex] if code],
            lock=[code for code in modifiers[X.LockMapIndex] if code],
        )
        if not keymap.shift:
            raise SandboxError("the keyboard has no Shift modifier key: restore the keymap")
        regular: list[tuple[int, list[int]]] = []
        for code, row in enumerate(rows, start=first):
            symbols = {keysym for keysym in row if keysym}
            filled = self._filled.get(code)
            if symbols and symbols != {filled}:
                self._filled.pop(code, None)  # someone else changed it: not ours any more
                regular.append((code, list(row[:2])))
            elif filled is not None and code in self._held_keys:
                keymap.placed[filled] = (code, 0)  # held since key_down: not free to refill
            else:
                if not symbols:
                    self._filled.pop(code, None)
                keymap.spare.append(code)
        for level in (0, 1):
            for code, row in regular:
                if level < len(row) and row[level]:
                    keymap.placed.setdefault(row[level], (code, level))
        return keymap

    def _place(self, keysyms: list[int], keymap: _Keymap | None = None) -> list[tuple[int, int]]:
        """(keycode, level) for each keysym, filling spare keycodes for the missing ones."""
        if not keysyms:
            return []
        keymap = keymap or self._read_keymap()
        missing = list(dict.fromkeys(k for k in keysyms if k not in keymap.placed))
        filled = self._fill_spare(missing, keymap)
        return [(filled[k], 0) if k in filled else keymap.placed[k] for k in keysyms]

    def _fill_spare(self, keysyms: list[int], keymap: _Keymap) -> dict[int, int]:
        """Put `keysyms` on spare keycodes in one batch; return keysym → keycode.

        Keysyms already on a spare keycode stay there; the others go to empty or least
        recently used spare keycodes, once the focused client has read their last key events.
        """
        if len(keysyms) > len(keymap.spare):
            raise SandboxError(
                f"the keymap has {len(keymap.spare)} spare keycodes for {len(keysyms)} keys "
                "it lacks: press fewer unusual keys at once"
            )
        current = {self._filled[code]: code for code in keymap.spare if code in self._filled}
        chosen = {keysym: current[keysym] for keysym in keysyms if keysym in current}
        free = sorted(
            (code for code in keymap.spare if code not in chosen.values()),
            key=lambda code: self._used_at.get(code, 0.0),
        )
        changes = dict(zip(free, (k for k in keysyms if k not in chosen), strict=False))
        if not changes:
            return chosen
        last_used = max(self._used_at.get(code, 0.0) for code in changes)
        if last_used and not self._await_focused_client():
            time.sleep(max(0.0, last_used + _REUSE_AFTER - time.monotonic()))
        catch = CatchError(XError)
        runs: list[list[int]] = []  # one request per run of consecutive keycodes
        for code in sorted(changes):
            if runs and code == runs[-1][-1] + 1:
                runs[-1].append(code)
            else:
                runs.append([code])
        for run in runs:
            mapping = [(changes[code], changes[code]) for code in run]
            self._display.change_keyboard_mapping(run[0], mapping, onerror=catch)
        self._display.sync()
        if catch.get_error():
            raise SandboxError(f"the X server refused a keymap change: {catch.get_error()}")
        self._filled.update(changes)
        time.sleep(_REMAP_SETTLE)
        return chosen | {keysym: code for code, keysym in changes.items()}

    def _type_chunks(self, keysyms: list[int], keymap: _Keymap) -> None:
        """Type in chunks whose keysyms missing from the keymap fit on the spare keycodes."""
        start = 0
        while start < len(keysyms):
            end, missing = start, []
            while end < len(keysyms):
                keysym = keysyms[end]
                if keysym not in keymap.placed and keysym not in missing:
                    if len(missing) == len(keymap.spare) and missing:
                        break
                    missing.append(keysym)
                end += 1
            filled = self._fill_spare(missing, keymap)
            self._type_chunk(keysyms[start:end], keymap, filled)
            start = end

    def _type_chunk(self, keysyms: list[int], keymap: _Keymap, filled: dict[int, int]) -> None:
        """Tap the key of each keysym, holding Shift for second-level ones."""
        user_shift = self._shift_held(keymap)
        shifted = False
        for keysym in keysyms:
            code, level = (filled[keysym], 0) if keysym in filled else keymap.placed[keysym]
            if not user_shift and shifted != (level == 1):
                shifted = level == 1
                self._key(keymap.shift[0], shifted)
            self._key(code, True)
            self._key(code, False)
        if shifted:
            self._key(keymap.shift[0], False)
        self._display.sync()
        self._mark_used(filled.values())

    def _shift_held(self, keymap: _Keymap, also: Iterable[int] = ()) -> bool:
        return bool(set(keymap.shift) & (set(self._held_keys) | set(also)))

    def _mark_used(self, codes: Iterable[int]) -> None:
        now = time.monotonic()
        for code in codes:
            if code in self._filled:
                self._used_at[code] = now

    # client sync

    def _await_focused_client(self) -> bool:
        """Ping the client with the keyboard focus; True once it answered.

        A client reads its events in order, so when it answers `_NET_WM_PING` it has read,
        and translated, every key event sent before. False when the focused window does not
        take pings or has not answered within `_PING_TIMEOUT` seconds.
        """
        if self._pinger is None:
            self._pinger = Display(self._display.get_display_name())
        pinger = self._pinger
        root = pinger.screen().root
        protocols, ping = pinger.intern_atom("WM_PROTOCOLS"), pinger.intern_atom("_NET_WM_PING")
        target = pinger.get_input_focus().focus
        try:
            while not isinstance(target, int) and target.id != root.id:
                if ping in target.get_wm_protocols():
                    break
                target = target.query_tree().parent
            else:
                return False
        except XError:
            return False  # the focused window went away while we looked
        self._pings += 1
        root.change_attributes(event_mask=X.SubstructureNotifyMask)  # answers go to the root
        message = [ping, self._pings, target.id, 0, 0]
        event = ClientMessage(window=target, client_type=protocols, data=(32, message))
        catch = CatchError(XError)
        target.send_event(event, onerror=catch)
        pinger.sync()
        deadline = time.monotonic() + _PING_TIMEOUT
        answered = False
        while True:
            while pinger.pending_events():
                event = pinger.next_event()
                answered |= (
                    event.type == X.ClientMessage
                    and event.client_type == protocols
                    and list(event.data[1][:2]) == message[:2]
                )
            left = deadline - time.monotonic()
            if answered or left <= 0 or catch.get_error():
                break
            select.select([pinger], [], [], left)
        root.change_attributes(event_mask=X.NoEventMask)
        pinger.sync()
        while pinger.pending_events():
            pinger.next_event()
        return answered


def _button_number(button: str) -> int:
    if button not in _BUTTONS:
        raise InvalidRequest(f"unknown button {button!r}: use left, right, middle, back or forward")
    return _BUTTONS[button]


def _point(x: int | None, y: int | None) -> tuple[int, int] | None:
    if (x is None) != (y is None):
        raise InvalidRequest("give both x and y, or neither to act where the pointer is")
    return None if x is None or y is None else (x, y)
