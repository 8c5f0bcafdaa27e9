"""Real HTTP servers speaking the Anthropic Messages API and the OpenAI Responses API, with
scripted answers: the only stand-in in these tests is the model.

`FakeVendorServer` runs uvicorn on a free 127.0.0.1 port in a background thread, and the
real `anthropic` and `openai` clients (and the OpenAI Agents SDK on top of the latter) talk
to it over a real socket:

    server = FakeVendorServer().start()
    server.script("messages", [claude_tool_use({"action": "screenshot"}), claude_text("done")])
    client = anthropic.AsyncAnthropic(base_url=server.url, api_key="k")
    server.script("responses", [computer_call([{"type": "click", ...}]), response_text("ok")])
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="k")

Each request to `POST /v1/messages` or `POST /v1/responses` takes the next reply scripted
for that API (a body built with the helpers below, or a function of the request giving
one); a request with no reply left gets HTTP 418. Every request is recorded.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from PIL import Image

Api = Literal["messages", "responses"]
Reply = Mapping[str, Any] | Callable[["VendorRequest"], Mapping[str, Any]]
_ids = itertools.count(1)


@dataclass(frozen=True)
class VendorRequest:
    """One request as received."""

    api: Api
    headers: Mapping[str, str]
    body: Any

    def images(self) -> list[Image.Image]:
        """Every image the request carries (base64 blocks and data URLs), decoded, in order."""
        found: list[Image.Image] = []

        def visit(node: Any) -> None:
            if isinstance(node, dict):
                source = node.get("source")
                if node.get("type") == "image" and isinstance(source, dict):
                    found.append(_decode(source["data"]))
                url = node.get("image_url")
                if isinstance(url, str) and url.startswith("data:image/"):
                    found.append(_decode(url.partition(",")[2]))
                for value in node.values():
                    visit(value)
            elif isinstance(node, list):
                for item in node:
                    visit(item)

        visit(self.body)
        return found

    def texts(self) -> str:
        """Every `text` string of the request, joined by newlines."""
        found: list[str] = []

        def visit(node: Any) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    if key == "text" and isinstance(value, str):
                        found.append(value)
                    else:
                        visit(value)
            elif isinstance(node, list):
                for item in node:
                    visit(item)

        visit(self.body)
        return "\n".join(found)


def _decode(data: str) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    image.load()
    return image


# --- Anthropic Messages API ---------------------------------------------------------------


def _message(content: list[dict[str, Any]], stop_reason: str) -> dict[str, Any]:
    return {
        "id": f"msg_fake_{next(_ids)}",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def claude_tool_use(tool_input: Mapping[str, Any], *, text: str = "", name: str = "computer"):
    """An assistant message calling the computer tool with `tool_input`."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content.append(
        {"type": "tool_use", "id": f"toolu_fake_{next(_ids)}", "name": name, "input": tool_input}
    )
    return _message(content, "tool_use")


def claude_text(text: str) -> dict[str, Any]:
    """An assistant message that ends the turn with `text`."""
    return _message([{"type": "text", "text": text}], "end_turn")


# --- OpenAI Responses API -----------------------------------------------------------------


def _response(output: list[dict[str, Any]]) -> dict[str, Any]:
    usage = {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }
    return {
        "id": f"resp_fake_{next(_ids)}",
        "object": "response",
        "created_at": time.time(),
        "model": "gpt-fake",
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "status": "completed",
        "usage": usage,
    }


def computer_call(
    actions: list[Mapping[str, Any]], *, pending_safety_checks: Iterable[Mapping] = ()
) -> dict[str, Any]:
    """A response whose output is one `computer_call` with the batch `actions`."""
    number = next(_ids)
    call = {
        "type": "computer_call",
        "id": f"cu_fake_{number}",
        "call_id": f"call_fake_{number}",
        "actions": list(actions),
        "pending_safety_checks": list(pending_safety_checks),
        "status": "completed",
    }
    return _response([call])


def response_text(text: str) -> dict[str, Any]:
    """A response whose output is one assistant message saying `text`."""
    message = {
        "type": "message",
        "id": f"msg_fake_{next(_ids)}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return _response([message])


# --- the server ---------------------------------------------------------------------------


class FakeVendorServer:
    """Scripted Messages and Responses endpoints on one local port."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._replies: dict[Api, deque[Reply]] = {"messages": deque(), "responses": deque()}
        self._requests: list[VendorRequest] = []
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    @property
    def url(self) -> str:
        """The base URL: as is for `anthropic` clients, with `/v1` for `openai` ones."""
        if self._port is None:
            raise RuntimeError("start() the FakeVendorServer first")
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> Self:
        if self._thread is not None:
            return self
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fake-vendor", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the fake vendor server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._thread is None or self._server is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._thread = self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def script(self, api: Api, replies: Iterable[Reply]) -> None:
        """The next requests to `api` get these replies, in order (replacing any left)."""
        with self._lock:
            self._replies[api] = deque(replies)

    def reset(self) -> None:
        with self._lock:
            for queue in self._replies.values():
                queue.clear()
            self._requests.clear()

    @property
    def pending(self) -> int:
        with self._lock:
            return sum(len(queue) for queue in self._replies.values())

    def requests(self, api: Api | None = None) -> list[VendorRequest]:
        with self._lock:
            return [r for r in self._requests if api is None or r.api == api]

    def _app(self) -> FastAPI:
        app = FastAPI()

        async def answer(api: Api, request: Request) -> JSONResponse:
            try:
                body = json.loads(await request.body())
            except ValueError:
                body = None
            recorded = VendorRequest(api, {k.lower(): v for k, v in request.headers.items()}, body)
            with self._lock:
                self._requests.append(recorded)
                reply = self._replies[api].popleft() if self._replies[api] else None
            if reply is None:
                error = {"type": "error", "error": {"type": "fake", "message": "no reply scripted"}}
                return JSONResponse(error, status_code=418)
            if not isinstance(body, dict) or body.get("stream"):
                return JSONResponse({"error": {"message": "non-streaming JSON only"}}, 400)
            return JSONResponse(dict(reply(recorded) if callable(reply) else reply))

        @app.post("/v1/messages")
        async def messages(request: Request) -> JSONResponse:
            return await answer("messages", request)

        @app.post("/v1/responses")
        async def responses(request: Request) -> JSONResponse:
            return await answer("responses", request)

        return app
