"""What each desktop uses, read every few seconds and kept for its life.

`Metrics` asks each running or paused desktop's sandbox for its `Usage` (cgroup counters,
QEMU's process, the disk image: file reads, done in a worker thread, all desktops in one
go) every `CUBICLE_METRICS_INTERVAL_S`, turns the CPU time into a percentage over the
interval, and keeps the last `KEEP` readings of each desktop (six hours at the default
interval, about 100 bytes each). `GET /api/desktops/{id}/metrics` reads them, and E2B's
`get_metrics` too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from cubicle.protocol.service import UsageSample
from cubicle.server.runtime import Sandbox
from cubicle.server.runtime.base import Usage

log = logging.getLogger("cubicle.metrics")

KEEP = 4320
"""Readings kept per desktop, the oldest dropped first."""


class Metrics:
    """The readings of every desktop, and the task that takes them."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._series: dict[str, deque[UsageSample]] = {}
        self._cpu: dict[str, tuple[float, float]] = {}
        """Per desktop: when (monotonic) and its CPU seconds at its last reading."""
        self._task: asyncio.Task | None = None

    def start(self, sandboxes: Callable[[], list[tuple[str, Sandbox]]]) -> None:
        """Read what `sandboxes()` names (desktop id, sandbox) every interval from now."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(sandboxes), name="desktop-metrics")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, sandboxes: Callable[[], list[tuple[str, Sandbox]]]) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.sample(sandboxes())
            except Exception:  # a reading gone wrong must not end the readings
                log.exception("reading desktops' usage failed")

    async def sample(self, sandboxes: list[tuple[str, Sandbox]]) -> None:
        """Take one reading of each of `sandboxes` now."""
        readings = await asyncio.to_thread(_read, sandboxes)
        at = datetime.now(UTC)
        for desktop_id, when, usage in readings:
            self._series.setdefault(desktop_id, deque(maxlen=KEEP)).append(
                self._sample(desktop_id, at, when, usage)
            )

    def _sample(self, desktop_id: str, at: datetime, when: float, usage: Usage) -> UsageSample:
        cpu_pct = None
        if usage.cpu_s is not None:
            before = self._cpu.get(desktop_id)
            if before is not None and when > before[0]:
                cpu_pct = round(max(0.0, usage.cpu_s - before[1]) / (when - before[0]) * 100, 1)
            self._cpu[desktop_id] = (when, usage.cpu_s)
        return UsageSample(
            at=at,
            cpu_pct=cpu_pct,
            memory_bytes=usage.memory_bytes,
            memory_cache_bytes=usage.memory_cache_bytes,
            disk_bytes=usage.disk_bytes,
            net_rx_bytes=usage.net_rx_bytes,
            net_tx_bytes=usage.net_tx_bytes,
        )

    def latest(self, desktop_id: str) -> UsageSample | None:
        series = self._series.get(desktop_id)
        return series[-1] if series else None

    def series(
        self, desktop_id: str, start: datetime | None = None, end: datetime | None = None
    ) -> list[UsageSample]:
        """Its readings from `start` to `end` (both included), oldest first."""
        return [
            sample
            for sample in self._series.get(desktop_id, ())
            if (start is None or sample.at >= start) and (end is None or sample.at <= end)
        ]

    def forget(self, desktop_id: str) -> None:
        self._series.pop(desktop_id, None)
        self._cpu.pop(desktop_id, None)


def _read(sandboxes: list[tuple[str, Sandbox]]) -> list[tuple[str, float, Usage]]:
    found = []
    for desktop_id, sandbox in sandboxes:
        usage = sandbox.usage()
        if usage is not None:
            found.append((desktop_id, time.monotonic(), usage))
    return found
