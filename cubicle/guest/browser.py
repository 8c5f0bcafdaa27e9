"""The desktop's Chromium with DevTools on: where they listen, starting the browser if none.

Every Chromium the session starts has DevTools on a port of the sandbox's loopback
(`CHROMIUM_FLAGS`), which it writes to its profile's `DevToolsActivePort`: the port, then
the browser's WebSocket path. The service reaches that port through the relay only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from cubicle.guest.system import System
from cubicle.protocol.errors import Conflict
from cubicle.protocol.models import DevTools

PROFILE = Path(".config/chromium")
"""Chromium's profile directory, in the desktop's home."""
_START_S = 60.0
"""Seconds Chromium may take to start and open DevTools (a microVM emulates its CPU)."""


async def _answering(port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _active(path: Path) -> DevTools | None:
    """What the profile's `DevToolsActivePort` says, if a browser answers there."""
    try:
        text = await asyncio.to_thread(path.read_text)
        port_line, browser_path = text.splitlines()[:2]
        port = int(port_line)
    except (OSError, ValueError):
        return None
    return DevTools(port=port, browser_path=browser_path) if await _answering(port) else None


async def devtools(system: System) -> DevTools:
    """The DevTools of the desktop's Chromium; starts one (on a blank page) if none runs."""
    active = system.home / PROFILE / "DevToolsActivePort"
    if found := await _active(active):
        return found
    with contextlib.suppress(OSError):
        active.unlink()  # what a browser that ended left behind
    await system.launch("chromium", ["--remote-debugging-port=0", "about:blank"])
    deadline = time.monotonic() + _START_S
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if found := await _active(active):
            return found
    raise Conflict(
        f"Chromium did not open DevTools within {_START_S:.0f} s: a Chromium started "
        "without them may hold the profile; close it and ask again"
    )
