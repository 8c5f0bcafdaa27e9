"""Browser keyboard events to desktop actions.

The page sends each `keydown`/`keyup` with the browser's `KeyboardEvent.key` (what the key
means: `a`, `A`, `é`, `ArrowLeft`, `F5`), its `code` (where it sits: `KeyA`, `ShiftLeft`)
and the modifier flags. Here:

- modifiers (Shift, Control, Alt, Meta) are held and released on the desktop as they are
  in the browser (`key_down`/`key_up` of `Shift_L`, `Control_R`, …), so that Shift+click
  and Ctrl+drag work; the flags on every event resynchronise them if an event was missed;
- named keys are tapped by their X keysym name (`ArrowLeft` → `Left`, `Enter` → `Return`,
  `PageUp` → `Prior`, `F1`…`F24`), with whatever modifiers are held;
- characters with Ctrl, Alt or Meta held are shortcuts: the key at the same place on a US
  keyboard is tapped (`code` `KeyC` → `c`), so Ctrl+C copies on any layout;
- other characters are typed as text (`type`), which places any Unicode character on the
  desktop's keymap whatever its layout. The browser already applied Shift (and AltGr, Caps
  Lock, dead keys), so a held Shift is lifted around the text and put back after.

Key repeat comes from the browser (repeated `keydown`s). Keys are never left held: named keys
and characters are taps, and `release()` lets go of every held modifier.
"""

from __future__ import annotations

from cubicle.protocol import actions as a

MODIFIERS: dict[str, str] = {
    "ShiftLeft": "Shift_L",
    "ShiftRight": "Shift_R",
    "ControlLeft": "Control_L",
    "ControlRight": "Control_R",
    "AltLeft": "Alt_L",
    "AltRight": "Alt_R",
    "MetaLeft": "Super_L",
    "MetaRight": "Super_R",
    "OSLeft": "Super_L",
    "OSRight": "Super_R",
}
"""`KeyboardEvent.code` of each modifier key → X keysym name."""

_MODIFIER_KEYS: dict[str, str] = {
    "Shift": "Shift_L",
    "Control": "Control_L",
    "Alt": "Alt_L",
    "Meta": "Super_L",
    "OS": "Super_L",
}
"""`KeyboardEvent.key` of each modifier → X keysym name, when `code` says nothing."""

NAMED: dict[str, str] = {
    "Enter": "Return",
    "Tab": "Tab",
    "Backspace": "BackSpace",
    "Escape": "Escape",
    "Delete": "Delete",
    "Insert": "Insert",
    "Home": "Home",
    "End": "End",
    "PageUp": "Prior",
    "PageDown": "Next",
    "ArrowLeft": "Left",
    "ArrowRight": "Right",
    "ArrowUp": "Up",
    "ArrowDown": "Down",
    "CapsLock": "Caps_Lock",
    "NumLock": "Num_Lock",
    "ScrollLock": "Scroll_Lock",
    "Pause": "Pause",
    "PrintScreen": "Print",
    "ContextMenu": "Menu",
    "Clear": "Clear",
    "Help": "Help",
    "Cancel": "Cancel",
    "Select": "Select",
    "Execute": "Execute",
    "Find": "Find",
    "Redo": "Redo",
    "Undo": "Undo",
    "AudioVolumeUp": "XF86AudioRaiseVolume",
    "AudioVolumeDown": "XF86AudioLowerVolume",
    "AudioVolumeMute": "XF86AudioMute",
    "MediaPlayPause": "XF86AudioPlay",
    "MediaStop": "XF86AudioStop",
    "MediaTrackNext": "XF86AudioNext",
    "MediaTrackPrevious": "XF86AudioPrev",
    "BrowserBack": "XF86Back",
    "BrowserForward": "XF86Forward",
    "BrowserRefresh": "XF86Reload",
    "BrowserHome": "XF86HomePage",
} | {f"F{n}": f"F{n}" for n in range(1, 25)}
"""`KeyboardEvent.key` of each non-character key → X keysym name."""

IGNORED = frozenset({"Dead", "Unidentified", "Process", "Compose", "AltGraph", "Fn", "FnLock"})
"""Keys that produce nothing by themselves: the character they lead to comes later."""

_FLAGS = {"shift": "Shift", "ctrl": "Control", "alt": "Alt", "meta": "Meta"}


def is_character(key: str) -> bool:
    """Whether `key` is text (`a`, `é`, `€`, `👍`) rather than a named key (`Enter`)."""
    if not key or key in NAMED or key in IGNORED or key in _MODIFIER_KEYS:
        return False
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in key):
        return False  # control characters type nothing
    return len(key) == 1 or not key.isascii()


def shortcut_key(key: str, code: str) -> str:
    """The key a shortcut means: the US-layout letter or digit at `code`, else `key` itself."""
    if code.startswith("Key") and len(code) == 4:
        return code[3].lower()
    if code.startswith("Digit") and len(code) == 6:
        return code[5]
    return key.lower() if key.isascii() else key


def _family(xname: str) -> str:
    return {"Shift": "shift", "Control": "ctrl", "Alt": "alt", "Super": "meta"}[xname.split("_")[0]]


class KeyboardState:
    """The modifiers one controller holds on the desktop, and what each key event does."""

    def __init__(self) -> None:
        self.held: dict[str, None] = {}
        """X names of the modifiers held down on the desktop, in the order pressed."""

    def translate(
        self,
        *,
        key: str,
        code: str,
        down: bool,
        shift: bool = False,
        ctrl: bool = False,
        alt: bool = False,
        meta: bool = False,
        altgr: bool = False,
    ) -> list[a.Action]:
        """The actions for one browser key event, given its modifier flags after the event."""
        modifier = MODIFIERS.get(code) or _MODIFIER_KEYS.get(key)
        if modifier is not None and key != "AltGraph":
            actions = self._sync(
                {"shift": shift, "ctrl": ctrl, "alt": alt, "meta": meta}, skip=_family(modifier)
            )
            if down and modifier not in self.held:
                self.held[modifier] = None
                actions.append(a.KeyDown(key=modifier))
            elif not down and modifier in self.held:
                del self.held[modifier]
                actions.append(a.KeyUp(key=modifier))
            return actions
        if not down or key in IGNORED:
            return []
        if altgr:  # Windows reports AltGr as Ctrl+Alt: the character is already composed
            ctrl = alt = False
        actions = self._sync({"shift": shift, "ctrl": ctrl, "alt": alt, "meta": meta})
        if key in NAMED:
            return [*actions, a.Key(keys=NAMED[key])]
        if not is_character(key):
            return actions  # a key the desktop has no name for (e.g. a launcher key)
        if ctrl or alt or meta:
            return [*actions, a.Key(keys=shortcut_key(key, code))]
        shifts = [name for name in self.held if name.startswith("Shift")]
        return [
            *actions,
            *(a.KeyUp(key=name) for name in shifts),
            a.Type(text=key),
            *(a.KeyDown(key=name) for name in shifts),
        ]

    def release(self) -> list[a.Action]:
        """Let go of every held modifier (focus lost, control released, viewer gone)."""
        actions: list[a.Action] = [a.KeyUp(key=name) for name in reversed(self.held)]
        self.held.clear()
        return actions

    def _sync(self, flags: dict[str, bool], skip: str | None = None) -> list[a.Action]:
        """Press or release modifiers so the desktop matches the browser's flags."""
        actions: list[a.Action] = []
        for family, pressed in flags.items():
            if family == skip:
                continue
            mine = [name for name in self.held if _family(name) == family]
            if pressed and not mine:
                name = _MODIFIER_KEYS[_FLAGS[family]]
                self.held[name] = None
                actions.append(a.KeyDown(key=name))
            elif not pressed:
                for name in mine:
                    del self.held[name]
                    actions.append(a.KeyUp(key=name))
        return actions
