"""The input actions a desktop understands, as one discriminated union on `type`.

Coordinates are screen pixels with the origin at the top-left corner. Key names follow
xdotool (`enter`, `ctrl+shift+t`, `alt+F4`, any X keysym name), case-insensitively.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Button = Literal["left", "right", "middle", "back", "forward"]
"""Mouse buttons; `back` and `forward` are the side buttons (X buttons 8 and 9)."""
Coordinate = Annotated[int, Field(ge=0, le=32767)]


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Move(_Action):
    """Move the pointer."""

    type: Literal["move"] = "move"
    x: Coordinate
    """Screen pixels from the left edge."""
    y: Coordinate
    """Screen pixels from the top edge."""


class Click(_Action):
    """Click a button, at (x, y) when given, else where the pointer is."""

    type: Literal["click"] = "click"
    x: Coordinate | None = None
    y: Coordinate | None = None
    button: Button = "left"
    count: Annotated[int, Field(ge=1, le=3)] = 1
    """1 for a click, 2 for a double click, 3 for a triple click."""
    modifiers: list[str] = Field(default_factory=list, max_length=8)
    """Keys held during the click, e.g. `["ctrl", "shift"]`."""


class MouseDown(_Action):
    type: Literal["mouse_down"] = "mouse_down"
    x: Coordinate | None = None
    y: Coordinate | None = None
    button: Button = "left"


class MouseUp(_Action):
    type: Literal["mouse_up"] = "mouse_up"
    x: Coordinate | None = None
    y: Coordinate | None = None
    button: Button = "left"


class Drag(_Action):
    """Press at the first point, move through the others, release at the last."""

    type: Literal["drag"] = "drag"
    path: list[tuple[Coordinate, Coordinate]] = Field(min_length=2, max_length=1000)
    button: Button = "left"


class Scroll(_Action):
    """Turn the wheel: `dy` > 0 scrolls down, `dx` > 0 scrolls right, in wheel clicks."""

    type: Literal["scroll"] = "scroll"
    x: Coordinate | None = None
    y: Coordinate | None = None
    dx: Annotated[int, Field(ge=-100, le=100)] = 0
    dy: Annotated[int, Field(ge=-100, le=100)] = 0


class Type(_Action):
    """Type any Unicode text, whatever the keyboard layout."""

    type: Literal["type"] = "type"
    text: str = Field(max_length=100_000)


class Key(_Action):
    """Press and release a key or a combination such as `ctrl+shift+t`."""

    type: Literal["key"] = "key"
    keys: str = Field(min_length=1, max_length=200)
    repeat: Annotated[int, Field(ge=1, le=100)] = 1


class KeyDown(_Action):
    type: Literal["key_down"] = "key_down"
    key: str = Field(min_length=1, max_length=100)


class KeyUp(_Action):
    type: Literal["key_up"] = "key_up"
    key: str = Field(min_length=1, max_length=100)


class Wait(_Action):
    type: Literal["wait"] = "wait"
    ms: Annotated[int, Field(ge=0, le=60_000)]
    """Milliseconds to wait."""


class WaitForSettle(_Action):
    """Return once the screen has not changed for `quiet_ms`, or after `timeout_ms`."""

    type: Literal["wait_for_settle"] = "wait_for_settle"
    quiet_ms: Annotated[int, Field(ge=10, le=10_000)] = 300
    """Milliseconds without a change that count as settled."""
    timeout_ms: Annotated[int, Field(ge=10, le=60_000)] = 5_000
    """Milliseconds after which to give up waiting."""
    idle_ms: Annotated[int, Field(ge=10, le=10_000)] | None = None
    """Return sooner, once nothing was drawn for this many milliseconds while the desktop's
    programs wanted next to no CPU: an idle desktop has nothing left to draw. None (or not
    below `quiet_ms`): wait the whole `quiet_ms`."""


Action = Annotated[
    Move
    | Click
    | MouseDown
    | MouseUp
    | Drag
    | Scroll
    | Type
    | Key
    | KeyDown
    | KeyUp
    | Wait
    | WaitForSettle,
    Field(discriminator="type"),
]

ActionBatch = Action | list[Action]
"""What `POST /actions` accepts: one action or a list run in order."""

action_batch_adapter: TypeAdapter[ActionBatch] = TypeAdapter(ActionBatch)


class ActionResult(BaseModel):
    """What one executed action reports."""

    type: str
    elapsed_ms: float
    """Milliseconds the action took."""
    settled: bool | None = None
    """For `wait_for_settle`: whether the screen went quiet before the timeout."""


class ActionsResponse(BaseModel):
    results: list[ActionResult]
    elapsed_ms: float
    """Milliseconds for the whole batch, measured in the guest."""
