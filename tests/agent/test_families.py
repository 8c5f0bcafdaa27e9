"""Each family's parser and coordinate convention, on canned raw answers (docs/grounding.md).

Expected points are worked out by hand from the convention, e.g. UI-TARS v1 (197, 525) on a
1920×1080 screen: 197/1000·1920 = 378.24 → 378, 525/1000·1080 = 567.
"""

from __future__ import annotations

import pytest

from cubicle.agent.errors import GroundingError
from cubicle.agent.grounding.families import FAMILIES, get_family
from cubicle.protocol.errors import InvalidRequest

pytestmark = pytest.mark.fast

SMALL = (1280, 800)
BIG = (1920, 1080)


def locate(family: str, raw: str, screen: tuple[int, int], sent: tuple[int, int] | None = None):
    """What `family` makes of `raw` on `screen`, the image sent as the family would send it."""
    chosen = get_family(family)
    return chosen.locate(raw, sent or chosen.image_size(screen), screen)


def test_every_family_of_the_spec_is_known():
    assert set(FAMILIES) == {
        "os-atlas",
        "ui-tars",
        "ui-tars-1.5",
        "showui",
        "uground",
        "qwen2.5-vl",
        "generic",
    }


def test_an_unknown_family_names_the_known_ones():
    with pytest.raises(InvalidRequest) as caught:
        get_family("ui-tars-2")
    assert "ui-tars-2" in str(caught.value)
    for name in FAMILIES:
        assert name in str(caught.value)


@pytest.mark.parametrize(
    ("screen", "sent"),
    [
        # Absolute families: exactly smart_resize of the screenshot.
        (("ui-tars-1.5", SMALL), (1288, 812)),
        (("ui-tars-1.5", BIG), (1932, 1092)),
        (("qwen2.5-vl", SMALL), (1288, 812)),
        (("qwen2.5-vl", BIG), (1932, 1092)),
        # Other families: scaled to a longer side of 1280, or as is when it fits.
        (("os-atlas", SMALL), (1280, 800)),
        (("os-atlas", BIG), (1280, 720)),
        (("showui", BIG), (1280, 720)),
        (("generic", BIG), (1280, 720)),
        (("generic", (1024, 768)), (1024, 768)),
    ],
)
def test_image_size_sent(screen, sent):
    family, size = screen
    assert get_family(family).image_size(size) == sent


class TestOsAtlas:
    """Box in 0–1000: centre/1000 × screen."""

    def test_box_with_tags(self):
        raw = "<|box_start|>(576,12),(592,42)<|box_end|>"
        # centre (584, 27) → 747.52, 21.6; corners 737.28, 9.6, 757.76, 33.6
        assert locate("os-atlas", raw, SMALL) == (748, 22, (737, 10, 758, 34))

    def test_box_with_the_object_reference_and_end_token(self):
        raw = (
            "<|object_ref_start|>language switch<|object_ref_end|>"
            "<|box_start|>(576,12),(592,42)<|box_end|><|im_end|>"
        )
        # centre 584·1.92 = 1121.28, 27·1.08 = 29.16; corners 1105.92, 12.96, 1136.64, 45.36
        assert locate("os-atlas", raw, BIG) == (1121, 29, (1106, 13, 1137, 45))

    def test_box_without_tags(self):
        """What vLLM returns when special tokens are skipped."""
        assert locate("os-atlas", "language switch(576,12),(592,42)", SMALL) == (
            748,
            22,
            (737, 10, 758, 34),
        )

    def test_numbers_in_the_element_name_are_not_the_box(self):
        raw = "the 2nd tab (3, 4)(576,12),(592,42)"
        assert locate("os-atlas", raw, SMALL) == (748, 22, (737, 10, 758, 34))

    def test_two_numbers_are_a_point(self):
        assert locate("os-atlas", "<|box_start|>(500,250)<|box_end|>", SMALL) == (640, 200, None)
        assert locate("os-atlas", "(500,250)", SMALL) == (640, 200, None)

    def test_the_far_edge_is_the_last_pixel(self):
        assert locate("os-atlas", "(1000,1000)", SMALL) == (1279, 799, None)
        assert locate("os-atlas", "(0,0)", SMALL) == (0, 0, None)

    def test_a_reversed_box_is_put_in_order(self):
        assert locate("os-atlas", "(592,42),(576,12)", SMALL) == (748, 22, (737, 10, 758, 34))


class TestShowUI:
    """Relative point, 0 to 1: x × Ws, y × Hs."""

    def test_point(self):
        assert locate("showui", "[0.73, 0.21]", SMALL) == (934, 168, None)  # 934.4, 168
        assert locate("showui", "[0.73, 0.21]", BIG) == (1402, 227, None)  # 1401.6, 226.8

    def test_above_one_is_off_screen(self):
        with pytest.raises(GroundingError, match="off the screen"):
            locate("showui", "[1.3, 0.2]", SMALL)


class TestUGround:
    """Point in 0–1000: x/1000 × Ws."""

    def test_point(self):
        assert locate("uground", "(512, 300)", SMALL) == (655, 240, None)  # 655.36, 240
        assert locate("uground", "(512, 300)", BIG) == (983, 324, None)  # 983.04, 324

    def test_bare_pair(self):
        assert locate("uground", "512, 300", SMALL) == (655, 240, None)

    def test_beyond_1000_is_off_screen(self):
        with pytest.raises(GroundingError, match="off the screen") as caught:
            locate("uground", "(1200, 300)", SMALL)
        assert "(1200, 300)" in str(caught.value)


class TestUiTars:
    """v1: 0–1000 whatever the image size."""

    @pytest.mark.parametrize(
        "raw",
        [
            "click(start_box='(197,525)')",
            "(197,525)",
            "Action: click(start_box='<|box_start|>(197,525)<|box_end|>')",
            "Thought: the button is at the bottom.\nAction: click(start_box='(197,525)')",
            "<point>197 525</point>",
        ],
    )
    def test_point_forms(self, raw):
        assert locate("ui-tars", raw, BIG) == (378, 567, None)

    def test_start_box_with_four_numbers_is_a_box(self):
        raw = "click(start_box='(100,200,300,400)')"
        assert locate("ui-tars", raw, SMALL) == (256, 240, (128, 160, 384, 320))

    def test_negative_is_off_screen(self):
        with pytest.raises(GroundingError, match="off the screen"):
            locate("ui-tars", "click(start_box='(-5,20)')", SMALL)

    def test_three_numbers_do_not_parse(self):
        with pytest.raises(GroundingError, match="2 numbers"):
            locate("ui-tars", "click(start_box='(1,2,3)')", SMALL)


class TestUiTars15:
    """Absolute pixels of the smart-resized image: x/w̄ × Ws, y/h̄ × Hs."""

    def test_point_on_1280x800_sent_as_1288x812(self):
        # 644/1288·1280 = 640, 406/812·800 = 400
        assert locate("ui-tars-1.5", "click(start_box='(644,406)')", SMALL) == (640, 400, None)

    def test_point_tag(self):
        # 197/1288·1280 = 195.78, 525/812·800 = 517.24
        assert locate("ui-tars-1.5", "<point>197 525</point>", SMALL) == (196, 517, None)
        raw = "click(point='<point>644 406</point>')"
        assert locate("ui-tars-1.5", raw, SMALL) == (640, 400, None)

    def test_point_on_1920x1080_sent_as_1932x1092(self):
        assert locate("ui-tars-1.5", "(966,546)", BIG) == (960, 540, None)

    def test_the_same_answer_means_something_else_for_v1(self):
        assert locate("ui-tars", "(644,406)", SMALL) == (824, 325, None)  # 824.32, 324.8

    def test_beyond_the_resized_image_is_off_screen(self):
        with pytest.raises(GroundingError, match="off the screen"):
            locate("ui-tars-1.5", "(1300,406)", SMALL)


class TestQwen25VL:
    """computer_use tool call, absolute pixels of the resized image."""

    def test_tool_call(self):
        raw = (
            '<tool_call>\n{"name": "computer_use", "arguments": '
            '{"action": "left_click", "coordinate": [966, 546]}}\n</tool_call>'
        )
        assert locate("qwen2.5-vl", raw, BIG) == (960, 540, None)

    def test_compact_tool_call_on_the_small_screen(self):
        raw = (
            '<tool_call>{"name":"computer_use","arguments":'
            '{"action":"left_click","coordinate":[322,203]}}</tool_call>'
        )
        assert locate("qwen2.5-vl", raw, SMALL) == (320, 200, None)

    def test_terminate_means_not_found(self):
        raw = (
            '<tool_call>{"name":"computer_use","arguments":'
            '{"action":"terminate","status":"failure"}}</tool_call>'
        )
        assert locate("qwen2.5-vl", raw, SMALL) is None

    def test_off_screen(self):
        raw = '<tool_call>{"name":"computer_use","arguments":{"coordinate":[1300,10]}}</tool_call>'
        with pytest.raises(GroundingError, match="off the screen"):
            locate("qwen2.5-vl", raw, SMALL)

    def test_a_call_without_coordinate_does_not_parse(self):
        raw = '<tool_call>{"name":"computer_use","arguments":{"action":"key"}}</tool_call>'
        with pytest.raises(GroundingError, match="coordinate"):
            locate("qwen2.5-vl", raw, SMALL)


class TestGeneric:
    """JSON in pixels of the image sent, scaled by Ws/W."""

    def test_json_in_pixels_of_the_downscaled_image(self):
        # 1920×1080 is sent as 1280×720: ×1.5
        assert locate("generic", '{"x": 640, "y": 360}', BIG) == (960, 540, None)

    def test_fenced_json(self):
        assert locate("generic", '```json\n{"x": 100, "y": 50}\n```', SMALL) == (100, 50, None)

    def test_json_with_prose_around(self):
        raw = 'Sure! The Save button is at {"x": 101.6, "y": 50} in the image.'
        assert locate("generic", raw, SMALL) == (102, 50, None)

    def test_not_found(self):
        assert locate("generic", '{"found": false}', SMALL) is None
        assert locate("generic", '{"x": null, "y": null}', SMALL) is None

    def test_off_the_image(self):
        with pytest.raises(GroundingError, match="off the screen"):
            locate("generic", '{"x": 1400, "y": 100}', SMALL)

    def test_a_string_coordinate_does_not_parse(self):
        with pytest.raises(GroundingError, match="not a number"):
            locate("generic", '{"x": "left", "y": 3}', SMALL)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_empty_answer_means_not_found(family):
    assert locate(family, "", SMALL) is None
    assert locate(family, "  \n", SMALL) is None


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_garbage_raises_with_the_raw_answer(family):
    raw = "I am sorry, I cannot see such an element."
    with pytest.raises(GroundingError) as caught:
        locate(family, raw, SMALL)
    assert raw in str(caught.value)
    assert caught.value.raw == raw


def test_a_long_answer_is_truncated_in_the_message_but_kept_whole():
    raw = "blah " * 1000
    with pytest.raises(GroundingError) as caught:
        locate("uground", raw, SMALL)
    assert len(str(caught.value)) < 600
    assert "5000 characters" in str(caught.value)
    assert caught.value.raw == raw
