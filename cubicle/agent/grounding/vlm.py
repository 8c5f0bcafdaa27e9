"""`VlmGrounder`: grounding with a vision-language model behind an OpenAI-compatible
chat-completions endpoint (vLLM, Ollama, OpenRouter, OpenAI…).

The family (see `families.py`) decides the prompt, the image size sent and how the answer
maps to screen pixels; this module sends the request, retries what is worth retrying and
turns `openai` exceptions into `ModelError`, here and nowhere else.
"""

from __future__ import annotations

import asyncio
import time
from typing import Self

from PIL import Image

from cubicle.agent._model import ChatModel
from cubicle.agent.grounding import _image
from cubicle.agent.grounding.base import Grounder, GroundingResult
from cubicle.agent.grounding.families import Family, get_family
from cubicle.protocol.errors import InvalidRequest


class VlmGrounder(Grounder):
    """Asks a grounding VLM where a described element is.

    `family` is one of `FAMILIES` ("os-atlas", "ui-tars", "ui-tars-1.5", "showui",
    "uground", "qwen2.5-vl", "generic"); `model` the model name the endpoint serves;
    `base_url` the endpoint, usually ending in `/v1`. Each request may take `timeout_s`
    seconds; timeouts, connection errors, 5xx and 429 answers are retried `max_retries`
    times, `retry_backoff_s` then twice that… apart.

    Building it connects to nothing; close it with `aclose()` (or `async with`).
    """

    def __init__(
        self,
        family: str,
        model: str,
        base_url: str,
        *,
        api_key: str = "EMPTY",
        timeout_s: float = 60.0,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self.family: Family = get_family(family)
        self.model = model
        self.base_url = base_url
        self._chat = ChatModel(
            model,
            base_url,
            api_key=api_key,
            role="grounding",
            timeout_s=timeout_s,
            max_retries=max_retries,
            retry_backoff_s=retry_backoff_s,
            temperature=self.family.temperature,
            max_tokens=self.family.max_tokens,
            extra_body=self.family.extra_body,
        )

    @property
    def source(self) -> str:
        """What results from this grounder carry in `GroundingResult.source`."""
        return f"vlm:{self.family.name}"

    async def ground(
        self,
        description: str,
        screenshot: bytes | Image.Image,
        screen_size: tuple[int, int],
    ) -> GroundingResult | None:
        """See `Grounder.ground`. The screenshot is resized per the family (to exactly its
        `smart_resize` size for absolute-pixel families) and sent as a PNG data URL."""
        started = time.monotonic()
        if not description.strip():
            raise InvalidRequest("describe the element to find; the description is empty")
        sent = await asyncio.to_thread(self._prepare, screenshot, screen_size)
        messages = self.family.build_messages(description, sent.data_url, sent.size)
        raw = (await self._chat.complete(messages)).text
        located = self.family.locate(raw, sent.size, screen_size)
        if located is None:
            return None
        x, y, box = located
        elapsed_ms = (time.monotonic() - started) * 1000
        return GroundingResult(x, y, box, raw=raw, source=self.source, elapsed_ms=elapsed_ms)

    def _prepare(
        self, screenshot: bytes | Image.Image, screen_size: tuple[int, int]
    ) -> _image.PreparedImage:
        image = _image.load(screenshot)
        _image.check_aspect(image.size, screen_size)
        return _image.prepare(image, self.family.image_size(image.size))

    async def aclose(self) -> None:
        """Close the HTTP connections; idempotent."""
        await self._chat.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
