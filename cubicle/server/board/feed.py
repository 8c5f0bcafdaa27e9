"""`BoardFeed`: board events fanned out to every open page (server-sent events).

Each listener gets a bounded queue. A listener that falls that far behind is dropped
rather than slowing the board: its stream ends, and the page reconnects and reloads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from cubicle.protocol.board import BoardEvent

_BACKLOG = 1_000
"""Events a listener may fall behind before it is dropped."""


class BoardFeed:
    """Publish board changes; `listen()` yields them as SSE messages."""

    def __init__(self) -> None:
        self._listeners: set[asyncio.Queue[str | None]] = set()

    def publish(self, kind: BoardEvent, **data: Any) -> None:
        """Send event `kind` with `data` (JSON-able) to every listener."""
        message = f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n"
        for queue in list(self._listeners):
            try:
                queue.put_nowait(message)
            except asyncio.QueueFull:
                self._drop(queue)

    def close(self) -> None:
        """End every stream (the service is stopping)."""
        for queue in list(self._listeners):
            self._drop(queue)

    def _drop(self, queue: asyncio.Queue[str | None]) -> None:
        """End one listener's stream: what it has not read yet is dropped."""
        self._listeners.discard(queue)
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(None)

    async def listen(self, heartbeat_s: float = 15.0) -> AsyncIterator[str]:
        """SSE text: a `hello` event, then every event, with a comment line as heartbeat."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(_BACKLOG)
        self._listeners.add(queue)
        try:
            yield f"retry: 1000\nevent: {BoardEvent.HELLO}\ndata: {{}}\n\n"
            while True:
                try:
                    message = await asyncio.wait_for(queue.get(), heartbeat_s)
                except TimeoutError:
                    yield ": still here\n\n"
                    continue
                if message is None:
                    return
                yield message
        finally:
            self._listeners.discard(queue)
