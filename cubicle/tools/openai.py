"""OpenAI's computer tool (Responses API, `{"type": "computer"}`) on a Cubicle desktop.

    computer = OpenAIComputer(desktop)                      # an AsyncDesktop
    response = client.responses.create(model=..., tools=[computer.tool_param()], input=...)
    for item in response.output:
        if item.type == "computer_call":
            outputs.append(await computer.call_output(item))  # a computer_call_output

A `computer_call` carries a batch (`actions[]`, or one `action` from the preview tool);
the whole batch goes to the desktop as one call (checked whole before any of it runs),
then the screen is sent back as a `computer_call_output` screenshot. Buttons `left`,
`right`, `wheel` (the middle button), `back` and `forward`; `keys` held during pointer
actions; key names as the model writes them (`CTRL`, `ENTER`, `ARROWLEFT`…); scroll
distances in pixels, turned into wheel clicks of `scroll_px_per_click`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol import actions as a
from cubicle.protocol.errors import InvalidRequest
from cubicle.tools.frame import Frame
from cubicle.tools.step import FrameScreen, ImageFormat, ToolStep, held, point_of, text_of

_BUTTONS: dict[str, a.Button] = {
    "left": "left",
    "right": "right",
    "wheel": "middle",
    "middle": "middle",
    "back": "back",
    "forward": "forward",
}
_KEY_NAMES = {"option": "alt", "cmd": "super", "command": "super", "return": "enter"}
"""OpenAI key names the desktop spells differently (the rest it takes as they come)."""
ACTION_TYPES = (
    "click",
    "double_click",
    "drag",
    "keypress",
    "move",
    "screenshot",
    "scroll",
    "type",
    "wait",
)


def key_name(name: str) -> str:
    """An OpenAI key name (`CTRL`, `ARROWLEFT`, `SPACE`, `a`) as the desktop's key name."""
    stripped = name.strip()
    if stripped == "+":
        return "plus"
    return _KEY_NAMES.get(stripped.lower(), stripped)


def _fields(action: Any) -> Mapping[str, Any]:
    if isinstance(action, Mapping):
        return action
    if hasattr(action, "model_dump"):
        return action.model_dump(exclude_none=True)
    raise InvalidRequest(f"a computer action must be an object; got {action!r}")


def actions_of(call: Any) -> list[Mapping[str, Any]]:
    """The actions of a `computer_call` (the SDK's object or its dict): `actions[]`, or the
    preview tool's single `action`."""
    fields = _fields(call)
    batch = fields.get("actions") or ([fields["action"]] if fields.get("action") else [])
    return [_fields(action) for action in batch]


class OpenAIComputer:
    """Runs OpenAI computer-tool calls on `desktop`.

    `max_size` bounds the screenshot the model sees (default: the whole screen, which the
    GA tool expects); coordinates are read in that screenshot's pixels. `wait_ms` is what a
    `wait` action waits; `settle` how long the screen must stay still after input before
    the screenshot (None: at once)."""

    def __init__(
        self,
        desktop: AsyncDesktop,
        *,
        max_size: tuple[int, int] | None = None,
        scroll_px_per_click: int = 100,
        wait_ms: int = 1000,
        settle: a.WaitForSettle | None = a.WaitForSettle(quiet_ms=150, timeout_ms=2000),  # noqa: B008
        image_format: ImageFormat = "png",
    ) -> None:
        screen = (desktop.info.screen.width, desktop.info.screen.height)
        frame = Frame.fit(screen, *max_size) if max_size else Frame.fit(screen)
        self.screen = FrameScreen(desktop, frame, settle=settle, image_format=image_format)
        self.scroll_px_per_click = scroll_px_per_click
        self.wait_ms = wait_ms

    @property
    def frame(self) -> Frame:
        return self.screen.frame

    def tool_param(self, *, preview: bool = False) -> dict[str, Any]:
        """The tool definition for `tools=[...]`: `{"type": "computer"}`, or the preview
        tool's `computer_use_preview` with the frame's size."""
        if not preview:
            return {"type": "computer"}
        return {
            "type": "computer_use_preview",
            "display_width": self.frame.width,
            "display_height": self.frame.height,
            "environment": "linux",
        }

    # --- the mapping ----------------------------------------------------------------------

    def plan(self, call: Any) -> ToolStep:
        """The desktop input of a whole `computer_call` (or one action, or a list of them),
        without running it; `InvalidRequest` saying what is wrong."""
        if isinstance(call, Sequence) and not isinstance(call, str | bytes):
            batch = [_fields(action) for action in call]
        else:
            fields = _fields(call)
            batch = (
                [fields]
                if "type" in fields and fields["type"] != "computer_call"
                else actions_of(fields)
            )
        inputs: list[a.Action] = []
        labels: list[str] = []
        point = None
        for action in batch:
            step = self.plan_action(action)
            inputs.extend(step.actions)
            labels.append(step.label)
            point = step.point or point
        return ToolStep(tuple(inputs), label="; ".join(labels)[:300], point=point)

    def plan_action(self, action: Mapping[str, Any]) -> ToolStep:
        """One action of a batch as desktop input."""
        kind = action.get("type")
        if kind not in ACTION_TYPES:
            raise InvalidRequest(
                f"unknown computer action {kind!r}: use one of {', '.join(ACTION_TYPES)}"
            )
        label = _label(action)
        keys = [key_name(k) for k in action.get("keys") or ()] if kind != "keypress" else []

        def at() -> tuple[int, int]:
            x, y = point_of([action.get("x"), action.get("y")], "x and y", kind)
            return self.frame.to_screen(x, y)

        if kind in ("click", "double_click"):
            button = _BUTTONS.get(action.get("button", "left"))
            if button is None:
                raise InvalidRequest(
                    f"click: unknown button {action.get('button')!r}: use left, right, "
                    "wheel, back or forward"
                )
            x, y = at()
            count = 2 if kind == "double_click" else 1
            click = a.Click(x=x, y=y, button=button, count=count)
            return ToolStep(held(keys, [click]), label=label, point=(x, y))
        if kind == "move":
            x, y = at()
            return ToolStep(held(keys, [a.Move(x=x, y=y)]), label=label, point=(x, y))
        if kind == "drag":
            path = [
                self.frame.to_screen(*point_of([p.get("x"), p.get("y")], "path", kind))
                for p in (_fields(p) for p in action.get("path") or ())
            ]
            if len(path) < 2:
                raise InvalidRequest("drag: path needs at least two points")
            return ToolStep(held(keys, [a.Drag(path=path)]), label=label, point=path[-1])
        if kind == "scroll":
            x, y = at()
            dx = self._clicks(action.get("scroll_x", 0))
            dy = self._clicks(action.get("scroll_y", 0))
            return ToolStep(
                held(keys, [a.Scroll(x=x, y=y, dx=dx, dy=dy)]), label=label, point=(x, y)
            )
        if kind == "keypress":
            names = action.get("keys")
            if not names or not all(isinstance(name, str) and name for name in names):
                raise InvalidRequest(
                    "keypress: keys must be a list of key names, e.g. ['CTRL', 'C']"
                )
            return ToolStep((a.Key(keys="+".join(key_name(n) for n in names)),), label=label)
        if kind == "type":
            return ToolStep((a.Type(text=text_of(action, "text", kind)),), label=label)
        if kind == "wait":
            return ToolStep((a.Wait(ms=self.wait_ms),), label=label)
        return ToolStep(label=label)  # screenshot: the batch ends with one anyway

    def _clicks(self, pixels: object) -> int:
        """Wheel clicks for a scroll of `pixels` (at least one when it is not 0)."""
        if not isinstance(pixels, int | float) or isinstance(pixels, bool):
            raise InvalidRequest(f"scroll: scroll_x and scroll_y must be numbers; got {pixels!r}")
        if pixels == 0:
            return 0
        clicks = max(1, round(abs(pixels) / self.scroll_px_per_click))
        return min(100, clicks) * (1 if pixels > 0 else -1)

    # --- running it -----------------------------------------------------------------------

    async def __call__(self, call: Any) -> str:
        """Run a `computer_call`'s actions; the screenshot after them, as a data URL."""
        step = self.plan(call)
        await self.screen.send(step.actions)
        return await self.screenshot_url()

    async def screenshot_url(self) -> str:
        data = base64.b64encode(await self.screen.screenshot()).decode("ascii")
        return f"data:{self.screen.media_type};base64,{data}"

    async def call_output(
        self, call: Any, *, acknowledge_safety_checks: bool = False
    ) -> dict[str, Any]:
        """The `computer_call_output` input item answering `call` after running it.

        A call with pending safety checks is refused (`InvalidRequest` quoting them) unless
        `acknowledge_safety_checks`: a person should confirm them first."""
        fields = _fields(call)
        checks = [_fields(check) for check in fields.get("pending_safety_checks") or ()]
        if checks and not acknowledge_safety_checks:
            shown = "; ".join(str(c.get("message") or c.get("code") or c.get("id")) for c in checks)
            raise InvalidRequest(f"the model asks for confirmation before acting: {shown}")
        output: dict[str, Any] = {
            "type": "computer_call_output",
            "call_id": fields.get("call_id"),
            "output": {"type": "computer_screenshot", "image_url": await self(fields)},
        }
        if checks:
            output["acknowledged_safety_checks"] = [
                {"id": c.get("id"), "code": c.get("code"), "message": c.get("message")}
                for c in checks
            ]
        return output


def _label(action: Mapping[str, Any]) -> str:
    shown = [
        f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}"
        for key, value in action.items()
        if key != "type" and value is not None
    ]
    return " ".join([str(action.get("type")), *shown])[:200]
