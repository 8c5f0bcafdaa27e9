"""Keep an idle guest small: its free heap goes back to the system once it is idle.

glibc's malloc raises its mmap threshold each time a large block is freed, up to 32 MiB,
so after the first screenshot every full-screen buffer (4 MB at 1280×800) is carved from
the heap and kept there, free but resident: several MB of an idle guest's memory for
good, times every desktop. Fixing the threshold low instead (each frame a mmap of its
own, returned when freed) costs a page fault per 4 KiB on every capture: measured in a
sandbox, a JPEG screenshot took 12.2 ms that way against 5.4 ms. So the heap stays as
glibc likes it while the guest works, and `IdleTrim` hands its free pages back
(`malloc_trim`) once nothing was captured for a moment.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from concurrent.futures import Executor

log = logging.getLogger("cubicle.guest")

IDLE_S = 2.0
"""Seconds without a capture after which the heap's free pages are returned."""


def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        log.info("no glibc malloc_trim here: an idle guest keeps its free heap")
        return None


class IdleTrim:
    """Trims the heap on `executor` (the thread that owns the big buffers) once `idle_s`
    passed since the last `touch()`. Call it from the event loop."""

    def __init__(self, executor: Executor, idle_s: float = IDLE_S) -> None:
        self._executor = executor
        self._idle_s = idle_s
        self._trim = _malloc_trim()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def touch(self) -> None:
        """The buffers were just used: trim `idle_s` from now, not before."""
        if self._trim is None or self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self._idle_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if not self._closed:
            self._executor.submit(self._trim, 0)

    def close(self) -> None:
        """No trim after this (call before the executor shuts down)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
