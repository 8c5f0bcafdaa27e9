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

import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass

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
