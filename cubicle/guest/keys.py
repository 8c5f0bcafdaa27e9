"""Key names to X keysyms: xdotool-style names, browser names, X keysym names, characters.

Pure lookups, no display needed. Names are case-insensitive (`Enter`, `enter` and `ENTER`
are the same key; `A` is the `a` key). A single non-ASCII character stands for itself
(`é`, `Ω`, `✓`). A keysym is the 32-bit X code of a symbol: Latin-1 characters are their own
code point, other Unicode characters are `0x01000000 + code point`.
"""

from __future__ import annotations

import importlib
from functools import cache

import Xlib.keysymdef

from cubicle.protocol.errors import UnknownKey

_HINT = (
    "use names like enter, tab, esc, ctrl, alt, shift, super, F1-F24, arrows, "
    "or an X keysym name such as KP_Enter"
)

_ALIASES: dict[str, str] = {
    "enter": "Return",
    "return": "Return",
    "tab": "Tab",
    "space": "space",
    "esc": "Escape",
    "escape": "Escape",
    "backspace": "BackSpace",
    "delete": "Delete",
    "del": "Delete",
    "insert": "Insert",
    "ins": "Insert",
    "home": "Home",
    "end": "End",
    "pageup": "Prior",
    "page_up": "Prior",
    "pgup": "Prior",
    "pagedown": "Next",
    "page_down": "Next",
    "pgdn": "Next",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "arrowup": "Up",
    "arrowdown": "Down",
    "arrowleft": "Left",
    "arrowright": "Right",
    "ctrl": "Control_L",
    "control": "Control_L",
    "ctrl_l": "Control_L",
    "ctrl_r": "Control_R",
    "shift": "Shift_L",
    "alt": "Alt_L",
    "altgr": "ISO_Level3_Shift",
    "super": "Super_L",
    "win": "Super_L",
    "windows": "Super_L",
    "meta": "Super_L",
    "cmd": "Super_L",
    "capslock": "Caps_Lock",
    "menu": "Menu",
    "printscreen": "Print",
    "print": "Print",
    "pause": "Pause",
    "numlock": "Num_Lock",
    "scrolllock": "Scroll_Lock",
    "plus": "plus",
    "minus": "minus",
} | {f"f{n}": f"F{n}" for n in range(1, 25)}

_RETURN = 0xFF0D
_TAB = 0xFF09


@cache
def _keysym_names() -> tuple[dict[str, int], dict[str, int]]:
    """Every keysym name python-xlib knows: (exact name → keysym, lowercased name → keysym).

    Where two names differ only in case (`Greek_alpha`, `Greek_ALPHA`), the lowercased
    table keeps the one with fewer capitals, so a case-insensitive name picks the small letter.
    """
    exact: dict[str, int] = {}
    for group in Xlib.keysymdef.__all__:
        module = importlib.import_module(f"Xlib.keysymdef.{group}")
        for attr, keysym in vars(module).items():
            if not attr.startswith("XK_"):
                continue
            name = attr[3:]
            exact.setdefault(name, keysym)
            if name.startswith("XF86_"):  # python-xlib spells XF86AudioMute as XF86_AudioMute
                exact.setdefault("XF86" + name[5:], keysym)
    folded: dict[str, tuple[int, int]] = {}
    for name, keysym in exact.items():
        capitals = sum(c.isupper() for c in name)
        key = name.lower()
        if key not in folded or capitals < folded[key][0]:
            folded[key] = (capitals, keysym)
    return exact, {key: keysym for key, (_, keysym) in folded.items()}


def char_keysym(char: str) -> int:
    """The keysym that types `char`: its code point for Latin-1, else `0x01000000 + code point`.

    Newline and carriage return give Return, tab gives Tab. Other control characters have no
    keysym that types them and raise `UnknownKey`.
    """
    if len(char) != 1:
        raise UnknownKey(f"{char!r} is not a single character")
    if char in "\n\r":
        return _RETURN
    if char == "\t":
        return _TAB
    point = ord(char)
    if point < 0x20 or 0x7F <= point < 0xA0 or 0xD800 <= point < 0xE000:
        raise UnknownKey(
            f"U+{point:04X} is a control character or lone surrogate and cannot be typed: "
            "remove it, or press a named key such as esc or backspace instead"
        )
    if point <= 0xFF:
        return point
    return 0x01000000 + point


def _resolve(name: str, combo: str | None) -> int:
    stripped = name if name == " " else name.strip()
    if len(stripped) == 1 and stripped.isprintable():
        return char_keysym(stripped.lower() if stripped.isascii() else stripped)
    folded = stripped.lower()
    exact, by_folded = _keysym_names()
    if folded in _ALIASES:
        return exact[_ALIASES[folded]]
    if stripped in exact:
        return exact[stripped]
    if folded in by_folded:
        return by_folded[folded]
    where = f" in {combo!r}" if combo is not None else ""
    raise UnknownKey(f"unknown key {name!r}{where}: {_HINT}")


def resolve_key(name: str) -> int:
    """The keysym for one key name, e.g. `enter`, `ctrl`, `F5`, `KP_Enter`, `a`, `é`.

    Raises `UnknownKey` when no alias, keysym name or single character matches.
    """
    return _resolve(name, None)


def parse_combo(combo: str) -> list[int]:
    """Keysyms of a combination such as `ctrl+shift+t`, `alt+F4` or `ctrl++`, in written order.

    Parts are separated by `+`; a `+` at the very end after a separator is the plus key.
    Whitespace around parts is ignored. Raises `UnknownKey` for an empty combination, an empty
    part or a name that does not resolve.
    """
    text = combo.strip()
    if text == "+":
        return [_resolve("+", combo)]
    if text.endswith("+") and text[:-1].rstrip().endswith("+"):
        parts = [*text[:-1].rstrip()[:-1].split("+"), "+"]
    else:
        parts = text.split("+")
    if any(not part.strip() for part in parts):
        raise UnknownKey(
            f"empty key name in {combo!r}: write combinations like ctrl+shift+t, alt+F4 or ctrl++"
        )
    return [_resolve(part.strip(), combo) for part in parts]
