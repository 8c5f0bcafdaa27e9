"""`VlmGrounder`: grounding with a vision-language model behind an OpenAI-compatible
chat-completions endpoint (vLLM, Ollama, OpenRouter, OpenAI…).

The family (see `families.py`) decides the prompt, the image size sent and how the answer
maps to screen pixels; this module sends the request, retries what is worth retrying and
turns `openai` exceptions into `ModelError`, here and nowhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Self

import openai
from openai.types.chat import ChatCompletion
from PIL import Image

from agent.errors import ModelError, excerpt
from agent.grounding import _image
from agent.grounding.base import Grounder, GroundingResult
from agent.grounding.families import Family, Messages, get_family
from desktop.errors import InvalidRequest

log = logging.getLogger(__name__)

_MAX_RETRY_AFTER_S = 30.0
"""Longest `Retry-After` of a 429 answer honoured, in seconds."""


def _given(value: float | None) -> float | openai.Omit:
    """None leaves the field out of the request (the server's default applies)."""
    return openai.omit if value is None else value


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


def _retry_after_s(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after")
    try:
        return min(float(value), _MAX_RETRY_AFTER_S) if value is not None else None
    except ValueError:  # an HTTP date: rare from model servers, fall back to our backoff
        return None


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
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0
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
        raw = await self._complete(messages)
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

    async def _complete(self, messages: Messages) -> str:
        """The model's answer text; `ModelError` once retries are spent or not worth it."""
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            delay = self.retry_backoff_s * 2 ** (attempt - 1)
            try:
                completion = await self._client.chat.completions.create(
                    model=self.model,
                    messages=messages,
                    max_tokens=self.family.max_tokens,
                    temperature=_given(self.family.temperature),
                    extra_body=dict(self.family.extra_body) or None,
                )
            except openai.APIStatusError as exc:
                if not _retryable(exc.status_code) or attempt == attempts:
                    raise ModelError(
                        self._status_message(exc, attempt), status=exc.status_code, attempts=attempt
                    ) from exc
                delay = max(delay, _retry_after_s(exc) or 0.0)
                reason = f"HTTP {exc.status_code}"
            except openai.APITimeoutError as exc:
                if attempt == attempts:
                    raise ModelError(
                        f"the model endpoint {self.base_url} did not answer within "
                        f"{self.timeout_s:g} s ({_attempts(attempt)}); check that the server "
                        "is up and not overloaded, or raise timeout_s",
                        attempts=attempt,
                    ) from exc
                reason = "timeout"
            except openai.APIConnectionError as exc:
                if attempt == attempts:
                    raise ModelError(
                        f"cannot reach the model endpoint {self.base_url} "
                        f"({exc.__cause__ or exc}; {_attempts(attempt)}); check that the "
                        "server runs and that base_url is right",
                        attempts=attempt,
                    ) from exc
                reason = "connection error"
            except (openai.APIResponseValidationError, json.JSONDecodeError) as exc:
                body = exc.doc if isinstance(exc, json.JSONDecodeError) else str(exc.body)
                raise self._not_a_completion(body, attempt) from exc
            else:
                return self._answer_text(completion, attempt)
            log.warning(
                "model %s at %s: %s (attempt %d of %d), retrying in %.1f s",
                self.model,
                self.base_url,
                reason,
                attempt,
                attempts,
                delay,
            )
            await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _answer_text(self, completion: object, attempt: int) -> str:
        """The text of the first choice; tool calls (servers that parse Qwen's <tool_call>
        themselves) are turned back into the text the model wrote."""
        if not isinstance(completion, ChatCompletion):  # the client hands back non-JSON text
            raise self._not_a_completion(str(completion), attempt)
        choices = getattr(completion, "choices", None)  # unset when the JSON is no completion
        if not choices:
            raise self._not_a_completion(completion.to_json(indent=None), attempt)
        message = choices[0].message
        text = message.content or ""
        for call in message.tool_calls or ():
            function = getattr(call, "function", None)
            if function is not None:
                payload = (
                    f'{{"name": {json.dumps(function.name)}, "arguments": {function.arguments}}}'
                )
                text += f"<tool_call>\n{payload}\n</tool_call>"
        return text

    def _not_a_completion(self, body: str, attempt: int) -> ModelError:
        return ModelError(
            f"the model endpoint {self.base_url} answered with something that is not a chat "
            f"completion: {excerpt(body, 200)}; check that base_url points to an "
            "OpenAI-compatible API (it usually ends in /v1)",
            attempts=attempt,
        )

    def _status_message(self, exc: openai.APIStatusError, attempt: int) -> str:
        status = exc.status_code
        said = excerpt(exc.message, 300)
        where = f"the model endpoint {self.base_url}"
        if status in (401, 403):
            hint = "check the API key"
        elif status == 404:
            hint = f"check base_url (it usually ends in /v1) and the model name {self.model!r}"
        elif status == 429:
            hint = "the endpoint is rate-limiting: slow down or raise its limits"
        elif status >= 500:
            hint = f"check the server's log and that it serves {self.model!r}"
        else:
            hint = f"check that it serves {self.model!r} and that this model accepts images"
        tries = f" on all {attempt} attempts" if attempt > 1 else ""
        return f"{where} answered HTTP {status}{tries}: {said}; {hint}"

    async def aclose(self) -> None:
        """Close the HTTP connections; idempotent."""
        await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
