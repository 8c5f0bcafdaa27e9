"""smart_resize against the values docs/grounding.md lists (and the processor's rules)."""

from __future__ import annotations

import pytest

from cubicle.agent.grounding.resize import UI_TARS_MIN_PIXELS, smart_resize
from cubicle.protocol.errors import InvalidRequest

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("width", "height", "expected_width", "expected_height"),
    [
        (1024, 768, 1036, 756),
        (1280, 800, 1288, 812),
        (1366, 768, 1372, 756),
        (1920, 1080, 1932, 1092),
    ],
)
def test_known_values_with_default_bounds(width, height, expected_width, expected_height):
    assert smart_resize(height, width) == (expected_height, expected_width)


def test_max_pixels_scales_both_sides_down_keeping_multiples_of_28():
    assert smart_resize(1080, 1920, max_pixels=1280 * 28 * 28) == (728, 1316)


def test_min_pixels_scales_up_with_ceil():
    # 56×56 = 3136 pixels is under UI-TARS's 78,400: β = sqrt(78400 / 3136) = 5 → 280×280.
    assert smart_resize(56, 56, min_pixels=UI_TARS_MIN_PIXELS) == (280, 280)
    # 30×50: β = sqrt(78400/1500) ≈ 7.23 → ceil(216.9/28)·28 = 224, ceil(361.5/28)·28 = 364.
    assert smart_resize(30, 50, min_pixels=UI_TARS_MIN_PIXELS) == (224, 364)


def test_tiny_images_become_at_least_one_patch():
    assert smart_resize(10, 10, min_pixels=0) == (28, 28)


@pytest.mark.parametrize("size", [(800, 1280), (1080, 1920), (768, 1366), (333, 777)])
def test_a_resized_size_resizes_to_itself(size):
    """Sending the smart-resized image means the server's processor leaves it alone."""
    resized = smart_resize(*size)
    assert resized[0] % 28 == 0 and resized[1] % 28 == 0
    assert smart_resize(*resized) == resized


def test_a_large_screen_stays_under_max_pixels():
    height, width = smart_resize(2160, 3840, max_pixels=1280 * 28 * 28)
    assert height * width <= 1280 * 28 * 28
    assert (height, width) == (728, 1316)


@pytest.mark.parametrize(("height", "width"), [(0, 100), (100, -1), (1, 500)])
def test_impossible_sizes_are_refused(height, width):
    with pytest.raises(InvalidRequest):
        smart_resize(height, width)
