"""`smart_resize`: the image size Qwen2-VL-family processors (Qwen2-VL, Qwen2.5-VL, UI-TARS-1.5)
resize a screenshot to.

Models that answer in ABSOLUTE pixels answer in pixels of that resized image, not of the
screenshot. Grounders therefore resize the screenshot to exactly this size themselves before
sending it, so the processor leaves it alone and the model's pixels are the pixels we sent.
"""

from __future__ import annotations

import math

from cubicle.protocol.errors import InvalidRequest

QWEN_MIN_PIXELS = 4 * 28 * 28
"""Default lower bound on h̄·w̄ (3136) of the Qwen2-VL / Qwen2.5-VL processors."""
QWEN_MAX_PIXELS = 16384 * 28 * 28
"""Default upper bound on h̄·w̄ (12,845,056) of the Qwen2-VL / Qwen2.5-VL processors."""
UI_TARS_MIN_PIXELS = 100 * 28 * 28
"""UI-TARS-1.5's lower bound on h̄·w̄ (78,400)."""

_MAX_ASPECT_RATIO = 200
"""The processors refuse images more elongated than this."""


def smart_resize(
    height: int,
    width: int,
    *,
    factor: int = 28,
    min_pixels: int = QWEN_MIN_PIXELS,
    max_pixels: int = QWEN_MAX_PIXELS,
) -> tuple[int, int]:
    """The (h̄, w̄) a `height`×`width` image is resized to, both multiples of `factor`.

    Note the order: height first, as in the Qwen processors, and the result is
    (height, width) too. Each side is rounded to the nearest multiple of `factor`; when the
    area then exceeds `max_pixels` (falls below `min_pixels`) both sides are scaled by the
    same β and floored (ceiled) to multiples of `factor`, keeping the aspect ratio.

    >>> smart_resize(800, 1280)
    (812, 1288)
    """
    if height <= 0 or width <= 0:
        raise InvalidRequest(f"an image must have a positive size, not {width}×{height} pixels")
    if max(height, width) / min(height, width) > _MAX_ASPECT_RATIO:
        raise InvalidRequest(
            f"a {width}×{height} image is too elongated for the model's image processor "
            f"(aspect ratio over {_MAX_ASPECT_RATIO}); crop it first"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
