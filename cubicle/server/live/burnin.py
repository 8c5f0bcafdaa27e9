"""The action overlay burned into a recording: decode, draw the marks, encode again.

A recording started with `overlay: true` cannot pass the hub's packets through as they are:
its frames must show the marks. `BurnIn` sits between the recording's hub subscription and
its MP4 writer. Each frame is decoded (FFmpeg's H.264 decoder), the marks still showing at
its time are drawn over it (`draw_marks`), and it is encoded again with libx264. While marks
animate and the screen holds still, it makes frames of its own (`TICK_US` apart), so that a
click on a still screen still shows its ripple spreading. Only this recording pays for it:
the live stream and plain recordings stay untouched.

The work runs in a thread (`asyncio.to_thread`), a frame at a time; if it falls behind, the
hub drops this subscriber's frames up to the next keyframe, as it would for a slow viewer.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import av
from PIL import Image, ImageDraw, ImageFont

from cubicle.guest.video.encoder import H264Encoder
from cubicle.protocol.errors import SandboxError
from cubicle.protocol.frames import EncodedFrame
from cubicle.protocol.service import ActionSource
from cubicle.server.live.overlay import Caption, Mark, OverlayMessage, Ripple, ScrollMark, Trail

TICK_US = 50_000
"""Microseconds between the frames made while marks animate over a still screen."""
SHOWN_US = {"click": 800_000, "drag": 1_500_000, "scroll": 1_000_000, "text": 2_500_000}
"""How long each kind of mark shows, microseconds (`keys` as `text`)."""
COLOURS = {"api": (230, 40, 120), "viewer": (30, 120, 235)}
"""The agent's marks (magenta) and a person's (blue), RGB."""
WHO = {"api": "Agent", "viewer": "Person"}


@dataclass(frozen=True)
class Shown:
    """A mark, who made it and since when it shows."""

    mark: Mark
    source: ActionSource
    at_us: int
    """Microseconds on the hub's clock."""

    @property
    def until_us(self) -> int:
        return self.at_us + SHOWN_US["text" if self.mark.kind == "keys" else self.mark.kind]


class BurnIn:
    """The frames of one subscription with the marks drawn in, re-encoded.

    Iterate it once; it ends when the frames it reads end.
    """

    def __init__(self, frames: AsyncIterator[EncodedFrame], clock_us: Callable[[], int]) -> None:
        self._frames = frames
        self._clock_us = clock_us
        """The hub's clock: the frames' timestamps, and the marks'."""
        self._shown: list[Shown] = []
        self._canvas = _Canvas()
        self._wake: asyncio.Future[None] | None = None
        """Resolved by `show()`: new marks start animating over a still screen."""

    def show(self, message: OverlayMessage, at_us: int) -> None:
        """Draw these marks from `at_us` (hub clock) on; text typed on and on by the same
        source while its caption shows joins that caption."""
        self._shown = [s for s in self._shown if s.until_us > at_us]
        for mark in message.marks:
            last = self._shown[-1] if self._shown else None
            if (
                isinstance(mark, Caption)
                and mark.kind == "text"
                and last is not None
                and isinstance(last.mark, Caption)
                and last.mark.kind == "text"
                and last.source == message.source
            ):
                joined = Caption(kind="text", text=(last.mark.text + mark.text)[-80:])
                self._shown[-1] = Shown(joined, message.source, at_us)
            else:
                self._shown.append(Shown(mark, message.source, at_us))
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def __aiter__(self) -> AsyncIterator[EncodedFrame]:
        return self._run()

    async def _next(self) -> EncodedFrame | None:
        """The next frame read, None once they ended."""
        try:
            return await anext(self._frames)
        except StopAsyncIteration:
            return None

    async def _run(self) -> AsyncIterator[EncodedFrame]:
        reading = asyncio.create_task(self._next())
        try:
            while True:
                now = self._clock_us()
                animating = self._canvas.has_picture and (
                    self._canvas.marked or any(s.until_us > now for s in self._shown)
                )  # until a frame without marks was made
                self._wake = asyncio.get_running_loop().create_future()
                await asyncio.wait(
                    {reading, self._wake},
                    timeout=TICK_US / 1e6 if animating else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if not reading.done() and self._wake.done():
                    continue  # new marks: animate from now on
                if reading.done():
                    frame = reading.result()
                    if frame is None:
                        return
                    reading = asyncio.create_task(self._next())
                    work = functools.partial(self._canvas.frame, frame, list(self._shown))
                else:
                    work = functools.partial(self._canvas.tick, self._clock_us(), list(self._shown))
                drawn = await asyncio.to_thread(work)
                if drawn is not None:
                    yield drawn
        finally:
            reading.cancel()
            await asyncio.wait({reading})
            await asyncio.to_thread(self._canvas.close)


class _Canvas:
    """Decoder, last picture and encoder; used from one thread at a time."""

    def __init__(self) -> None:
        self._decoder = av.CodecContext.create("h264", "r")
        self._decoder.thread_type = "SLICE"  # frame threads would hold pictures back
        self._encoder: H264Encoder | None = None
        self._picture: Image.Image | None = None
        self._last_pts = -1
        self.marked = False
        """The last frame made shows marks."""

    @property
    def has_picture(self) -> bool:
        return self._picture is not None

    def frame(self, frame: EncodedFrame, shown: list[Shown]) -> EncodedFrame | None:
        """The frame with the marks drawn, or None if it decodes to no picture."""
        packet = av.Packet(frame.data)
        packet.pts = frame.pts_us
        try:
            pictures = self._decoder.decode(packet)
        except av.FFmpegError as exc:
            raise SandboxError(f"decoding the video to draw the overlay failed: {exc}") from exc
        if not pictures:
            return None
        self._picture = pictures[-1].to_image()
        return self._draw(frame.pts_us, shown, keyframe=frame.keyframe)

    def tick(self, at_us: int, shown: list[Shown]) -> EncodedFrame | None:
        """The last picture again, the marks as they are at `at_us`."""
        return None if self._picture is None else self._draw(at_us, shown, keyframe=False)

    def _draw(self, at_us: int, shown: list[Shown], *, keyframe: bool) -> EncodedFrame:
        assert self._picture is not None
        at_us = max(at_us, self._last_pts + 1)
        self._last_pts = at_us
        showing = [s for s in shown if s.at_us <= at_us < s.until_us]
        self.marked = bool(showing)
        image = self._picture
        if showing:
            image = image.copy()
            draw_marks(image, showing, at_us)
        if self._encoder is None:
            self._encoder = H264Encoder(image.width, image.height)
            keyframe = True
        return self._encoder.encode(image.tobytes("raw", "BGRX"), at_us, keyframe=keyframe)

    def close(self) -> None:
        encoder, self._encoder = self._encoder, None
        if encoder is not None:
            encoder.close()


# --- drawing -----------------------------------------------------------------------------------


@functools.cache
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:  # no DejaVu on this machine: Pillow's own font
        return ImageFont.load_default(size)


def draw_marks(image: Image.Image, shown: list[Shown], at_us: int) -> None:
    """Draw each mark as it looks at `at_us` (hub clock): rings spread and fade, paths,
    scroll marks and captions fade out in their last quarter."""
    draw = ImageDraw.Draw(image, "RGBA")
    captions = []
    for each in shown:
        progress = (at_us - each.at_us) / (each.until_us - each.at_us)
        red, green, blue = COLOURS[each.source]
        fade = round(255 * min(1.0, 4 * (1 - progress)))  # full, then out in the last quarter
        match each.mark:
            case Ripple(x=x, y=y, button=button, count=count):
                for ring in range(count):
                    radius = 8 + 34 * max(0.0, progress - 0.15 * ring)
                    alpha = round(255 * (1 - progress))
                    box = (x - radius, y - radius, x + radius, y + radius)
                    draw.ellipse(box, outline=(red, green, blue, alpha), width=4)
                draw.ellipse((x - 5, y - 5, x + 5, y + 5), fill=(red, green, blue, fade))
                label = WHO[each.source] + ("" if button == "left" else f" {button}")
                label += f" ×{count}" if count > 1 else ""
                _tag(draw, x + 14, y + 12, label, (red, green, blue, fade))
            case Trail(points=points):
                draw.line(points, fill=(red, green, blue, fade), width=4, joint="curve")
                (x0, y0), (x1, y1) = points[0], points[-1]
                draw.ellipse((x0 - 5, y0 - 5, x0 + 5, y0 + 5), fill=(red, green, blue, fade))
                draw.ellipse((x1 - 7, y1 - 7, x1 + 7, y1 + 7), outline=(red, green, blue, fade),
                             width=3)  # fmt: skip
            case ScrollMark(x=x, y=y, dx=dx, dy=dy):
                _arrow(draw, x, y, dx, dy, (red, green, blue, fade))
                clicks = abs(dy) if dy else abs(dx)
                _tag(
                    draw,
                    x + 16,
                    y + 12,
                    f"{WHO[each.source]} scroll ×{clicks}",
                    (red, green, blue, fade),
                )
            case Caption(kind=kind, text=text):
                verb = "typed" if kind == "text" else "pressed"
                captions.append((f"{WHO[each.source]} {verb}: {text}", (red, green, blue, fade)))
    for row, (line, colour) in enumerate(reversed(captions[-2:])):  # the newest at the bottom
        _caption(draw, image, line, colour, row=row)


def _tag(draw: ImageDraw.ImageDraw, x: int, y: int, text: str, colour) -> None:
    font = _font(14)
    left, top, right, bottom = draw.textbbox((x, y), text, font=font)
    draw.rounded_rectangle((left - 4, top - 3, right + 4, bottom + 3), 4, fill=colour)
    draw.text((x, y), text, font=font, fill=(255, 255, 255, colour[3]))


def _caption(draw, image: Image.Image, text: str, colour, *, row: int) -> None:
    """A caption centred near the bottom; `row` 0 is the lowest."""
    font = _font(20)
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    width, height = right - left, bottom - top
    x = (image.width - width) // 2
    y = image.height - 40 - height - row * (height + 26)
    draw.rounded_rectangle(
        (x - 12, y - 8, x + width + 12, y + height + 10), 8, fill=(20, 24, 32, min(colour[3], 210))
    )
    draw.rectangle((x - 12, y - 8, x - 6, y + height + 10), fill=colour)
    draw.text((x - left, y - top), text, font=font, fill=(255, 255, 255, colour[3]))


def _arrow(draw, x: int, y: int, dx: int, dy: int, colour) -> None:
    """A chevron at (x, y) pointing the way the wheel scrolled."""
    ux, uy = (0, 1 if dy > 0 else -1) if dy else (1 if dx > 0 else -1, 0)
    for step in (0, 10):
        tip = (x + ux * (8 + step), y + uy * (8 + step))
        back = (x + ux * (step - 4), y + uy * (step - 4))
        side = (-uy * 9, ux * 9)
        draw.line(
            [(back[0] + side[0], back[1] + side[1]), tip, (back[0] - side[0], back[1] - side[1])],
            fill=colour,
            width=4,
        )
