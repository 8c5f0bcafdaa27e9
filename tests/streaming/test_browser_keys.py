"""Browser key events to desktop actions (pure mapping; the desktop side is tested live)."""

from __future__ import annotations

import pytest

from cubicle.guest.keys import parse_combo, resolve_key
from cubicle.protocol import actions as a
from cubicle.server.live.keys import NAMED, KeyboardState

pytestmark = pytest.mark.fast


def press(state: KeyboardState, key: str, code: str = "", **flags) -> list[a.Action]:
    return state.translate(key=key, code=code, down=True, **flags)


def release(state: KeyboardState, key: str, code: str = "", **flags) -> list[a.Action]:
    return state.translate(key=key, code=code, down=False, **flags)


@pytest.mark.parametrize(
    ("key", "xname"),
    [
        ("ArrowLeft", "Left"),
        ("ArrowRight", "Right"),
        ("ArrowUp", "Up"),
        ("ArrowDown", "Down"),
        ("Enter", "Return"),
        ("Backspace", "BackSpace"),
        ("Escape", "Escape"),
        ("Tab", "Tab"),
        ("PageUp", "Prior"),
        ("PageDown", "Next"),
        ("Home", "Home"),
        ("Delete", "Delete"),
        ("F1", "F1"),
        ("F12", "F12"),
    ],
)
def test_named_keys_are_tapped_by_their_x_name(key, xname):
    state = KeyboardState()
    assert press(state, key) == [a.Key(keys=xname)]
    assert release(state, key) == []


def test_every_named_key_is_a_name_the_desktop_knows():
    for xname in NAMED.values():
        resolve_key(xname)
        parse_combo(xname)


def test_characters_are_typed_as_the_browser_composed_them():
    state = KeyboardState()
    assert press(state, "a", "KeyA") == [a.Type(text="a")]
    assert press(state, "é", "Digit2") == [a.Type(text="é")]
    assert press(state, "€", "KeyE", altgr=True, ctrl=True, alt=True) == [a.Type(text="€")]
    assert press(state, " ", "Space") == [a.Type(text=" ")]
    assert press(state, "👍") == [a.Type(text="👍")]


def test_shift_is_held_for_clicks_and_lifted_around_text():
    state = KeyboardState()
    assert press(state, "Shift", "ShiftLeft", shift=True) == [a.KeyDown(key="Shift_L")]
    assert press(state, "A", "KeyA", shift=True) == [
        a.KeyUp(key="Shift_L"),
        a.Type(text="A"),
        a.KeyDown(key="Shift_L"),
    ]
    # A named key keeps the held Shift: Shift+Left selects.
    assert press(state, "ArrowLeft", "ArrowLeft", shift=True) == [a.Key(keys="Left")]
    assert release(state, "Shift", "ShiftLeft") == [a.KeyUp(key="Shift_L")]
    assert state.held == {}


def test_shortcuts_press_the_us_key_at_the_same_place():
    state = KeyboardState()
    assert press(state, "Control", "ControlLeft", ctrl=True) == [a.KeyDown(key="Control_L")]
    assert press(state, "c", "KeyC", ctrl=True) == [a.Key(keys="c")]
    assert press(state, "с", "KeyC", ctrl=True) == [a.Key(keys="c")]  # Cyrillic layout
    assert press(state, "!", "Digit1", ctrl=True, shift=True) == [
        a.KeyDown(key="Shift_L"),  # the Shift keydown was missed: the flags catch up
        a.Key(keys="1"),
    ]
    assert state.release() == [a.KeyUp(key="Shift_L"), a.KeyUp(key="Control_L")]


def test_right_hand_modifiers_and_missed_releases():
    state = KeyboardState()
    assert press(state, "Alt", "AltRight", alt=True) == [a.KeyDown(key="Alt_R")]
    assert press(state, "Alt", "AltRight", alt=True) == []  # auto-repeat of a held modifier
    # The Alt keyup happened outside the page: the next event's flags release it.
    assert press(state, "x", "KeyX") == [a.KeyUp(key="Alt_R"), a.Type(text="x")]
    assert press(state, "Meta", "MetaLeft", meta=True) == [a.KeyDown(key="Super_L")]


def test_keys_that_type_nothing_by_themselves_are_ignored():
    state = KeyboardState()
    for key in ("Dead", "Unidentified", "Process", "AltGraph", "LaunchApp2", "\x00"):
        assert press(state, key) == []
