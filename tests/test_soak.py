"""A short soak (`bench/soak.py`): desktops created, watched, recorded and deleted, and
board tasks run, for 45 s; then nothing the service held at the start has grown: no
process, file descriptor, cgroup directory, mount, sandbox directory or temp file left
behind. The service's memory may grow a little while Python's caches warm up, never by
more than 64 MiB in so short a run (the 10-minute run reports its ratio)."""

from __future__ import annotations

import pytest

from bench.soak import soak


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_short_soak_leaves_nothing_behind():
    result = soak(45)
    assert result.cycles >= 3 and result.tasks >= 1, result
    assert result.errors == []
    assert result.grew == {}, f"left behind: {result.grew} (start {result.start}, end {result.end})"
    assert result.end.processes == 1  # the service alone: no sandbox or helper outlived it
    assert result.end.service_rss_mb < result.start.service_rss_mb + 64
