"""The `openai-computer` planner: an OpenAI model with its computer tool, through the
Responses API.

The conversation lives on the server (`previous_response_id`): each step sends only what
is new, the `computer_call_output` with the screen after the last call (and the error when
it failed). A call with pending safety checks is not run: the run fails with them, for a
person to look at.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import openai

from cubicle.agent.errors import ModelError, model_error
from cubicle.agent.planner import Observation, PastStep
from cubicle.agent.tool_planner import ToolPlanner
from cubicle.client.sdk import AsyncDesktop
from cubicle.tools.frame import Size
from cubicle.tools.openai import OpenAIComputer, actions_of
from cubicle.tools.step import ToolStep


class OpenAIComputerPlanner(ToolPlanner):
    """An OpenAI model on `desktop` through the Responses API at `base_url` (None: the
    client's default, `OPENAI_BASE_URL` or OpenAI's)."""

    kind = "openai-computer"

    def __init__(
        self,
        desktop: AsyncDesktop,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 4096,
        timeout_s: float = 120.0,
        max_retries: int = 2,
    ) -> None:
        super().__init__(model)
        self.computer = OpenAIComputer(desktop)
        self.max_tokens = max_tokens
        try:
            self.client = openai.AsyncOpenAI(
                base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries
            )
        except openai.OpenAIError as exc:
            raise ModelError(f"cannot set up the OpenAI client: {exc}") from exc
        self._previous: str | None = None
        self._pending: str | None = None
        self._input: list[dict[str, Any]] = []
        """Input items for the next request."""
        self._extra: list[str] = []
        """Calls made beside the one acted on: one at a time, so they only get the screen."""

    @property
    def frame_size(self) -> Size:
        return self.computer.frame.size

    def _shots(self, call_ids: list[str], data_url: str) -> None:
        """Answer these calls with the screen `data_url`, and the extra calls too."""
        output = {"type": "computer_screenshot", "image_url": data_url}
        for call_id in [*call_ids, *self._extra]:
            self._input.append(
                {"type": "computer_call_output", "call_id": call_id, "output": output}
            )
        self._extra = []

    async def ask(self, observation: Observation, shot: bytes, history: Sequence[PastStep]) -> None:
        import base64

        url = f"data:image/png;base64,{base64.b64encode(shot).decode('ascii')}"
        news = history[-1].result if history else ""
        if self._previous is None:
            content = [
                {"type": "input_text", "text": f"The task: {observation.task}"},
                {"type": "input_image", "image_url": url},
            ]
            self._input = [{"role": "user", "content": content}]
        elif self._pending is not None:
            self._shots([self._pending], url)
            if news.startswith("error"):
                self._input.append({"role": "user", "content": news})
        else:
            content = [{"type": "input_text", "text": f"{news}\nThe screen now:".strip()}]
            content.append({"type": "input_image", "image_url": url})
            self._input.append({"role": "user", "content": content})
        self._pending = None

    async def turn(self) -> tuple[str, str, object | None]:
        try:
            response = await self.client.responses.create(
                model=self.model,
                instructions=self.system,
                tools=[self.computer.tool_param()],  # type: ignore[list-item]
                input=self._input,  # type: ignore[arg-type]
                previous_response_id=self._previous or openai.omit,
                max_output_tokens=self.max_tokens,
                truncation="auto",
            )
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            raise model_error(exc, endpoint="the OpenAI endpoint", model=self.model) from exc
        self._previous, self._input = response.id, []
        calls = [item for item in response.output if item.type == "computer_call"]
        text = (response.output_text or "").strip()
        call = calls[0] if calls else None
        self._extra = [extra.call_id for extra in calls[1:]]  # answered with the next screen
        answer = json.dumps(actions_of(call), ensure_ascii=False) if call else text
        return text, answer, call

    def refuse(self, call: object) -> str | None:
        checks = getattr(call, "pending_safety_checks", None) or []
        if not checks:
            return None
        shown = "; ".join(c.message or c.code or c.id for c in checks)
        return f"the model asks a person to confirm before it acts: {shown}"

    def plan(self, call: object) -> ToolStep:
        return self.computer.plan(call)

    async def answer_now(self, call: object, step: ToolStep | None, problem: str | None) -> None:
        self._shots([getattr(call, "call_id", "")], await self.computer.screenshot_url())
        if problem is not None:
            self._input.append({"role": "user", "content": f"That call could not run: {problem}"})

    def accept(self, call: object) -> None:
        self._pending = getattr(call, "call_id", None)

    async def aclose(self) -> None:
        await self.client.close()
