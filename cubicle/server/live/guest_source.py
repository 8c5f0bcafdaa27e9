"""A desktop's frames as its guest daemon streams them: `GET /frames`, `POST /frames/keyframe`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from cubicle.protocol.frames import EncodedFrame, read_frames
from cubicle.protocol.routes import GuestPath
from cubicle.server.guest_client import GuestClient

FPS = 30
"""Frames per second the guest is asked for at most; it sends frames only on change."""


class GuestFrames:
    """The `FrameSource` of one desktop, reached through its guest client."""

    def __init__(self, guest: Callable[[], GuestClient], *, fps: int = FPS) -> None:
        self._guest = guest
        """Hands out the desktop's guest client; raises once the desktop is gone."""
        self._fps = fps

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[AsyncIterator[EncodedFrame]]:
        # No read timeout: a still screen sends nothing for as long as it stays still.
        async with self._guest().stream(
            "GET", GuestPath.FRAMES, params={"fps": self._fps}, read_timeout_s=None
        ) as response:
            yield read_frames(response.chunks())

    async def request_keyframe(self) -> None:
        await self._guest().request("POST", GuestPath.FRAMES_KEYFRAME)
