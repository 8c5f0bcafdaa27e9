"""A real frame source for host-side tests: a moving pattern encoded by libx264.

Encoded as the guest encodes (ultrafast, zerolatency, constrained baseline, SPS/PPS on every
keyframe, keyframes only at the start and on request), at a steady frame rate, so hub,
WebRTC and recording tests run on real H.264 without a desktop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from fractions import Fraction

import av
import numpy as np

from cubicle.protocol.frames import EncodedFrame


class PatternFrames:
    """A `FrameSource`: a bar moving across a gradient, `fps` frames a second."""

    def __init__(self, width: int = 320, height: int = 240, *, fps: int = 30) -> None:
        self.width, self.height, self.fps = width, height, fps
        self.opens = 0
        """How many times a stream was opened."""
        self.open_now = 0
        """Streams open right now."""
        self.keyframe_requests = 0
        self.keyframe_requested = asyncio.Event()
        """Set by every keyframe request; clear it to wait for the next one."""
        self._want_keyframe = False

    def _codec(self) -> av.VideoCodecContext:
        codec = av.CodecContext.create("libx264", "w")
        codec.width, codec.height = self.width, self.height
        codec.pix_fmt = "yuv420p"
        codec.time_base = Fraction(1, 1_000_000)
        codec.framerate = Fraction(self.fps, 1)
        codec.options = {
            "preset": "ultrafast",
            "tune": "zerolatency",
            "profile": "baseline",
            "forced-idr": "1",
            "x264-params": "keyint=100000:bframes=0:repeat-headers=1:annexb=1",
        }
        codec.open()
        return codec

    def _picture(self, index: int) -> av.VideoFrame:
        image = np.zeros((self.height, self.width, 3), np.uint8)
        image[:, :, 0] = np.linspace(0, 255, self.width, dtype=np.uint8)[None, :]
        image[:, :, 2] = np.linspace(0, 255, self.height, dtype=np.uint8)[:, None]
        left = (index * 8) % self.width
        image[:, left : left + 16] = 255
        return av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")

    def _encode(self, codec: av.VideoCodecContext, index: int, pts_us: int, key: bool) -> bytes:
        picture = self._picture(index)
        picture.pts = pts_us
        picture.pict_type = av.video.frame.PictureType.I if key else av.video.frame.PictureType.NONE
        (packet,) = codec.encode(picture)
        return bytes(packet)

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[AsyncIterator[EncodedFrame]]:
        self.opens += 1
        self.open_now += 1
        try:
            yield self._frames()
        finally:
            self.open_now -= 1

    async def _frames(self) -> AsyncIterator[EncodedFrame]:
        codec = self._codec()
        started = time.monotonic()
        index = 0
        while True:
            pts_us = int((time.monotonic() - started) * 1e6)
            key = index == 0 or self._want_keyframe
            self._want_keyframe = False
            data = await asyncio.to_thread(self._encode, codec, index, pts_us, key)
            yield EncodedFrame(data, pts_us, key, self.width, self.height)
            index += 1
            await asyncio.sleep(max(0.0, started + index / self.fps - time.monotonic()))

    async def request_keyframe(self) -> None:
        self.keyframe_requests += 1
        self.keyframe_requested.set()
        self._want_keyframe = True
