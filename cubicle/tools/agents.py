"""A Cubicle desktop as the OpenAI Agents SDK's computer, for its `ComputerTool`.

    from agents import Agent, ComputerTool
    from cubicle.tools import CubicleComputer

    computer = CubicleComputer(desktop)          # an AsyncDesktop
    agent = Agent(name="operator", model="gpt-5.4", tools=[ComputerTool(computer)])

Each method is one action of OpenAI's computer tool and goes through `OpenAIComputer`'s
mapping (buttons, key names, held keys, scroll pixels to wheel clicks): the same mapping
as the bare Responses API, not a second one. `BlockingCubicleComputer` is the `Computer`
(blocking) twin for a blocking `Desktop`.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from agents.computer import AsyncComputer, Button, Computer

from cubicle.client.sdk import AsyncDesktop, Desktop, _LoopThread
from cubicle.tools.openai import OpenAIComputer


class CubicleComputer(AsyncComputer):
    """An `AsyncComputer` backed by a Cubicle desktop; takes `OpenAIComputer`'s options
    (`max_size`, `scroll_px_per_click`, `wait_ms`, `settle`)."""

    def __init__(self, desktop: AsyncDesktop, **options: Any) -> None:
        self.desktop = desktop
        self.tool = OpenAIComputer(desktop, **options)

    @property
    def environment(self) -> Literal["ubuntu"]:
        """For the preview tool (`computer-use-preview`): a Linux desktop."""
        return "ubuntu"

    @property
    def dimensions(self) -> tuple[int, int]:
        """The screenshot's size, which the preview tool declares."""
        return self.tool.frame.size

    async def _act(self, action: dict[str, Any], keys: list[str] | None = None) -> None:
        if keys:
            action["keys"] = keys
        await self.tool.screen.send(self.tool.plan_action(action).actions)

    async def screenshot(self) -> str:
        return base64.b64encode(await self.tool.screen.screenshot()).decode("ascii")

    async def click(self, x: int, y: int, button: Button, *, keys: list[str] | None = None) -> None:
        await self._act({"type": "click", "x": x, "y": y, "button": button}, keys)

    async def double_click(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        await self._act({"type": "double_click", "x": x, "y": y}, keys)

    async def scroll(
        self, x: int, y: int, scroll_x: int, scroll_y: int, *, keys: list[str] | None = None
    ) -> None:
        action = {"type": "scroll", "x": x, "y": y, "scroll_x": scroll_x, "scroll_y": scroll_y}
        await self._act(action, keys)

    async def type(self, text: str) -> None:
        await self._act({"type": "type", "text": text})

    async def wait(self) -> None:
        await self._act({"type": "wait"})

    async def move(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        await self._act({"type": "move", "x": x, "y": y}, keys)

    async def keypress(self, keys: list[str]) -> None:
        await self._act({"type": "keypress", "keys": keys})

    async def drag(self, path: list[tuple[int, int]], *, keys: list[str] | None = None) -> None:
        points = [{"x": x, "y": y} for x, y in path]
        await self._act({"type": "drag", "path": points}, keys)


class BlockingCubicleComputer(Computer):
    """The blocking `Computer` twin of `CubicleComputer`, for a blocking `Desktop`."""

    def __init__(self, desktop: Desktop, **options: Any) -> None:
        self.desktop = desktop
        self._async = CubicleComputer(desktop._async, **options)

    @property
    def environment(self) -> Literal["ubuntu"]:
        return self._async.environment

    @property
    def dimensions(self) -> tuple[int, int]:
        return self._async.dimensions

    def screenshot(self) -> str:
        return _LoopThread.run(self._async.screenshot())

    def click(self, x: int, y: int, button: Button, *, keys: list[str] | None = None) -> None:
        _LoopThread.run(self._async.click(x, y, button, keys=keys))

    def double_click(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        _LoopThread.run(self._async.double_click(x, y, keys=keys))

    def scroll(
        self, x: int, y: int, scroll_x: int, scroll_y: int, *, keys: list[str] | None = None
    ) -> None:
        _LoopThread.run(self._async.scroll(x, y, scroll_x, scroll_y, keys=keys))

    def type(self, text: str) -> None:
        _LoopThread.run(self._async.type(text))

    def wait(self) -> None:
        _LoopThread.run(self._async.wait())

    def move(self, x: int, y: int, *, keys: list[str] | None = None) -> None:
        _LoopThread.run(self._async.move(x, y, keys=keys))

    def keypress(self, keys: list[str]) -> None:
        _LoopThread.run(self._async.keypress(keys))

    def drag(self, path: list[tuple[int, int]], *, keys: list[str] | None = None) -> None:
        _LoopThread.run(self._async.drag(path, keys=keys))
