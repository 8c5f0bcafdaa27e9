"""Windows larger than the screen are fitted to it; windows that fit are left alone."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from Xlib.display import Display

from cubicle.guest.fit import WindowFitter
from cubicle.guest.windows import list_windows, wait_for_window
from cubicle.protocol.models import WindowInfo

from .conftest import XSession
from .test_windows import PROBE

FRAME_ALLOWANCE = 40
"""Pixels of title bar and borders xfwm4 may add around a window."""


@pytest.fixture(scope="module")
def fitter(x_session: XSession) -> Iterator[WindowFitter]:
    watching = WindowFitter(x_session.display)
    watching.start()
    yield watching
    watching.stop()


def open_probe(x_session: XSession, display: Display, width: int, height: int) -> WindowInfo:
    title = f"fit {uuid.uuid4().hex[:8]}"
    argv = ["/usr/bin/python3", "-c", PROBE, title, "60", "60", str(width), str(height)]
    x_session.spawn([*argv, "normal"])
    return wait_for_window(display, lambda w: w.title == title, 10.0)


def settled(display: Display, window_id: int) -> WindowInfo:
    """The window once its geometry has held still for a moment."""
    last, since = None, time.monotonic()
    deadline = since + 10
    while time.monotonic() < deadline:
        now = next(w for w in list_windows(display) if w.id == window_id)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > 0.5:
            return now
        time.sleep(0.05)
    raise AssertionError(f"window {window_id} kept changing: {last}")


def test_a_window_taller_than_the_screen_is_fitted_to_it(x_session, display, fitter):
    window = settled(display, open_probe(x_session, display, 1000, 1100).id)
    assert window.y >= 0 and window.y + window.height <= x_session.height
    assert window.height >= x_session.height - FRAME_ALLOWANCE - window.y
    assert window.width == 1000


def test_a_window_that_fits_is_left_alone(x_session, display, fitter):
    window = settled(display, open_probe(x_session, display, 400, 300).id)
    assert (window.width, window.height) == (400, 300)
