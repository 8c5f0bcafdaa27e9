"""H.264 encoding of raw screen captures with libx264 (through PyAV), tuned for live view.

Constrained baseline (what every browser decodes: `avc1.42e01f` and up), no B-frames, no
lookahead, SPS/PPS in front of every keyframe, Annex-B start codes. Keyframes come on
demand, so the GOP is long: a static desktop costs nothing and a joining viewer asks for
an IDR instead of waiting for one.
"""

from __future__ import annotations

from fractions import Fraction

import av
from av.video.frame import PictureType
from av.video.reformatter import VideoReformatter

from desktop.errors import SandboxError
from streaming.frames import EncodedFrame

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

    def encode(self, bgra: bytes | bytearray, pts_us: int, *, keyframe: bool) -> EncodedFrame:
        """Encode one capture of `source_width × source_height` BGRA pixels, rows unpadded.

        `pts_us` must grow from call to call; `keyframe` forces an IDR (with SPS/PPS).
        """
        if self._codec is None:
            raise SandboxError("the H.264 encoder is closed")
        self._load(bgra)
        picture = self._reformatter.reformat(self._bgra, format="yuv420p", threads=1)
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

    def _load(self, bgra: bytes | bytearray) -> None:
        """Copy the capture into the BGRA frame, minding its row padding and an odd size."""
        row = self.source_width * 4
        if len(bgra) < row * self.source_height:
            raise SandboxError(
                f"capture of {len(bgra)} bytes is short of {self.source_width}×"
                f"{self.source_height} BGRA pixels"
            )
        plane = self._bgra.planes[0]
        if plane.line_size == row:
            plane.update(memoryview(bgra)[: row * self.height])
            return
        source, target = memoryview(bgra), memoryview(plane)
        used = self.width * 4
        for y in range(self.height):
            target[y * plane.line_size : y * plane.line_size + used] = source[
                y * row : y * row + used
            ]

    def close(self) -> None:
        """Flush and free the encoder (x264 joins its threads); idempotent."""
        codec, self._codec = self._codec, None
        if codec is not None:
            try:
                codec.encode(None)
            except av.FFmpegError as exc:
                raise SandboxError(f"the H.264 encoder failed while closing: {exc}") from exc
