"""What a planner may answer: one action per step, as a discriminated union on `type`.

A planner's answer is a JSON object `{"thought": "...", "action": {"type": "click", ...}}`.
Elements are named by description ("the Save button in the dialog"), which a grounder turns
into screen pixels; a point `[x, y]` is accepted too, for planners that ground themselves.
Once a planner hands an action to the loop, every point in it is in real screen pixels
(the planner maps the model's frame to the screen).

`parse_answer` turns a raw answer into a `PlannerAnswer` or raises `AnswerError` with a
message written for the model, which the planner feeds back when it asks again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from cubicle.protocol.actions import Action as DesktopAction

Point = tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0)]]
"""(x, y): in the model's frame as the model wrote it, in screen pixels once planned."""
Description = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=300)]
Target = Description | Point
"""An element by description ("the File menu"), or a point [x, y]."""


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Click(_Action):
    """Click, double-click or right-click an element."""

    type: Literal["click", "double_click", "right_click"]
    target: Target


class TypeText(_Action):
    """Type text where the keyboard focus is; a newline presses Enter."""

    type: Literal["type"] = "type"
    text: str = Field(min_length=1, max_length=10_000)


class PressKey(_Action):
    """Press a key or a combination, xdotool-style: `enter`, `ctrl+s`, `alt+F4`."""

    type: Literal["key"] = "key"
    keys: str = Field(min_length=1, max_length=100)


class Scroll(_Action):
    """Turn the mouse wheel `amount` clicks, over `target` when given."""

    type: Literal["scroll"] = "scroll"
    direction: Literal["up", "down", "left", "right"]
    amount: int = Field(default=3, ge=1, le=50)
    """Wheel clicks."""
    target: Target | None = None


class Drag(_Action):
    """Press on `start`, move to `end`, release."""

    type: Literal["drag"] = "drag"
    start: Target
    end: Target


class Wait(_Action):
    """Let the screen change on its own (a page loading…)."""

    type: Literal["wait"] = "wait"
    seconds: float = Field(default=1.0, gt=0, le=30)
    """Seconds to wait."""


class Open(_Action):
    """Open a file or URL with its default application."""

    type: Literal["open"] = "open"
    target: str = Field(min_length=1, max_length=4096)


class Launch(_Action):
    """Start an application: `mousepad`, `terminal`, `files`, `browser`, …"""

    type: Literal["launch"] = "launch"
    app: str = Field(min_length=1, max_length=200)
    args: list[str] = Field(default_factory=list, max_length=32)


class Exec(_Action):
    """Run a shell command inside the desktop (only when the run allows it)."""

    type: Literal["exec"] = "exec"
    command: str = Field(min_length=1, max_length=10_000)


class Computer(_Action):
    """Input a vendor's computer tool asked for (`anthropic`, `openai-computer` planners),
    already mapped to the desktop by the tool's executor; never part of a JSON answer."""

    type: Literal["computer"] = "computer"
    inputs: list[DesktopAction] = Field(min_length=1, max_length=1000)
    """Desktop actions in screen pixels, sent as one batch."""
    request: str = Field(max_length=300)
    """The tool call as the model made it, in a few words."""
    point: Point | None = None
    """The pointer target in screen pixels, when there is one."""


class Done(_Action):
    """The task is complete."""

    type: Literal["done"] = "done"
    summary: str = Field(default="", max_length=2_000)


class Fail(_Action):
    """The task cannot be done; `reason` says why."""

    type: Literal["fail"] = "fail"
    reason: str = Field(min_length=1, max_length=2_000)


PlannedAction = Annotated[
    Click
    | TypeText
    | PressKey
    | Scroll
    | Drag
    | Wait
    | Open
    | Launch
    | Exec
    | Computer
    | Done
    | Fail,
    Field(discriminator="type"),
]
"""One step's action."""

ACTION_TYPES = (
    "click",
    "double_click",
    "right_click",
    "type",
    "key",
    "scroll",
    "drag",
    "wait",
    "open",
    "launch",
    "exec",
    "done",
    "fail",
)
"""Every `type` a planner may answer in JSON (`computer` comes from vendor tools only)."""


class PlannerAnswer(BaseModel):
    """A planner's whole answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    thought: str = Field(default="", max_length=5_000)
    """The model's reasoning, one or two sentences."""
    action: PlannedAction


class AnswerError(ValueError):
    """A planner's answer cannot be used; the message is written for the model to read."""


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)
_SHOWN_ERRORS = 4


def _validation_message(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors()[:_SHOWN_ERRORS]:
        where = ".".join(str(part) for part in error["loc"] if not str(part).startswith("function"))
        problems.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(problems)


def parse_answer(raw: str, *, allow_exec: bool = False) -> PlannerAnswer:
    """The answer `raw` (JSON, maybe in a ```json fence or with prose around it) validated.

    Raises `AnswerError` saying what to fix: not JSON, an unknown action type, a missing
    field, or `exec` when the run does not allow it.
    """
    fenced = _FENCE.search(raw)
    text = fenced.group(1) if fenced else raw
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise AnswerError("the answer holds no JSON object; answer with exactly one JSON object")
    try:
        payload = json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        raise AnswerError(f"the answer is not valid JSON ({exc.msg} at {exc.pos})") from exc
    if isinstance(payload, dict) and "action" not in payload and "type" in payload:
        payload = {"action": payload}  # the action alone, without the envelope
    try:
        answer = PlannerAnswer.model_validate(payload)
    except ValidationError as exc:
        raise AnswerError(
            f"the JSON does not follow the schema: {_validation_message(exc)}"
        ) from exc
    if isinstance(answer.action, Computer):
        raise AnswerError(f"unknown action type 'computer': use one of {', '.join(ACTION_TYPES)}")
    if isinstance(answer.action, Exec) and not allow_exec:
        raise AnswerError(
            "exec is not allowed in this run: do the task through the screen "
            "(click, type, key, launch, open)"
        )
    return answer


def targets(action: PlannedAction) -> list[Target]:
    """The elements `action` points at, in order (a drag has two)."""
    if isinstance(action, Click):
        return [action.target]
    if isinstance(action, Scroll):
        return [action.target] if action.target is not None else []
    if isinstance(action, Drag):
        return [action.start, action.end]
    if isinstance(action, Computer) and action.point is not None:
        return [action.point]
    return []


def map_points(action: PlannedAction, convert: Callable[[Point], Point]) -> PlannedAction:
    """`action` with every point target passed through `convert` (descriptions unchanged)."""

    def mapped(target: Target | None) -> Target | None:
        return convert(target) if isinstance(target, tuple) else target

    if isinstance(action, Click | Scroll):
        return action.model_copy(update={"target": mapped(action.target)})
    if isinstance(action, Drag):
        return action.model_copy(update={"start": mapped(action.start), "end": mapped(action.end)})
    return action


def _shown(target: Target) -> str:
    return f"({target[0]}, {target[1]})" if isinstance(target, tuple) else json.dumps(target)


def _cut(text: str, limit: int = 60) -> str:
    return json.dumps(text if len(text) <= limit else text[:limit] + "…", ensure_ascii=False)


def describe(action: PlannedAction) -> str:
    """One line for people: `click "the File menu"`, `type "hello"`, `key ctrl+s`."""
    match action:
        case Click(type=kind, target=target):
            return f"{kind} {_shown(target)}"
        case TypeText(text=text):
            return f"type {_cut(text)}"
        case PressKey(keys=keys):
            return f"key {keys}"
        case Scroll(direction=direction, amount=amount, target=target):
            where = f" over {_shown(target)}" if target is not None else ""
            return f"scroll {direction} {amount}{where}"
        case Drag(start=start, end=end):
            return f"drag {_shown(start)} → {_shown(end)}"
        case Wait(seconds=seconds):
            return f"wait {seconds:g} s"
        case Open(target=target):
            return f"open {_cut(target)}"
        case Launch(app=app, args=args):
            return " ".join(["launch", app, *args])
        case Exec(command=command):
            return f"exec {_cut(command)}"
        case Computer(request=request):
            return f"computer {request}"
        case Done(summary=summary):
            return f"done {_cut(summary)}" if summary else "done"
        case Fail(reason=reason):
            return f"fail {_cut(reason)}"
    raise AssertionError(f"unknown action {action!r}")
