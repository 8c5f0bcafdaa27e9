"""The `anthropic` planner: Claude with its computer tool, through the Messages API.

One conversation per run. The first message holds the task and the screen; each later
step answers Claude's last tool call with the screen after it (or the error). Screenshots
are sent at the size Anthropic recommends (`AnthropicComputer`), and only the last few are
kept in the conversation.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anthropic

from cubicle.agent.errors import ModelError, model_error
from cubicle.agent.planner import Observation, PastStep
from cubicle.agent.tool_planner import ToolPlanner
from cubicle.client.sdk import AsyncDesktop
from cubicle.tools.anthropic import AnthropicComputer, Version
from cubicle.tools.frame import Size
from cubicle.tools.step import ToolStep

_OLD_SCREENSHOT = {"type": "text", "text": "[an earlier screenshot, no longer shown]"}


class ClaudePlanner(ToolPlanner):
    """Claude on `desktop` through the Messages API at `base_url` (None: the client's
    default, `ANTHROPIC_BASE_URL` or Anthropic's), `api_key` (None: `ANTHROPIC_API_KEY`)."""

    kind = "anthropic"

    def __init__(
        self,
        desktop: AsyncDesktop,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        version: Version = "computer_20251124",
        max_tokens: int = 4096,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        keep_screenshots: int = 3,
    ) -> None:
        super().__init__(model)
        self.computer = AnthropicComputer(desktop, version=version)
        self.max_tokens = max_tokens
        self.keep_screenshots = max(1, keep_screenshots)
        try:
            self.client = anthropic.AsyncAnthropic(
                base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries
            )
        except anthropic.AnthropicError as exc:
            raise ModelError(f"cannot set up the Anthropic client: {exc}") from exc
        self.messages: list[dict[str, Any]] = []
        self._pending: str | None = None
        self._answers: list[dict[str, Any]] = []
        """tool_result blocks to send with the next user message."""

    @property
    def frame_size(self) -> Size:
        return self.computer.frame.size

    async def ask(self, observation: Observation, shot: bytes, history: Sequence[PastStep]) -> None:
        image = self.computer.image_block(shot)
        if not self.messages:
            task = {"type": "text", "text": f"The task: {observation.task}\nThe screen now:"}
            self.messages.append({"role": "user", "content": [task, image]})
        elif self._pending is None:  # the last step ended without a call to answer
            news = history[-1].result if history else ""
            note = {"type": "text", "text": f"{news}\nThe screen now:".strip()}
            self.messages.append({"role": "user", "content": [*self._answers, note, image]})
        else:
            last = history[-1].result if history else ""
            answer: dict[str, Any] = {"type": "tool_result", "tool_use_id": self._pending}
            if last.startswith("error"):
                answer |= {"content": [{"type": "text", "text": last}, image], "is_error": True}
            else:
                answer["content"] = [image]
            self.messages.append({"role": "user", "content": [*self._answers, answer]})
        self._answers, self._pending = [], None

    async def turn(self) -> tuple[str, str, object | None]:
        _forget_old_screenshots(self.messages, self.keep_screenshots)
        try:
            message = await self.client.beta.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                system=self.system,
                tools=[self.computer.tool_param()],  # type: ignore[list-item]
                messages=self.messages,  # type: ignore[arg-type]
                betas=[self.computer.beta_flag],
            )
        except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
            raise model_error(exc, endpoint="the Anthropic endpoint", model=self.model) from exc
        blocks = [block.model_dump(exclude_none=True) for block in message.content]
        self.messages.append({"role": "assistant", "content": blocks})
        text = "\n".join(b["text"] for b in blocks if b["type"] == "text").strip()
        uses = [b for b in blocks if b["type"] == "tool_use"]
        for extra in uses[1:]:  # one action at a time: later ones are answered, not run
            self._answers.append(_error(extra["id"], "one computer action at a time: ask again"))
        call = uses[0] if uses else None
        answer = json.dumps(call["input"], ensure_ascii=False) if call else text
        return text, answer, call

    def plan(self, call: object) -> ToolStep:
        assert isinstance(call, dict)
        return self.computer.plan(call["input"], call.get("name"))

    async def answer_now(self, call: object, step: ToolStep | None, problem: str | None) -> None:
        assert isinstance(call, dict)
        if problem is not None or step is None:
            answer = _error(call["id"], problem or "this call cannot run")
        else:
            content = await self.computer.observe(step)
            answer = {"type": "tool_result", "tool_use_id": call["id"], "content": content}
        self.messages.append({"role": "user", "content": [*self._answers, answer]})
        self._answers = []

    def accept(self, call: object) -> None:
        assert isinstance(call, dict)
        self._pending = call["id"]

    async def aclose(self) -> None:
        await self.client.close()


def _error(tool_use_id: str, message: str) -> dict[str, Any]:
    content = [{"type": "text", "text": message}]
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": True}


def _forget_old_screenshots(messages: list[dict[str, Any]], keep: int) -> None:
    """Replace all but the last `keep` images of the conversation with a short note."""
    seen = 0
    for message in reversed(messages):
        if message["role"] != "user":
            continue
        for holder in _image_holders(message["content"]):
            for index, block in reversed(list(enumerate(holder))):
                if block.get("type") == "image":
                    seen += 1
                    if seen > keep:
                        holder[index] = _OLD_SCREENSHOT


def _image_holders(content: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    holders = [content]
    holders += [
        b["content"]
        for b in content
        if b.get("type") == "tool_result" and isinstance(b.get("content"), list)
    ]
    return holders
