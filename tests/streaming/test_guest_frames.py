"""`GET /frames` end to end: a real sandboxed desktop, read over its guest socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from cubicle.protocol.frames import EncodedFrame, read_frames
from tests.streaming.h264 import Decoder, nal_types


@pytest.fixture
async def guest(service, desktop) -> AsyncIterator[httpx.AsyncClient]:
    socket = service.data_dir / "desktops" / desktop["id"] / "guest.sock"
    transport = httpx.AsyncHTTPTransport(uds=str(socket))
    async with httpx.AsyncClient(transport=transport, base_url="http://guest", timeout=30) as c:
        yield c


async def stats(guest: httpx.AsyncClient) -> dict:
    response = await guest.get("/frames/stats")
    assert response.status_code == 200, response.text
    return response.json()


async def settle_to_idle(guest: httpx.AsyncClient) -> dict:
    """Stats once the last reader has left and the encoder thread has stopped."""
    for _ in range(100):
        current = await stats(guest)
        if current["subscribers"] == 0 and not current["encoder_running"]:
            return current
        await asyncio.sleep(0.02)
    pytest.fail(f"the encoder still runs with nobody reading: {current}")


async def next_frame(frames: AsyncIterator[EncodedFrame], within: float = 5.0) -> EncodedFrame:
    return await asyncio.wait_for(anext(frames), within)


async def test_frames_stream_a_keyframe_then_what_the_api_changes(api, desktop, guest):
    before = await settle_to_idle(guest)
    async with guest.stream("GET", "/frames", params={"fps": 30}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/octet-stream"
        frames = read_frames(response.aiter_raw())
        decoder = Decoder()
        first = await next_frame(frames)
        assert first.keyframe and nal_types(first.data)[:2] == [7, 8]
        picture = decoder.decode(first)
        assert (picture.width, picture.height) == (1280, 800) == (first.width, first.height)
        assert (await stats(guest))["subscribers"] == 1

        launched = await asyncio.to_thread(
            api.post, f"/api/desktops/{desktop['id']}/launch", json={"app": "mousepad"}
        )
        assert launched.status_code == 200, launched.text
        changed = await next_frame(frames, within=10.0)
        decoder.decode(changed)
        assert changed.pts_us > first.pts_us

        keyframe_asked = await guest.post("/frames/keyframe")
        assert keyframe_asked.status_code == 204
        for _ in range(100):  # mousepad may still be drawing: frames before the IDR are fine
            frame = await next_frame(frames, within=2.0)
            decoder.decode(frame)
            if frame.keyframe:
                break
        else:
            pytest.fail("no keyframe after POST /frames/keyframe")
    after = await settle_to_idle(guest)  # leaving the stream stops the encoder
    assert after["encoders_started"] == before["encoders_started"] + 1
    assert after["frames_encoded"] > before["frames_encoded"]


async def test_two_readers_share_one_encoder(guest):
    before = await settle_to_idle(guest)
    async with (
        guest.stream("GET", "/frames") as one,
        guest.stream("GET", "/frames", params={"fps": 10}) as two,
    ):
        frames_one, frames_two = read_frames(one.aiter_raw()), read_frames(two.aiter_raw())
        first_one, first_two = await next_frame(frames_one), await next_frame(frames_two)
        assert first_one.keyframe and first_two.keyframe
        during = await stats(guest)
        assert during["subscribers"] == 2 and during["encoder_running"]
        assert during["encoders_started"] == before["encoders_started"] + 1
        assert during["fps"] == 30
    await settle_to_idle(guest)


async def test_bad_fps_is_a_4xx(guest):
    response = await guest.get("/frames", params={"fps": 0})
    assert response.status_code == 422
    assert "fps" in response.json()["detail"]
