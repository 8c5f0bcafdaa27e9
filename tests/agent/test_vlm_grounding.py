"""`VlmGrounder` end to end: the real `openai` client against the scripted model server."""

from __future__ import annotations

import io
import socket
import time
from dataclasses import dataclass

import pytest
from PIL import Image, ImageDraw

from cubicle.agent.errors import ModelError
from cubicle.agent.grounding import VlmGrounder
from cubicle.protocol.errors import InvalidRequest
from tests.agent.fake_model import FakeModelServer, Turn

pytestmark = pytest.mark.fast

FAST = {"retry_backoff_s": 0.01}
"""Retry quickly where the backoff schedule is not what a test checks."""


def screenshot(size: tuple[int, int]) -> Image.Image:
    """A grey screen with a red button centred on the middle of the screen."""
    image = Image.new("RGB", size, (200, 200, 200))
    width, height = size
    ImageDraw.Draw(image).rectangle(
        (width // 2 - 40, height // 2 - 20, width // 2 + 40, height // 2 + 20), fill=(255, 0, 0)
    )
    return image


@dataclass(frozen=True)
class Case:
    family: str
    screen: tuple[int, int]
    answer: str
    point: tuple[int, int]
    """Expected result, screen pixels, worked out by hand."""
    sent: tuple[int, int]
    """Expected size of the image the model receives."""
    prompt: str
    """A fragment the request's text must contain."""


CASES = [
    Case(
        "os-atlas",
        (1920, 1080),
        "<|box_start|>(576,12),(592,42)<|box_end|>",
        (1121, 29),
        (1280, 720),
        'what is the position of the element corresponding to the command "the Save button" '
        "(with bbox)?",
    ),
    Case(
        "ui-tars",
        (1920, 1080),
        "click(start_box='(197,525)')",
        (378, 567),
        (1280, 720),
        "Output only the coordinate of one point in your response. What element matches the "
        "following task: the Save button",
    ),
    Case(
        "ui-tars-1.5",
        (1280, 800),
        "click(start_box='(644,406)')",
        (640, 400),
        (1288, 812),
        "What element matches the following task: the Save button",
    ),
    Case(
        "showui",
        (1280, 800),
        "[0.73, 0.21]",
        (934, 168),
        (1280, 800),
        "a relative coordinate on the screenshot, scaled from 0 to 1",
    ),
    Case(
        "uground",
        (1280, 800),
        "(512, 300)",
        (655, 240),
        (1280, 800),
        "Description: the Save button\n\nAnswer:",
    ),
    Case(
        "qwen2.5-vl",
        (1920, 1080),
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
        '"coordinate": [966, 546]}}\n</tool_call>',
        (960, 540),
        (1932, 1092),
        "The screen's resolution is 1932x1092.",
    ),
    Case(
        "generic",
        (1920, 1080),
        '```json\n{"x": 640, "y": 360}\n```',
        (960, 540),
        (1280, 720),
        "This screenshot is 1280×720 pixels",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.family}-{case.screen[0]}")
async def test_each_family_end_to_end(fake_model: FakeModelServer, case: Case):
    fake_model.script([case.answer])
    async with VlmGrounder(case.family, "grounder-7b", fake_model.url) as grounder:
        result = await grounder.ground("the Save button", screenshot(case.screen), case.screen)

    assert result is not None
    assert (result.x, result.y) == case.point
    assert result.raw == case.answer
    assert result.source == f"vlm:{case.family}"
    assert result.elapsed_ms > 0
    (request,) = fake_model.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == "grounder-7b"
    assert case.prompt in request.text
    assert "the Save button" in request.text
    assert request.image_sizes == [case.sent]
    assert request.headers["authorization"] == "Bearer EMPTY"


async def test_request_parameters_per_family(fake_model: FakeModelServer):
    fake_model.script(["(500,500)", "(500, 500)", "(500,500)"])
    for family in ("os-atlas", "uground", "ui-tars"):
        async with VlmGrounder(family, "m", fake_model.url) as grounder:
            await grounder.ground("the Save button", screenshot((1280, 800)), (1280, 800))
    os_atlas, uground, ui_tars = (request.body for request in fake_model.requests)
    assert os_atlas["skip_special_tokens"] is False
    assert uground["temperature"] == 0
    assert "temperature" not in ui_tars and "skip_special_tokens" not in ui_tars
    assert all(body["max_tokens"] == 256 for body in (os_atlas, uground, ui_tars))


async def test_the_image_sent_is_the_screenshot_resized_not_cropped(fake_model: FakeModelServer):
    fake_model.script(["click(start_box='(644,406)')"])
    async with VlmGrounder("ui-tars-1.5", "m", fake_model.url) as grounder:
        result = await grounder.ground("the red button", screenshot((1280, 800)), (1280, 800))
    (sent,) = fake_model.requests[0].images()
    assert sent.size == (1288, 812)
    assert sent.convert("RGB").getpixel((644, 406)) == (255, 0, 0)  # the button's middle
    assert sent.convert("RGB").getpixel((5, 5)) == (200, 200, 200)
    assert result is not None and (result.x, result.y) == (640, 400)


async def test_png_bytes_and_a_scaled_down_screenshot(fake_model: FakeModelServer):
    """The screenshot may be encoded and smaller than the screen: points are still in the
    screen's pixels."""
    buffer = io.BytesIO()
    screenshot((960, 540)).save(buffer, format="PNG")
    fake_model.script(['{"x": 480, "y": 270}'])
    async with VlmGrounder("generic", "m", fake_model.url) as grounder:
        result = await grounder.ground("the red button", buffer.getvalue(), (1920, 1080))
    assert fake_model.requests[0].image_sizes == [(960, 540)]
    assert result is not None and (result.x, result.y) == (960, 540)


async def test_qwen_answer_parsed_into_tool_calls_by_the_server(fake_model: FakeModelServer):
    """vLLM with a tool parser hands back `tool_calls` and no content."""
    arguments = {"action": "left_click", "coordinate": [322, 203]}
    fake_model.script([Turn.tool_call("computer_use", arguments)])
    async with VlmGrounder("qwen2.5-vl", "m", fake_model.url) as grounder:
        result = await grounder.ground("the red button", screenshot((1280, 800)), (1280, 800))
    assert result is not None and (result.x, result.y) == (320, 200)
    assert "<tool_call>" in result.raw


@pytest.mark.parametrize("answer", ['{"found": false}', ""])
async def test_not_found_is_none(fake_model: FakeModelServer, answer: str):
    fake_model.script([answer])
    async with VlmGrounder("generic", "m", fake_model.url) as grounder:
        assert (
            await grounder.ground("a purple unicorn", screenshot((1280, 800)), (1280, 800)) is None
        )


async def test_a_500_is_retried_then_succeeds(fake_model: FakeModelServer):
    fake_model.script([Turn.error(500, "CUDA out of memory"), "(512, 300)"])
    async with VlmGrounder("uground", "m", fake_model.url, **FAST) as grounder:
        result = await grounder.ground("the Save button", screenshot((1280, 800)), (1280, 800))
    assert result is not None and (result.x, result.y) == (655, 240)
    assert len(fake_model.requests) == 2


async def test_a_429_is_retried_after_the_retry_after_it_gives(fake_model: FakeModelServer):
    fake_model.script([Turn.error(429, "slow down", **{"retry-after": "0.3"}), "(512, 300)"])
    async with VlmGrounder("uground", "m", fake_model.url, **FAST) as grounder:
        result = await grounder.ground("the Save button", screenshot((1280, 800)), (1280, 800))
    assert result is not None
    first, second = fake_model.requests
    assert second.received_at - first.received_at >= 0.3


async def test_three_500s_raise_model_error_after_backing_off(fake_model: FakeModelServer):
    fake_model.script([Turn.error(500, "CUDA out of memory")] * 3)
    async with VlmGrounder("uground", "grounder-7b", fake_model.url) as grounder:
        with pytest.raises(ModelError) as caught:
            await grounder.ground("the Save button", screenshot((1280, 800)), (1280, 800))
    error = caught.value
    assert error.status == 500 and error.attempts == 3
    message = str(error)
    assert "HTTP 500 on all 3 attempts" in message
    assert "CUDA out of memory" in message
    assert fake_model.url in message and "grounder-7b" in message
    first, second, third = (request.received_at for request in fake_model.requests)
    assert second - first >= 0.5  # the default backoff: 0.5 s, then 1 s
    assert third - second >= 1.0


async def test_a_hang_is_retried_then_raises_model_error(fake_model: FakeModelServer):
    fake_model.script([Turn.hang(10.0, "(512, 300)")] * 3)
    started = time.monotonic()
    async with VlmGrounder("uground", "m", fake_model.url, timeout_s=0.3, **FAST) as grounder:
        with pytest.raises(
            ModelError, match=r"did not answer within 0\.3 s \(3 attempts\)"
        ) as caught:
            await grounder.ground("the Save button", screenshot((1280, 800)), (1280, 800))
    assert time.monotonic() - started < 5
    assert caught.value.status is None and caught.value.attempts == 3
    assert len(fake_model.requests) == 3


async def test_a_slow_answer_within_the_timeout_is_fine(fake_model: FakeModelServer):
    fake_model.script([Turn.answer("(512, 300)", delay_s=0.3)])
    async with VlmGrounder("uground", "m", fake_model.url, timeout_s=5) as grounder:
        result = await grounder.ground("the Save button", screenshot((1280, 800)), (1280, 800))
    assert result is not None and result.elapsed_ms >= 300


@pytest.mark.parametrize(
    ("status", "hint"),
    [(400, "accepts images"), (401, "API key"), (404, "ends in /v1"), (422, "accepts images")],
)
async def test_client_errors_are_not_retried(fake_model: FakeModelServer, status: int, hint: str):
    fake_model.script([Turn.error(status, "bad request: image_url not supported")])
    async with VlmGrounder("uground", "grounder-7b", fake_model.url, **FAST) as grounder:
        with pytest.raises(ModelError) as caught:
            await grounder.ground("the Save button", screenshot((1280, 800)), (1280, 800))
    assert len(fake_model.requests) == 1
    assert caught.value.status == status and caught.value.attempts == 1
    assert f"HTTP {status}:" in str(caught.value)
    assert "image_url not supported" in str(caught.value)
    assert hint in str(caught.value)


@pytest.mark.parametrize(
    "turn",
    [Turn.garbage(), Turn.garbage("{not json", "application/json"), Turn.garbage("{}")],
    ids=["html", "broken-json", "empty-object"],
)
async def test_a_body_that_is_not_a_completion_raises_model_error(
    fake_model: FakeModelServer, turn: Turn
):
    fake_model.script([turn] * 2)
    async with VlmGrounder("uground", "m", fake_model.url, max_retries=1, **FAST) as grounder:
        with pytest.raises(ModelError, match="not a chat completion") as caught:
            await grounder.ground("the Save button", screenshot((1280, 800)), (1280, 800))
    assert turn.body is not None and turn.body in str(caught.value)
    assert len(fake_model.requests) == 2  # retried once, like a 502


async def test_an_unreachable_endpoint_raises_model_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    async with VlmGrounder("uground", "m", url, max_retries=1, **FAST) as grounder:
        with pytest.raises(ModelError, match="cannot reach the grounding model endpoint") as caught:
            await grounder.ground("the Save button", screenshot((1280, 800)), (1280, 800))
    assert url in str(caught.value) and caught.value.attempts == 2


def test_an_unknown_family_is_refused_before_any_request():
    with pytest.raises(InvalidRequest, match="pick one of: os-atlas"):
        VlmGrounder("gpt-vision", "m", "http://127.0.0.1:9/v1")


async def test_bad_inputs_are_refused_before_any_request(fake_model: FakeModelServer):
    async with VlmGrounder("uground", "m", fake_model.url) as grounder:
        with pytest.raises(InvalidRequest, match="aspect ratios differ"):
            await grounder.ground("the Save button", screenshot((1280, 800)), (1920, 1080))
        with pytest.raises(InvalidRequest, match="not an image"):
            await grounder.ground("the Save button", b"not a png", (1280, 800))
        with pytest.raises(InvalidRequest, match="description is empty"):
            await grounder.ground("  ", screenshot((1280, 800)), (1280, 800))
    assert fake_model.requests == []
