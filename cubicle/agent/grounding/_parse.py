"""Parsers for the raw answers of grounding models, and the mapping to screen pixels.

A parser returns the numbers the model gave, in the model's own frame: 2 numbers are a point
(x, y), 4 a box (x1, y1, x2, y2). It returns None when the model says the element is not
there, and raises `GroundingError` when the answer does not parse. Nothing is ever `eval`ed:
regexes, `json` and `ast.literal_eval` only.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from cubicle.agent.errors import GroundingError

Numbers = tuple[float, ...]
"""2 numbers (a point) or 4 (a box: x1, y1, x2, y2), in the model's frame."""

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_GROUP = re.compile(rf"[\[(]\s*({_NUM}(?:\s*,\s*{_NUM})*)\s*[\])]")
"""A parenthesised or bracketed list of numbers: `(197,525)`, `[0.73, 0.21]`, `[1, 2, 3, 4]`."""
_PAIR = rf"\(\s*({_NUM})\s*,\s*({_NUM})\s*\)"
_PAIR_SEPARATOR = re.compile(r"\s*,?\s*")
_POINT = re.compile(_PAIR)
_BOX_TAGS = re.compile(r"<\|box_start\|>(.*?)<\|box_end\|>", re.S)
_OBJECT_REF = re.compile(r"<\|object_ref_start\|>.*?<\|object_ref_end\|>", re.S)
_ACTION_ARG = re.compile(r"\b(?:start_box|start_point|point)\s*=\s*(['\"])(.*?)\1", re.S)
_POINT_TAG = re.compile(r"<point>(.*?)</point>", re.S)
_BBOX_TAG = re.compile(r"<bbox>(.*?)</bbox>", re.S)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


def _numbers(text: str) -> Numbers:
    return tuple(float(n) for n in re.findall(_NUM, text))


def _point_or_box(numbers: Numbers, what: str, raw: str) -> Numbers:
    if len(numbers) not in (2, 4):
        raise GroundingError(f"expected 2 numbers (a point) or 4 (a box) in {what}", raw=raw)
    return numbers


def _last_group(text: str, sizes: tuple[int, ...] = (2, 4)) -> Numbers | None:
    groups = [_numbers(m.group(1)) for m in _GROUP.finditer(text)]
    fitting = [g for g in groups if len(g) in sizes]
    return fitting[-1] if fitting else None


def parse_os_atlas(raw: str) -> Numbers | None:
    """`<|box_start|>(576,12),(592,42)<|box_end|>`, the same without the tags (vLLM drops
    special tokens unless asked not to), or one pair: a point. Frame 0–1000.

    Untagged, the element's name comes first and may hold numbers of its own, so the box is
    the last two pairs when only a comma separates them, else the last pair is a point."""
    tagged = _BOX_TAGS.search(raw)
    text = tagged.group(1) if tagged else _OBJECT_REF.sub("", raw)
    pairs = list(_POINT.finditer(text))
    if not pairs:
        raise GroundingError("OS-Atlas answers a box (x1,y1),(x2,y2) or a point (x,y)", raw=raw)
    last = pairs[-1]
    if len(pairs) > 1 and _PAIR_SEPARATOR.fullmatch(text, pairs[-2].end(), last.start()):
        return _numbers(" ".join(pairs[-2].groups() + last.groups()))
    return _numbers(" ".join(last.groups()))


def parse_bracketed(raw: str) -> Numbers | None:
    """ShowUI's `[0.73, 0.21]` (or a 4-number box), frame 0–1."""
    found = _last_group(raw)
    if found is None:
        raise GroundingError("ShowUI answers a point [x, y] with x and y from 0 to 1", raw=raw)
    return found


def parse_pair(raw: str) -> Numbers | None:
    """UGround's `(512, 300)`; a bare `512, 300` too. Frame 0–1000."""
    found = _last_group(raw)
    if found is None:
        bare = re.fullmatch(rf"\s*({_NUM})\s*,\s*({_NUM})\s*", raw)
        if bare is None:
            raise GroundingError("UGround answers a point (x, y) from 0 to 1000", raw=raw)
        found = _numbers(" ".join(bare.groups()))
    return found


def parse_ui_tars(raw: str) -> Numbers | None:
    """UI-TARS action syntax: `click(start_box='(197,525)')`, `start_box='<|box_start|>(x1,y1,
    x2,y2)<|box_end|>'`, `click(point='<point>197 525</point>')`, `<point>197 525</point>`,
    or a bare `(197,525)`. 2 numbers are a point, 4 a box. The frame depends on the version
    (v1: 0–1000; 1.5: pixels of the smart-resized image), not the syntax."""
    argument = _ACTION_ARG.search(raw)
    if argument:
        return _point_or_box(_numbers(argument.group(2)), "the action's start_box/point", raw)
    for tag in (_POINT_TAG, _BBOX_TAG, _BOX_TAGS):
        found = tag.search(raw)
        if found:
            return _point_or_box(_numbers(found.group(1)), "the tagged point", raw)
    group = _last_group(raw)
    if group is None:
        raise GroundingError(
            "UI-TARS answers click(start_box='(x,y)'), (x,y) or <point>x y</point>", raw=raw
        )
    return group


def _json_object(text: str, raw: str, what: str) -> dict[str, Any]:
    """The first `{…}` object in `text` (code fences and prose around it are ignored)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise GroundingError(f"expected {what}", raw=raw)
    snippet = text[start : end + 1]
    try:
        value = json.loads(snippet)
    except json.JSONDecodeError:
        try:  # single quotes, True/False: a Python literal, still never eval'ed
            value = ast.literal_eval(snippet)
        except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
            raise GroundingError(f"expected {what}, but it is not valid JSON", raw=raw) from exc
    if not isinstance(value, dict):
        raise GroundingError(f"expected {what}", raw=raw)
    return value


def _coordinate(value: object, what: str, raw: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GroundingError(f"{what} is not a number", raw=raw)
    return float(value)


def parse_qwen_tool_call(raw: str) -> Numbers | None:
    """`<tool_call>{"name":"computer_use","arguments":{"action":"left_click","coordinate":
    [x,y]}}</tool_call>` (or the bare JSON). Frame: pixels of the resized image sent.
    A `terminate` call without a coordinate means the model gave up: not found."""
    call = _TOOL_CALL.search(raw)
    what = 'a computer_use <tool_call> with "coordinate": [x, y]'
    payload = _json_object(call.group(1) if call else raw, raw, what)
    arguments = payload.get("arguments", payload)
    if isinstance(arguments, str):  # some servers double-encode the arguments
        arguments = _json_object(arguments, raw, what)
    if not isinstance(arguments, dict):
        raise GroundingError(f"expected {what}", raw=raw)
    coordinate = arguments.get("coordinate")
    if coordinate is None and arguments.get("action") == "terminate":
        return None
    if not isinstance(coordinate, list | tuple) or len(coordinate) != 2:
        raise GroundingError(f"expected {what}", raw=raw)
    return tuple(_coordinate(c, "a coordinate", raw) for c in coordinate)


def parse_json_point(raw: str) -> Numbers | None:
    """`{"x": 412, "y": 230}`, maybe in ```json fences or with prose around it;
    `{"found": false}` (or null coordinates) means not found. Frame: pixels of the image
    sent."""
    payload = _json_object(raw, raw, 'a JSON object {"x": …, "y": …}')
    if payload.get("found") is False:
        return None
    x, y = payload.get("x"), payload.get("y")
    if x is None and y is None:
        return None
    return _coordinate(x, '"x"', raw), _coordinate(y, '"y"', raw)


def to_screen(
    numbers: Numbers,
    frame: tuple[float, float],
    screen_size: tuple[int, int],
    raw: str,
) -> tuple[int, int, tuple[int, int, int, int] | None]:
    """Map a point or box from the model's `frame` (width, height: (1000, 1000) for 0–1000
    answers, (1, 1) for relative ones, the image sent for absolute ones) to screen pixels.

    Returns (x, y, box); for a box, (x, y) is its centre. Coordinates outside the frame
    raise `GroundingError`: the model pointed off the screen, and guessing a nearby point
    would click something nobody asked for. A coordinate on the frame's far edge (1000 of
    0–1000) maps to the last pixel.
    """
    frame_w, frame_h = frame
    screen_w, screen_h = screen_size
    xs, ys = numbers[0::2], numbers[1::2]
    if not all(0 <= x <= frame_w for x in xs) or not all(0 <= y <= frame_h for y in ys):
        shown = ", ".join(f"{n:g}" for n in numbers)
        raise GroundingError(
            f"the model pointed off the screen: ({shown}) lies outside its answer frame "
            f"of {frame_w:g}×{frame_h:g}",
            raw=raw,
        )

    def pixel(value: float, frame_side: float, screen_side: int) -> int:
        return min(round(value / frame_side * screen_side), screen_side - 1)

    if len(numbers) == 2:
        return pixel(xs[0], frame_w, screen_w), pixel(ys[0], frame_h, screen_h), None
    left, right = sorted(xs)
    top, bottom = sorted(ys)
    box = (
        pixel(left, frame_w, screen_w),
        pixel(top, frame_h, screen_h),
        pixel(right, frame_w, screen_w),
        pixel(bottom, frame_h, screen_h),
    )
    centre_x = pixel((left + right) / 2, frame_w, screen_w)
    centre_y = pixel((top + bottom) / 2, frame_h, screen_h)
    return centre_x, centre_y, box
