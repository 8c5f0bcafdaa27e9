"""What one model tool call asks of a desktop (`ToolStep`), and the desktop calls that carry
it out and look at the result (`FrameScreen`), shared by every executor.

An executor turns a vendor's tool input into a `ToolStep` without touching the desktop
(`plan`), so the built-in agent can act it out in its own loop with the same mapping;
`FrameScreen` sends the step's input and fetches what the model sees next, in the frame's
size and coordinates.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol import actions as a
from cubicle.protocol.errors import InvalidRequest, OffScreen
from cubicle.tools.frame import Frame, Size

Observe = Literal["screenshot", "cursor", "zoom", "nothing"]
ImageFormat = Literal["png", "jpeg", "webp"]
MEDIA_TYPES: dict[str, str] = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


@dataclass(frozen=True, slots=True)
class ToolStep:
    """One tool call, mapped: the input to send, then what to show the model."""

    actions: tuple[a.Action, ...] = ()
    """Input in screen pixels, sent as one batch (checked whole before any of it runs)."""
    observe: Observe = "screenshot"
    """What the model gets back: the screen, the pointer's position, a zoomed region."""
    region: tuple[int, int, int, int] | None = None
    """For `zoom`: the region in screen pixels (left, top, right, bottom)."""
    label: str = ""
    """The call in a few words, as the model asked it: `left_click [512, 300]`."""
    point: Size | None = None
    """The pointer target in screen pixels, when there is one (for run records)."""


def point_of(value: object, field: str, action: str) -> tuple[int, int]:
    """An `[x, y]` pair from a model, as two ints; `InvalidRequest` saying what is wrong."""
    if (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    ):
        return round(value[0]), round(value[1])
    raise InvalidRequest(f"{action}: {field} must be [x, y], two whole numbers; got {value!r}")


def number_of(
    payload: Mapping[str, Any], field: str, action: str, default: float | None = None
) -> float:
    value = payload.get(field, default)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    raise InvalidRequest(f"{action}: {field} must be a number ≥ 0; got {value!r}")


def text_of(payload: Mapping[str, Any], field: str, action: str) -> str:
    value = payload.get(field)
    if isinstance(value, str) and value:
        return value
    raise InvalidRequest(f"{action}: {field} must be a non-empty string; got {value!r}")


_HOLD_AFTER_MS = 50
"""Milliseconds modifiers stay down after the pointer input they modify. A window manager
that grabs the button (xfwm4 does, to focus on click) freezes the pointer until it hands the
click on; keys released before then would reach the window ahead of the later presses."""


def held(modifiers: Sequence[str], inner: Sequence[a.Action]) -> tuple[a.Action, ...]:
    """`inner` with `modifiers` held down around it (pressed in order, released in reverse)."""
    if not modifiers:
        return tuple(inner)
    downs = [a.KeyDown(key=key) for key in modifiers]
    ups = [a.KeyUp(key=key) for key in reversed(modifiers)]
    return (*downs, *inner, a.Wait(ms=_HOLD_AFTER_MS), *ups)


def waits(ms: int) -> list[a.Action]:
    """A wait of `ms` milliseconds as `Wait` actions (each at most the API's 60 s)."""
    chunks: list[a.Action] = []
    while ms > 0:
        chunks.append(a.Wait(ms=min(ms, 60_000)))
        ms -= 60_000
    return chunks or [a.Wait(ms=0)]


class FrameScreen:
    """A desktop seen through a frame: input sent in screen pixels, pictures and the pointer
    given back in the frame's.

    `settle` is appended to every batch of input, so the picture that follows shows its
    effect (None: do not wait)."""

    def __init__(
        self,
        desktop: AsyncDesktop,
        frame: Frame,
        *,
        settle: a.WaitForSettle | None = None,
        image_format: ImageFormat = "png",
    ) -> None:
        self.desktop = desktop
        self.frame = frame
        self.settle = settle
        self.image_format: ImageFormat = image_format

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.image_format]

    async def send(self, actions: Sequence[a.Action]) -> a.ActionsResponse | None:
        """Send `actions` (and the settle) in one batch; an `OffScreen` from the service is
        retold in the frame's terms. None when there was nothing to send."""
        batch = [*actions, self.settle] if actions and self.settle is not None else list(actions)
        if not batch:
            return None
        try:
            return await self.desktop.actions(*batch)
        except OffScreen as exc:
            raise self.frame.off_screen(exc) from exc

    async def screenshot(self) -> bytes:
        """The screen at the frame's size, encoded in `image_format`."""
        if not self.frame.scaled:
            return await self.desktop.screenshot(self.image_format, quality=90)
        return await self.desktop.screenshot(
            self.image_format, quality=90, max_width=self.frame.width, max_height=self.frame.height
        )

    async def cursor(self) -> Size:
        """Where the pointer is, in frame pixels."""
        x, y = await self.desktop.get_cursor_position()
        return self.frame.from_screen(x, y)

    async def zoom(self, region: tuple[int, int, int, int]) -> bytes:
        """`region` (screen pixels) at full detail, enlarged to fill the frame, aspect kept."""
        png = await self.desktop.screenshot("png")
        return await asyncio.to_thread(_crop, png, region, self.frame.size, self.image_format)


def _crop(png: bytes, region: tuple[int, int, int, int], fit: Size, fmt: ImageFormat) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as shot:
        part = shot.convert("RGB").crop(region)
    factor = min(fit[0] / part.width, fit[1] / part.height)
    size = (max(1, round(part.width * factor)), max(1, round(part.height * factor)))
    part = part.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    part.save(out, format={"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}[fmt])
    return out.getvalue()
