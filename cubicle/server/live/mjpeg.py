"""The fallback live view: JPEG screenshots as `multipart/x-mixed-replace` (MJPEG).

For browsers or networks where WebRTC does not get through. One poller per desktop asks
the guest for a JPEG (`GET /screenshot`, cursor drawn in) about a dozen times a second while
anyone watches, and every watcher gets the newest picture; a watcher that is slow simply
misses pictures, and an unchanged screen sends nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from cubicle.protocol.errors import CubicleError, DesktopUnavailable, NotFound
from cubicle.protocol.routes import GuestPath
from cubicle.server.guest_client import GuestClient

log = logging.getLogger("cubicle.streaming")

FPS = 12
"""Screenshots per second while anyone watches."""
QUALITY = 70
"""JPEG quality, 1–100."""
BOUNDARY = "cubicle-frame"
MEDIA_TYPE = f"multipart/x-mixed-replace; boundary={BOUNDARY}"


_PART_HEAD = f"\r\n--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n\r\n".encode()
FIRST = _PART_HEAD[2:]
"""What the body starts with: the first boundary and the first picture's headers."""


def part(jpeg: bytes) -> bytes:
    """One picture of the multipart body, then the next boundary and the next part's headers.

    Chromium shows a part only once the next part's headers have arrived; sending them
    right away (without a length, which is not known yet) shows each picture at once,
    the last one of a still screen included.
    """
    return jpeg + _PART_HEAD


class JpegFeed:
    """The newest JPEG of one desktop's screen, polled only while someone watches."""

    def __init__(
        self, guest: Callable[[], GuestClient], *, fps: int = FPS, name: str = "mjpeg"
    ) -> None:
        self.name = name
        self.watchers = 0
        self._guest = guest
        self._interval = 1 / fps
        self._latest: bytes | None = None
        self._version = 0
        self._changed = asyncio.Event()
        self._poller: asyncio.Task | None = None
        self._closed = False

    async def watch(self) -> AsyncIterator[bytes]:
        """The multipart body for one watcher: pictures as the screen changes, until closed."""
        self.watchers += 1
        if self._poller is None and not self._closed:
            self._poller = asyncio.create_task(self._poll(), name=f"{self.name}-poll")
        try:
            yield FIRST
            seen = 0
            while not self._closed:
                if self._version != seen and self._latest is not None:
                    seen = self._version
                    yield part(self._latest)
                else:
                    await self._changed.wait()
        finally:
            self.watchers -= 1
            if self.watchers == 0 and self._poller is not None:
                self._poller.cancel()
                self._poller = None

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                response = await self._guest().request(
                    "GET",
                    GuestPath.SCREENSHOT,
                    params={"format": "jpeg", "quality": QUALITY, "cursor": True},
                )
            except (DesktopUnavailable, NotFound) as exc:
                log.info("%s: %s", self.name, exc)
                self._end()
                return
            except CubicleError as exc:
                log.warning("%s: screenshot failed (%s); trying again in 1 s", self.name, exc)
                await asyncio.sleep(1)
                continue
            if response.content != self._latest:
                self._latest = response.content
                self._version += 1
                self._changed.set()
                self._changed = asyncio.Event()
            await asyncio.sleep(max(0.0, self._interval - (loop.time() - started)))

    def _end(self) -> None:
        self._closed = True
        self._changed.set()

    async def stop(self) -> None:
        """End every watcher's stream and stop polling; idempotent."""
        self._end()
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.wait([poller])
