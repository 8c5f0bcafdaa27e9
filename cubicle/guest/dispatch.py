"""Check a batch of actions against the live screen, then carry them out in order.

The whole batch is checked before anything runs, so a batch with one bad action (a point
off the screen, an unknown key) changes nothing on the desktop. This is the only place
where points and key names are checked: the screen size comes from the X server as it is
now (`InputController.current_size`), not from the size the desktop started with.
"""

from __future__ import annotations

import asyncio
import time

from cubicle.guest.core import Guest
from cubicle.guest.keys import parse_combo, resolve_key
from cubicle.protocol import actions as a
from cubicle.protocol.errors import OffScreen


def _points(action: a.Action) -> list[tuple[int | None, int | None]]:
    if isinstance(action, a.Drag):
        return list(action.path)
    return [(getattr(action, "x", None), getattr(action, "y", None))]


def validate(batch: list[a.Action], width: int, height: int) -> None:
    """Raise OffScreen or UnknownKey for the first action that cannot run as asked."""
    for index, action in enumerate(batch):
        where = f"action {index} ({action.type})"
        for x, y in _points(action):
            if (x is None) != (y is None):
                raise OffScreen(f"{where}: give both x and y, or neither")
            if x is not None and (x >= width or y >= height):
                raise OffScreen(
                    f"{where}: point ({x}, {y}) is off the {width}×{height} screen; "
                    f"x must be 0–{width - 1} and y 0–{height - 1}"
                )
        if isinstance(action, a.Key):
            parse_combo(action.keys)
        elif isinstance(action, a.KeyDown | a.KeyUp):
            resolve_key(action.key)
        elif isinstance(action, a.Click):
            for name in action.modifiers:
                resolve_key(name)


async def run_batch(guest: Guest, batch: a.ActionBatch) -> a.ActionsResponse:
    """Check the whole batch against the screen as it is now, then run it in order."""
    items = batch if isinstance(batch, list) else [batch]
    width, height = await guest.on_x_quick(guest.input.current_size)
    validate(items, width, height)
    started = time.perf_counter()
    results = [await execute(action, guest) for action in items]
    return a.ActionsResponse(results=results, elapsed_ms=(time.perf_counter() - started) * 1000)


async def execute(action: a.Action, guest: Guest) -> a.ActionResult:
    """Carry out one checked action and report how long it took.

    Actions that only send events run through `on_x_quick`; those that wait for the X
    server (drags, keys, which read and may change the keymap) run on the X thread.
    """
    started = time.perf_counter()
    settled = None
    controller, quick, on_x = guest.input, guest.on_x_quick, guest.on_x
    match action:
        case a.Move(x=x, y=y):
            await quick(controller.move, x, y)
        case a.Click():
            x, y, modifiers = action.x, action.y, list(action.modifiers)
            run = on_x if modifiers else quick  # modifiers: a keymap read, two round trips
            await run(controller.click, x, y, action.button, action.count, modifiers)
        case a.MouseDown() | a.MouseUp():
            if action.x is not None:
                await quick(controller.move, action.x, action.y)
            press = isinstance(action, a.MouseDown)
            await quick(controller.button_down if press else controller.button_up, action.button)
        case a.Drag():
            await on_x(controller.drag, list(action.path), action.button)
        case a.Scroll():
            await quick(controller.scroll, action.x, action.y, action.dx, action.dy)
        case a.Type():
            await on_x(controller.type_text, action.text)
        case a.Key():
            await on_x(controller.press, action.keys, action.repeat)
        case a.KeyDown():
            await on_x(controller.key_down, action.key)
        case a.KeyUp():
            await on_x(controller.key_up, action.key)
        case a.Wait():
            await asyncio.sleep(action.ms / 1000)
        case a.WaitForSettle():
            await guest.input_processed()  # the input before it is part of what settles
            meter = guest.system.desktop_cpu_seconds
            settled = await guest.screen.wait_for_settle(
                action.quiet_ms,
                action.timeout_ms,
                meter,
                idle_ms=action.idle_ms,
                wanting=lambda: meter.wanting,
            )
    return a.ActionResult(
        type=action.type, elapsed_ms=(time.perf_counter() - started) * 1000, settled=settled
    )
