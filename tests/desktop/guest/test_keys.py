"""Key names and combinations resolve to the X keysyms an X keyboard would send."""

from __future__ import annotations

import pytest

from cubicle.guest.keys import char_keysym, parse_combo, resolve_key
from cubicle.protocol.errors import InvalidRequest, UnknownKey

pytestmark = pytest.mark.fast

# Values from X11/keysymdef.h, written out so the test does not reuse the code under test.
RETURN, TAB, ESCAPE, BACKSPACE, DELETE, INSERT = 0xFF0D, 0xFF09, 0xFF1B, 0xFF08, 0xFFFF, 0xFF63
HOME, END, PRIOR, NEXT = 0xFF50, 0xFF57, 0xFF55, 0xFF56
LEFT, UP, RIGHT, DOWN = 0xFF51, 0xFF52, 0xFF53, 0xFF54
CONTROL_L, CONTROL_R, SHIFT_L, ALT_L, SUPER_L = 0xFFE3, 0xFFE4, 0xFFE1, 0xFFE9, 0xFFEB
ISO_LEVEL3_SHIFT, CAPS_LOCK, MENU, PRINT, PAUSE = 0xFE03, 0xFFE5, 0xFF67, 0xFF61, 0xFF13
NUM_LOCK, SCROLL_LOCK, KP_ENTER, XF86_AUDIO_MUTE = 0xFF7F, 0xFF14, 0xFF8D, 0x1008FF12


@pytest.mark.parametrize(
    ("names", "keysym"),
    [
        (["enter", "return", "Return", "ENTER"], RETURN),
        (["tab", "Tab"], TAB),
        (["space", "Space", " "], 0x20),
        (["esc", "escape", "Escape"], ESCAPE),
        (["backspace", "BackSpace"], BACKSPACE),
        (["delete", "del", "Del"], DELETE),
        (["insert", "ins"], INSERT),
        (["home"], HOME),
        (["end", "End"], END),
        (["pageup", "page_up", "pgup", "Prior", "PageUp"], PRIOR),
        (["pagedown", "page_down", "pgdn", "Next"], NEXT),
        (["up", "arrowup", "ArrowUp"], UP),
        (["down", "arrowdown"], DOWN),
        (["left", "arrowleft"], LEFT),
        (["right", "ArrowRight"], RIGHT),
        (["ctrl", "control", "ctrl_l", "Control_L", "CTRL"], CONTROL_L),
        (["ctrl_r", "control_r"], CONTROL_R),
        (["shift", "Shift"], SHIFT_L),
        (["alt", "Alt"], ALT_L),
        (["altgr", "AltGr"], ISO_LEVEL3_SHIFT),
        (["super", "win", "meta", "cmd", "windows", "Super_L"], SUPER_L),
        (["capslock", "Caps_Lock"], CAPS_LOCK),
        (["menu"], MENU),
        (["printscreen", "print"], PRINT),
        (["pause"], PAUSE),
        (["numlock"], NUM_LOCK),
        (["scrolllock"], SCROLL_LOCK),
        (["plus", "+"], ord("+")),
        (["minus", "-"], ord("-")),
        (["KP_Enter", "kp_enter", "KP_ENTER"], KP_ENTER),
        (["XF86AudioMute", "xf86audiomute"], XF86_AUDIO_MUTE),
    ],
)
def test_names_and_aliases(names: list[str], keysym: int) -> None:
    for name in names:
        assert resolve_key(name) == keysym, name


def test_function_keys_f1_to_f24() -> None:
    for number in range(1, 25):
        assert resolve_key(f"f{number}") == 0xFFBE + number - 1
        assert resolve_key(f"F{number}") == 0xFFBE + number - 1


def test_single_characters() -> None:
    assert resolve_key("a") == ord("a")
    assert resolve_key("A") == ord("a")  # names are case-insensitive
    assert resolve_key("1") == ord("1")
    assert resolve_key("/") == ord("/")
    assert resolve_key("é") == 0xE9  # Latin-1 is its own keysym
    assert resolve_key("Ω") == 0x010003A9  # other Unicode: 0x01000000 + code point
    assert resolve_key("✓") == 0x01002713
    assert resolve_key(" é ") == 0xE9  # whitespace around a name is ignored


def test_keysym_names_fold_case_towards_the_small_letter() -> None:
    assert resolve_key("Greek_alpha") == 0x7E1
    assert resolve_key("Greek_ALPHA") == 0x7C1  # an exact spelling wins
    assert resolve_key("greek_alpha") == 0x7E1
    assert resolve_key("aacute") == 0xE1
    assert resolve_key("Aacute") == 0xC1


def test_characters_for_typing() -> None:
    assert char_keysym("\n") == RETURN
    assert char_keysym("\t") == TAB
    assert char_keysym("A") == ord("A")  # typing keeps case
    assert char_keysym("你") == 0x01000000 + ord("你")
    assert char_keysym("😀") == 0x0101F600
    with pytest.raises(UnknownKey, match="U\\+0007"):
        char_keysym("\a")


def test_combos_keep_written_order() -> None:
    assert parse_combo("ctrl+shift+t") == [CONTROL_L, SHIFT_L, ord("t")]
    assert parse_combo("alt+F4") == [ALT_L, 0xFFC1]
    assert parse_combo("shift+ctrl+T") == [SHIFT_L, CONTROL_L, ord("t")]
    assert parse_combo("enter") == [RETURN]
    assert parse_combo(" ctrl + alt + del ") == [CONTROL_L, ALT_L, DELETE]


def test_plus_key_in_combos() -> None:
    assert parse_combo("ctrl++") == [CONTROL_L, ord("+")]
    assert parse_combo("ctrl+ +") == [CONTROL_L, ord("+")]
    assert parse_combo("+") == [ord("+")]
    assert parse_combo("ctrl+shift++") == [CONTROL_L, SHIFT_L, ord("+")]
    assert parse_combo("ctrl+plus") == [CONTROL_L, ord("+")]
    assert parse_combo("ctrl+-") == [CONTROL_L, ord("-")]


@pytest.mark.parametrize("combo", ["", "   ", "ctrl+", "+ctrl", "ctrl++a", "ctrl+ +a", "++"])
def test_empty_parts_are_rejected(combo: str) -> None:
    with pytest.raises(UnknownKey, match="empty key name"):
        parse_combo(combo)


def test_unknown_names_say_what_to_use() -> None:
    with pytest.raises(UnknownKey) as caught:
        parse_combo("ctrl+entr")
    assert str(caught.value) == (
        "unknown key 'entr' in 'ctrl+entr': use names like enter, tab, esc, ctrl, alt, "
        "shift, super, F1-F24, arrows, or an X keysym name such as KP_Enter"
    )
    assert caught.value.code == "unknown_key"
    assert isinstance(caught.value, InvalidRequest)
    with pytest.raises(UnknownKey, match="unknown key 'f99': use names like"):
        resolve_key("f99")
    for name in ["", "ctrlx", "XF86NoSuchKey", "\t"]:
        with pytest.raises(UnknownKey):
            resolve_key(name)
