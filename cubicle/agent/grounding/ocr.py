"""`OcrGrounder`: find the described text on the screenshot with offline OCR.

OCR is RapidOCR's PP-OCR (text detection, then recognition; screens are upright, so no
direction classifier) on onnxruntime, from the `rapidocr_onnxruntime` wheel, which carries
its ONNX models: nothing is downloaded. The engine is built on first use, once per process,
and runs in a worker thread, one recognition at a time. Reading a 1280×800 screen takes
about a second on an idle core, several on a busy small machine (`bench.grounding`).

OCR returns one box per line of text, and lines run labels together ("Document Help", or
"EditSearchView" with the spaces lost). So the target is looked for inside lines: its
letters and digits, case-folded, are slid along the line's letters and digits, and the
closest window (difflib ratio ≥ `min_similarity`; exact for targets of three characters or
fewer) wins. A window that does not start and end at a word edge (a space, punctuation, a
lower-to-upper case change) is marked down, so "File" inside "Profile" does not count.

Where to point: the line's pixels are split into runs of ink at gaps wider than a space
(the gaps between menu-bar labels), and the runs are lined up with word starts in the
text. A match that is a whole run (or a whole line) is a standalone label and scores a
little higher than the same word inside a phrase ("File" the menu over "File System").
Character positions are estimated in proportion to character counts within their run, or
within the line's box when the runs cannot be lined up; the centre is returned in screen
pixels, mapped back from a scaled screenshot.

The target text is the description's quoted text, else the description without its
article, role word and context ("the File menu" → "File"), as `parse_description` reads it.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import itertools
import os
import threading
import time
import unicodedata
from dataclasses import dataclass
from typing import Any

from PIL import Image

from cubicle.agent.errors import AgentError
from cubicle.agent.grounding import _image
from cubicle.agent.grounding.a11y import normalise, parse_description
from cubicle.agent.grounding.base import Grounder, GroundingResult

Box = tuple[int, int, int, int]
"""(left, top, right, bottom) in screen pixels, right and bottom exclusive."""

_OFF_EDGE_PENALTY = 0.25
"""Subtracted from a match that starts or ends inside a word."""
_WHOLE_BONUS = 0.05
"""Added to a match that is all the letters and digits of its line, or of runs of ink set
apart by wide gaps (a standalone label)."""
_GAP = 0.45
"""A gap between runs of ink at least this fraction of the line's height separates labels
(a space between words is narrower)."""
_INK = 48
"""Grey levels from the line's background (its median) that count as ink."""

_engine: Any = None
_engine_lock = threading.Lock()
"""Guards building the engine and running it: one recognition at a time per process."""


@dataclass(frozen=True, slots=True)
class TextLine:
    """One line of text OCR read on the screen."""

    text: str
    """What it reads, as recognised (spacing may be lost between close words)."""
    box: Box
    """Axis-aligned bounds of the line, in screen pixels."""
    confidence: float
    """The recogniser's confidence, 0 to 1."""
    chunks: tuple[tuple[int, int], ...] = ()
    """(left, right) in screen pixels of each run of ink in the line, runs being set apart
    by gaps wider than a space: the labels OCR ran together. Empty when not measured."""


@dataclass(frozen=True, slots=True)
class TextMatch:
    """Where the target text sits in one line."""

    line: TextLine
    start: int
    """Index in `line.text` of the first character matched."""
    end: int
    """Index in `line.text` after the last character matched."""
    similarity: float
    """difflib ratio between the target and the matched characters, 0 to 1."""
    score: float
    """`similarity`, marked down off word edges, up for a whole line or run of ink."""
    box: Box
    """The matched characters' box in screen pixels: their share, by character count, of
    the width of their run of ink (of the line, when runs were not matched to words)."""


def _load_engine() -> Any:
    """The RapidOCR engine, built on first use; the caller holds `_engine_lock`.

    onnxruntime ≥ 1.29 sends usage telemetry to Microsoft from Linux too (a DNS lookup of
    mobile.events.data.microsoft.com, a device id under ~/.cache/Microsoft) unless
    `ORT_DISABLE_TELEMETRY=1` is set before it starts: it is set here, unless the user set
    it either way, and telemetry events are switched off as well.
    """
    global _engine
    if _engine is None:
        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
        try:
            import onnxruntime
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as exc:
            raise AgentError(
                "the OCR grounder needs the rapidocr_onnxruntime package: "
                "pip install 'rapidocr_onnxruntime>=1.3,<1.5'"
            ) from exc
        if os.environ["ORT_DISABLE_TELEMETRY"] == "1":
            onnxruntime.disable_telemetry_events()
        _engine = RapidOCR()
    return _engine


def _recognise(image: Image.Image) -> list[tuple[Any, str, float]]:
    """Raw RapidOCR lines (quadrilateral, text, confidence) of `image`; blocks."""
    with _engine_lock:
        result, _timings = _load_engine()(image, use_cls=False)  # screens are upright
    return list(result or ())


def _compact(text: str) -> tuple[str, list[int]]:
    """The case-folded letters and digits of `text`, each with its index in `text`."""
    chars: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        if char.isalnum():
            folded = char.casefold()
            chars.append(folded)
            origin.extend([index] * len(folded))
    return "".join(chars), origin


def _edge(text: str, before: int, after: int) -> bool:
    """Whether a word may end at `before` and start at `after` (adjacent indices)."""
    if before < 0 or after >= len(text):
        return True
    left, right = text[before], text[after]
    if not (left.isalnum() and right.isalnum()):
        return True
    return (left.islower() and right.isupper()) or left.isalpha() != right.isalpha()


def find_text(target: str, line: TextLine, min_similarity: float = 0.8) -> TextMatch | None:
    """The best window of `line` for `target` (compared on letters and digits, any case),
    or None when no window reaches `min_similarity`."""
    wanted, _ = _compact(normalise(target))
    chars, origin = _compact(line.text)
    size = len(wanted)
    if not size or not chars:
        return None
    layout = _layout(line)
    sizes = (size,) if size <= 3 else (size - 1, size, size + 1)
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(wanted)
    best: tuple[float, float, int, int] | None = None
    for width in sizes:
        for first in range(len(chars) - width + 1):
            matcher.set_seq1(chars[first : first + width])
            if (
                matcher.real_quick_ratio() < min_similarity
                or matcher.quick_ratio() < min_similarity
            ):
                continue
            similarity = matcher.ratio()
            if similarity < (1.0 if size <= 3 else min_similarity):
                continue
            start, end = origin[first], origin[first + width - 1] + 1
            score = similarity
            if not (_edge(line.text, start - 1, start) and _edge(line.text, end - 1, end)):
                score -= _OFF_EDGE_PENALTY
            if (first == 0 and first + width == len(chars)) or _whole_chunks(
                line.text, layout, start, end
            ):
                score += _WHOLE_BONUS
            if score >= min_similarity and (best is None or score > best[0]):
                best = (score, similarity, start, end)
    if best is None:
        return None
    score, similarity, start, end = best
    box = _span_box(line, layout, start, end)
    return TextMatch(line, start, end, round(similarity, 3), round(score, 3), box)


Layout = list[tuple[tuple[int, int], tuple[int, int]]]
"""Per run of ink: (start, end) of the characters of the line's text drawn in it, and its
(left, right) in screen pixels."""


def _layout(line: TextLine) -> Layout | None:
    """Which characters of `line.text` each run of ink draws, or None when the runs cannot
    be lined up with word starts in the text.

    Each boundary between two runs goes to the word start nearest to where the characters'
    share of the line's width puts it. Runs at either end no wider than the line is tall
    (an icon, a border) are dropped when that is what it takes.
    """
    chunks, height = line.chunks, line.box[3] - line.box[1]
    if not chunks:
        return None
    lead = 1 if len(chunks) > 1 and chunks[0][1] - chunks[0][0] <= height else 0
    tail = 1 if len(chunks) > 1 + lead and chunks[-1][1] - chunks[-1][0] <= height else 0
    for skip_first, skip_last in ((0, 0), (lead, 0), (0, tail), (lead, tail)):
        kept = chunks[skip_first : len(chunks) - skip_last]
        spans = _spans(line.text, line.box, kept)
        if spans is not None:
            return list(zip(spans, kept, strict=True))
    return None


def _spans(
    text: str, box: Box, chunks: tuple[tuple[int, int], ...]
) -> list[tuple[int, int]] | None:
    per_pixel = len(text) / max(box[2] - box[0], 1)
    starts = [i for i, char in enumerate(text) if char.isalnum() and _edge(text, i - 1, i)]
    cuts = [0]
    for (_, end), (start, _) in itertools.pairwise(chunks):
        estimate = ((end + start) / 2 - box[0]) * per_pixel
        options = [i for i in starts if i > cuts[-1]]
        if not options:
            return None
        cut = min(options, key=lambda i: abs(i - estimate))
        if abs(cut - estimate) > 0.25 * len(text) + 1:
            return None
        cuts.append(cut)
    cuts.append(len(text))
    return list(itertools.pairwise(cuts))


def _whole_chunks(text: str, layout: Layout | None, start: int, end: int) -> bool:
    """Whether `text[start:end]` holds all the letters and digits of the runs it touches."""
    if layout is None:
        return False
    touched = [span for span, _ in layout if span[0] < end and start < span[1]]
    first, last = touched[0][0], touched[-1][1]
    return not any(char.isalnum() for char in text[first:start] + text[end:last])


def _span_box(line: TextLine, layout: Layout | None, start: int, end: int) -> Box:
    """Screen box of `line.text[start:end]`: each end placed by character count within its
    run of ink, or within the whole line when runs are not lined up with the text."""
    left, top, right, bottom = line.box

    def x_at(index: int, edge: int) -> float:
        """Screen x of the left (edge 0) or right (edge 1) side of character `index`."""
        if layout is None:
            return left + (right - left) * (index + edge) / max(len(line.text), 1)
        (first, last), (x0, x1) = next(item for item in layout if item[0][0] <= index < item[0][1])
        drawn = line.text[first:last]
        first += len(drawn) - len(drawn.lstrip())
        last -= len(drawn) - len(drawn.rstrip())
        share = (index + edge - first) / max(last - first, 1)
        return x0 + (x1 - x0) * min(max(share, 0.0), 1.0)

    x_left, x_right = round(x_at(start, 0)), round(x_at(end - 1, 1))
    return x_left, top, max(x_right, x_left + 1), bottom


def ink_chunks(image: Image.Image, box: Box) -> tuple[tuple[int, int], ...]:
    """(left, right) in `image` pixels of the runs of ink in `box` of `image`, runs being
    separated by gaps of at least `_GAP` times the box's height."""
    import numpy as np

    grey = np.asarray(image.crop(box).convert("L"), dtype=np.int16)
    if grey.size == 0:
        return ()
    inked = np.flatnonzero((np.abs(grey - np.median(grey)) > _INK).any(axis=0))
    if not inked.size:
        return ()
    gap = max(3.0, _GAP * grey.shape[0])
    breaks = np.flatnonzero(np.diff(inked) > gap)
    firsts = [inked[0], *inked[breaks + 1]]
    lasts = [*inked[breaks], inked[-1]]
    return tuple((box[0] + int(a), box[0] + int(b) + 1) for a, b in zip(firsts, lasts, strict=True))


class OcrGrounder(Grounder):
    """Grounds descriptions of text on the screen ("the Save button" → the word "Save").

    `min_similarity` (0 to 1) is how close the text read must be to the target's letters;
    lines read with less than `min_confidence` are ignored. The last screenshot's text is
    kept, so grounding several descriptions on one screenshot runs OCR once.
    """

    source = "ocr"
    """What results from this grounder carry in `GroundingResult.source`."""

    def __init__(self, *, min_similarity: float = 0.8, min_confidence: float = 0.5) -> None:
        self.min_similarity = min_similarity
        self.min_confidence = min_confidence
        self._last: tuple[bytes, list[TextLine]] | None = None
        """(digest of the screenshot and screen size, its lines) of the last screenshot."""
        self._last_lock = threading.Lock()

    async def read(
        self, screenshot: bytes | Image.Image, screen_size: tuple[int, int]
    ) -> list[TextLine]:
        """Every line of text on the screenshot, boxes in screen pixels, top to bottom."""
        return await asyncio.to_thread(self._read, screenshot, screen_size)

    async def ground(
        self,
        description: str,
        screenshot: bytes | Image.Image,
        screen_size: tuple[int, int],
    ) -> GroundingResult | None:
        """See `Grounder.ground`; None when the target text is not read on the screen."""
        started = time.monotonic()
        target = parse_description(description).name
        if not normalise(target):
            return None
        lines = await self.read(screenshot, screen_size)
        matches = [
            found
            for line in lines
            if line.confidence >= self.min_confidence
            and (found := find_text(target, line, self.min_similarity)) is not None
        ]
        if not matches:
            return None
        best = min(
            matches,
            key=lambda m: (-m.score, -m.line.confidence, m.line.box[1], m.line.box[0]),
        )
        left, top, right, bottom = best.box
        raw = (
            f"{best.line.text!r} ({','.join(map(str, best.line.box))}) "
            f"{len(best.line.chunks)} runs of ink "
            f"chars {best.start}:{best.end} similarity={best.similarity:.2f} "
            f"confidence={best.line.confidence:.2f}"
        )
        return GroundingResult(
            (left + right) // 2,
            (top + bottom) // 2,
            best.box,
            raw=raw,
            source=self.source,
            elapsed_ms=(time.monotonic() - started) * 1000,
        )

    def _read(
        self, screenshot: bytes | Image.Image, screen_size: tuple[int, int]
    ) -> list[TextLine]:
        data = screenshot if isinstance(screenshot, bytes) else screenshot.tobytes()
        key = hashlib.blake2b(data, digest_size=16)
        shape = (getattr(screenshot, "size", None), getattr(screenshot, "mode", None))
        key.update(repr((screen_size, shape)).encode())
        digest = key.digest()
        with self._last_lock:
            if self._last is not None and self._last[0] == digest:
                return self._last[1]
        image = _image.load(screenshot)
        _image.check_aspect(image.size, screen_size)
        scale_x, scale_y = screen_size[0] / image.size[0], screen_size[1] / image.size[1]
        lines = []
        for quad, text, confidence in _recognise(image):
            xs = [point[0] for point in quad]
            ys = [point[1] for point in quad]
            found = (
                max(0, round(min(xs))),
                max(0, round(min(ys))),
                min(image.size[0], round(max(xs))),
                min(image.size[1], round(max(ys))),
            )
            text = unicodedata.normalize("NFC", text)  # spaces kept: they take room in the box
            if not text.strip() or found[0] >= found[2] or found[1] >= found[3]:
                continue
            box = (
                round(found[0] * scale_x),
                round(found[1] * scale_y),
                round(found[2] * scale_x),
                round(found[3] * scale_y),
            )
            chunks = tuple(
                (round(a * scale_x), round(b * scale_x)) for a, b in ink_chunks(image, found)
            )
            lines.append(TextLine(text, box, float(confidence), chunks))
        lines.sort(key=lambda line: (line.box[1], line.box[0]))
        with self._last_lock:
            self._last = (digest, lines)
        return lines
