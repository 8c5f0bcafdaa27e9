"""Chromium inside a desktop, through its DevTools endpoint on the desktop's own loopback.

Tasks that use the browser start it with `--remote-debugging-port` (setup `launch` of
`chromium`/`google-chrome` adds it, `chrome_open_tabs` starts it so when it is not
running). The endpoint is reachable only from inside the desktop's network namespace, so
every question goes through a small probe run by the desktop's Python
(`_devtools_probe.py`): which tabs are open, which one is in front, a page's URL, title,
text and HTML.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cubicle.evals.context import TaskContext
from cubicle.evals.errors import CheckerError, SetupFailed

DEBUG_PORT = 9222
"""Chromium's DevTools port inside the desktop (OSWorld's `chromium_port`)."""
START_TIMEOUT_S = 20.0
"""Seconds Chromium may take to open its DevTools endpoint."""
CHROME_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
"""Commands that mean "the browser" in a task; each runs Debian's chromium."""


@dataclass(frozen=True)
class Tab:
    """One open page."""

    id: str
    title: str
    url: str
    visible: bool
    """Whether it is the tab in front of its window."""


@dataclass(frozen=True)
class Page:
    """What a page holds now."""

    title: str
    url: str
    text: str
    """The body's rendered text (innerText)."""
    html: str


@functools.cache
def _probe_source() -> str:
    return (Path(__file__).with_name("_devtools_probe.py")).read_text()


def browser_argv(argv: list[str]) -> list[str]:
    """`argv` of a task's browser launch as Cubicle runs it: Debian's chromium, with the
    DevTools port (OSWorld's tasks ask for google-chrome on port 1337 and forward 9222)."""
    rest = [a for a in argv[1:] if not a.startswith("--remote-debugging-port")]
    return ["chromium", f"--remote-debugging-port={DEBUG_PORT}", *rest]


def is_browser(argv: list[str]) -> bool:
    return bool(argv) and Path(argv[0]).name in CHROME_NAMES


async def _ask(ctx: TaskContext, *args: str) -> Any:
    result = await ctx.python(_probe_source(), str(DEBUG_PORT), *args, timeout_s=30)
    if result.exit_code != 0:
        raise CheckerError(
            f"Chromium's DevTools did not answer {args[0]!r} inside the desktop (is the "
            f"browser running with --remote-debugging-port={DEBUG_PORT}? set it up with a "
            f"`launch` of chromium or `chrome_open_tabs`): {result.stderr.strip()[-300:]}"
        )
    return json.loads(result.stdout)


async def running(ctx: TaskContext) -> bool:
    """Whether Chromium's DevTools endpoint answers inside the desktop."""
    try:
        await _ask(ctx, "version")
    except CheckerError:
        return False
    return True


async def start(ctx: TaskContext, urls: list[str]) -> None:
    """Start Chromium on `urls` with its DevTools port; returns once the port answers."""
    await ctx.desktop.launch(*browser_argv(["chromium", *urls]))
    await wait_until_running(ctx)


async def wait_until_running(ctx: TaskContext) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not await running(ctx):
        if time.monotonic() > deadline:
            raise SetupFailed(f"Chromium's DevTools did not answer within {START_TIMEOUT_S:g} s")
        await asyncio.sleep(0.2)


async def open_tabs(ctx: TaskContext, urls: list[str]) -> None:
    """Open each URL in a new tab (starting the browser on them when it is not running)."""
    if not await running(ctx):
        await start(ctx, urls)
        return
    await _ask(ctx, "open", *urls)


async def tabs(ctx: TaskContext) -> list[Tab]:
    return [Tab(**item) for item in await _ask(ctx, "tabs")]


async def active_tab(ctx: TaskContext) -> Tab | None:
    """The tab in front (the visible one; the first listed when none says so)."""
    found = await tabs(ctx)
    return next((tab for tab in found if tab.visible), found[0] if found else None)


async def page(ctx: TaskContext, tab: Tab) -> Page | None:
    data = await _ask(ctx, "page", tab.id)
    return Page(**data) if data else None


async def close_tab(ctx: TaskContext, tab: Tab) -> None:
    await _ask(ctx, "close", tab.id)
