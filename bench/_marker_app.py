"""The marker: the wall-clock time drawn on the screen as squares a page can read back.

Runs inside a desktop (copied there by `bench._marker`) under the service's interpreter,
whose virtualenv the sandbox binds: python-xlib and numpy, nothing of `bench`. So this
file stands alone and only imports them in `main()`.

`python _marker_app.py MODE X Y PERIOD_MS` maps an override-redirect window (no window
manager frame, above the normal windows) and redraws it every PERIOD_MS milliseconds. At
screen pixel (X, Y) it draws a row of `SQUARES` black/white squares of `SQUARE` pixels,
on a white quiet zone of `SQUARE` pixels all round:

    guard (4) | time: milliseconds since the epoch mod 2**24, MSB first (24) | CRC-8 (8) | guard (4)

White is 1. The time is read right before the squares are drawn, and the code reaches the
window in one X request (a copy from a pixmap), so a grab never sees half a code. MODE
`small` maps a window of just the code; MODE `full` maps one over the whole screen whose
background, a busy texture of coloured tiles, stripes and discs, scrolls `SCROLL_PX`
pixels a frame, so every pixel of the screen changes every frame.
"""

from __future__ import annotations

import sys
import time

SQUARE = 12
"""Pixels per side of one square."""
GUARD_LEFT = (1, 0, 1, 0)
GUARD_RIGHT = (0, 1, 0, 1)
TIME_BITS = 24
"""The code holds the time in milliseconds modulo 2**24 (4.6 hours)."""
CRC_BITS = 8
SQUARES = len(GUARD_LEFT) + TIME_BITS + CRC_BITS + len(GUARD_RIGHT)
CODE_WIDTH = (SQUARES + 2) * SQUARE
"""Pixels, quiet zone included."""
CODE_HEIGHT = 3 * SQUARE
SCROLL_PX = 4
"""Pixels the `full` background moves per frame."""


def crc8(value: int) -> int:
    """CRC-8 (polynomial 0x07) of the three bytes of `value`, most significant first."""
    crc = 0
    for shift in (16, 8, 0):
        crc ^= (value >> shift) & 0xFF
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def code_bits(ms: int) -> list[int]:
    """The squares for time `ms`, left to right (1 = white)."""
    value = ms % (1 << TIME_BITS)
    word = (value << CRC_BITS) | crc8(value)
    data = [(word >> (TIME_BITS + CRC_BITS - 1 - i)) & 1 for i in range(TIME_BITS + CRC_BITS)]
    return [*GUARD_LEFT, *data, *GUARD_RIGHT]


def _texture(np, width: int, height: int):
    """BGRX pixels, `height` × `width`: tiles of pseudo-random colours, stripes, discs."""
    rows, cols = np.mgrid[0:height, 0:width]
    seed = ((rows // 32) * 7919 + (cols // 32) * 104729) % 997
    bgrx = np.zeros((height, width, 4), np.uint8)
    bgrx[..., 0] = (seed % 13) * 19
    bgrx[..., 1] = (seed % 7) * 36
    bgrx[..., 2] = (seed % 10) * 25
    stripes = ((cols + rows // 2) % 48) < 4
    bgrx[stripes] = (230, 230, 230, 0)
    for i in range(40):
        cx, cy, r = (i * 149) % width, (i * 89) % height, 20 + i % 30
        bgrx[(cols - cx) ** 2 + (rows - cy) ** 2 < r * r] = (20, 20, 20, 0)
    return bgrx


def _upload(window, gc, np, pixels, y0: int = 0) -> None:
    """PutImage `pixels` into `window` at row `y0`, in requests small enough for X."""
    height, width = pixels.shape[:2]
    step = max(1, 200_000 // (width * 4))
    for top in range(0, height, step):
        chunk = np.ascontiguousarray(pixels[top : top + step])
        window.put_image(gc, 0, y0 + top, width, chunk.shape[0], 2, 24, 0, chunk.tobytes())


def main(argv: list[str]) -> None:
    import numpy as np
    from Xlib import X, display

    mode, x, y, period = argv[0], int(argv[1]), int(argv[2]), float(argv[3]) / 1000
    dpy = display.Display()
    screen = dpy.screen()
    width, height = screen.width_in_pixels, screen.height_in_pixels
    full = mode == "full"
    left, top = (x, y) if full else (SQUARE, SQUARE)
    window = screen.root.create_window(
        0 if full else x - SQUARE,
        0 if full else y - SQUARE,
        width if full else CODE_WIDTH,
        height if full else CODE_HEIGHT,
        0,
        screen.root_depth,
        X.InputOutput,
        X.CopyFromParent,
        override_redirect=True,
        background_pixel=screen.white_pixel,
    )
    black = window.create_gc(foreground=screen.black_pixel)
    white = window.create_gc(foreground=screen.white_pixel)
    code = window.create_pixmap(CODE_WIDTH, CODE_HEIGHT, screen.root_depth)
    if full:  # the texture twice, one above the other, so any scroll offset is one copy
        texture = window.create_pixmap(width, 2 * height, screen.root_depth)
        pixels = _texture(np, width, height)
        _upload(texture, white, np, pixels)
        _upload(texture, white, np, pixels, height)
        outside = window.create_gc()  # draws everywhere but on the code
        outside.set_clip_rectangles(
            0,
            0,
            [
                (0, 0, width, top - SQUARE),
                (0, top - SQUARE, left - SQUARE, CODE_HEIGHT),
                (left - SQUARE + CODE_WIDTH, top - SQUARE, width, CODE_HEIGHT),
                (0, top - SQUARE + CODE_HEIGHT, width, height),
            ],
            X.Unsorted,
        )
    window.map()
    frame = 0
    deadline = time.monotonic()
    while True:
        code.fill_rectangle(white, 0, 0, CODE_WIDTH, CODE_HEIGHT)
        bits = code_bits(int(time.time() * 1000))
        squares = [((i + 1) * SQUARE, SQUARE, SQUARE, SQUARE) for i, b in enumerate(bits) if not b]
        code.poly_fill_rectangle(black, squares)
        window.copy_area(white, code, 0, 0, CODE_WIDTH, CODE_HEIGHT, left - SQUARE, top - SQUARE)
        if full:
            offset = (frame * SCROLL_PX) % height
            window.copy_area(outside, texture, 0, offset, width, height, 0, 0)
        dpy.flush()
        frame += 1
        deadline = max(deadline + period, time.monotonic())
        time.sleep(max(0.0, deadline - time.monotonic()))


if __name__ == "__main__":
    main(sys.argv[1:])
