"""Planners: the task, the recent history and the screen in, one action out.

`ChatPlanner` works with any vision chat model: it asks for one action as JSON in the
schema of `cubicle.agent.actions`, names elements by description and leaves pixels to a grounder.
`UiTarsPlanner` (in `cubicle.agent.uitars`) talks to a model that grounds itself. Both share
`ChatModelPlanner.decide`: prepare the screenshot, ask, and when the answer cannot be used,
ask again with the problem fed back, a bounded number of times.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from openai.types.chat import ChatCompletionContentPartParam, ChatCompletionMessageParam
from PIL import Image

from cubicle.agent._model import ChatModel
from cubicle.agent.actions import AnswerError, PlannedAction, Point, map_points, parse_answer
from cubicle.agent.errors import AgentError, GroundingError
from cubicle.agent.grounding import _image, _parse
from cubicle.agent.grounding.families import Family, get_family
from cubicle.agent.steps import ModelCall
from cubicle.protocol.a11y_text import a11y_text  # noqa: F401 - the agent's name for it


class PlanError(AgentError):
    """The planner kept answering something that is not a usable action."""

    code = "plan_error"

    def __init__(self, message: str, *, calls: Sequence[ModelCall] = ()) -> None:
        super().__init__(message)
        self.calls = tuple(calls)
        """Every model call of the step, each with the problem found in its answer."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What the planner gets to see at one step."""

    task: str
    step: int
    """1 for the first step."""
    screenshot: Image.Image
    """The whole screen at full size, RGB."""
    screen_size: tuple[int, int]
    """(width, height) of the real screen, pixels."""
    a11y_text: str | None = None
    """The accessibility tree as compact text, when the run asks for it."""


@dataclass(frozen=True, slots=True)
class PastStep:
    """One earlier step, as the planner is reminded of it."""

    step: int
    answer: str
    """The planner's answer that was acted on; "" when no usable answer came."""
    result: str
    """What happened: the action's effect or the error."""
    image: _image.PreparedImage | None
    """The screenshot the planner saw then; None once history trimming dropped it."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The planner's choice for one step."""

    thought: str
    action: PlannedAction
    """Points, if any, already in real screen pixels."""
    answer: str
    """The raw answer the action came from."""
    calls: tuple[ModelCall, ...]
    """Every model call of the step (re-asks after unusable answers included)."""
    image: _image.PreparedImage
    """The screenshot as sent to the model."""
    prepare_ms: float
    """Milliseconds spent resizing and encoding the screenshot."""

    @property
    def model_ms(self) -> float:
        """Milliseconds spent waiting for the model."""
        return sum(call.elapsed_ms for call in self.calls)


class Planner(ABC):
    """Decides the next action."""

    grounds_itself: ClassVar[bool] = False
    """True when actions come with screen points and need no grounder."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Kind and model, for run records: "json:qwen2.5-vl-7b"."""

    @abstractmethod
    async def decide(self, observation: Observation, history: Sequence[PastStep]) -> Decision:
        """The next action. Raises `ModelError` when the model endpoint fails (after its
        retries) and `PlanError` when its answers stay unusable."""

    async def aclose(self) -> None:  # noqa: B027 - a no-op default
        """Release what the planner holds; idempotent."""


class Conversation:
    """Chat messages being built, with a text copy for run records (images as `[image W×H]`).

    Consecutive parts of the same role are merged into one message."""

    def __init__(self) -> None:
        self.messages: list[ChatCompletionMessageParam] = []
        self._shown: list[str] = []
        self._roles: list[str] = []

    def add(self, role: str, *parts: str | _image.PreparedImage) -> None:
        content: list[ChatCompletionContentPartParam] = []
        shown = []
        for part in parts:
            if isinstance(part, str):
                content.append({"type": "text", "text": part})
                shown.append(part)
            else:
                content.append({"type": "image_url", "image_url": {"url": part.data_url}})
                shown.append(f"[image {part.size[0]}×{part.size[1]}]")
        if role == "user" and self._roles and self._roles[-1] == "user":
            previous = self.messages[-1]["content"]
            assert isinstance(previous, list)
            previous.extend(content)  # type: ignore[arg-type]
            self._shown[-1] += "\n" + "\n".join(shown)
            return
        if role == "user":
            self.messages.append({"role": "user", "content": content})
        else:  # system and assistant messages as plain text: every server takes that
            text = "\n".join(part for part in parts if isinstance(part, str))
            self.messages.append({"role": role, "content": text})  # type: ignore[misc]
        self._roles.append(role)
        self._shown.append("\n".join(shown))

    @property
    def text(self) -> str:
        return "\n\n".join(
            f"[{role}]\n{shown}" for role, shown in zip(self._roles, self._shown, strict=True)
        )


def _encode(image: Image.Image, size: tuple[int, int]) -> _image.PreparedImage:
    """`image` resized to exactly `size` when it differs, as a PNG data URL (fast zlib level:
    screenshots compress well either way)."""
    if image.size != size:
        image = image.resize(size, Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return _image.PreparedImage(data_url=f"data:image/png;base64,{encoded}", size=image.size)


class ChatModelPlanner(Planner):
    """A planner behind a `ChatModel`: ask, check, re-ask with the problem fed back.

    `family` decides the image size sent (exactly the `smart_resize` size for
    absolute-pixel families) and the frame of any coordinates in answers. Unusable answers
    are re-asked `max_parse_retries` times before the step fails with `PlanError`.
    """

    kind: ClassVar[str] = "chat"

    def __init__(self, model: ChatModel, *, family: str, max_parse_retries: int = 2) -> None:
        self.model = model
        self.family: Family = get_family(family)
        self.max_parse_retries = max_parse_retries

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.model.model}"

    @abstractmethod
    def conversation(
        self, observation: Observation, sent: _image.PreparedImage, history: Sequence[PastStep]
    ) -> Conversation:
        """The messages asking for the next action."""

    @abstractmethod
    def parse(
        self, raw: str, sent_size: tuple[int, int], screen_size: tuple[int, int]
    ) -> tuple[str, PlannedAction]:
        """(thought, action with screen points) from a raw answer; `AnswerError` saying
        what to fix otherwise."""

    def feedback(self, problem: AnswerError) -> str:
        """What the model is told after an unusable answer."""
        return f"That answer could not be used: {problem}. Answer again, in the required format."

    def prepare(
        self, screenshot: Image.Image, screen_size: tuple[int, int]
    ) -> _image.PreparedImage:
        """The screenshot as sent: scaled per the family, PNG-encoded (CPU-bound)."""
        _image.check_aspect(screenshot.size, screen_size)
        return _encode(screenshot, self.family.image_size(screenshot.size))

    def to_screen(
        self, point: Point, sent_size: tuple[int, int], screen_size: tuple[int, int]
    ) -> Point:
        """A point in the answer's frame mapped to screen pixels; `AnswerError` when it
        lies outside the frame."""
        try:
            x, y, _ = _parse.to_screen(
                (float(point[0]), float(point[1])), self.family.frame(sent_size), screen_size, ""
            )
        except GroundingError as exc:
            raise AnswerError(f"the point {list(point)} is off the screen: {exc.message}") from exc
        return x, y

    async def decide(self, observation: Observation, history: Sequence[PastStep]) -> Decision:
        started = time.perf_counter()
        sent = await asyncio.to_thread(
            self.prepare, observation.screenshot, observation.screen_size
        )
        prepare_ms = (time.perf_counter() - started) * 1000
        conversation = self.conversation(observation, sent, history)
        calls: list[ModelCall] = []
        for _ in range(self.max_parse_retries + 1):
            completion = await self.model.complete(conversation.messages)
            raw = completion.text
            call = ModelCall(
                prompt=conversation.text,
                answer=raw,
                elapsed_ms=completion.elapsed_ms,
                attempts=completion.attempts,
                prompt_tokens=completion.prompt_tokens,
                completion_tokens=completion.completion_tokens,
            )
            try:
                thought, action = self.parse(raw, sent.size, observation.screen_size)
            except AnswerError as problem:
                calls.append(call.model_copy(update={"error": str(problem)}))
                conversation.add("assistant", raw)
                conversation.add("user", self.feedback(problem))
                continue
            calls.append(call)
            return Decision(thought, action, raw, (*calls,), sent, prepare_ms)
        raise PlanError(
            f"the planner's answer was unusable {len(calls)} times in a row; the last problem: "
            f"{calls[-1].error}",
            calls=calls,
        )

    async def aclose(self) -> None:
        await self.model.aclose()


_SYSTEM = """\
You operate a Linux desktop (XFCE) to carry out a task for a user. At each step you see a \
screenshot of the whole screen ({width}×{height} pixels) and answer with ONE action as a \
JSON object, and nothing else:

{{"thought": "<one or two sentences: what you see and why this action>", "action": {{...}}}}

The actions ("type" picks one):
{{"type": "click", "target": "<element>"}}
{{"type": "double_click", "target": "<element>"}}
{{"type": "right_click", "target": "<element>"}}
{{"type": "type", "text": "<text>"}}  types where the keyboard focus is; "\\n" presses Enter
{{"type": "key", "keys": "ctrl+s"}}  a key or combination: enter, tab, esc, ctrl+a, alt+F4…
{{"type": "scroll", "direction": "down", "amount": 3, "target": "<element>"}}  target optional
{{"type": "drag", "start": "<element>", "end": "<element>"}}
{{"type": "wait", "seconds": 2}}  when the screen is still loading
{{"type": "open", "target": "<file path or URL>"}}  opens it with its default application
{{"type": "launch", "app": "mousepad"}}  starts an application: mousepad, terminal, files, browser
{exec}{{"type": "done", "summary": "<what was achieved>"}}  once the screen shows the task is done
{{"type": "fail", "reason": "<why>"}}  when the task cannot be done

An <element> is a short description of one visible element by its text or look and where it \
is: "the File menu", "the Save button in the dialog", "the editor's text area". {points}

One action per answer: after it you get the new screenshot and what happened. Click a text \
field before typing into it unless it already has the keyboard focus."""

_EXEC = '{{"type": "exec", "command": "<shell command>"}}  runs a command inside the desktop\n'
_POINTS = {
    "image-pixels": "Where an element has no words, you may give a point [x, y] instead: "
    "pixels of the screenshot, x from the left and y from the top edge, within "
    "{width}×{height}.",
    "0-1000": "Where an element has no words, you may give a point [x, y] instead, each "
    "from 0 to 1000 across the screenshot (x from the left, y from the top).",
    "0-1": "",  # points must be whole numbers: relative ones cannot be given
}


class ChatPlanner(ChatModelPlanner):
    """Any vision chat model, answering one JSON action per step (see `cubicle.agent.actions`).

    Elements are named by description, for a grounder to find; a point in the answer is
    read in `family`'s frame ("generic": pixels of the image sent) and mapped to the screen.
    `allow_exec` offers the `exec` action (a shell inside the desktop) to the model.
    """

    kind = "json"

    def __init__(
        self,
        model: ChatModel,
        *,
        family: str = "generic",
        allow_exec: bool = False,
        max_parse_retries: int = 2,
    ) -> None:
        super().__init__(model, family=family, max_parse_retries=max_parse_retries)
        self.allow_exec = allow_exec

    def system_prompt(self, sent_size: tuple[int, int]) -> str:
        width, height = sent_size
        points = _POINTS[self.family.convention].format(width=width, height=height)
        exec_line = _EXEC.format() if self.allow_exec else ""
        return _SYSTEM.format(width=width, height=height, exec=exec_line, points=points)

    def conversation(
        self, observation: Observation, sent: _image.PreparedImage, history: Sequence[PastStep]
    ) -> Conversation:
        talk = Conversation()
        talk.add("system", self.system_prompt(sent.size))
        talk.add("user", f"The task: {observation.task}")
        for past in history:
            seen = [past.image] if past.image is not None else ["(screenshot no longer shown)"]
            talk.add("user", f"Step {past.step}, the screen:", *seen)
            if past.answer:
                talk.add("assistant", past.answer)
            talk.add("user", f"What happened at step {past.step}: {past.result}")
        parts: list[str | _image.PreparedImage] = [
            f"Step {observation.step}, the screen now:",
            sent,
        ]
        if observation.a11y_text:
            parts.append(f"Its accessibility tree (role 'name'):\n{observation.a11y_text}")
        parts.append("Answer with one JSON object.")
        talk.add("user", *parts)
        return talk

    def parse(
        self, raw: str, sent_size: tuple[int, int], screen_size: tuple[int, int]
    ) -> tuple[str, PlannedAction]:
        answer = parse_answer(raw, allow_exec=self.allow_exec)
        action = map_points(answer.action, lambda p: self.to_screen(p, sent_size, screen_size))
        return answer.thought, action

    def feedback(self, problem: AnswerError) -> str:
        return (
            f"That answer could not be used: {problem}. Answer again with exactly one JSON "
            'object {"thought": "...", "action": {"type": ...}} using one of the actions listed.'
        )
