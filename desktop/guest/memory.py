"""Keep an idle guest small: its big buffers go back to the system once freed.

glibc's malloc raises its mmap threshold each time a large block is freed, up to 32 MiB,
so after the first screenshot every full-screen buffer (4 MB at 1280×800) is carved from
the heap and kept there, free but resident: 6 MB of an idle guest's memory for good, times
every desktop. A fixed threshold of 1 MiB keeps frames mmapped (returned when freed) and
everything smaller on the heap.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("cubicle.guest")

M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter (malloc.h)."""
MMAP_THRESHOLD = 1 << 20


def return_big_buffers() -> None:
    """Fix malloc's mmap threshold at 1 MiB (glibc only; elsewhere nothing changes)."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        log.info("malloc's mmap threshold stays dynamic (no glibc mallopt here)")
