"""H.264 encoding of raw screen captures with libx264 (through PyAV), tuned for live view.

Constrained baseline (what every browser decodes: `avc1.42e01f` and up), no B-frames, no
lookahead, SPS/PPS in front of every keyframe, Annex-B start codes. Keyframes come on
demand, so the GOP is long: a static desktop costs nothing and a joining viewer asks for
an IDR instead of waiting for one.

The encoder keeps the last picture in YUV and converts only the rows a capture says
changed (plus a few around them, which the chroma filter reads), so a small change costs
a small conversion; x264 still looks at the whole picture.

The pointer is drawn in while converting (`cubicle.guest.video.pointer.blend`), never into the
capture: when only the pointer moved, the rectangles it left and entered are converted
again from the capture and nothing else is touched.
"""

from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
from av.video.frame import PictureType
from av.video.reformatter import VideoReformatter

from cubicle.guest.video.pointer import Pointer, blend
from cubicle.protocol.errors import SandboxError
from cubicle.protocol.frames import EncodedFrame

_FILTER_ROWS = 4
"""Rows above and below a changed band that swscale's vertical chroma filter reads: a band
converted with this margin gives the same YUV rows as the whole picture converted."""
_FILTER_COLUMNS = 8
"""The same, left and right of a changed rectangle, for the horizontal chroma filter."""

Box = tuple[int, int, int, int]
"""A rectangle of the picture: left, top, right, bottom in pixels (right and bottom out)."""

KEYINT = 600
"""Frames between automatic keyframes; others come when a viewer asks for one."""

_X264_PARAMS = ":".join(
    [
        f"keyint={KEYINT}",
        "bframes=0",
        "repeat-headers=1",  # SPS/PPS before every keyframe, so any IDR starts a stream
        "annexb=1",
        # swscale turns BGRA into limited-range BT.601 YUV; say so in the VUI.
        "colorprim=smpte170m",
        "transfer=smpte170m",
        "colormatrix=smpte170m",
        "range=tv",
    ]
)


class H264Encoder:
    """Encodes BGRA screen captures of one fixed size; use from one thread at a time.

    An odd width or height is cropped by one pixel: 4:2:0 needs even sizes.
    """

    def __init__(self, width: int, height: int, *, fps: int = 30, crf: int = 23) -> None:
        self.source_width, self.source_height = width, height
        self.width, self.height = width & ~1, height & ~1
        """Encoded size in pixels (the source size rounded down to even)."""
        if self.width < 2 or self.height < 2:
            raise SandboxError(f"cannot encode a {width}×{height} screen")
        try:
            codec = av.CodecContext.create("libx264", "w")
            codec.width, codec.height = self.width, self.height
            codec.pix_fmt = "yuv420p"
            codec.time_base = Fraction(1, 1_000_000)
            codec.framerate = Fraction(fps, 1)
            codec.options = {
                "preset": "ultrafast",
                "tune": "zerolatency",
                "profile": "baseline",
                "crf": str(crf),
                "forced-idr": "1",
                "x264-params": _X264_PARAMS,
            }
            codec.open()
        except av.FFmpegError as exc:
            raise SandboxError(f"cannot start the H.264 encoder (libx264): {exc}") from exc
        self._codec: av.VideoCodecContext | None = codec
        self._bgra = av.VideoFrame(self.width, self.height, "bgra")
        self._reformatter = VideoReformatter()
        self._picture: av.VideoFrame | None = None
        """The last picture, in YUV."""
        self._drawn: tuple[Box, int] | None = None
        """Where the last picture shows the pointer, and which shape (its serial)."""

    def encode(
        self,
        bgra: bytes | bytearray,
        pts_us: int,
        *,
        keyframe: bool,
        rows: range | None = None,
        pointer: Pointer | None = None,
    ) -> EncodedFrame:
        """Encode one capture of `source_width × source_height` BGRA pixels, rows unpadded.

        `pts_us` must grow from call to call; `keyframe` forces an IDR (with SPS/PPS).
        `rows`: the only rows that changed since the last call (None: maybe any); the first
        call converts them all. `pointer`: drawn over the capture (None: no pointer).
        """
        if self._codec is None:
            raise SandboxError("the H.264 encoder is closed")
        self._check_size(bgra)
        picture = self._convert(bgra, rows, pointer)
        picture.pts = pts_us
        picture.time_base = self._codec.time_base
        picture.pict_type = PictureType.I if keyframe else PictureType.NONE
        try:
            packets = self._codec.encode(picture)
        except av.FFmpegError as exc:
            raise SandboxError(f"the H.264 encoder failed: {exc}") from exc
        if len(packets) != 1:  # zerolatency: no lookahead, no frame threads, no delay
            raise SandboxError(f"the H.264 encoder returned {len(packets)} packets for a frame")
        packet = packets[0]
        return EncodedFrame(bytes(packet), pts_us, packet.is_keyframe, self.width, self.height)

    def _check_size(self, bgra: bytes | bytearray) -> None:
        if len(bgra) < self.source_width * 4 * self.source_height:
            raise SandboxError(
                f"capture of {len(bgra)} bytes is short of {self.source_width}×"
                f"{self.source_height} BGRA pixels"
            )

    def _convert(
        self, bgra: bytes | bytearray, rows: range | None, pointer: Pointer | None
    ) -> av.VideoFrame:
        """The picture in YUV, converting only `rows` and the pointer's old and new places
        (everything if `rows` is None, or at first)."""
        drawn = self._pointer_box(pointer)
        if self._picture is None or rows is None or len(rows) >= self.height:
            _load(self._bgra, bgra, self.source_width * 4, range(self.height))
            if pointer is not None:
                blend(_pixels(self._bgra), 0, 0, pointer)
            self._picture = self._reformatter.reformat(self._bgra, format="yuv420p", threads=1)
            self._drawn = drawn
            return self._picture
        regions: list[Box] = []
        if len(rows):
            regions.append((0, rows.start, self.width, rows.stop))
        if drawn != self._drawn:  # the pointer moved or changed shape: redraw both places
            regions += [where[0] for where in (self._drawn, drawn) if where is not None]
            self._drawn = drawn
        for region in _merged(regions):
            self._convert_region(bgra, region, pointer)
        return self._picture

    def _pointer_box(self, pointer: Pointer | None) -> tuple[Box, int] | None:
        """Where `pointer` lands on the picture (clipped to it) and its shape's serial."""
        if pointer is None:
            return None
        left, top, right, bottom = pointer.box
        box = (max(left, 0), max(top, 0), min(right, self.width), min(bottom, self.height))
        if box[0] >= box[2] or box[1] >= box[3]:
            return None
        return box, pointer.image.serial

    def _convert_region(self, bgra: bytes | bytearray, region: Box, pointer: Pointer | None):
        """Convert one rectangle of the capture (with the pointer drawn over it) into the
        YUV picture, through a patch with the margins the chroma filters read."""
        assert self._picture is not None
        # Whole chroma samples, and one more on each side: swscale's chroma filters read a
        # luma pixel beyond the pair each chroma sample covers.
        x0, y0 = max((region[0] & ~1) - 2, 0), max((region[1] & ~1) - 2, 0)
        x1 = min(((region[2] + 1) & ~1) + 2, self.width)
        y1 = min(((region[3] + 1) & ~1) + 2, self.height)
        if x0 >= x1 or y0 >= y1:
            return
        left, top = max(x0 - _FILTER_COLUMNS, 0), max(y0 - _FILTER_ROWS, 0)
        right = min(x1 + _FILTER_COLUMNS, self.width)
        bottom = min(y1 + _FILTER_ROWS, self.height)
        patch = av.VideoFrame(right - left, bottom - top, "bgra")
        size = self.source_height * self.source_width * 4
        capture = np.frombuffer(bgra, np.uint8, size).reshape(self.source_height, -1, 4)
        pixels = _pixels(patch)
        pixels[...] = capture[top:bottom, left:right]
        if pointer is not None:
            blend(pixels, left, top, pointer)
        converted = self._reformatter.reformat(patch, format="yuv420p", threads=1)
        for shift, source, target in zip(
            (0, 1, 1), converted.planes, self._picture.planes, strict=True
        ):  # chroma planes: half the size each way
            inner = _plane(source, (bottom - top) >> shift)
            _plane(target, self.height >> shift)[
                y0 >> shift : y1 >> shift, x0 >> shift : x1 >> shift
            ] = inner[
                (y0 - top) >> shift : (y1 - top) >> shift,
                (x0 - left) >> shift : (x1 - left) >> shift,
            ]

    def close(self) -> None:
        """Flush and free the encoder (x264 joins its threads); idempotent."""
        codec, self._codec = self._codec, None
        if codec is not None:
            try:
                codec.encode(None)
            except av.FFmpegError as exc:
                raise SandboxError(f"the H.264 encoder failed while closing: {exc}") from exc


def _load(frame: av.VideoFrame, bgra: bytes | bytearray, row: int, rows: range) -> None:
    """Copy `rows` of a capture (`row` bytes each, unpadded) into a BGRA frame of as many
    rows, minding the frame's row padding and a capture one pixel wider than the frame."""
    plane = frame.planes[0]
    source = memoryview(bgra)[rows.start * row : rows.stop * row]
    if plane.line_size == row:
        plane.update(source)
        return
    target, used = memoryview(plane), frame.width * 4
    for y in range(len(rows)):
        target[y * plane.line_size : y * plane.line_size + used] = source[y * row : y * row + used]


def _pixels(frame: av.VideoFrame) -> np.ndarray:
    """A writable (height, width, 4) view of a BGRA frame's pixels."""
    return _plane(frame.planes[0], frame.height)[:, : frame.width * 4].reshape(
        frame.height, frame.width, 4
    )


def _plane(plane, rows: int) -> np.ndarray:
    """A writable (rows, line size) view of one plane of a frame."""
    return np.frombuffer(memoryview(plane), np.uint8).reshape(rows, plane.line_size)


def _merged(regions: list[Box]) -> list[Box]:
    """The regions, those that touch or overlap made one (their bounding box)."""
    boxes = list(regions)
    at = 0
    while at < len(boxes):
        for other in range(at + 1, len(boxes)):
            a, b = boxes[at], boxes[other]
            if a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]:
                del boxes[other]
                boxes[at] = (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))
                break
        else:
            at += 1
    return boxes
