"""A real HTTP server that speaks the OpenAI chat-completions protocol with scripted answers.

The only stand-in in Cubicle's tests is the model. `FakeModelServer` runs uvicorn on a free
127.0.0.1 port in a background thread; the real `openai` client talks to it over a real
socket. Each request to `POST /v1/chat/completions` takes the next scripted `Turn`: an
answer, an HTTP error, an answer after a delay (a hang, when the delay outlasts the client's
timeout), or a body that is not JSON at all. Every request is recorded.

    server = FakeModelServer()
    server.start()
    server.script(["(197,525)", Turn.error(500), Turn.hang(5.0)])
    ... AsyncOpenAI(base_url=server.url, api_key="k") ...
    server.requests[0].image_sizes  # [(1288, 812)]
    server.stop()
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Self

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from PIL import Image

UNSCRIPTED_STATUS = 418
"""Status of the answer to a request for which no turn was scripted (never retried)."""


@dataclass(frozen=True)
class Turn:
    """What the server does for one request."""

    content: str = ""
    """The assistant message's text (status 200 only)."""
    status: int = 200
    """HTTP status; anything but 200 answers an OpenAI-style error body."""
    delay_s: float = 0.0
    """Seconds to wait before answering; `stop()` and `reset()` cut the wait short."""
    body: str | None = None
    """A raw body sent instead of a completion, e.g. garbage that is not JSON."""
    media_type: str = "application/json"
    """Content-Type of a raw `body`."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Extra response headers, e.g. {"retry-after": "0"}."""
    tool_calls: tuple[tuple[str, str], ...] = ()
    """(function name, arguments as JSON text) of each tool call; the content is then null,
    as servers that parse tool calls answer."""
    usage: tuple[int, int] | None = (0, 0)
    """(prompt tokens, completion tokens) the answer's `usage` reports; None leaves it out."""

    @classmethod
    def answer(
        cls, content: str, *, delay_s: float = 0.0, usage: tuple[int, int] | None = (0, 0)
    ) -> Turn:
        return cls(content=content, delay_s=delay_s, usage=usage)

    @classmethod
    def tool_call(cls, name: str, arguments: Mapping[str, Any]) -> Turn:
        """A parsed tool call, the way vLLM's tool parsers hand it back."""
        return cls(tool_calls=((name, json.dumps(arguments)),))

    @classmethod
    def error(cls, status: int, message: str = "", **headers: str) -> Turn:
        text = message or f"scripted HTTP {status}"
        return cls(content=text, status=status, headers=headers)

    @classmethod
    def hang(cls, delay_s: float, content: str = "") -> Turn:
        """Answer `content` only after `delay_s` seconds (past the client's timeout)."""
        return cls(content=content, delay_s=delay_s)

    @classmethod
    def garbage(
        cls, body: str = "<html>502 Bad Gateway</html>", media_type: str = "text/html"
    ) -> Turn:
        """A 200 whose body is not a chat completion."""
        return cls(body=body, media_type=media_type)


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received, as sent."""

    method: str
    path: str
    headers: Mapping[str, str]
    """Request headers, names lower-case."""
    raw_body: bytes
    body: Any
    """The JSON body decoded, or None when it was not JSON."""
    received_at: float
    """`time.monotonic()` when it arrived."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", [])) if isinstance(self.body, dict) else []

    def texts(self, role: str | None = None) -> list[str]:
        """The text of every message (of `role`, if given), text parts in order."""
        found: list[str] = []
        for message in self.messages:
            if role is not None and message.get("role") != role:
                continue
            content = message.get("content")
            if isinstance(content, str):
                found.append(content)
            elif isinstance(content, list):
                found.extend(p["text"] for p in content if p.get("type") == "text")
        return found

    @property
    def text(self) -> str:
        """All the prompt's text, every role, joined with newlines."""
        return "\n".join(self.texts())

    def image_urls(self) -> list[str]:
        return [
            part["image_url"]["url"]
            for message in self.messages
            if isinstance(message.get("content"), list)
            for part in message["content"]
            if part.get("type") == "image_url"
        ]

    def images(self) -> list[Image.Image]:
        """Every `image_url` part decoded (data URLs only)."""
        decoded = []
        for url in self.image_urls():
            header, _, data = url.partition(",")
            if not (header.startswith("data:image/") and header.endswith(";base64")):
                raise ValueError(f"not a base64 image data URL: {url[:60]!r}")
            image = Image.open(io.BytesIO(base64.b64decode(data)))
            image.load()
            decoded.append(image)
        return decoded

    @property
    def image_sizes(self) -> list[tuple[int, int]]:
        """(width, height) of every image sent, in pixels."""
        return [image.size for image in self.images()]


class FakeModelServer:
    """An OpenAI-compatible chat-completions server replaying scripted turns."""

    def __init__(self, models: Iterable[str] = ("fake-model",)) -> None:
        self.models = list(models)
        self._lock = threading.Condition()
        self._turns: deque[Turn] = deque()
        self._responder: Callable[[RecordedRequest], str | Turn] | None = None
        self._requests: list[RecordedRequest] = []
        self._release = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    @property
    def url(self) -> str:
        """The base URL for OpenAI clients, ending in /v1."""
        if self._port is None:
            raise RuntimeError("start() the FakeModelServer first")
        return f"http://127.0.0.1:{self._port}/v1"

    def start(self) -> None:
        if self._thread is not None:
            return
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fake-model", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake model server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop serving; idempotent. Requests still waiting out a delay are cut short."""
        if self._thread is None or self._server is None:
            return
        self._release_waiters()
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._thread = None
        self._server = None

    def script(self, turns: Iterable[str | Turn]) -> None:
        """The next requests get these turns, in order (a str is an answer); replaces any
        turns not yet used."""
        with self._lock:
            self._turns = deque(t if isinstance(t, Turn) else Turn.answer(t) for t in turns)

    def respond_with(self, responder: Callable[[RecordedRequest], str | Turn] | None) -> None:
        """Answer requests no scripted turn is left for with `responder(request)`: for
        several runs at once, whose requests interleave (None: answer 418 again)."""
        with self._lock:
            self._responder = responder

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every chat-completions request received since the last `reset()`, in order."""
        with self._lock:
            return list(self._requests)

    def wait_for_requests(self, count: int, timeout_s: float = 10.0) -> list[RecordedRequest]:
        """Block until `count` requests have arrived (from an async test: through
        `asyncio.to_thread`); `TimeoutError` after `timeout_s` seconds."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._requests) >= count, timeout_s):
                got = len(self._requests)
                raise TimeoutError(f"{got} of {count} requests arrived within {timeout_s} s")
            return list(self._requests)

    @property
    def pending(self) -> int:
        """Scripted turns not used yet."""
        with self._lock:
            return len(self._turns)

    def reset(self) -> None:
        """Forget the script and the recorded requests; cut pending delays short."""
        with self._lock:
            self._turns.clear()
            self._requests.clear()
            self._responder = None
        self._release_waiters()

    def release(self) -> None:
        """Answer every request waiting out a delay now (the script stays)."""
        self._release_waiters()

    def _release_waiters(self) -> None:
        old, self._release = self._release, asyncio.Event()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(old.set)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            self._loop = asyncio.get_running_loop()
            yield

        app = FastAPI(lifespan=lifespan)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models
            ]
            return {"object": "list", "data": data}

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request) -> Response:
            raw = await request.body()
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            recorded = RecordedRequest(
                method=request.method,
                path=request.url.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                raw_body=raw,
                body=body,
                received_at=time.monotonic(),
            )
            with self._lock:
                self._requests.append(recorded)
                self._lock.notify_all()
                number = len(self._requests)
                turn = self._turns.popleft() if self._turns else None
                responder = self._responder
            if turn is None and responder is not None:
                answer = responder(recorded)
                turn = answer if isinstance(answer, Turn) else Turn.answer(answer)
            if turn is None:
                return _error(
                    UNSCRIPTED_STATUS, f"FakeModelServer: no turn scripted for request #{number}"
                )
            if not isinstance(body, dict) or body.get("stream"):
                return _error(400, "FakeModelServer takes a non-streaming JSON body")
            if turn.delay_s:
                release = self._release
                with suppress(TimeoutError):
                    await asyncio.wait_for(release.wait(), turn.delay_s)
            if turn.body is not None:
                return Response(turn.body, media_type=turn.media_type, headers=dict(turn.headers))
            if turn.status != 200:
                return _error(turn.status, turn.content, dict(turn.headers))
            return JSONResponse(_completion(number, body.get("model", ""), turn))

        return app


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    error = {"message": message, "type": "fake_error", "param": None, "code": status}
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def _completion(number: int, model: str, turn: Turn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if turn.tool_calls:
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": f"call-{number}-{index}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for index, (name, arguments) in enumerate(turn.tool_calls)
        ]
    completion: dict[str, Any] = {
        "id": f"chatcmpl-fake-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if turn.tool_calls else "stop",
                "logprobs": None,
            }
        ],
    }
    if turn.usage is not None:
        prompt, answer = turn.usage
        completion["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": answer,
            "total_tokens": prompt + answer,
        }
    return completion
