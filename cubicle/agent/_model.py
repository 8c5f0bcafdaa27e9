"""`ChatModel`: the agent's door to an OpenAI-compatible chat-completions endpoint.

Timeouts, retries with exponential backoff, and the translation of `openai` exceptions into
`ModelError` happen here and nowhere else, for planners and VLM grounders alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from cubicle.agent.errors import ModelError, excerpt, model_error

log = logging.getLogger(__name__)

Messages = list[ChatCompletionMessageParam]

_MAX_RETRY_AFTER_S = 30.0
"""Longest `Retry-After` of a 429 answer honoured, in seconds."""


@dataclass(frozen=True, slots=True)
class Completion:
    """A model's answer and what it cost."""

    text: str
    """The first choice's text."""
    elapsed_ms: float
    """Wall time of the whole call in milliseconds, retries and backoff included."""
    attempts: int
    """Requests made (1 when the first one answered)."""
    prompt_tokens: int | None = None
    """Tokens the endpoint counted in the request (its `usage`); None when it says nothing."""
    completion_tokens: int | None = None
    """Tokens the endpoint counted in the answer; None when it says nothing."""


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


def _retry_after_s(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after")
    try:
        return min(float(value), _MAX_RETRY_AFTER_S) if value is not None else None
    except ValueError:
        return None


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"


class ChatModel:
    """One model behind one endpoint, for one role ("planner").

    Each request may take `timeout_s` seconds; timeouts, connection errors, 5xx, 429 and
    answers that are no chat completion (a proxy's error page) are retried `max_retries`
    times, `retry_backoff_s` then twice that… apart. `temperature`
    None leaves the server's default. Building it connects to nothing.
    """

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str = "EMPTY",
        role: str = "planner",
        timeout_s: float = 120.0,
        max_retries: int = 2,
        retry_backoff_s: float = 1.0,
        temperature: float | None = 0.0,
        max_tokens: int = 1024,
        extra_body: Mapping[str, object] | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.role = role
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.extra_body = dict(extra_body) if extra_body else None
        """Fields sent beside the standard ones (vLLM's `skip_special_tokens`, say)."""
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0
        )

    async def complete(self, messages: Messages) -> Completion:
        """The model's answer to `messages`; `ModelError` once retries are spent."""
        started = time.monotonic()
        attempts = self.max_retries + 1
        for attempt in range(1, attempts + 1):
            delay = self.retry_backoff_s * 2 ** (attempt - 1)
            try:
                completion = await self._client.chat.completions.create(
                    model=self.model,
                    messages=messages,
                    max_tokens=self.max_tokens,
                    temperature=openai.omit if self.temperature is None else self.temperature,
                    extra_body=self.extra_body,
                )
            except openai.APIStatusError as exc:
                if not _retryable(exc.status_code) or attempt == attempts:
                    raise self._status_error(exc, attempt) from exc
                delay = max(delay, _retry_after_s(exc) or 0.0)
                reason = f"HTTP {exc.status_code}"
            except openai.APITimeoutError as exc:
                if attempt == attempts:
                    raise ModelError(
                        f"the {self.role} model endpoint {self.base_url} did not answer within "
                        f"{self.timeout_s:g} s ({_attempts(attempt)}); check that the server is "
                        "up and not overloaded, or raise the timeout",
                        attempts=attempt,
                    ) from exc
                reason = "timeout"
            except openai.APIConnectionError as exc:
                if attempt == attempts:
                    raise ModelError(
                        f"cannot reach the {self.role} model endpoint {self.base_url} "
                        f"({exc.__cause__ or exc}; {_attempts(attempt)}); check that the server "
                        "runs and that the base URL is right",
                        attempts=attempt,
                    ) from exc
                reason = "connection error"
            except (openai.APIResponseValidationError, json.JSONDecodeError) as exc:
                # A proxy's error page, a server restarting: as passing as a 502.
                body = exc.doc if isinstance(exc, json.JSONDecodeError) else str(exc.body)
                if attempt == attempts:
                    raise self._not_a_completion(body, attempt) from exc
                reason = "an answer that is not a chat completion"
            else:
                try:
                    text = self._answer_text(completion, attempt)
                except ModelError:
                    if attempt == attempts:
                        raise
                    reason = "an answer that is not a chat completion"
                else:
                    elapsed_ms = (time.monotonic() - started) * 1000
                    usage = getattr(completion, "usage", None)
                    return Completion(
                        text=text,
                        elapsed_ms=elapsed_ms,
                        attempts=attempt,
                        prompt_tokens=getattr(usage, "prompt_tokens", None),
                        completion_tokens=getattr(usage, "completion_tokens", None),
                    )
            log.warning(
                "%s model %s: %s (attempt %d of %d), retrying in %.1f s",
                self.role,
                self.model,
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
            f"the {self.role} model endpoint {self.base_url} answered with something that is "
            f"not a chat completion: {excerpt(body, 200)}; check that the base URL points to "
            "an OpenAI-compatible API (it usually ends in /v1)",
            attempts=attempt,
        )

    def _status_error(self, exc: openai.APIStatusError, attempt: int) -> ModelError:
        endpoint = f"the {self.role} model endpoint {self.base_url}"
        return model_error(exc, endpoint=endpoint, model=self.model, attempts=attempt)

    async def aclose(self) -> None:
        """Close the HTTP connections; idempotent."""
        await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
