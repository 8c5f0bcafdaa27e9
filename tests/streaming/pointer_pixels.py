"""Finding the pointer in a picture of a real desktop: where it differs from the screen
without it. The desktop's own screenshots say where the pointer must be: the pixels
`screenshot?cursor=true` changes over the plain screenshot."""

from __future__ import annotations

import io

import httpx
import numpy as np
from PIL import Image

Box = tuple[int, int, int, int]
"""left, top, right, bottom (included), screen pixels."""
REACH = 48
"""Pixels around the pointer's position searched for it."""


def rgb(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def screenshots(api: httpx.Client, desktop_id: str) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(screen without the pointer, with it, the pointer's position from X-Cursor)."""
    url = f"/api/desktops/{desktop_id}/screenshot"
    plain = api.get(url)
    drawn = api.get(url, params={"cursor": "true"})
    assert plain.status_code == drawn.status_code == 200, drawn.text
    x, y = (int(v) for v in drawn.headers["x-cursor"].split(","))
    return rgb(plain.content), rgb(drawn.content), (x, y)


def differs(picture: np.ndarray, plain: np.ndarray, x: int, y: int, threshold: int) -> Box | None:
    """The box of pixels near (x, y) where `picture` differs from `plain` by more than
    `threshold` (summed over R, G, B); None if none do."""
    left, top = max(x - REACH, 0), max(y - REACH, 0)
    window = (slice(top, y + REACH), slice(left, x + REACH))
    changed = np.abs(picture[window] - plain[window]).sum(axis=2) > threshold
    rows, cols = np.nonzero(changed)
    if not len(rows):
        return None
    return left + cols.min(), top + rows.min(), left + cols.max(), top + rows.max()


def pointer_box(plain: np.ndarray, drawn: np.ndarray, x: int, y: int) -> Box:
    """Where the desktop itself draws its pointer (exact pixels, no compression)."""
    box = differs(drawn, plain, x, y, 150)
    assert box is not None, f"screenshot?cursor=true shows no pointer near {(x, y)}"
    return box


def near(box: Box | None, expected: Box, pixels: int) -> bool:
    return box is not None and all(abs(a - b) <= pixels for a, b in zip(box, expected, strict=True))
