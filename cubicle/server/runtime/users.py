"""Host user ids for sandboxes when the service runs as root: one per desktop.

Several services may run on one host (tests, benchmarks): a lock file per user id keeps
two sandboxes from ever sharing one, and the kernel drops the lock when the holder dies,
so a crash leaks nothing.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from cubicle.protocol.errors import CapacityReached

HOST_UID_BASE = 200_000
"""Host user ids of sandboxes when the service runs as root: base + slot."""
UID_SLOTS = 1000
LOCK_DIR = Path("/run/lock/cubicle")


def claim() -> tuple[int, int]:
    """A host user id no other sandbox on this host holds, and the lock that holds it."""
    LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    for slot in range(UID_SLOTS):
        uid = HOST_UID_BASE + slot
        fd = os.open(LOCK_DIR / f"uid-{uid}", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return uid, fd
    raise CapacityReached(f"all {UID_SLOTS} sandbox user ids on this host are in use")
