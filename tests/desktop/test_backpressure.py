"""Slow calls are bounded per desktop: past a short line they get 429 with `Retry-After`,
and cheap calls still answer meanwhile (issue 17)."""

from __future__ import annotations

import asyncio

import httpx

from cubicle import AsyncDesktop
from cubicle.protocol.lanes import LANES


async def test_a_flood_of_screenshots_gets_429_with_retry_after_and_the_cursor_still_answers(
    service, desktop
):
    base = f"/api/desktops/{desktop['id']}"
    headers = {"Authorization": f"Bearer {service.token}"}
    running, waiting, _ = LANES["screenshot"]
    flood = 4 * (running + waiting)
    limits = httpx.Limits(max_connections=flood + 8)
    async with httpx.AsyncClient(
        base_url=service.url, headers=headers, timeout=120, limits=limits
    ) as client:
        # The pointer drawn in makes every picture a fresh encoding (none comes from cache).
        shots = [
            client.get(f"{base}/screenshot", params={"format": "png", "cursor": "true"})
            for _ in range(flood)
        ]
        cursor = client.get(f"{base}/cursor")
        answers = await asyncio.gather(*shots, cursor)
    *pictures, where = answers
    assert where.status_code == 200 and set(where.json()) == {"x", "y"}
    statuses = [answer.status_code for answer in pictures]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(200) >= running
    refused = [answer for answer in pictures if answer.status_code == 429]
    assert refused, "no screenshot was refused although the line was full"
    for answer in refused:
        assert answer.json()["error"] == "busy"
        assert int(answer.headers["retry-after"]) >= 1
    for answer in pictures:
        if answer.status_code == 200:
            assert answer.content.startswith(b"\x89PNG")


async def test_the_sdk_waits_out_busy_answers_by_itself(service, desktop):
    running, waiting, _ = LANES["screenshot"]
    remote = await AsyncDesktop.connect(desktop["id"], base_url=service.url, token=service.token)
    try:
        pictures = await asyncio.gather(
            *(remote.screenshot() for _ in range(2 * (running + waiting)))
        )
    finally:
        await remote.close()
    assert all(picture.startswith(b"\x89PNG") for picture in pictures)
