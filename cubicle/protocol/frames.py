"""Encoded video frames and how they travel from the guest to the host.

`GET /frames` on the guest answers a stream of records, each a fixed 24-byte header and
one H.264 access unit in Annex-B form (start codes, SPS/PPS before every keyframe):

    offset  size  field
    0       4     magic b"CUBF"
    4       1     flags: bit 0 = keyframe
    5       3     reserved, zero
    8       8     pts: microseconds since the stream started (capture time), little-endian
    16      2     width in pixels
    18      2     height in pixels
    20      4     length of the access unit in bytes

The same `EncodedFrame` then feeds WebRTC viewers, recordings and the fallback transport.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

MAGIC = b"CUBF"
HEADER = struct.Struct("<4sB3xQHHI")
KEYFRAME = 0x01
MAX_FRAME_BYTES = 32 * 1024 * 1024
"""Largest access unit accepted from a guest; anything bigger is a broken stream."""


class FrameStreamError(ValueError):
    """The bytes on the wire are not a frame stream."""


@dataclass(frozen=True)
class EncodedFrame:
    """One H.264 access unit."""

    data: bytes
    """Annex-B bytes; a keyframe carries SPS and PPS in front of its IDR slice."""
    pts_us: int
    """Capture time in microseconds since the stream started."""
    keyframe: bool
    width: int
    """Pixels."""
    height: int
    """Pixels."""

    def pack(self) -> bytes:
        flags = KEYFRAME if self.keyframe else 0
        header = HEADER.pack(MAGIC, flags, self.pts_us, self.width, self.height, len(self.data))
        return header + self.data


def unpack_header(header: bytes) -> tuple[bool, int, int, int, int]:
    """(keyframe, pts_us, width, height, length) from a record header."""
    magic, flags, pts_us, width, height, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameStreamError(f"bad frame record magic {magic!r}")
    if length > MAX_FRAME_BYTES:
        raise FrameStreamError(f"frame of {length} bytes is over {MAX_FRAME_BYTES}")
    return bool(flags & KEYFRAME), pts_us, width, height, length


async def read_frames(chunks: AsyncIterator[bytes]) -> AsyncIterator[EncodedFrame]:
    """Reassemble frames from a byte stream cut at arbitrary places (an HTTP body)."""
    buffer = bytearray()
    need: tuple[bool, int, int, int, int] | None = None
    async for chunk in chunks:
        buffer += chunk
        while True:
            if need is None:
                if len(buffer) < HEADER.size:
                    break
                need = unpack_header(bytes(buffer[: HEADER.size]))
                del buffer[: HEADER.size]
            keyframe, pts_us, width, height, length = need
            if len(buffer) < length:
                break
            yield EncodedFrame(bytes(buffer[:length]), pts_us, keyframe, width, height)
            del buffer[:length]
            need = None


log = logging.getLogger("cubicle.frames")


class FrameSource(Protocol):
    """What a `Subscription` asks of the source it belongs to."""

    def request_keyframe(self) -> None: ...

    def detach(self, subscription: Subscription) -> None: ...


class Subscription:
    """One consumer's frames from a source, starting at a keyframe: the guest's video
    source hands these to the frame stream, the service's hub to viewers and recordings.

    An async iterator (ends once the source ended or the consumer closed it; raises the
    source's error if it failed) and an async context manager that closes it. A consumer
    that falls behind (more than `max_frames` queued, or more than `max_span_us` between
    the oldest queued frame and the newest) loses its backlog and waits for the next
    keyframe, which the source is asked for at once: a late viewer catches up to now, it
    does not play the past. Its methods belong on the event loop it was made on; a source
    that runs in a thread hands frames over with `loop.call_soon_threadsafe`.
    """

    def __init__(
        self,
        source: FrameSource,
        *,
        max_frames: int,
        max_span_us: int | None = None,
        name: str = "subscriber",
        fps: int = 30,
    ) -> None:
        self.name = name
        self.fps = fps
        """Frames per second this consumer wants at most."""
        self.dropped = 0
        """Frames this consumer never got: it was behind, or waiting for a keyframe."""
        self.loop = asyncio.get_running_loop()
        self._source = source
        self._max_frames = max_frames
        self._max_span_us = max_span_us
        self._queue: collections.deque[EncodedFrame] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._waiting_for_keyframe = True
        self._error: Exception | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> EncodedFrame:
        while not self._queue:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._queue.popleft()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop receiving frames; idempotent. The source may stop when nobody is left."""
        if not self._closed:
            self._closed = True
            self._queue.clear()
            self._wake()
            self._source.detach(self)

    # --- for the source ---------------------------------------------------------------------

    def offer(self, frame: EncodedFrame) -> None:
        """Queue `frame`, or drop it (and the backlog) if this consumer is behind."""
        if self._closed:
            return
        if not self._waiting_for_keyframe and self._queue and self._behind(frame):
            log.debug("%s fell behind: skipping %d frames", self.name, len(self._queue))
            self.dropped += len(self._queue)
            self._queue.clear()
            self._waiting_for_keyframe = True
            if not frame.keyframe:
                self._source.request_keyframe()
        if self._waiting_for_keyframe:
            if not frame.keyframe:
                self.dropped += 1
                return
            self._waiting_for_keyframe = False
        self._queue.append(frame)
        self._wake()

    def end(self) -> None:
        """The source ended: what is queued is still read, then the iteration stops."""
        self._closed = True
        self._wake()

    def fail(self, error: Exception) -> None:
        """The source failed: what is queued is still read, then `error` is raised."""
        self._error = error
        self.end()

    def _behind(self, frame: EncodedFrame) -> bool:
        if len(self._queue) >= self._max_frames:
            return True
        span = frame.pts_us - self._queue[0].pts_us
        return self._max_span_us is not None and span > self._max_span_us

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
