"""Claude's computer tool (`computer_20250124`, `computer_20251124`) on a Cubicle desktop.

    from anthropic import Anthropic
    from cubicle import Desktop
    from cubicle.tools import AnthropicComputer

    computer = AnthropicComputer(desktop)            # an AsyncDesktop
    tools = [computer.tool_param()]                  # display_width_px/height_px set for you
    ...
    for block in message.content:
        if block.type == "tool_use":
            results.append(await computer.tool_result(block))   # the tool_result block

The screen is shown to Claude at the size Anthropic recommends (`Frame.for_claude`: at
most 1568 pixels on the long side and about 1.15 megapixels), or at `max_size`; the tool
definition states that size, and every coordinate Claude answers is scaled back to the
screen. Each action answers what Anthropic's reference implementation answers: a
screenshot after input (once the screen has settled), `X=…,Y=…` for `cursor_position`, the
region enlarged for `zoom`. Modifiers (`text` on clicks, drags and scrolls) are held around
the action; `hold_key` holds its keys for `duration` seconds.

The tool input may name its action in `action` (the `computer` tool) or, as the
`computer_toolset_20260801` sends it, in the block's name; both map the same way.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Literal, cast

from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol import actions as a
from cubicle.protocol.errors import CubicleError, InvalidRequest
from cubicle.tools.frame import Frame
from cubicle.tools.step import (
    FrameScreen,
    ImageFormat,
    ToolStep,
    held,
    number_of,
    point_of,
    text_of,
    waits,
)

Version = Literal["computer_20250124", "computer_20251124"]
VERSIONS: tuple[Version, ...] = ("computer_20250124", "computer_20251124")
BETA_FLAGS: dict[str, str] = {
    "computer_20250124": "computer-use-2025-01-24",
    "computer_20251124": "computer-use-2025-11-24",
}
"""The `anthropic-beta` flag each tool version needs."""

_CLICKS: dict[str, tuple[a.Button, int]] = {
    "left_click": ("left", 1),
    "right_click": ("right", 1),
    "middle_click": ("middle", 1),
    "double_click": ("left", 2),
    "triple_click": ("left", 3),
}
_SCROLL: dict[str, tuple[int, int]] = {
    "up": (0, -1),
    "down": (0, 1),
    "left": (-1, 0),
    "right": (1, 0),
}
ACTIONS_20250124 = (
    "key",
    "hold_key",
    "type",
    "cursor_position",
    "mouse_move",
    "left_mouse_down",
    "left_mouse_up",
    *_CLICKS,
    "left_click_drag",
    "scroll",
    "wait",
    "screenshot",
)
ACTIONS: dict[Version, tuple[str, ...]] = {
    "computer_20250124": ACTIONS_20250124,
    "computer_20251124": (*ACTIONS_20250124, "zoom"),
}
_MAX_SECONDS = 100
"""Longest `wait` or `hold_key`, seconds (as Anthropic's reference implementation)."""


def _modifiers(payload: Mapping[str, Any], action: str) -> list[str]:
    """Keys to hold during a pointer action: `text` ("ctrl+shift"), as the tool sends them."""
    value = payload.get("text", payload.get("key"))
    if value is None or value == "":
        return []
    if not isinstance(value, str):
        raise InvalidRequest(f"{action}: text (keys to hold) must be a string like 'shift'")
    return [part.strip() for part in value.split("+") if part.strip()]


def _key_presses(text: str, repeat: int) -> list[a.Action]:
    """xdotool's `key` syntax: combinations separated by spaces, each pressed in turn."""
    combos = text.split() or ["space"]
    return [a.Key(keys=combo, repeat=repeat) for combo in combos]


class AnthropicComputer:
    """Runs Claude's computer-tool calls on `desktop`.

    `max_size` bounds the frame shown to Claude (default: Anthropic's recommended size);
    `settle` is how long the screen must stay still after input before the screenshot
    (None: take it at once)."""

    def __init__(
        self,
        desktop: AsyncDesktop,
        *,
        version: Version = "computer_20251124",
        max_size: tuple[int, int] | None = None,
        settle: a.WaitForSettle | None = a.WaitForSettle(quiet_ms=150, timeout_ms=2000),  # noqa: B008
        image_format: ImageFormat = "png",
    ) -> None:
        if version not in VERSIONS:
            raise InvalidRequest(f"unknown computer tool version {version!r}: use {VERSIONS}")
        self.version: Version = version
        screen = (desktop.info.screen.width, desktop.info.screen.height)
        frame = Frame.fit(screen, *max_size) if max_size else Frame.for_claude(screen)
        self.screen = FrameScreen(desktop, frame, settle=settle, image_format=image_format)

    @property
    def frame(self) -> Frame:
        return self.screen.frame

    @property
    def beta_flag(self) -> str:
        """The `anthropic-beta` flag (`betas=[...]`) this tool version needs."""
        return BETA_FLAGS[self.version]

    def tool_param(self) -> dict[str, Any]:
        """The tool definition for `tools=[...]`: a `BetaToolComputerUse20250124Param` or
        `…20251124Param` (with `enable_zoom`)."""
        param: dict[str, Any] = {
            "type": self.version,
            "name": "computer",
            "display_width_px": self.frame.width,
            "display_height_px": self.frame.height,
        }
        if self.version == "computer_20251124":
            param["enable_zoom"] = True
        return param

    # --- the mapping ----------------------------------------------------------------------

    def plan(self, tool_input: Mapping[str, Any], name: str | None = None) -> ToolStep:
        """The desktop input and the observation one tool call asks for, without running
        it. `InvalidRequest` (with what to fix) for an input the tool does not allow."""
        if not isinstance(tool_input, Mapping):
            raise InvalidRequest(f"the tool input must be an object; got {tool_input!r}")
        action = tool_input.get("action", name if name not in (None, "computer") else None)
        allowed = ACTIONS[self.version]
        if action not in allowed:
            raise InvalidRequest(
                f"unknown action {action!r} for {self.version}: use one of {', '.join(allowed)}"
            )
        label = _label(action, tool_input)
        frame = self.frame

        def at(field: str = "coordinate") -> tuple[int, int] | None:
            if tool_input.get(field) is None:
                return None
            return frame.to_screen(*point_of(tool_input[field], field, action))

        if action in _CLICKS:
            button, count = _CLICKS[action]
            point = at()
            x, y = point or (None, None)
            click = a.Click(x=x, y=y, button=button, count=count)
            return ToolStep(held(_modifiers(tool_input, action), [click]), label=label, point=point)
        if action == "mouse_move":
            point = at() or _required(action, "coordinate")
            return ToolStep((a.Move(x=point[0], y=point[1]),), label=label, point=point)
        if action in ("left_mouse_down", "left_mouse_up"):
            point = at()
            x, y = point or (None, None)
            kind = a.MouseDown if action == "left_mouse_down" else a.MouseUp
            return ToolStep((kind(x=x, y=y),), label=label, point=point)
        if action == "left_click_drag":
            start = at("start_coordinate") or _required(action, "start_coordinate")
            end = at() or _required(action, "coordinate")
            drag = a.Drag(path=[start, end])
            return ToolStep(held(_modifiers(tool_input, action), [drag]), label=label, point=end)
        if action == "scroll":
            direction = tool_input.get("scroll_direction")
            if direction not in _SCROLL:
                raise InvalidRequest("scroll: scroll_direction must be up, down, left or right")
            amount = min(100, int(number_of(tool_input, "scroll_amount", action, default=3)))
            dx, dy = _SCROLL[direction]
            point = at()
            x, y = point or (None, None)
            scroll = a.Scroll(x=x, y=y, dx=dx * amount, dy=dy * amount)
            return ToolStep(
                held(_modifiers(tool_input, action), [scroll]), label=label, point=point
            )
        if action == "type":
            return ToolStep((a.Type(text=text_of(tool_input, "text", action)),), label=label)
        if action == "key":
            repeat = int(number_of(tool_input, "repeat", action, default=1)) or 1
            presses = _key_presses(text_of(tool_input, "text", action), min(repeat, 100))
            return ToolStep(tuple(presses), label=label)
        if action == "hold_key":
            keys = [k.strip() for k in text_of(tool_input, "text", action).split("+") if k.strip()]
            seconds = min(number_of(tool_input, "duration", action), _MAX_SECONDS)
            return ToolStep(held(keys, waits(round(seconds * 1000))), label=label)
        if action == "wait":
            seconds = min(number_of(tool_input, "duration", action, default=1), _MAX_SECONDS)
            return ToolStep(tuple(waits(round(seconds * 1000))), label=label)
        if action == "cursor_position":
            return ToolStep(observe="cursor", label=label)
        if action == "zoom":
            region = tool_input.get("region")
            if not (isinstance(region, list | tuple) and len(region) == 4):
                raise InvalidRequest(f"zoom: region must be [x0, y0, x1, y1]; got {region!r}")
            x0, y0 = point_of(region[:2], "region", action)
            x1, y1 = point_of(region[2:], "region", action)
            return ToolStep(
                observe="zoom", region=frame.region_to_screen(x0, y0, x1, y1), label=label
            )
        return ToolStep(label=label)  # screenshot

    # --- running it -------------------------------------------------------------------------

    async def __call__(
        self, tool_input: Mapping[str, Any], name: str | None = None
    ) -> list[dict[str, Any]]:
        """Run one tool call; the tool_result's content blocks (text and image) as the
        Messages API takes them. Raises `CubicleError` (its message says what to fix)."""
        step = self.plan(tool_input, name)
        await self.screen.send(step.actions)
        return await self.observe(step)

    async def observe(self, step: ToolStep) -> list[dict[str, Any]]:
        """The content blocks showing the model what `step` asks to see, now."""
        if step.observe == "cursor":
            x, y = await self.screen.cursor()
            return [{"type": "text", "text": f"X={x},Y={y}"}]
        if step.observe == "nothing":
            return [{"type": "text", "text": "done"}]
        if step.observe == "zoom":
            assert step.region is not None
            return [self.image_block(await self.screen.zoom(step.region))]
        return [self.image_block(await self.screen.screenshot())]

    def image_block(self, data: bytes) -> dict[str, Any]:
        """A `BetaImageBlockParam` holding `data` (encoded in the screen's image format)."""
        source = {
            "type": "base64",
            "media_type": self.screen.media_type,
            "data": base64.b64encode(data).decode("ascii"),
        }
        return {"type": "image", "source": source}

    async def tool_result(self, block: Any) -> dict[str, Any]:
        """The `tool_result` block answering a `tool_use` block (the SDK's object or its
        dict): its content, or `is_error` with the message when the call cannot run."""
        get = block.get if isinstance(block, Mapping) else lambda key: getattr(block, key, None)
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": get("id")}
        if get("toolset_name"):
            result["toolset_name"] = get("toolset_name")
        tool_input: Any = get("input")  # a dict, or the SDK's model of one
        if hasattr(tool_input, "model_dump"):
            tool_input = tool_input.model_dump(exclude_none=True)
        try:
            result["content"] = await self(cast(Mapping[str, Any], tool_input or {}), get("name"))
        except CubicleError as exc:
            result["content"] = [{"type": "text", "text": exc.message}]
            result["is_error"] = True
        return result


def _required(action: str, field: str) -> tuple[int, int]:
    raise InvalidRequest(f"{action}: {field} is required, as [x, y]")


def _label(action: str, tool_input: Mapping[str, Any]) -> str:
    shown = [
        f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
        for key, value in tool_input.items()
        if key != "action" and value is not None
    ]
    return " ".join([action, *shown])[:200]
