"""The guest's live video: `GET /frames`, `POST /frames/keyframe`, `GET /frames/stats`.

`GET /frames` answers a stream of packed `EncodedFrame` records (see `cubicle.protocol.frames`)
starting at a keyframe, for as long as the client reads; every client shares the desktop's
one encoder. Nothing is sent while the screen does not change.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from cubicle.guest.web import query
from cubicle.protocol.errors import DesktopGone
from cubicle.protocol.frames import EncodedFrame, Subscription
from cubicle.protocol.models import FramesQuery
from cubicle.protocol.routes import GuestPath

if TYPE_CHECKING:
    from cubicle.guest.video.source import VideoSource, VideoStats


@functools.cache
def _stats() -> TypeAdapter[VideoStats]:
    from cubicle.guest.video.source import VideoStats

    return TypeAdapter(VideoStats)


def frame_routes(source: Callable[[], VideoSource]) -> list[Route]:
    """The routes; `source` gives the video source, made (and PyAV loaded) on first use."""

    async def frames(request: Request) -> Response:
        fps = query(request, FramesQuery).fps
        subscription = source().subscribe(fps)
        try:  # the first keyframe, so a broken capture is a 5xx rather than an empty stream
            first = await anext(subscription)
        except StopAsyncIteration:
            subscription.close()
            raise DesktopGone("the desktop's video stopped: it is shutting down") from None
        except BaseException:
            subscription.close()
            raise
        return _FrameStream(subscription, first)

    async def keyframe(request: Request) -> Response:
        source().request_keyframe()
        return Response(status_code=204)

    async def stats(request: Request) -> Response:
        return Response(_stats().dump_json(source().stats()), media_type="application/json")

    return [
        Route(GuestPath.FRAMES, frames, methods=["GET"]),
        Route(GuestPath.FRAMES_KEYFRAME, keyframe, methods=["POST"]),
        Route(GuestPath.FRAMES_STATS, stats, methods=["GET"]),
    ]


class _FrameStream(StreamingResponse):
    """Packed frame records; the subscription ends however the response ends.

    Closing in `__call__` rather than in the body generator also covers a client that
    leaves before the body is first iterated (a generator never started has no `finally`).
    """

    def __init__(self, subscription: Subscription, first: EncodedFrame) -> None:
        async def records():
            yield first.pack()
            async for frame in subscription:
                yield frame.pack()

        super().__init__(
            records(), media_type="application/octet-stream", headers={"Cache-Control": "no-store"}
        )
        self._subscription = subscription

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._subscription.close()
