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
from enum import StrEnum

from cubicle.protocol.errors import Busy


class LaneName(StrEnum):
    """The slow kinds of call that take a lane, on both sides."""

    SCREENSHOT = "screenshot"
    FILES = "files"
    A11Y = "a11y"


class Lane:
    """At most `running` calls at once; at most `waiting` more wait; others get `Busy`."""

    def __init__(self, name: LaneName, *, running: int, waiting: int, max_wait_s: float) -> None:
        self.name = name
        self.running = running
        self.waiting = waiting
        self.max_wait_s = max_wait_s
        """Longest a call waits for its turn before it hears `Busy` after all."""
        self._slots = asyncio.Semaphore(running)
        self._waiters = 0
        self.refused = 0
        """Calls answered `Busy` so far."""

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the lane's slots for the body of the `async with`."""
        if self._slots.locked() and self._waiters >= self.waiting:
            raise self._busy(f"{self._waiters} wait")
        self._waiters += 1
        try:
            async with asyncio.timeout(self.max_wait_s):
                await self._slots.acquire()
        except TimeoutError:
            raise self._busy(f"this one waited {self.max_wait_s:g} s") from None
        finally:
            self._waiters -= 1
        try:
            yield
        finally:
            self._slots.release()

    def _busy(self, waiting: str) -> Busy:
        self.refused += 1
        return Busy(
            f"{self.running} {self.name} calls run on this desktop and {waiting}: "
            f"retry in {Busy.retry_after_s} s"
        )


LANES: dict[LaneName, tuple[int, int, float]] = {
    LaneName.SCREENSHOT: (2, 16, 2.0),
    LaneName.FILES: (2, 8, 10.0),
    LaneName.A11Y: (1, 4, 10.0),
}
"""Each slow kind of call, per desktop: (how many run at once, how many more may wait, the
longest one waits in seconds).

Sixteen screenshots may wait on one desktop, two seconds at most: a dozen agents looking at
the same desktop still get their pictures in turn; more than that, or a desktop too slow to
keep up, and callers hear `Busy` rather than wait ever longer."""


def desktop_lanes() -> dict[LaneName, Lane]:
    """A fresh set of lanes for one desktop."""
    return {
        kind: Lane(kind, running=running, waiting=waiting, max_wait_s=wait_s)
        for kind, (running, waiting, wait_s) in LANES.items()
    }
