"""The service gives its free heap back to the system after a desktop ends.

A desktop's life passes through the service's heap: its recording's buffers, its stream's
frames, the screenshots its agent sent to a model. glibc keeps what was freed for the next
allocation, spread over its arenas, and returns little of it by itself, so a busy service's
resident memory crept up cycle after cycle: in a soak of 200 s (a desktop created,
watched, recorded and deleted every 2.5 s, a board task every third), 255 MB, of which
`malloc_trim` handed back 45. `HeapTrim.soon()` does that a moment after a desktop ended
(at most once per moment however many ended), on a thread, so the event loop never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger("cubicle.heap")

DELAY_S = 2.0
"""Seconds after a desktop ended before the heap is trimmed (what ended with it is freed
by then)."""


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (musl)."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class HeapTrim:
    """Trims the heap `delay_s` after `soon()`, once however often it was called meanwhile."""

    def __init__(self, delay_s: float = DELAY_S) -> None:
        self._delay_s = delay_s
        self._trim = malloc_trim()
        self._pending: asyncio.Task[None] | None = None
        self.trims = 0
        """Trims done so far."""
        if self._trim is None:
            log.info("no glibc malloc_trim here: the service keeps its free heap")

    def soon(self) -> None:
        """Something big was just freed: trim in a moment, unless a trim is coming already."""
        if self._trim is None or (self._pending is not None and not self._pending.done()):
            return
        self._pending = asyncio.create_task(self._later(self._trim), name="trim-heap")

    async def _later(self, trim: Callable[[int], int]) -> None:
        await asyncio.sleep(self._delay_s)
        await asyncio.to_thread(trim, 0)
        self.trims += 1

    async def close(self) -> None:
        """Drop a trim still to come; idempotent."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
