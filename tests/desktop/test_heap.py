"""The service hands its free heap back to the system after a desktop ends
(`cubicle.server.heap.HeapTrim`), measured on this process's own resident memory."""

from __future__ import annotations

import asyncio

import pytest

from cubicle.server.heap import HeapTrim, malloc_trim

pytestmark = pytest.mark.fast


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(malloc_trim() is None, reason="no glibc malloc_trim")
def test_a_trim_returns_what_was_freed_and_comes_once_for_many_ends():
    async def scenario() -> tuple[float, float, int]:
        heap = HeapTrim(delay_s=0.2)
        # 120 MB in blocks under malloc's mmap threshold (so from the heap), a few kept
        # alive between the freed ones, as a desktop's life leaves it.
        blocks = [bytearray(30_000) for _ in range(4000)]
        kept = blocks[::50]
        del blocks
        before = _rss_mb()
        for _ in range(5):  # five desktops end at once
            heap.soon()
        await asyncio.sleep(1.0)
        after = _rss_mb()
        await heap.close()
        assert len(kept) == 80
        return before, after, heap.trims

    before, after, trims = asyncio.run(scenario())
    assert trims == 1
    assert before - after > 60, f"resident {before:.0f} MB before the trim, {after:.0f} after"


def test_closing_drops_a_trim_still_to_come():
    async def scenario() -> int:
        heap = HeapTrim(delay_s=30)
        heap.soon()
        await heap.close()
        await heap.close()  # idempotent
        return heap.trims

    assert asyncio.run(scenario()) == 0
