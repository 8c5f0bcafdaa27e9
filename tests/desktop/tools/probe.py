"""The input probe (`probe_app.py`) started in a desktop, and its log read back through the
files API: what a window really received, buttons, held modifiers and keysyms included."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cubicle import AsyncDesktop

APP = Path(__file__).with_name("probe_app.py")
LOG = "~/probe.jsonl"

_LAUNCHER = """
import subprocess, sys
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
print(child.pid)
"""
"""Starts the probe in its own session, holding none of exec's descriptors, so the exec call
returns at once and its timeout does not kill the probe."""

Event = dict[str, Any]


class Probe:
    """The probe's window in one desktop; `area` is where it is on the screen."""

    def __init__(self, desktop: AsyncDesktop) -> None:
        self.desktop = desktop
        self.pid: int | None = None
        self.area: tuple[int, int, int, int] = (0, 0, 0, 0)
        """x, y, width, height of the window, screen pixels."""

    async def start(self) -> Probe:
        await self.desktop.files.write("~/probe_app.py", APP.read_bytes())
        await self.desktop.files.write(LOG, b"")
        argv = ["/usr/bin/python3", "/home/user/probe_app.py", "/home/user/probe.jsonl"]
        ran = await self.desktop.exec([sys.executable, "-c", _LAUNCHER, *argv])
        assert ran.exit_code == 0, ran
        self.pid = int(ran.stdout)
        await self.wait_for(lambda events: [e for e in events if e["e"] == "ready"])
        await self.desktop.wait_for_settle(quiet_ms=200)
        ready = [e for e in await self.events() if e["e"] in ("ready", "area")][-1]
        self.area = (ready["x"], ready["y"], ready["w"], ready["h"])
        return self

    async def events(self) -> list[Event]:
        raw = await self.desktop.files.read(LOG)
        return [json.loads(line) for line in raw.decode().splitlines() if line.strip()]

    async def mark(self) -> int:
        """How many events so far: `since(mark)` reads the ones after."""
        return len(await self.events())

    async def since(self, mark: int) -> list[Event]:
        return (await self.events())[mark:]

    async def wait_for(
        self, found: Callable[[list[Event]], Any], mark: int = 0, timeout_s: float = 10.0
    ) -> Any:
        """Poll the log (events after `mark`) until `found(events)` is truthy; return it."""
        deadline = time.monotonic() + timeout_s
        while True:
            events = await self.since(mark)
            if value := found(events):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"the probe did not see it within {timeout_s} s: {events}")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.pid is not None:
            await self.desktop.exec(f"kill {self.pid} 2>/dev/null || true")
            self.pid = None


def presses(events: list[Event]) -> list[Event]:
    return [e for e in events if e["e"] == "press"]


def keys(events: list[Event]) -> list[tuple[str, list[str]]]:
    """(keysym, modifiers held) of every key press."""
    return [(e["keysym"], e["mods"]) for e in events if e["e"] == "key"]


def typed(events: list[Event]) -> str:
    """The text the key presses typed."""
    return "".join(e["char"] for e in events if e["e"] == "key")


def scrolls(events: list[Event]) -> list[Event]:
    return [e for e in events if e["e"] == "scroll"]
