"""`UiTarsPlanner`: a planner that grounds itself, speaking UI-TARS's own action language.

UI-TARS answers `Thought: …` then `Action: click(start_box='(x,y)')`. The point is in the
family's frame (see docs/grounding.md): 0–1000 for UI-TARS v1 ("ui-tars"), absolute pixels of
the smart-resized image for UI-TARS-1.5 ("ui-tars-1.5"), which is why the screenshot is
sent at exactly that size. Actions are parsed with `ast` (never `eval`) and turned into
the schema of `cubicle.agent.actions`, points mapped to real screen pixels.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Sequence

from cubicle.agent._model import ChatModel
from cubicle.agent.actions import (
    AnswerError,
    Click,
    Done,
    Drag,
    Fail,
    PlannedAction,
    Point,
    PressKey,
    Scroll,
    TypeText,
    Wait,
)
from cubicle.agent.errors import GroundingError
from cubicle.agent.grounding._image import PreparedImage
from cubicle.agent.planner import ChatModelPlanner, Conversation, Observation, PastStep
from cubicle.agent.settings import UI_TARS_FAMILIES
from cubicle.protocol.errors import InvalidRequest

PROMPT = """\
You are a GUI agent. You are given a task and your action history, with screenshots. You \
need to perform the next action to complete the task.

## Output Format
```
Thought: ...
Action: ...
```

## Action Space

click(start_box='<|box_start|>(x1,y1)<|box_end|>')
left_double(start_box='<|box_start|>(x1,y1)<|box_end|>')
right_single(start_box='<|box_start|>(x1,y1)<|box_end|>')
drag(start_box='<|box_start|>(x1,y1)<|box_end|>', end_box='<|box_start|>(x3,y3)<|box_end|>')
hotkey(key='')
type(content='') #If you want to submit your input, use "\\n" at the end of `content`.
scroll(start_box='<|box_start|>(x1,y1)<|box_end|>', direction='down or up or right or left')
wait() #Sleep for 5s and take a screenshot to check for any changes.
finished(content='xxx') # Use escape characters \\', \\", and \\n in content part to ensure \
we can parse the content in normal python string format.
call_user() # Submit the task and call the user when the task is unsolvable, or when you \
need the user's help.

## Note
- Use English in `Thought` part.
- Write a small plan and finally summarize your next action (with its target element) in \
one sentence in `Thought` part.

## User Instruction
{instruction}
"""

_SCROLL_CLICKS = 5
"""Wheel clicks of one `scroll(...)`."""
_WAIT_S = 5.0
"""Seconds of one `wait()`, as the prompt promises the model."""
_ACTION = re.compile(r"^\s*Action\s*:\s*", re.M)
_THOUGHT = re.compile(r"^\s*(?:Thought|Reflection|Action_Summary)\s*:\s*", re.M)
_CALL = re.compile(r"([a-z_]+)\s*\((.*)\)\s*$", re.S)
_QUOTED_ARG = re.compile(r"(\w+)\s*=\s*'(.*)'\s*$", re.S)
_CLICKS = {"click": "click", "left_single": "click", "left_double": "double_click"}
_CLICKS |= {"right_single": "right_click"}


def _call(text: str) -> tuple[str, dict[str, str]]:
    """`name(key='value', …)` as (name, arguments). `ast` reads it (the whole text, else its
    first paragraph, else its first line: models sometimes add a second action); a lone
    string argument with unescaped quotes inside (`type(content='it's')`) is read by a regex."""
    text = text.strip()
    first = text.split("\n\n")[0].strip()
    for candidate in dict.fromkeys((text, first, text.splitlines()[0] if text else "")):
        try:
            node = ast.parse(candidate, mode="eval").body
        except SyntaxError:
            continue
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            break
        arguments: dict[str, str] = {}
        for keyword in node.keywords:
            if keyword.arg is None or not isinstance(keyword.value, ast.Constant):
                raise AnswerError(f"the action's arguments must be quoted strings: {candidate}")
            arguments[keyword.arg] = str(keyword.value.value)
        return node.func.id, arguments
    match = _CALL.fullmatch(first)
    argument = _QUOTED_ARG.fullmatch(match.group(2)) if match else None
    if match is None or (match.group(2).strip() and argument is None):
        raise AnswerError(f"the action {first!r} is not a call like click(start_box='(x,y)')")
    return match.group(1), ({argument.group(1): argument.group(2)} if argument else {})


def _keys(key: str) -> str:
    """UI-TARS's `ctrl c` / `ctrl+c` as `ctrl+c`."""
    parts = [part for part in re.split(r"[\s+]+", key.strip()) if part]
    if not parts:
        raise AnswerError("hotkey(key='…') needs a key, e.g. hotkey(key='ctrl s')")
    return "+".join(parts)


class UiTarsPlanner(ChatModelPlanner):
    """UI-TARS (v1 with `family="ui-tars"`, 1.5 with "ui-tars-1.5") as planner and grounder
    in one: its actions carry points, so the run needs no grounder."""

    kind = "ui-tars"
    grounds_itself = True

    def __init__(
        self, model: ChatModel, *, family: str = "ui-tars-1.5", max_parse_retries: int = 2
    ) -> None:
        if family not in UI_TARS_FAMILIES:
            raise InvalidRequest(
                f"UiTarsPlanner speaks the UI-TARS action language: family must be one of "
                f"{', '.join(UI_TARS_FAMILIES)}, not {family!r}"
            )
        super().__init__(model, family=family, max_parse_retries=max_parse_retries)

    def conversation(
        self, observation: Observation, sent: PreparedImage, history: Sequence[PastStep]
    ) -> Conversation:
        talk = Conversation()
        talk.add("user", PROMPT.format(instruction=observation.task))
        for past in history:
            talk.add("user", past.image if past.image is not None else "(earlier screenshot)")
            if past.answer:
                talk.add("assistant", past.answer)
            if not past.result.startswith("ok"):
                talk.add("user", f"That step did not work: {past.result}")
        talk.add("user", sent)
        return talk

    def parse(
        self, raw: str, sent_size: tuple[int, int], screen_size: tuple[int, int]
    ) -> tuple[str, PlannedAction]:
        found = _ACTION.search(raw)
        if found is None:
            raise AnswerError("the answer has no 'Action: ...' line")
        thought = _THOUGHT.sub("", raw[: found.start()]).strip()
        name, arguments = _call(raw[found.end() :])

        def point(key: str) -> Point:
            aliases = (key, key.replace("box", "point"), "point" if key == "start_box" else "")
            value = next((arguments[name] for name in aliases if arguments.get(name)), None)
            if not value:
                raise AnswerError(f"{name}(...) needs {key}='(x,y)'")
            try:
                located = self.family.locate(value, sent_size, screen_size)
            except GroundingError as exc:
                raise AnswerError(f"{key}={value!r} is not a point on the screen") from exc
            if located is None:
                raise AnswerError(f"{key}={value!r} is not a point on the screen")
            return located[0], located[1]

        return thought, self._action(name, arguments, point)

    def _action(
        self, name: str, arguments: dict[str, str], point: Callable[[str], Point]
    ) -> PlannedAction:
        if name in _CLICKS:
            return Click(type=_CLICKS[name], target=point("start_box"))  # type: ignore[arg-type]
        if name in ("drag", "select"):
            return Drag(start=point("start_box"), end=point("end_box"))
        if name in ("hotkey", "press", "keydown"):
            return PressKey(keys=_keys(arguments.get("key", "")))
        if name == "type":
            content = arguments.get("content", "")
            if not content:
                raise AnswerError("type(content='…') needs some text")
            return TypeText(text=content)
        if name == "scroll":
            direction = arguments.get("direction", "").strip().lower()
            if direction not in ("up", "down", "left", "right"):
                raise AnswerError("scroll(...) needs direction='up', 'down', 'left' or 'right'")
            placed = any(arguments.get(name) for name in ("start_box", "start_point", "point"))
            where = point("start_box") if placed else None
            return Scroll(direction=direction, amount=_SCROLL_CLICKS, target=where)  # type: ignore[arg-type]
        if name == "wait":
            return Wait(seconds=_WAIT_S)
        if name == "finished":
            return Done(summary=arguments.get("content", ""))
        if name == "call_user":
            return Fail(reason="the model asked for a person's help (call_user)")
        raise AnswerError(f"{name}(...) is not one of the actions listed in the action space")
