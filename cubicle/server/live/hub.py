"""One encoded stream per desktop, fanned out to every viewer and recording.

A `FrameHub` reads a desktop's frames through one `FrameSource` while at least one
`Subscription` is open, and stops reading (so the guest stops encoding) when the last one
closes. Each subscription has its own bounded queue of about two seconds: a subscriber that
falls behind loses its queue and waits for the next keyframe, which the hub asks the source
for; the others never wait for it. A new subscriber also starts at a keyframe.

Frames leave the hub on the hub's own clock: microseconds since the hub was built, taken
from `time.monotonic()`, so that a reader that reconnects (and a guest whose stream starts
again at zero) still gives consumers timestamps that only grow, and so that actions stamped
with `clock_us()` line up with the video.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from cubicle.protocol.errors import CubicleError, DesktopUnavailable, NotFound
from cubicle.protocol.frames import EncodedFrame, FrameStreamError, Subscription

log = logging.getLogger("cubicle.streaming")

QUEUE_SECONDS = 2.0
"""How much video (seconds of timestamps) one subscriber may have waiting."""
QUEUE_FRAMES = 120
"""At most this many frames wait for one subscriber, whatever their timestamps say."""
KEYFRAME_INTERVAL_S = 0.5
"""Keyframe requests reach the source at most this often; requests in between are merged."""
RETRY_S = (0.25, 5.0)
"""First and longest wait before reading again after the source failed, seconds."""


class FrameSource(Protocol):
    """Where a hub's frames come from: the guest's `GET /frames`, or a test encoder."""

    def open(self) -> AbstractAsyncContextManager[AsyncIterator[EncodedFrame]]:
        """Start the stream; the first frame is a keyframe. Leaving the context ends it."""
        ...

    async def request_keyframe(self) -> None:
        """Ask for the next frame to be a keyframe (with SPS and PPS)."""
        ...


@dataclass(frozen=True)
class HubStats:
    subscribers: int
    reading: bool
    """Whether the reader is connected to the source right now."""
    readers_started: int
    """How many times the hub opened its source since it was built."""
    frames: int
    """Frames received from the source."""
    keyframes: int
    """Keyframes among them."""
    keyframe_requests: int
    """Keyframe requests sent to the source."""
    dropped: int
    """Frames skipped for slow or joining subscribers, summed over all of them."""
    fps: float
    """Frames received per second over the last two seconds."""
    width: int | None
    """Pixels of the last frame; None before the first."""
    height: int | None


class FrameHub:
    """Reads one source for as long as anyone subscribes, and fans its frames out."""

    def __init__(self, source: FrameSource, *, name: str = "hub") -> None:
        self.name = name
        self._source = source
        self._epoch = time.monotonic()
        self._subscribers: list[Subscription] = []
        self._reader: asyncio.Task | None = None
        self._retired: asyncio.Task | None = None
        """A reader told to stop whose stream may still be closing."""
        self._keyframer: asyncio.Task | None = None
        self._keyframe_wanted = asyncio.Event()
        self._wanted_at = 0.0
        self._last_keyframe_at = 0.0
        self._reading = False
        self._stopped = False
        self._last_pts = -1
        self._arrivals: collections.deque[float] = collections.deque()
        self._size: tuple[int, int] | None = None
        self._counts = collections.Counter[str]()

    # --- the hub's clock -------------------------------------------------------------------

    def clock_us(self, monotonic: float | None = None) -> int:
        """Microseconds on the frames' clock for a `time.monotonic()` value (default: now)."""
        return int(((time.monotonic() if monotonic is None else monotonic) - self._epoch) * 1e6)

    # --- subscribers -----------------------------------------------------------------------

    def subscribe(self, name: str = "subscriber") -> Subscription:
        """A new subscription, starting at the next keyframe; starts the reader if needed."""
        subscription = Subscription(
            self, max_frames=QUEUE_FRAMES, max_span_us=int(QUEUE_SECONDS * 1e6), name=name
        )
        if self._stopped:
            subscription.end()
            return subscription
        self._subscribers.append(subscription)
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name=f"{self.name}-reader")
            self._keyframer = asyncio.create_task(self._keyframes(), name=f"{self.name}-keys")
        elif self._reading:
            self.request_keyframe()  # a fresh reader starts with a keyframe anyway
        return subscription

    def detach(self, subscription: Subscription) -> None:
        """`subscription` is closed: it gets no more frames."""
        if subscription not in self._subscribers:
            return
        self._subscribers.remove(subscription)
        self._counts["dropped"] += subscription.dropped
        if not self._subscribers and self._reader is not None:
            # Nobody watches: stop reading, so the guest stops encoding. A subscriber that
            # comes back starts a new reader, which first waits for this one to finish.
            old, self._reader = self._reader, None
            keyframer, self._keyframer = self._keyframer, None
            old.cancel()
            if keyframer is not None:
                keyframer.cancel()
            self._retired = old

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    # --- keyframes -------------------------------------------------------------------------

    def request_keyframe(self) -> None:
        """Ask the source for a keyframe soon; requests are merged and rate-limited."""
        # The latest request counts: a keyframe that came before it does not answer it.
        self._wanted_at = time.monotonic()
        self._keyframe_wanted.set()

    async def _keyframes(self) -> None:
        while True:
            await self._keyframe_wanted.wait()
            self._keyframe_wanted.clear()
            if self._last_keyframe_at >= self._wanted_at:
                continue  # one arrived since it was asked for
            try:
                await self._source.request_keyframe()
                self._counts["keyframe_requests"] += 1
            except CubicleError as exc:
                log.debug("%s: keyframe request failed: %s", self.name, exc)
            await asyncio.sleep(KEYFRAME_INTERVAL_S)

    # --- reading ---------------------------------------------------------------------------

    async def _read(self) -> None:
        if (retired := self._retired) is not None:
            self._retired = None
            await asyncio.wait([retired])
        wait = RETRY_S[0]
        while True:
            try:
                async with self._source.open() as frames:
                    self._counts["readers_started"] += 1
                    self._reading = True
                    offset: int | None = None
                    async for frame in frames:
                        if offset is None:
                            offset = self.clock_us() - frame.pts_us
                        self._publish(frame, offset)
                        wait = RETRY_S[0]
                log.info("%s: the frame stream ended; reading again", self.name)
            except (DesktopUnavailable, NotFound) as exc:
                log.info("%s: %s", self.name, exc)
                self._end_all()
                return
            except (CubicleError, FrameStreamError) as exc:
                log.warning("%s: reading frames failed (%s); again in %.2f s", self.name, exc, wait)
            finally:
                self._reading = False
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_S[1])

    def _publish(self, frame: EncodedFrame, offset: int) -> None:
        pts = max(frame.pts_us + offset, self._last_pts + 1)
        self._last_pts = pts
        frame = dataclasses.replace(frame, pts_us=pts)
        now = time.monotonic()
        self._counts["frames"] += 1
        if frame.keyframe:
            self._counts["keyframes"] += 1
            self._last_keyframe_at = now
        self._size = (frame.width, frame.height)
        self._arrivals.append(now)
        while self._arrivals and self._arrivals[0] < now - 2.0:
            self._arrivals.popleft()
        for subscription in self._subscribers:
            subscription.offer(frame)

    def _end_all(self) -> None:
        for subscription in self._subscribers:
            self._counts["dropped"] += subscription.dropped
            subscription.end()
        self._subscribers.clear()
        self._reader = None
        if self._keyframer is not None:
            self._keyframer.cancel()
            self._keyframer = None

    # --- lifecycle -------------------------------------------------------------------------

    def stats(self) -> HubStats:
        now = time.monotonic()
        recent = [t for t in self._arrivals if t >= now - 2.0]
        return HubStats(
            subscribers=len(self._subscribers),
            reading=self._reading,
            readers_started=self._counts["readers_started"],
            frames=self._counts["frames"],
            keyframes=self._counts["keyframes"],
            keyframe_requests=self._counts["keyframe_requests"],
            dropped=self._counts["dropped"] + sum(s.dropped for s in self._subscribers),
            fps=len(recent) / 2.0,
            width=self._size[0] if self._size else None,
            height=self._size[1] if self._size else None,
        )

    async def stop(self) -> None:
        """End every subscription and stop reading for good; idempotent."""
        self._stopped = True
        tasks = [t for t in (self._reader, self._keyframer, self._retired) if t is not None]
        self._reader = self._keyframer = self._retired = None
        for subscription in list(self._subscribers):
            subscription.end()
        self._subscribers.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
