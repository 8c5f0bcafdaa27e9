"""H.264 encoding of raw screen captures with libx264 (through PyAV), tuned for live view.

Constrained baseline (what every browser decodes: `avc1.42e01f` and up), no B-frames, no
lookahead, SPS/PPS in front of every keyframe, Annex-B start codes. Keyframes come on
demand, so the GOP is long: a static desktop costs nothing and a joining viewer asks for
an IDR instead of waiting for one.

The encoder keeps the last picture in YUV and converts only the rows a capture says
changed (plus a few around them, which the chroma filter reads), so a small change costs
a small conversion; x264 still looks at the whole picture.
"""

from __future__ import annotations

from fractions import Fraction

import av
from av.video.frame import PictureType
from av.video.reformatter import VideoReformatter

from desktop.protocol.errors import SandboxError
from streaming.frames import EncodedFrame

_FILTER_ROWS = 4
"""Rows above and below a changed band that swscale's vertical chroma filter reads: a band
converted with this margin gives the same YUV rows as the whole picture converted."""

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

    def encode(
        self, bgra: bytes | bytearray, pts_us: int, *, keyframe: bool, rows: range | None = None
    ) -> EncodedFrame:
        """Encode one capture of `source_width × source_height` BGRA pixels, rows unpadded.

        `pts_us` must grow from call to call; `keyframe` forces an IDR (with SPS/PPS).
        `rows`: the only rows that changed since the last call (None: maybe any); the first
        call converts them all.
        """
        if self._codec is None:
            raise SandboxError("the H.264 encoder is closed")
        self._check_size(bgra)
        picture = self._convert(bgra, rows)
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

    def _convert(self, bgra: bytes | bytearray, rows: range | None) -> av.VideoFrame:
        """The picture in YUV, converting only `rows` (all of them if None, or at first)."""
        if self._picture is None or rows is None or len(rows) >= self.height:
            _load(self._bgra, bgra, self.source_width * 4, range(self.height))
            self._picture = self._reformatter.reformat(self._bgra, format="yuv420p", threads=1)
            return self._picture
        first, end = max(rows.start & ~1, 0), min((rows.stop + 1) & ~1, self.height)
        if first >= end:
            return self._picture  # nothing changed
        top = max(first - _FILTER_ROWS, 0)
        bottom = min(end + _FILTER_ROWS, self.height)
        band = av.VideoFrame(self.width, bottom - top, "bgra")
        _load(band, bgra, self.source_width * 4, range(top, bottom))
        converted = self._reformatter.reformat(band, format="yuv420p", threads=1)
        planes = zip(converted.planes, self._picture.planes, strict=True)
        for shift, (source, target) in zip((0, 1, 1), planes, strict=True):  # chroma: half
            _copy_rows(
                source, (first - top) >> shift, target, first >> shift, (end - first) >> shift
            )
        return self._picture

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


def _copy_rows(source, source_row: int, target, target_row: int, count: int) -> None:
    """Copy `count` rows between two planes of the same width (line sizes may differ)."""
    source_view, target_view = memoryview(source), memoryview(target)
    if source.line_size == target.line_size:
        size = source.line_size
        target_view[target_row * size : (target_row + count) * size] = source_view[
            source_row * size : (source_row + count) * size
        ]
        return
    used = min(source.line_size, target.line_size)
    for y in range(count):
        s, t = (source_row + y) * source.line_size, (target_row + y) * target.line_size
        target_view[t : t + used] = source_view[s : s + used]
