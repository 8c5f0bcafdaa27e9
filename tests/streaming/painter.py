"""Moving content for streaming tests, in a process of its own so it does not compete for
the test's GIL: `python -m tests.streaming.painter DISPLAY SECONDS`.

Covers the screen with an override-redirect window and slides coloured stripes across it,
about 100 repaints a second, like a fast scroll; exits after SECONDS.
"""

from __future__ import annotations

import sys
import time

from Xlib import X
from Xlib.display import Display


def paint(display_name: str, seconds: float) -> int:
    display = Display(display_name)
    root = display.screen().root
    geometry = root.get_geometry()
    window = root.create_window(
        0,
        0,
        geometry.width,
        geometry.height,
        0,
        X.CopyFromParent,
        override_redirect=True,
        background_pixel=0xFFFFFF,
    )
    window.map()
    gc = window.create_gc(foreground=0)
    step, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        for y in range(0, geometry.height, 16):
            gc.change(foreground=((y * 7919 + step * 8) * 2654435761) & 0xFFFFFF)
            x = (step * 8) % geometry.width - geometry.width // 2 + y % 64
            window.fill_rectangle(gc, x, y, geometry.width // 2, 8)
        display.sync()
        step += 1
        time.sleep(0.01)
    window.destroy()
    display.close()
    return step


if __name__ == "__main__":
    print(paint(sys.argv[1], float(sys.argv[2])))
