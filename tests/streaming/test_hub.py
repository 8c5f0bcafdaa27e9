"""The host's fan-out: one reader per desktop, bounded queues, keyframes on join."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from cubicle.server.live.hub import QUEUE_SECONDS, FrameHub
from tests.streaming.pattern_source import PatternFrames

pytestmark = pytest.mark.fast


async def take(subscription, count: int, timeout_s: float = 10.0) -> list:
    frames = []
    async with asyncio.timeout(timeout_s):
        async for frame in subscription:
            frames.append(frame)
            if len(frames) == count:
                return frames
    return frames


async def test_five_subscribers_share_one_reader_and_each_starts_at_a_keyframe():
    source = PatternFrames()
    hub = FrameHub(source)
    try:
        subscriptions = [hub.subscribe(f"viewer-{n}") for n in range(5)]
        received = await asyncio.gather(*(take(s, 20) for s in subscriptions))
        assert source.opens == 1 and hub.stats().readers_started == 1
        for frames in received:
            assert len(frames) == 20
            assert frames[0].keyframe
            assert all(b.pts_us > a.pts_us for a, b in itertools.pairwise(frames))
        assert hub.stats().subscribers == 5
    finally:
        await hub.stop()
    assert source.open_now == 0


async def test_the_reader_runs_only_while_someone_subscribes():
    source = PatternFrames()
    hub = FrameHub(source)
    try:
        first = hub.subscribe()
        await take(first, 3)
        first.close()
        await asyncio.sleep(0.2)
        assert source.open_now == 0 and not hub.stats().reading
        frames_then = hub.stats().frames
        await asyncio.sleep(0.3)
        assert hub.stats().frames == frames_then  # nothing read, nothing encoded

        again = hub.subscribe()
        frames = await take(again, 3)
        assert source.opens == 2
        assert frames[0].keyframe
        # The hub's clock keeps growing across the restart although the source began at 0.
        assert frames[0].pts_us > 0.4e6
    finally:
        await hub.stop()


async def test_a_joining_subscriber_starts_at_a_keyframe_asked_of_the_source():
    source = PatternFrames()  # keyframes only at the start and on request
    hub = FrameHub(source)
    try:
        first = hub.subscribe("first")
        await take(first, 10)
        requests = source.keyframe_requests
        started = time.monotonic()
        late = hub.subscribe("late")
        (frame,) = await take(late, 1, timeout_s=3)
        assert frame.keyframe
        assert source.keyframe_requests == requests + 1
        assert time.monotonic() - started < 1.0
    finally:
        await hub.stop()


async def test_every_joiner_gets_its_keyframe_when_requests_meet_in_the_cool_down():
    source = PatternFrames()  # keyframes only at the start and on request
    hub = FrameHub(source)
    try:
        first = hub.subscribe("first")
        await take(first, 3)
        second = hub.subscribe("second")
        await take(second, 1)  # its request went out: the next waits out the rate limit
        third = hub.subscribe("third")  # asks during the wait
        await source.request_keyframe()  # a keyframe comes for some other reason
        await take(third, 1)
        fourth = hub.subscribe("fourth")  # asks after that keyframe, still during the wait
        # Its keyframe comes once the rate limit allows, not when something else asks.
        (frame,) = await take(fourth, 1, timeout_s=1.0)
        assert frame.keyframe
    finally:
        await hub.stop()


async def test_a_slow_subscriber_skips_to_a_keyframe_without_holding_up_the_others():
    source = PatternFrames(fps=30)
    hub = FrameHub(source)
    try:
        fast = hub.subscribe("fast")
        slow = hub.subscribe("slow")
        await take(slow, 1)
        # The fast one reads every frame while the slow one reads nothing for 3 s.
        fast_frames = await take(fast, int(30 * (QUEUE_SECONDS + 1)))
        # The fast one lost nothing: it got (or has queued) every frame the hub received.
        assert fast.dropped == 0
        assert len(fast_frames) + len(fast._queue) == hub.stats().frames
        assert all(b.pts_us > a.pts_us for a, b in itertools.pairwise(fast_frames))
        assert slow.dropped > 0
        # What the slow one finds when it reads again: at most ~2 s queued, starting at a
        # keyframe the hub asked for when it fell behind.
        queued = len(slow._queue)
        assert queued <= 30 * QUEUE_SECONDS + 5
        (next_frame,) = await take(slow, 1)
        assert next_frame.keyframe
        assert source.keyframe_requests >= 1
    finally:
        await hub.stop()


async def test_keyframe_requests_are_merged_and_rate_limited():
    source = PatternFrames()
    hub = FrameHub(source)
    try:
        subscription = hub.subscribe()
        await take(subscription, 5)
        before = source.keyframe_requests
        for _ in range(50):
            hub.request_keyframe()
            await asyncio.sleep(0.01)
        assert 1 <= source.keyframe_requests - before <= 2
    finally:
        await hub.stop()


async def test_stop_ends_every_subscription():
    hub = FrameHub(PatternFrames())
    subscription = hub.subscribe()
    await take(subscription, 2)
    await hub.stop()
    await hub.stop()  # idempotent
    assert await take(subscription, 1000, timeout_s=2) is not None
    assert subscription.closed
    assert hub.subscribe().closed  # a stopped hub hands out ended subscriptions
