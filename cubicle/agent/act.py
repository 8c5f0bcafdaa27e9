"""Carrying out a planned action on a desktop through the SDK, then waiting for the screen to
settle: the guest's `wait_for_settle` (the screen unchanged for a while), not a fixed sleep.

Input actions and the settle go to the desktop in one `actions` call; `open` and `launch`
also wait for a window to appear (or an open one to change its title, as when a file opens
in a new tab), `exec` reports the command's output.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from cubicle.agent import actions as p
from cubicle.agent.settings import RunLimits
from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol import actions as a

_OUTPUT_SHOWN = 2_000
"""Characters of a command's output told to the planner."""
_EXEC_TIMEOUT_S = 60.0
"""Seconds an `exec` action may run."""
_WINDOW_POLL_S = 0.1
"""Seconds between looks for a launched application's window."""


@dataclass(frozen=True, slots=True)
class Acted:
    """What carrying out one action did and cost."""

    result: str
    """What happened, in words for the planner: `ok: click "the File menu" at (24, 70)`."""
    settled: bool
    """Whether the screen went quiet before the settle timeout."""
    act_ms: float
    """Milliseconds of the action itself (input events, launch and window wait, exec)."""
    settle_ms: float
    """Milliseconds spent waiting for the screen to settle."""


def inputs(action: p.PlannedAction, points: list[tuple[int, int]]) -> list[a.Action]:
    """The desktop input actions for `action`, its targets at `points` (screen pixels, one
    per target in order); [] for actions that are not input (open, launch, exec…)."""
    match action:
        case p.Click(type=kind):
            x, y = points[0]
            button = "right" if kind == "right_click" else "left"
            return [a.Click(x=x, y=y, button=button, count=2 if kind == "double_click" else 1)]
        case p.TypeText(text=text):
            return [a.Type(text=text)]
        case p.PressKey(keys=keys):
            return [a.Key(keys=keys)]
        case p.Scroll(direction=direction, amount=amount):
            dx = {"left": -amount, "right": amount}.get(direction, 0)
            dy = {"up": -amount, "down": amount}.get(direction, 0)
            x, y = points[0] if points else (None, None)
            return [a.Scroll(x=x, y=y, dx=dx, dy=dy)]
        case p.Drag():
            return [a.Drag(path=[points[0], points[1]])]
        case p.Wait(seconds=seconds):
            return [a.Wait(ms=round(seconds * 1000))]
        case p.Computer(inputs=batch):
            return list(batch)
    return []


async def act(
    desktop: AsyncDesktop,
    action: p.PlannedAction,
    points: list[tuple[int, int]],
    limits: RunLimits,
) -> Acted:
    """Carry out `action` (not `done`/`fail`) and wait for the screen to settle. Desktop
    errors (`InvalidRequest` for an off-screen point or an unknown key…) propagate."""
    started = time.perf_counter()
    settle = a.WaitForSettle(
        quiet_ms=limits.settle_quiet_ms,
        timeout_ms=limits.settle_timeout_ms,
        idle_ms=limits.settle_idle_ms,
    )
    done = p.describe(action)
    if points and not isinstance(action, p.Computer):  # its request names its points
        done += " at " + " → ".join(f"({x}, {y})" for x, y in points)
    events = inputs(action, points)
    if events:
        response = await desktop.actions(*events, settle)
        settle_ms = response.results[-1].elapsed_ms
        act_ms = (time.perf_counter() - started) * 1000 - settle_ms
    else:
        done = await _command(desktop, action, done, limits.launch_timeout_s)
        act_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        response = await desktop.actions(settle)
        settle_ms = (time.perf_counter() - started) * 1000
    settled = bool(response.results[-1].settled)
    calm = "" if settled else f"; the screen was still changing after {settle.timeout_ms} ms"
    return Acted(f"ok: {done}{calm}", settled, act_ms, settle_ms)


async def _command(
    desktop: AsyncDesktop, action: p.PlannedAction, done: str, window_timeout_s: float
) -> str:
    """Open, launch or exec; what happened, in words for the planner."""
    if isinstance(action, p.Exec):
        ran = await desktop.exec(action.command, timeout_s=_EXEC_TIMEOUT_S)
        output = (ran.stdout + ran.stderr)[-_OUTPUT_SHOWN:]
        code = "timed out" if ran.timed_out else f"exit code {ran.exit_code}"
        return f"{done}: {code}; output: {output!r}"
    if not isinstance(action, p.Launch | p.Open):
        raise AssertionError(f"not a command: {action!r}")
    before = {(window.id, window.title) for window in await desktop.get_windows()}
    if isinstance(action, p.Launch):
        launched = await desktop.launch(action.app, *action.args)
    else:
        launched = await desktop.open(action.target)
    deadline = time.monotonic() + window_timeout_s
    while time.monotonic() < deadline:
        # A new window, or a known one with a new title (a file opened in a new tab).
        changed = [w for w in await desktop.get_windows() if (w.id, w.title) not in before]
        if changed:
            return f"{done} (pid {launched.pid}): window {changed[0].title!r} shows it"
        await asyncio.sleep(_WINDOW_POLL_S)
    return (
        f"{done} (pid {launched.pid}), but no window appeared or changed within "
        f"{window_timeout_s:g} s"
    )
