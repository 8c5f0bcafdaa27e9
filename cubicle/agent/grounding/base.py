"""What every grounder promises: a description and a screenshot in, a screen point out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from PIL import Image


@dataclass(frozen=True, slots=True)
class GroundingResult:
    """Where a grounder found the described element, in real screen pixels."""

    x: int
    """Horizontal position of the point to act on, in screen pixels from the left edge."""
    y: int
    """Vertical position of the point to act on, in screen pixels from the top edge."""
    box: tuple[int, int, int, int] | None
    """The element's box (left, top, right, bottom) in screen pixels, when the grounder
    gave one; (x, y) is then its centre."""
    raw: str
    """The grounder's raw output (the model's answer, for model grounders)."""
    source: str
    """Which grounder answered, e.g. "vlm:ui-tars", "a11y", "ocr"."""
    elapsed_ms: float
    """Wall time of the whole `ground` call in milliseconds, image preparation and retries
    included."""


class Grounder(ABC):
    """Turns a description of an on-screen element into a point on the real screen."""

    @abstractmethod
    async def ground(
        self,
        description: str,
        screenshot: bytes | Image.Image,
        screen_size: tuple[int, int],
    ) -> GroundingResult | None:
        """Find the element `description` names ("the Save button in the dialog").

        `screenshot` is an encoded image (PNG, JPEG…) or a PIL image of the whole screen; it
        may be scaled down but must keep the screen's aspect ratio. `screen_size` is the real
        screen's (width, height) in pixels: the result is in that screen's pixels.

        Returns None when the grounder says the element is not on the screen; raises
        `GroundingError` when its answer cannot be turned into an on-screen point and
        `ModelError` when a model behind it failed.
        """

    def prepare(self, screenshot: Image.Image, screen_size: tuple[int, int]) -> None:  # noqa: B027
        """A new screen was seen (`screenshot`, full size): start reading in the background
        what `ground` will need for it, while the planner thinks. A no-op unless a grounder
        has cheap work to get ahead on; `ground` on this same image object uses it."""

    async def aclose(self) -> None:  # noqa: B027 - a no-op default, overridden when needed
        """Release what the grounder holds (HTTP connections…); idempotent."""
