"""MCP tools that look at the screen and send input, in the frame of the last screenshot.

`screenshot` takes the size the caller wants (`max_width`/`max_height`, the aspect kept)
and says the scale; from then on the desktop's pointer tools read x and y in that
screenshot's pixels, until a screenshot of another size. Every result names the desktop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import Field

from cubicle.mcp.session import Desktops, Held, guarded, result
from cubicle.protocol import actions as a
from cubicle.protocol.errors import OffScreen
from cubicle.tools.frame import Frame
from cubicle.tools.step import MEDIA_TYPES, held

DesktopId = Annotated[str, Field(description="The desktop's id, as create_desktop gave it.")]
X = Annotated[int | None, Field(description="Pixels from the left of the last screenshot.")]
Y = Annotated[int | None, Field(description="Pixels from the top of the last screenshot.")]
Modifiers = Annotated[
    list[str], Field(description='Keys held during the action, e.g. ["ctrl", "shift"].')
]


def _frame_line(desktop_id: str, frame: Frame) -> str:
    return f"desktop {desktop_id}; points are pixels of the {frame.describe()}"


async def _send(
    held_desktop: Held, desktop_id: str, actions: list[a.Action], done: str
) -> CallToolResult:
    try:
        response = await held_desktop.desktop.actions(*actions)
    except OffScreen as exc:
        raise held_desktop.frame.off_screen(exc) from exc
    frame = held_desktop.frame
    data: dict[str, object] = {"desktop_id": desktop_id, "frame": [frame.width, frame.height]}
    data["elapsed_ms"] = round(response.elapsed_ms, 1)
    if any(r.settled is not None for r in response.results):
        data["settled"] = bool(response.results[-1].settled)
    return result(f"{done} ({_frame_line(desktop_id, frame)})", data)


def _point(frame: Frame, x: int | None, y: int | None) -> tuple[int | None, int | None]:
    if x is None and y is None:
        return None, None
    if x is None or y is None:
        raise OffScreen("give both x and y, or neither")
    return frame.to_screen(x, y)


class InputTools:
    """The screen and input, in the frame of the desktop's last screenshot, as MCP tools."""

    def __init__(self, desktops: Desktops) -> None:
        self.desktops = desktops

    async def screenshot(
        self,
        desktop_id: DesktopId,
        max_width: Annotated[int | None, Field(ge=16, le=16384)] = None,
        max_height: Annotated[int | None, Field(ge=16, le=16384)] = None,
        format: Literal["png", "jpeg"] = "png",
    ) -> CallToolResult:
        """See the screen, shrunk to fit max_width × max_height (the aspect kept; default
        the whole screen). Later x/y of this desktop's tools are pixels of this image."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            screen = entry.frame.screen
            entry.frame = frame = Frame.fit(screen, max_width, max_height)
            image = await entry.desktop.screenshot(
                format, quality=85, max_width=frame.width, max_height=frame.height
            )
            text = (
                f"desktop {desktop_id}: {frame.width}×{frame.height} screenshot of the "
                f"{screen[0]}×{screen[1]} screen, scale {frame.scale:.4g} (screen pixels per "
                "image pixel); give x and y in this image's pixels"
            )
            data = {
                "desktop_id": desktop_id,
                "width": frame.width,
                "height": frame.height,
                "screen": list(screen),
                "scale": round(frame.scale, 6),
            }
            return result(text, data, (image, MEDIA_TYPES[format]))

    async def click(
        self,
        desktop_id: DesktopId,
        x: X = None,
        y: Y = None,
        button: a.Button = "left",
        count: Annotated[int, Field(ge=1, le=3)] = 1,
        modifiers: Modifiers | None = None,
    ) -> CallToolResult:
        """Click at (x, y), or where the pointer is; count 2 or 3 for a double or triple click."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            sx, sy = _point(entry.frame, x, y)
            actions = held(modifiers or [], [a.Click(x=sx, y=sy, button=button, count=count)])
            where = f" at ({x}, {y})" if x is not None else ""
            return await _send(
                entry, desktop_id, list(actions), f"clicked {button} ×{count}{where}"
            )

    async def double_click(
        self, desktop_id: DesktopId, x: X = None, y: Y = None, modifiers: Modifiers | None = None
    ) -> CallToolResult:
        """Double-click the left button at (x, y), or where the pointer is."""
        return await self.click(desktop_id, x, y, "left", 2, modifiers)

    async def triple_click(
        self, desktop_id: DesktopId, x: X = None, y: Y = None, modifiers: Modifiers | None = None
    ) -> CallToolResult:
        """Triple-click the left button at (x, y) (selects a line or paragraph)."""
        return await self.click(desktop_id, x, y, "left", 3, modifiers)

    async def move(self, desktop_id: DesktopId, x: int, y: int) -> CallToolResult:
        """Move the pointer to (x, y) without clicking (hover)."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            sx, sy = entry.frame.to_screen(x, y)
            return await _send(entry, desktop_id, [a.Move(x=sx, y=sy)], f"moved to ({x}, {y})")

    async def mouse_down(
        self, desktop_id: DesktopId, x: X = None, y: Y = None, button: a.Button = "left"
    ) -> CallToolResult:
        """Press and hold a mouse button, at (x, y) when given."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            sx, sy = _point(entry.frame, x, y)
            return await _send(
                entry, desktop_id, [a.MouseDown(x=sx, y=sy, button=button)], f"pressed {button}"
            )

    async def mouse_up(
        self, desktop_id: DesktopId, x: X = None, y: Y = None, button: a.Button = "left"
    ) -> CallToolResult:
        """Release a held mouse button, at (x, y) when given."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            sx, sy = _point(entry.frame, x, y)
            return await _send(
                entry, desktop_id, [a.MouseUp(x=sx, y=sy, button=button)], f"released {button}"
            )

    async def drag(
        self,
        desktop_id: DesktopId,
        path: Annotated[list[tuple[int, int]], Field(min_length=2, max_length=1000)],
        button: a.Button = "left",
        modifiers: Modifiers | None = None,
    ) -> CallToolResult:
        """Press at the first [x, y] of path, move through the others, release at the last."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            points = [entry.frame.to_screen(px, py) for px, py in path]
            actions = held(modifiers or [], [a.Drag(path=points, button=button)])
            return await _send(
                entry, desktop_id, list(actions), f"dragged through {len(path)} points"
            )

    async def scroll(
        self,
        desktop_id: DesktopId,
        dy: Annotated[
            int, Field(ge=-100, le=100, description="Wheel clicks; > 0 scrolls down.")
        ] = 0,
        dx: Annotated[
            int, Field(ge=-100, le=100, description="Wheel clicks; > 0 scrolls right.")
        ] = 0,
        x: X = None,
        y: Y = None,
        modifiers: Modifiers | None = None,
    ) -> CallToolResult:
        """Turn the mouse wheel over (x, y) (or where the pointer is)."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            sx, sy = _point(entry.frame, x, y)
            actions = held(modifiers or [], [a.Scroll(x=sx, y=sy, dx=dx, dy=dy)])
            return await _send(entry, desktop_id, list(actions), f"scrolled dx={dx} dy={dy}")

    async def type_text(
        self, desktop_id: DesktopId, text: Annotated[str, Field(max_length=100_000)]
    ) -> CallToolResult:
        """Type any Unicode text where the keyboard focus is (a newline presses Enter)."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            return await _send(
                entry, desktop_id, [a.Type(text=text)], f"typed {len(text)} characters"
            )

    async def key(
        self,
        desktop_id: DesktopId,
        keys: Annotated[str, Field(description="A key or combination: enter, ctrl+s, alt+F4.")],
        repeat: Annotated[int, Field(ge=1, le=100)] = 1,
    ) -> CallToolResult:
        """Press and release a key or a combination (xdotool names, case-insensitive)."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            return await _send(
                entry, desktop_id, [a.Key(keys=keys, repeat=repeat)], f"pressed {keys}"
            )

    async def key_down(self, desktop_id: DesktopId, key: str) -> CallToolResult:
        """Press and hold one key until key_up."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            return await _send(entry, desktop_id, [a.KeyDown(key=key)], f"holding {key}")

    async def key_up(self, desktop_id: DesktopId, key: str) -> CallToolResult:
        """Release a key held by key_down."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            return await _send(entry, desktop_id, [a.KeyUp(key=key)], f"released {key}")

    async def wait(
        self, desktop_id: DesktopId, ms: Annotated[int, Field(ge=0, le=60_000)]
    ) -> CallToolResult:
        """Wait ms milliseconds."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            return await _send(entry, desktop_id, [a.Wait(ms=ms)], f"waited {ms} ms")

    async def wait_for_settle(
        self,
        desktop_id: DesktopId,
        quiet_ms: Annotated[int, Field(ge=10, le=10_000)] = 300,
        timeout_ms: Annotated[int, Field(ge=10, le=60_000)] = 5_000,
    ) -> CallToolResult:
        """Wait until the screen has not changed for quiet_ms (or timeout_ms passed)."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            settle = a.WaitForSettle(quiet_ms=quiet_ms, timeout_ms=timeout_ms)
            return await _send(entry, desktop_id, [settle], "waited for the screen")

    async def cursor_position(self, desktop_id: DesktopId) -> CallToolResult:
        """Where the pointer is, in pixels of the last screenshot."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            x, y = entry.frame.from_screen(*await entry.desktop.get_cursor_position())
            data = {"desktop_id": desktop_id, "x": x, "y": y}
            return result(f"pointer at ({x}, {y}) ({_frame_line(desktop_id, entry.frame)})", data)


TOOLS: list[Callable[..., Awaitable[CallToolResult]]] = [
    InputTools.screenshot,
    InputTools.click,
    InputTools.double_click,
    InputTools.triple_click,
    InputTools.move,
    InputTools.mouse_down,
    InputTools.mouse_up,
    InputTools.drag,
    InputTools.scroll,
    InputTools.type_text,
    InputTools.key,
    InputTools.key_down,
    InputTools.key_up,
    InputTools.wait,
    InputTools.wait_for_settle,
    InputTools.cursor_position,
]
"""The tools, in the order a client lists them."""
