"""The one `Subscription` the guest's video source and the service's hub both hand out:
what a consumer receives when it keeps up, falls behind, or its source ends or fails."""

from __future__ import annotations

import asyncio

import pytest

from cubicle.protocol.errors import SandboxError
from cubicle.protocol.frames import EncodedFrame, Subscription

pytestmark = pytest.mark.fast


class Source:
    """A source that records what its subscriptions ask of it."""

    def __init__(self) -> None:
        self.keyframe_requests = 0
        self.detached: list[Subscription] = []

    def request_keyframe(self) -> None:
        self.keyframe_requests += 1

    def detach(self, subscription: Subscription) -> None:
        self.detached.append(subscription)


def frame(pts_ms: int, keyframe: bool = False) -> EncodedFrame:
    return EncodedFrame(b"x", pts_us=pts_ms * 1000, keyframe=keyframe, width=8, height=8)


async def drain(subscription: Subscription) -> list[int]:
    """The pts (ms) of every frame left, once the subscription has ended."""
    return [f.pts_us // 1000 async for f in subscription]


async def test_a_consumer_starts_at_a_keyframe_and_reads_in_order():
    subscription = Subscription(Source(), max_frames=10)
    for pts, key in [(1, False), (2, False), (3, True), (4, False), (5, False)]:
        subscription.offer(frame(pts, key))
    subscription.end()
    assert await drain(subscription) == [3, 4, 5]
    assert subscription.dropped == 2


async def test_one_that_falls_behind_loses_its_backlog_and_waits_for_a_fresh_keyframe():
    source = Source()
    subscription = Subscription(source, max_frames=3)
    subscription.offer(frame(0, keyframe=True))
    for pts in (1, 2, 3):  # with 0, 1 and 2 queued, 3 is one too many
        subscription.offer(frame(pts))
    assert source.keyframe_requests == 1
    for pts in (4, 5):  # still waiting for its keyframe: not asked again
        subscription.offer(frame(pts))
    assert source.keyframe_requests == 1
    subscription.offer(frame(6, keyframe=True))
    subscription.offer(frame(7))
    subscription.end()
    assert await drain(subscription) == [6, 7]
    assert subscription.dropped == 6  # 0, 1, 2 of the backlog; 3, 4, 5 while waiting


async def test_a_backlog_older_than_the_span_counts_as_behind():
    source = Source()
    subscription = Subscription(source, max_frames=100, max_span_us=50_000)
    subscription.offer(frame(0, keyframe=True))
    subscription.offer(frame(40))
    subscription.offer(frame(60, keyframe=True))  # 60 ms after the oldest: behind
    subscription.end()
    assert await drain(subscription) == [60]
    assert subscription.dropped == 2 and source.keyframe_requests == 0  # it had one


async def test_a_waiting_consumer_wakes_for_each_frame_and_for_the_end():
    subscription = Subscription(Source(), max_frames=10)
    reader = asyncio.create_task(drain(subscription))
    await asyncio.sleep(0)
    subscription.offer(frame(1, keyframe=True))
    await asyncio.sleep(0)
    subscription.offer(frame(2))
    subscription.end()
    assert await asyncio.wait_for(reader, 1) == [1, 2]


async def test_a_failed_source_raises_its_error_after_what_was_queued():
    subscription = Subscription(Source(), max_frames=10)
    subscription.offer(frame(1, keyframe=True))
    subscription.fail(SandboxError("capture failed"))
    assert (await anext(subscription)).pts_us == 1000
    with pytest.raises(SandboxError, match="capture failed"):
        await anext(subscription)


async def test_closing_detaches_once_and_drops_what_was_queued():
    source = Source()
    async with Subscription(source, max_frames=10) as subscription:
        subscription.offer(frame(1, keyframe=True))
    subscription.close()
    assert source.detached == [subscription]
    assert subscription.closed and await drain(subscription) == []
    subscription.offer(frame(2, keyframe=True))
    assert await drain(subscription) == []
