"""What each grounding-model family expects and answers (see docs/grounding.md).

A `Family` knows the prompt its models were trained on, the image size to send, extra request
parameters, how to parse the answer, and the frame the answer's numbers live in:

- "0-1000": normalised to 0–1000 on each axis whatever the image size (OS-Atlas, UGround,
  UI-TARS v1);
- "0-1": relative, 0 to 1 (ShowUI);
- "image-pixels": absolute pixels of the image sent (UI-TARS-1.5, Qwen2.5-VL: of the
  smart-resized image, which we resize to ourselves; generic chat VLMs: of the image we send).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from openai.types.chat import (
    ChatCompletionContentPartParam,
    ChatCompletionMessageParam,
)

from cubicle.agent.grounding import _parse
from cubicle.agent.grounding._image import fit_within
from cubicle.agent.grounding.resize import (
    QWEN_MAX_PIXELS,
    QWEN_MIN_PIXELS,
    UI_TARS_MIN_PIXELS,
    smart_resize,
)
from cubicle.protocol.errors import InvalidRequest

Convention = Literal["0-1000", "0-1", "image-pixels"]
Messages = list[ChatCompletionMessageParam]
BuildMessages = Callable[[str, str, tuple[int, int]], Messages]
"""(description, image data URL, (width, height) of the image sent) → chat messages."""

MAX_SIDE = 1280
"""Longer side, in pixels, of the image sent to families whose answers do not depend on it."""


@dataclass(frozen=True, slots=True)
class Family:
    """One family of grounding models: how to ask, what to send, how to read the answer."""

    name: str
    """Name users pick it by, e.g. "ui-tars-1.5"."""
    convention: Convention
    """Frame of the numbers in the answer (see the module docstring)."""
    build_messages: BuildMessages
    parse: Callable[[str], _parse.Numbers | None]
    """Raw answer → 2 numbers (point) or 4 (box) in the answer's frame; None = not there."""
    smart_resized: bool = False
    """Send the image at exactly `smart_resize` of its size (absolute-pixel Qwen-style
    models); otherwise scale it down to fit `MAX_SIDE`, or send it as is when it fits."""
    min_pixels: int = QWEN_MIN_PIXELS
    """Lower bound on the area of the smart-resized image, in pixels."""
    max_pixels: int = QWEN_MAX_PIXELS
    """Upper bound on the area of the smart-resized image, in pixels."""
    temperature: float | None = None
    """Sampling temperature; None leaves the server's (the model's generation config)."""
    max_tokens: int = 256
    """Cap on the answer's length, in tokens: grounding answers are a few dozen."""
    extra_body: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    """Fields added to the request body as is (vLLM sampling options…)."""

    def image_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """(width, height) to send a screenshot of `size` (width, height) at."""
        if self.smart_resized:
            width, height = size
            h_bar, w_bar = smart_resize(
                height, width, min_pixels=self.min_pixels, max_pixels=self.max_pixels
            )
            return w_bar, h_bar
        return fit_within(size, MAX_SIDE)

    def locate(
        self, raw: str, sent_size: tuple[int, int], screen_size: tuple[int, int]
    ) -> tuple[int, int, tuple[int, int, int, int] | None] | None:
        """The model's answer `raw` as (x, y, box) in screen pixels, box None for a point;
        None when the answer is empty or says the element is not there.

        `sent_size` is the (width, height) of the image the model saw, `screen_size` the
        real screen's. Raises `GroundingError` for answers that do not parse or point off
        the screen."""
        numbers = self.parse(raw) if raw.strip() else None
        if numbers is None:
            return None
        return _parse.to_screen(numbers, self.frame(sent_size), screen_size, raw)

    def frame(self, sent_size: tuple[int, int]) -> tuple[float, float]:
        """(width, height) of the answer's frame, given the size of the image sent."""
        if self.convention == "0-1000":
            return 1000.0, 1000.0
        if self.convention == "0-1":
            return 1.0, 1.0
        return float(sent_size[0]), float(sent_size[1])


def _image(url: str) -> ChatCompletionContentPartParam:
    return {"type": "image_url", "image_url": {"url": url}}


def _text(text: str) -> ChatCompletionContentPartParam:
    return {"type": "text", "text": text}


def _user(*parts: ChatCompletionContentPartParam) -> ChatCompletionMessageParam:
    return {"role": "user", "content": list(parts)}


def _os_atlas(description: str, url: str, size: tuple[int, int]) -> Messages:
    prompt = (
        "In this UI screenshot, what is the position of the element corresponding to the "
        f'command "{description}" (with bbox)?'
    )
    return [_user(_image(url), _text(prompt))]


_SHOWUI_SYSTEM = (
    "Based on the screenshot of the page, I give a text description and you give its "
    "corresponding location. The coordinate represents a clickable location [x, y] for an "
    "element, which is a relative coordinate on the screenshot, scaled from 0 to 1."
)


def _showui(description: str, url: str, size: tuple[int, int]) -> Messages:
    return [_user(_text(_SHOWUI_SYSTEM), _image(url), _text(description))]


_UGROUND = """\
Your task is to help the user identify the precise coordinates (x, y) of a specific \
area/element/object on the screen based on a description.

- Your response should aim to point to the center or a representative point within the \
described area/element/object as accurately as possible.
- If the description is unclear or ambiguous, infer the most relevant area or element based \
on its likely context or purpose.
- Your answer should be a single string (x, y) corresponding to the point of the interest.

Description: {description}

Answer:"""


def _uground(description: str, url: str, size: tuple[int, int]) -> Messages:
    return [_user(_image(url), _text(_UGROUND.format(description=description)))]


def _ui_tars(description: str, url: str, size: tuple[int, int]) -> Messages:
    prompt = (
        "Output only the coordinate of one point in your response. "
        f"What element matches the following task: {description}"
    )
    return [_user(_image(url), _text(prompt))]


def _computer_use_tool(width: int, height: int) -> dict[str, object]:
    """Qwen2.5-VL's `computer_use` function, reduced to pointing; the resolution it states is
    the resized image's, the frame of its coordinates."""
    description = (
        "Use a mouse and keyboard to interact with a computer, and take screenshots.\n"
        "* This is an interface to a desktop GUI.\n"
        f"* The screen's resolution is {width}x{height}.\n"
        "* Whenever you intend to move the cursor to click on an element like an icon, you "
        "should consult a screenshot to determine the coordinates of the element before "
        "moving the cursor.\n"
        "* Make sure to click any buttons, links, icons, etc with the cursor tip in the "
        "center of the element. Don't click boxes on their edges unless asked."
    )
    actions = (
        "The action to perform. The available actions are:\n"
        "* `mouse_move`: Move the cursor to a specified (x, y) pixel coordinate on the screen.\n"
        "* `left_click`: Click the left mouse button at a specified (x, y) pixel coordinate "
        "on the screen.\n"
        "* `terminate`: Terminate the current task and report its completion status."
    )
    coordinate = (
        "(x, y): The x (pixels from the left edge) and y (pixels from the top edge) "
        "coordinates to move the mouse to."
    )
    return {
        "type": "function",
        "function": {
            "name_for_human": "computer_use",
            "name": "computer_use",
            "description": description,
            "parameters": {
                "properties": {
                    "action": {
                        "description": actions,
                        "enum": ["mouse_move", "left_click", "terminate"],
                        "type": "string",
                    },
                    "coordinate": {"description": coordinate, "type": "array"},
                    "status": {
                        "description": "The status of the task. Required only by `terminate`.",
                        "type": "string",
                        "enum": ["success", "failure"],
                    },
                },
                "required": ["action"],
                "type": "object",
            },
            "args_format": "Format the arguments as a JSON object.",
        },
    }


def _qwen_system(width: int, height: int) -> str:
    tool = json.dumps(_computer_use_tool(width, height), ensure_ascii=False)
    return (
        "You are a helpful assistant.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{tool}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _qwen(description: str, url: str, size: tuple[int, int]) -> Messages:
    return [
        {"role": "system", "content": _qwen_system(*size)},
        _user(
            _text(f"Click on the element that matches this description: {description}"), _image(url)
        ),
    ]


def _generic(description: str, url: str, size: tuple[int, int]) -> Messages:
    width, height = size
    prompt = (
        f"This screenshot is {width}×{height} pixels. Find the user-interface element that "
        f'matches this description: "{description}".\n'
        'Answer with JSON only: {"x": <integer>, "y": <integer>}, the pixel at the centre of '
        f"the element, counted from the top-left corner of this {width}×{height} image. "
        'If no element matches, answer {"found": false}.'
    )
    return [_user(_image(url), _text(prompt))]


FAMILIES: Mapping[str, Family] = MappingProxyType(
    {
        family.name: family
        for family in (
            Family(
                "os-atlas",
                "0-1000",
                _os_atlas,
                _parse.parse_os_atlas,
                # vLLM strips <|box_start|> and friends unless told not to.
                extra_body=MappingProxyType({"skip_special_tokens": False}),
            ),
            Family("ui-tars", "0-1000", _ui_tars, _parse.parse_ui_tars),
            Family(
                "ui-tars-1.5",
                "image-pixels",
                _ui_tars,
                _parse.parse_ui_tars,
                smart_resized=True,
                min_pixels=UI_TARS_MIN_PIXELS,
            ),
            Family("showui", "0-1", _showui, _parse.parse_bracketed),
            Family("uground", "0-1000", _uground, _parse.parse_pair, temperature=0.0),
            Family(
                "qwen2.5-vl",
                "image-pixels",
                _qwen,
                _parse.parse_qwen_tool_call,
                smart_resized=True,
            ),
            Family("generic", "image-pixels", _generic, _parse.parse_json_point, temperature=0.0),
        )
    }
)
"""Every known family, by name."""


def get_family(name: str) -> Family:
    """The family called `name`; `InvalidRequest` naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        known = ", ".join(FAMILIES)
        raise InvalidRequest(
            f"unknown grounding model family {name!r}; pick one of: {known}"
        ) from None
