"""`Lane`: a bounded line for one desktop's slow calls, on both sides of the guest protocol.

Slow calls (a screenshot's encoding, a file's transfer, an accessibility snapshot) run a few
at a time per desktop; a few more may wait for their turn; past that, the call is answered
at once with `Busy` (429 and `Retry-After`) instead of joining a queue that only grows. Cheap
calls (the cursor, a click) never take a lane, so they never wait behind a slow one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from desktop.protocol.errors import Busy


class Lane:
    """At most `running` calls at once; at most `waiting` more wait; others get `Busy`."""

    def __init__(self, name: str, *, running: int, waiting: int) -> None:
        self.name = name
        self.running = running
        self.waiting = waiting
        self._slots = asyncio.Semaphore(running)
        self._waiters = 0
        self.refused = 0
        """Calls answered `Busy` so far."""

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the lane's slots for the body of the `async with`."""
        if self._slots.locked() and self._waiters >= self.waiting:
            self.refused += 1
            raise Busy(
                f"{self.running} {self.name} calls run and {self._waiters} wait on this "
                f"desktop: retry in {Busy.retry_after_s} s"
            )
        self._waiters += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiters -= 1
        try:
            yield
        finally:
            self._slots.release()


LANES: dict[str, tuple[int, int]] = {
    "screenshot": (2, 16),
    "files": (2, 8),
    "a11y": (1, 4),
}
"""Each slow kind of call: (how many run at once, how many more may wait), per desktop.

Sixteen screenshots may wait on one desktop: a dozen agents looking at the same desktop
still get their pictures in turn; more than that is a client that does not wait for its
answers, and it hears `Busy`."""


def desktop_lanes() -> dict[str, Lane]:
    """A fresh set of lanes for one desktop."""
    return {
        kind: Lane(kind, running=running, waiting=waiting)
        for kind, (running, waiting) in LANES.items()
    }
