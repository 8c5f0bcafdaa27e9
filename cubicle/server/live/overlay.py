"""What a watcher is shown of the actions run on a desktop: marks on the picture.

Every batch that runs through the manager's door (`ActionsRan`) becomes an `OverlayMessage`:
a click is a ripple at its point (button and count), a drag its path, a scroll a mark with
its direction, typed text and pressed keys a caption, and `source` tells whether the agent
(`api`) or a person (`viewer`) acted. Viewers get the message over their data channel or
WebSocket and draw it over the video (`web/overlay.js`); a recording started with
`overlay: true` burns the same marks into its frames (`cubicle.server.live.burnin`).

A click without coordinates lands where the pointer is: `Marker` follows the pointer through
the actions it sees, so that such a click still gets its point. A person's press, moves and
release (the viewer sends those, not `drag`) become a path once the button goes up.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from cubicle.protocol import actions as a
from cubicle.protocol.service import ActionSource

CAPTION_CHARACTERS = 200
"""Longest caption sent for one batch's typed text; longer text is cut with an ellipsis."""
_TRAIL_POINTS = 200
"""Most points kept of a person's drag."""
_MODIFIER_NAMES = {
    "shift": "Shift",
    "control": "Ctrl",
    "ctrl": "Ctrl",
    "alt": "Alt",
    "super": "Super",
    "meta": "Super",
}


class _Mark(BaseModel):
    model_config = ConfigDict(frozen=True)


class Ripple(_Mark):
    """A click (or a press): rings spreading from the point."""

    kind: Literal["click"] = "click"
    x: int
    """Screen pixels from the left edge."""
    y: int
    """Screen pixels from the top edge."""
    button: a.Button = "left"
    count: int = 1
    """1 for a click, 2 for a double click, 3 for a triple click."""
    modifiers: list[str] = Field(default_factory=list)
    """Keys held during the click, e.g. `["ctrl"]`."""


class Trail(_Mark):
    """A drag: the path the pointer took with the button down, first point first."""

    kind: Literal["drag"] = "drag"
    points: list[tuple[int, int]]
    """Screen pixels."""
    button: a.Button = "left"


class ScrollMark(_Mark):
    """Wheel clicks at a point: `dy` > 0 scrolled down, `dx` > 0 right."""

    kind: Literal["scroll"] = "scroll"
    x: int
    y: int
    dx: int
    dy: int


class Caption(_Mark):
    """Typed text (`text`) or pressed keys (`keys`, e.g. `Ctrl+s`, `Return ×3`)."""

    kind: Literal["text", "keys"]
    text: str


Mark = Annotated[Ripple | Trail | ScrollMark | Caption, Field(discriminator="kind")]


class OverlayMessage(BaseModel):
    """What a viewer is told after a batch of actions ran on its desktop."""

    type: Literal["overlay"] = "overlay"
    source: ActionSource
    """`api`: a program (the agent) acted; `viewer`: a person in a browser."""
    marks: list[Mark]


class Marker:
    """Turns one desktop's action batches into marks, following its pointer and buttons."""

    def __init__(self) -> None:
        self.pointer: tuple[int, int] | None = None
        """Where the actions seen so far left the pointer (None: not known yet)."""
        self._pressed: dict[str, list[tuple[int, int]]] = {}
        """Buttons held down, each with the path since it went down."""
        self._modifiers: dict[str, None] = {}
        """Modifier keys held down (`key_down`), as shown in captions."""

    def marks(self, actions: list[a.Action] | tuple[a.Action, ...]) -> list[Mark]:
        """The marks for a batch that ran, in order."""
        found: list[Mark] = []
        for action in actions:
            found.extend(self._mark(action))
        return found

    def _at(self, x: int | None, y: int | None) -> tuple[int, int] | None:
        if x is not None and y is not None:
            self._move_to((x, y))
        return self.pointer

    def _move_to(self, point: tuple[int, int]) -> None:
        self.pointer = point
        for path in self._pressed.values():
            if len(path) < _TRAIL_POINTS and path[-1] != point:
                path.append(point)

    def _mark(self, action: a.Action) -> list[Mark]:
        match action:
            case a.Move(x=x, y=y):
                self._move_to((x, y))
            case a.Click(x=x, y=y, button=button, count=count, modifiers=modifiers):
                if (point := self._at(x, y)) is not None:
                    return [Ripple(x=point[0], y=point[1], button=button, count=count,
                                   modifiers=[*self._held(), *modifiers])]  # fmt: skip
            case a.MouseDown(x=x, y=y, button=button):
                if (point := self._at(x, y)) is not None:
                    self._pressed[button] = [point]
                    return [Ripple(x=point[0], y=point[1], button=button,
                                   modifiers=self._held())]  # fmt: skip
            case a.MouseUp(x=x, y=y, button=button):
                self._at(x, y)
                path = self._pressed.pop(button, None)
                if path is not None and len(path) > 1:
                    return [Trail(points=path, button=button)]
            case a.Drag(path=path, button=button):
                self._move_to(path[-1])
                return [Trail(points=[tuple(p) for p in path[:_TRAIL_POINTS]], button=button)]
            case a.Scroll(x=x, y=y, dx=dx, dy=dy):
                if (point := self._at(x, y)) is not None and (dx or dy):
                    return [ScrollMark(x=point[0], y=point[1], dx=dx, dy=dy)]
            case a.Type(text=text) if text:
                cut = text if len(text) <= CAPTION_CHARACTERS else text[:CAPTION_CHARACTERS] + "…"
                return [Caption(kind="text", text=cut)]
            case a.Key(keys=keys, repeat=repeat):
                shown = "+".join([*self._held(), keys])
                return [Caption(kind="keys", text=shown + (f" ×{repeat}" if repeat > 1 else ""))]
            case a.KeyDown(key=key):
                if (name := _modifier(key)) is not None:
                    self._modifiers[name] = None
                else:
                    return [Caption(kind="keys", text="+".join([*self._held(), key]))]
            case a.KeyUp(key=key):
                if (name := _modifier(key)) is not None:
                    self._modifiers.pop(name, None)
        return []

    def _held(self) -> list[str]:
        return list(self._modifiers)


def _modifier(key: str) -> str | None:
    """`Ctrl` for `Control_L`, `ctrl`…; None for a key that is not a modifier."""
    return _MODIFIER_NAMES.get(key.lower().split("_")[0])
