"""`GrounderChain`: try grounders in order, cheap exact ones first; `build_grounders` makes
one from a spec such as "a11y,ocr,vlm:ui-tars-1.5".

A grounder that finds nothing (None) or whose answer is unusable (`GroundingError`) hands
over to the next. A grounder that cannot work at all right now (`ModelError`: its endpoint
is down; `A11yUnavailable`: the accessibility bus is) hands over too, unless it is the last,
whose error then propagates. Anything else (a desktop that is gone, a bad request)
propagates at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Sequence

from PIL import Image

from cubicle.agent.errors import GroundingError, ModelError
from cubicle.agent.grounding import _image
from cubicle.agent.grounding.a11y import A11yGrounder
from cubicle.agent.grounding.base import Grounder, GroundingResult
from cubicle.agent.grounding.families import get_family
from cubicle.agent.grounding.ocr import OcrGrounder
from cubicle.agent.grounding.vlm import VlmGrounder
from cubicle.client.sdk import AsyncDesktop
from cubicle.protocol.errors import A11yUnavailable, InvalidRequest

log = logging.getLogger(__name__)

GROUNDER_NAMES = ("a11y", "ocr", "vlm")
"""Names `build_grounders` understands."""


class GrounderChain(Grounder):
    """Asks each grounder in turn and returns the first answer.

    The result is the answering grounder's, its `source` saying which one it was ("a11y",
    "ocr", "vlm:ui-tars"…), with `elapsed_ms` covering the whole chain.
    """

    def __init__(self, grounders: Sequence[Grounder]) -> None:
        if not grounders:
            raise InvalidRequest("a grounder chain needs at least one grounder")
        self.grounders = tuple(grounders)

    async def ground(
        self,
        description: str,
        screenshot: bytes | Image.Image,
        screen_size: tuple[int, int],
    ) -> GroundingResult | None:
        """See `Grounder.ground`. The screenshot is decoded once for all grounders."""
        started = time.monotonic()
        if isinstance(screenshot, bytes):
            screenshot = await asyncio.to_thread(_image.load, screenshot)
        last = len(self.grounders) - 1
        for index, grounder in enumerate(self.grounders):
            name = _name(grounder)
            try:
                result = await grounder.ground(description, screenshot, screen_size)
            except GroundingError as exc:
                log.info("grounder %s gave an unusable answer for %r: %s", name, description, exc)
                continue
            except (ModelError, A11yUnavailable) as exc:
                if index == last:
                    raise
                log.warning(
                    "grounder %s failed for %r, trying the next: %s", name, description, exc
                )
                continue
            if result is not None:
                elapsed_ms = (time.monotonic() - started) * 1000
                return dataclasses.replace(result, elapsed_ms=elapsed_ms)
            log.debug("grounder %s did not find %r", name, description)
        return None

    def prepare(self, screenshot: Image.Image, screen_size: tuple[int, int]) -> None:
        """See `Grounder.prepare`: every grounder of the chain gets ahead."""
        for grounder in self.grounders:
            grounder.prepare(screenshot, screen_size)

    async def aclose(self) -> None:
        """Close every grounder of the chain; idempotent."""
        for grounder in self.grounders:
            await grounder.aclose()


def _name(grounder: Grounder) -> str:
    return str(getattr(grounder, "source", type(grounder).__name__))


def build_grounders(
    spec: str,
    desktop: AsyncDesktop,
    *,
    model: str | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    family: str | None = None,
    timeout_s: float = 60.0,
    max_retries: int = 2,
) -> GrounderChain:
    """A chain built from `spec`: grounder names, comma-separated, tried in that order.

    Names: `a11y` (the desktop's accessibility tree), `ocr` (text on the screenshot),
    `vlm` or `vlm:<family>` (a grounding model; the family defaults to `family`, see
    `FAMILIES`). A `vlm` needs `model` (the name the endpoint serves) and `base_url` (an
    OpenAI-compatible endpoint, usually ending in /v1); `api_key` (None: "EMPTY", what
    local servers accept), `timeout_s` and `max_retries` go to it as well. Raises
    `InvalidRequest` saying what to fix.
    """
    parts = [part.strip() for part in spec.split(",")]
    if not spec.strip() or not all(parts):
        raise InvalidRequest(
            f"grounder spec {spec!r} has an empty entry: name grounders separated by commas, "
            'e.g. "a11y,ocr,vlm:ui-tars-1.5"'
        )
    grounders: list[Grounder] = []
    seen: set[str] = set()
    for part in parts:
        name, _, argument = (piece.strip() for piece in part.partition(":"))
        if name not in GROUNDER_NAMES:
            raise InvalidRequest(
                f"unknown grounder {name!r} in {spec!r}; pick from {', '.join(GROUNDER_NAMES)} "
                '(e.g. "a11y,ocr,vlm:ui-tars-1.5")'
            )
        if part in seen:
            raise InvalidRequest(f"grounder {part!r} appears twice in {spec!r}")
        seen.add(part)
        if name != "vlm" and argument:
            raise InvalidRequest(
                f"grounder {name!r} takes no argument; write {name!r}, not {part!r}"
            )
        if name == "a11y":
            grounders.append(A11yGrounder(desktop))
        elif name == "ocr":
            grounders.append(OcrGrounder())
        else:
            grounders.append(
                _vlm(
                    argument or family, model, base_url, api_key or "EMPTY", timeout_s, max_retries
                )
            )
    return GrounderChain(grounders)


def _vlm(
    family: str | None,
    model: str | None,
    base_url: str | None,
    api_key: str,
    timeout_s: float,
    max_retries: int,
) -> VlmGrounder:
    if not family:
        raise InvalidRequest(
            'name the grounding model family of "vlm", e.g. "vlm:ui-tars-1.5", or pass family='
        )
    get_family(family)  # an unknown family is the first thing to fix
    if not model or not base_url:
        raise InvalidRequest(
            f'"vlm:{family}" needs a model endpoint: pass model= (the name the endpoint serves) '
            "and base_url= (an OpenAI-compatible endpoint, usually ending in /v1)"
        )
    return VlmGrounder(
        family, model, base_url, api_key=api_key, timeout_s=timeout_s, max_retries=max_retries
    )
