"""Cubicle's own actions as JSON Schema function definitions, for any model with tool calling.

    tools = function_tools("openai")       # chat completions: {"type": "function", "function": …}
    tools = function_tools("responses")    # Responses API:    {"type": "function", "name": …}
    tools = function_tools("anthropic")    # Messages API:     {"name", "input_schema"}

    functions = CubicleFunctions(desktop)
    result = await functions.call(name, arguments)   # arguments as the model sent them

One function per action of `desktop.actions` (`click`, `move`, `drag`, `scroll`, `type`,
`key`…, the schema being the action's own, `type` left out), and `screenshot`. Points are
in the pixels of the screenshot the model was shown (`max_size` bounds it; default the
whole screen).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, get_args

from pydantic import ValidationError

from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol import actions as a
from cubicle.protocol.errors import InvalidRequest
from cubicle.tools.frame import Frame
from cubicle.tools.step import FrameScreen, ImageFormat

Style = Literal["openai", "responses", "anthropic"]
_SCREENSHOT = {
    "name": "screenshot",
    "description": "See the screen: answers an image whose pixels are the coordinates the "
    "other functions take.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
}


def _action_classes() -> list[type[a._Action]]:
    union = get_args(get_args(a.Action)[0])
    return list(union)


@cache
def _definitions() -> tuple[dict[str, Any], ...]:
    found = []
    for cls in _action_classes():
        schema = cls.model_json_schema()
        name = schema["properties"].pop("type")["const"]
        schema.pop("title", None)
        description = schema.pop("description", None) or f"The `{name}` action."
        for prop in schema["properties"].values():
            prop.pop("title", None)
        schema["required"] = [r for r in schema.get("required", []) if r != "type"]
        found.append({"name": name, "description": description, "parameters": schema})
    return (*found, _SCREENSHOT)


def function_tools(style: Style = "openai") -> list[dict[str, Any]]:
    """Every action, and `screenshot`, as function definitions in a vendor's format."""
    tools = []
    for d in _definitions():
        params = json.loads(json.dumps(d["parameters"]))  # a copy the caller may change
        if style == "openai":
            function = {"name": d["name"], "description": d["description"], "parameters": params}
            tools.append({"type": "function", "function": function})
        elif style == "responses":
            tools.append({"type": "function", **{**d, "parameters": params}})
        elif style == "anthropic":
            tools.append(
                {"name": d["name"], "description": d["description"], "input_schema": params}
            )
        else:
            raise InvalidRequest(f"unknown style {style!r}: use openai, responses or anthropic")
    return tools


@dataclass(frozen=True, slots=True)
class FunctionResult:
    """What a function call gives back to the model."""

    text: str
    """A line for the model: what ran, or where the image's pixels map."""
    image: bytes | None = None
    """For `screenshot`: the screen, encoded in the functions' image format."""


class CubicleFunctions:
    """Runs calls of `function_tools()` functions on `desktop`."""

    def __init__(
        self,
        desktop: AsyncDesktop,
        *,
        max_size: tuple[int, int] | None = None,
        image_format: ImageFormat = "png",
    ) -> None:
        screen = (desktop.info.screen.width, desktop.info.screen.height)
        frame = Frame.fit(screen, *max_size) if max_size else Frame.fit(screen)
        self.screen = FrameScreen(desktop, frame, image_format=image_format)

    def plan(self, name: str, arguments: str | Mapping[str, Any] | None) -> a.Action | None:
        """The desktop action a call names, its points mapped to the screen; None for
        `screenshot`. `InvalidRequest` for an unknown name or bad arguments."""
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                raise InvalidRequest(f"{name}: the arguments are not JSON ({exc.msg})") from exc
        if not isinstance(arguments, Mapping):
            raise InvalidRequest(f"{name}: the arguments must be a JSON object")
        names = [d["name"] for d in _definitions()]
        if name not in names:
            raise InvalidRequest(f"unknown function {name!r}: use one of {', '.join(names)}")
        if name == "screenshot":
            return None
        try:
            action = a.action_batch_adapter.validate_python({**arguments, "type": name})
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors()[:4]
            )
            raise InvalidRequest(f"{name}: {problems}") from exc
        assert not isinstance(action, list)
        return self._to_screen(action)

    def _to_screen(self, action: a.Action) -> a.Action:
        frame = self.screen.frame
        if not frame.scaled:
            return action
        if isinstance(action, a.Drag):
            return action.model_copy(update={"path": [frame.to_screen(*p) for p in action.path]})
        x, y = getattr(action, "x", None), getattr(action, "y", None)
        if x is None or y is None:
            return action
        sx, sy = frame.to_screen(x, y)
        return action.model_copy(update={"x": sx, "y": sy})

    async def call(self, name: str, arguments: str | Mapping[str, Any] | None) -> FunctionResult:
        """Run one function call. Raises `CubicleError` with what to fix."""
        action = self.plan(name, arguments)
        if action is None:
            image = await self.screen.screenshot()
            return FunctionResult(f"the {self.screen.frame.describe()}", image)
        response = await self.screen.send([action])
        assert response is not None
        return FunctionResult(response.model_dump_json())
