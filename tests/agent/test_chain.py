"""`GrounderChain` and `build_grounders`: the real a11y and OCR grounders on a real desktop,
and a VLM grounder talking to the scripted model server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from cubicle.agent.errors import ModelError
from cubicle.agent.grounding import VlmGrounder
from cubicle.agent.grounding.a11y import A11yGrounder
from cubicle.agent.grounding.chain import GrounderChain, build_grounders
from cubicle.agent.grounding.ocr import OcrGrounder
from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol.errors import InvalidRequest
from tests.agent.fake_model import FakeModelServer, Turn
from tests.agent.test_a11y_grounder import SCREEN, inside, node, start_mousepad

FAST = {"retry_backoff_s": 0.01, "max_retries": 0}


@pytest.fixture(scope="module")
async def mousepad(service) -> AsyncIterator[AsyncDesktop]:
    """mousepad with a word in its document that only OCR can see (the document's text is
    no element's name)."""
    desktop = await start_mousepad(service)
    try:
        await desktop.write("Zanzibar")
        await desktop.wait_for_settle()
        yield desktop
    finally:
        await desktop.kill()


@pytest.fixture(scope="module")
def ocr() -> OcrGrounder:
    return OcrGrounder()


@pytest.fixture(scope="module")
async def screenshot(mousepad: AsyncDesktop) -> bytes:
    return await mousepad.screenshot()


async def test_a11y_answers_first(mousepad: AsyncDesktop, ocr: OcrGrounder, screenshot: bytes):
    chain = GrounderChain([A11yGrounder(mousepad), ocr])

    result = await chain.ground("the File menu", screenshot, SCREEN)

    assert result is not None and result.source == "a11y"
    assert inside(result, await node(mousepad, "File", "menu"))


async def test_what_only_ocr_sees_falls_through_to_ocr(
    mousepad: AsyncDesktop, ocr: OcrGrounder, screenshot: bytes
):
    a11y = A11yGrounder(mousepad)
    assert await a11y.ground("Zanzibar", screenshot, SCREEN) is None

    result = await GrounderChain([a11y, ocr]).ground("Zanzibar", screenshot, SCREEN)

    assert result is not None and result.source == "ocr"
    assert "Zanzibar" in result.raw
    assert inside(result, await node(mousepad, "", "text"))  # inside the document


async def test_nothing_found_is_none(mousepad: AsyncDesktop, ocr: OcrGrounder, screenshot: bytes):
    chain = GrounderChain([A11yGrounder(mousepad), ocr])
    assert await chain.ground("the Quasimodo button", screenshot, SCREEN) is None


async def test_a_vlm_last_answers_what_the_others_miss(
    mousepad: AsyncDesktop, ocr: OcrGrounder, screenshot: bytes, fake_model: FakeModelServer
):
    fake_model.script(["click(start_box='(500,500)')"])
    async with VlmGrounder("ui-tars", "ui-tars-7b", fake_model.url, **FAST) as vlm:
        chain = GrounderChain([A11yGrounder(mousepad), ocr, vlm])
        result = await chain.ground("the Quasimodo button", screenshot, SCREEN)

    assert result is not None
    assert (result.source, result.x, result.y) == ("vlm:ui-tars", 640, 400)
    (request,) = fake_model.requests
    assert request.image_sizes == [SCREEN]
    assert result.elapsed_ms >= 0


async def test_an_unusable_answer_hands_over_to_the_next(
    mousepad: AsyncDesktop, screenshot: bytes, fake_model: FakeModelServer
):
    fake_model.script(["I cannot see it, sorry"])
    async with VlmGrounder("ui-tars", "ui-tars-7b", fake_model.url, **FAST) as vlm:
        result = await GrounderChain([vlm, A11yGrounder(mousepad)]).ground(
            "the File menu", screenshot, SCREEN
        )
    assert result is not None and result.source == "a11y"
    assert len(fake_model.requests) == 1


async def test_a_failing_model_hands_over_unless_it_is_last(
    mousepad: AsyncDesktop, screenshot: bytes, fake_model: FakeModelServer
):
    fake_model.script([Turn.error(400), Turn.error(400)])
    async with VlmGrounder("ui-tars", "ui-tars-7b", fake_model.url, **FAST) as vlm:
        first = await GrounderChain([vlm, A11yGrounder(mousepad)]).ground(
            "the File menu", screenshot, SCREEN
        )
        assert first is not None and first.source == "a11y"

        with pytest.raises(ModelError, match="HTTP 400"):
            await GrounderChain([A11yGrounder(mousepad), vlm]).ground(
                "the Quasimodo button", screenshot, SCREEN
            )
    assert len(fake_model.requests) == 2


async def test_build_grounders_from_a_spec(mousepad: AsyncDesktop, fake_model: FakeModelServer):
    chain = build_grounders(
        "a11y, ocr, vlm:ui-tars-1.5", mousepad, model="ui-tars-1.5-7b", base_url=fake_model.url
    )
    a11y, ocr, vlm = chain.grounders
    assert isinstance(a11y, A11yGrounder) and a11y.desktop is mousepad
    assert isinstance(ocr, OcrGrounder)
    assert isinstance(vlm, VlmGrounder)
    assert (vlm.family.name, vlm.model, vlm.base_url) == (
        "ui-tars-1.5",
        "ui-tars-1.5-7b",
        fake_model.url,
    )

    (plain,) = build_grounders(
        "vlm", mousepad, family="showui", model="m", base_url=fake_model.url
    ).grounders
    assert isinstance(plain, VlmGrounder) and plain.source == "vlm:showui"
    await chain.aclose()
    await plain.aclose()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("a11y,bogus", "unknown grounder 'bogus'"),
        ("", "empty entry"),
        ("a11y,,ocr", "empty entry"),
        ("ocr:fast", "takes no argument"),
        ("a11y,a11y", "appears twice"),
        ("vlm", "name the grounding model family"),
        ("vlm:nope", "unknown grounding model family 'nope'"),
        ("a11y,vlm:ui-tars", "needs a model endpoint"),
    ],
)
async def test_build_grounders_says_what_is_wrong(mousepad: AsyncDesktop, spec: str, message: str):
    with pytest.raises(InvalidRequest, match=message):
        build_grounders(spec, mousepad)


def test_an_empty_chain_is_refused():
    with pytest.raises(InvalidRequest, match="at least one grounder"):
        GrounderChain([])
