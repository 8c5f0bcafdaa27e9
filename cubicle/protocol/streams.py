"""Async streams both sides pass on: stop one when something else happens first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import TypeVar

T = TypeVar("T")


async def until(items: AsyncGenerator[T, None], stop: Awaitable[object]) -> AsyncIterator[T]:
    """`items` until they end or `stop` completes, whichever comes first; `items` is
    closed either way, cancelled or not (its `finally` runs: a command's stream ends its
    command)."""
    stopped = asyncio.ensure_future(stop)
    following: asyncio.Future[T] | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(items))
            await asyncio.wait((following, stopped), return_when=asyncio.FIRST_COMPLETED)
            if not following.done():
                return
            try:
                item = following.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        for pending in (following, stopped):
            if pending is not None and not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await pending
        await items.aclose()
