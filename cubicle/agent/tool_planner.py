"""What the planners speaking a vendor's computer tool share (`anthropic`, `openai-computer`).

The model answers with tool calls. The tool's executor (`cubicle.tools`) maps each call:
input calls become one `Computer` action for the agent loop to carry out (so pauses,
records and the settle apply as to any step); calls that only look (a screenshot, the
pointer, a zoom) are answered at once, and the model asked again, within the same step.
The executor's mapping is the only one: the same code serves users' own loops.
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from PIL import Image

from cubicle.agent import actions as p
from cubicle.agent.grounding._image import PreparedImage
from cubicle.agent.planner import Decision, Observation, PastStep, PlanError, Planner
from cubicle.agent.steps import ModelCall
from cubicle.tools.frame import Size
from cubicle.tools.step import ToolStep

MAX_CALLS_PER_STEP = 6
"""Model calls one step may take (looks answered at once, bad calls fed back)."""

_SYSTEM = """\
You operate a Linux desktop (XFCE, with a terminal, the mousepad text editor, the thunar \
file manager and the chromium browser) to carry out the user's task, through the computer \
tool. Act one step at a time and look at the screen after each. When the task is done, \
answer with a short summary and no tool call; if it cannot be done, say why, also without \
a tool call."""


def encode_png(image: Image.Image, size: Size) -> bytes:
    """`image` at `size`, as PNG (fast zlib level)."""
    if image.size != size:
        image = image.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=1)
    return out.getvalue()


class ToolPlanner(Planner):
    """A planner whose model calls a computer tool; one conversation per run."""

    grounds_itself: ClassVar[bool] = True
    kind: ClassVar[str] = "tool"

    def __init__(self, model: str, *, system: str = _SYSTEM) -> None:
        self.model = model
        self.system = system
        self._calls: list[ModelCall] = []

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.model}"

    @property
    @abstractmethod
    def frame_size(self) -> Size:
        """The size screenshots are sent at."""

    @abstractmethod
    async def ask(self, observation: Observation, shot: bytes, history: Sequence[PastStep]) -> None:
        """Add this step's news to the conversation: the task and screen at the first step,
        else the answer to the call acted on last (the screen now, or the error)."""

    @abstractmethod
    async def turn(self) -> tuple[str, str, object | None]:
        """Ask the model once; (its text, its answer as text for the record, the tool call
        it made or None)."""

    @abstractmethod
    def plan(self, call: object) -> ToolStep:
        """The executor's mapping of `call` (`InvalidRequest` when it cannot run)."""

    @abstractmethod
    async def answer_now(self, call: object, step: ToolStep | None, problem: str | None) -> None:
        """Answer a call that needs no input (a look) or could not be used (`problem`), so
        the conversation can go on."""

    @abstractmethod
    def accept(self, call: object) -> None:
        """The call's input goes to the desktop: answer it at the next step."""

    def refuse(self, call: object) -> str | None:
        """Why the call must not run at all (the run fails), or None."""
        return None

    async def decide(self, observation: Observation, history: Sequence[PastStep]) -> Decision:
        from cubicle.protocol.errors import CubicleError

        started = time.perf_counter()
        shot = await asyncio.to_thread(encode_png, observation.screenshot, self.frame_size)
        data_url = f"data:image/png;base64,{base64.b64encode(shot).decode('ascii')}"
        image = PreparedImage(data_url=data_url, size=self.frame_size)
        prepare_ms = (time.perf_counter() - started) * 1000
        await self.ask(observation, shot, history)
        calls: list[ModelCall] = []
        for _ in range(MAX_CALLS_PER_STEP):
            began = time.perf_counter()
            text, answer, call = await self.turn()
            record = ModelCall(
                prompt=f"step {observation.step}", answer=answer, elapsed_ms=_ms(began)
            )
            if call is None:
                calls.append(record)
                return Decision(
                    text, p.Done(summary=text[:2000]), answer, (*calls,), image, prepare_ms
                )
            if (refused := self.refuse(call)) is not None:
                calls.append(record)
                action = p.Fail(reason=refused[:2000])
                return Decision(text, action, answer, (*calls,), image, prepare_ms)
            try:
                step = self.plan(call)
            except CubicleError as exc:
                calls.append(record.model_copy(update={"error": exc.message}))
                await self.answer_now(call, None, exc.message)
                continue
            calls.append(record)
            if not step.actions:
                await self.answer_now(call, step, None)
                continue
            self.accept(call)
            action = p.Computer(inputs=list(step.actions), request=step.label, point=step.point)
            return Decision(text, action, answer, (*calls,), image, prepare_ms)
        raise PlanError(
            f"the model made {len(calls)} tool calls in one step without an action to carry out; "
            f"the last problem: {calls[-1].error or 'none'}",
            calls=calls,
        )


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
