"""Frames: the picture of the screen a model is shown, and how its points map to the screen.

A model reads coordinates off the screenshot it was sent. When that screenshot is smaller
than the screen, every point it answers must be scaled back up before it reaches the
desktop, and every point reported to it (the cursor) scaled down. `Frame` does both, with
the same rounding the service uses when it shrinks a screenshot (`GET …/screenshot` with
`max_width`/`max_height`), so the picture fetched at a frame's size is exactly that size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cubicle.protocol.errors import OffScreen

Size = tuple[int, int]
"""(width, height) in pixels."""

_MAX_COORDINATE = 32767
"""The largest coordinate the actions API takes."""


@dataclass(frozen=True, slots=True)
class Frame:
    """A screenshot size (`width`×`height`) standing for a screen of `screen`'s size."""

    width: int
    height: int
    screen: Size

    @classmethod
    def fit(
        cls, screen: Size, max_width: int | None = None, max_height: int | None = None
    ) -> Frame:
        """The screen shrunk (never enlarged) by one factor to fit `max_width`×`max_height`,
        rounded as the screenshot endpoint rounds; the whole screen when both are None."""
        width, height = screen
        scale = max(
            width / max_width if max_width else 1.0,
            height / max_height if max_height else 1.0,
            1.0,
        )
        if scale == 1.0:
            return cls(width, height, screen)
        return cls(max(1, round(width / scale)), max(1, round(height / scale)), screen)

    @classmethod
    def for_claude(
        cls, screen: Size, *, max_long_edge: int = 1568, max_pixels: int = 1_150_000
    ) -> Frame:
        """The size Anthropic recommends sending Claude: at most `max_long_edge` pixels on
        the long side and about `max_pixels` in all (larger images are shrunk by the API
        itself, and the model's coordinates would then miss), the screen's aspect kept."""
        width, height = screen
        factor = min(
            1.0, max_long_edge / max(width, height), math.sqrt(max_pixels / (width * height))
        )
        if factor == 1.0:
            return cls(width, height, screen)
        return cls.fit(screen, math.floor(width * factor), math.floor(height * factor))

    @property
    def size(self) -> Size:
        return self.width, self.height

    @property
    def scale(self) -> float:
        """Screen pixels per frame pixel (the larger of the two axes')."""
        return max(self.screen[0] / self.width, self.screen[1] / self.height)

    @property
    def scaled(self) -> bool:
        return self.size != self.screen

    def to_screen(self, x: int, y: int) -> Size:
        """The screen pixel under frame pixel (x, y). Points past the frame's right or bottom
        edge map past the screen's, for the service to refuse with its own message;
        negative ones are refused here (`OffScreen`)."""
        if x < 0 or y < 0:
            raise OffScreen(self._outside(x, y))
        screen_x = int((x + 0.5) * self.screen[0] / self.width)
        screen_y = int((y + 0.5) * self.screen[1] / self.height)
        if screen_x > _MAX_COORDINATE or screen_y > _MAX_COORDINATE:
            raise OffScreen(self._outside(x, y))
        return screen_x, screen_y

    def from_screen(self, x: int, y: int) -> Size:
        """The frame pixel showing screen pixel (x, y)."""
        return (
            min(self.width - 1, int((x + 0.5) * self.width / self.screen[0])),
            min(self.height - 1, int((y + 0.5) * self.height / self.screen[1])),
        )

    def region_to_screen(self, x0: int, y0: int, x1: int, y1: int) -> tuple[int, int, int, int]:
        """A rectangle (left, top, right, bottom; right and bottom exclusive) in frame pixels
        as screen pixels, clipped to the screen; `OffScreen` when nothing of it is on it."""
        if not (0 <= x0 < x1 <= self.width and 0 <= y0 < y1 <= self.height):
            raise OffScreen(
                f"region {[x0, y0, x1, y1]} is not a rectangle inside the {self.describe()}: "
                f"give [x0, y0, x1, y1] with 0 ≤ x0 < x1 ≤ {self.width} and "
                f"0 ≤ y0 < y1 ≤ {self.height}"
            )
        sx, sy = self.screen[0] / self.width, self.screen[1] / self.height
        return (
            math.floor(x0 * sx),
            math.floor(y0 * sy),
            min(self.screen[0], math.ceil(x1 * sx)),
            min(self.screen[1], math.ceil(y1 * sy)),
        )

    def describe(self) -> str:
        """ "1024×640 screenshot of the 1280×800 screen" (or "1280×800 screen")."""
        if not self.scaled:
            return f"{self.width}×{self.height} screen"
        return (
            f"{self.width}×{self.height} screenshot of the {self.screen[0]}×{self.screen[1]} screen"
        )

    def _outside(self, x: int, y: int) -> str:
        return (
            f"({x}, {y}) is off the {self.describe()}: "
            f"x must be 0–{self.width - 1} and y 0–{self.height - 1}"
        )

    def off_screen(self, exc: OffScreen) -> OffScreen:
        """The service's `OffScreen` for a mapped point, told in this frame's terms too."""
        if not self.scaled:
            return exc
        error = OffScreen(
            f"a point is off the {self.describe()} (x must be 0–{self.width - 1}, "
            f"y 0–{self.height - 1}); the service said: {exc.message}"
        )
        error.status_code = exc.status_code
        return error
