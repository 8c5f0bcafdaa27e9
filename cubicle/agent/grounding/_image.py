"""Screenshot preparation for model grounders: decode, resize, encode as a data URL.

CPU-bound (decoding and PNG-encoding a 1920×1080 image takes tens of milliseconds), so
callers run `prepare` in a thread.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from cubicle.protocol.errors import InvalidRequest

_ASPECT_TOLERANCE = 0.02
"""Relative difference allowed between the screenshot's and the screen's aspect ratios."""


@dataclass(frozen=True, slots=True)
class PreparedImage:
    """The image as sent to the model."""

    data_url: str
    """`data:image/png;base64,…`, for an OpenAI `image_url` content part."""
    size: tuple[int, int]
    """(width, height) in pixels of the image sent: the frame of absolute-pixel answers."""


def load(screenshot: bytes | Image.Image) -> Image.Image:
    """The screenshot as an RGB PIL image; encoded bytes are decoded."""
    if isinstance(screenshot, Image.Image):
        image = screenshot
    else:
        try:
            image = Image.open(io.BytesIO(screenshot))
            image.load()
        except (UnidentifiedImageError, OSError) as exc:
            raise InvalidRequest(
                f"the screenshot ({len(screenshot)} bytes) is not an image PIL can decode; "
                "pass PNG or JPEG bytes or a PIL image"
            ) from exc
    return image if image.mode == "RGB" else image.convert("RGB")


def check_aspect(image_size: tuple[int, int], screen_size: tuple[int, int]) -> None:
    """Refuse a screenshot that cannot be a scaled copy of the screen: its points would map
    to the wrong places."""
    width, height = image_size
    screen_w, screen_h = screen_size
    if screen_w <= 0 or screen_h <= 0:
        raise InvalidRequest(f"the screen size must be positive, not {screen_w}×{screen_h}")
    image_ratio, screen_ratio = width / height, screen_w / screen_h
    if abs(image_ratio - screen_ratio) > _ASPECT_TOLERANCE * screen_ratio:
        raise InvalidRequest(
            f"the screenshot is {width}×{height} but the screen is {screen_w}×{screen_h}: "
            "their aspect ratios differ, so points cannot be mapped back; pass a screenshot "
            "of the whole screen (scaled or not) and the screen's real size"
        )


def fit_within(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """`size` (width, height) scaled down, aspect kept, so its longer side is at most
    `max_side`; unchanged when it already fits."""
    width, height = size
    longer = max(width, height)
    if longer <= max_side:
        return size
    scale = max_side / longer
    return max(1, round(width * scale)), max(1, round(height * scale))


def prepare(image: Image.Image, size: tuple[int, int]) -> PreparedImage:
    """`image` resized to exactly `size` (width, height) when it differs, PNG-encoded."""
    if image.size != size:
        image = image.resize(size, Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
    return PreparedImage(data_url=f"data:image/png;base64,{encoded}", size=image.size)
