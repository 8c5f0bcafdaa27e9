"""Reading H.264 back in tests: NAL unit types, the SPS profile, a real decoder."""

from __future__ import annotations

import av

from cubicle.protocol.frames import EncodedFrame


def nal_types(access_unit: bytes) -> list[int]:
    """The NAL unit types of an Annex-B access unit, in order."""
    types, at = [], 0
    while (at := access_unit.find(b"\x00\x00\x01", at)) >= 0:
        at += 3
        types.append(access_unit[at] & 0x1F)
    return types


def sps_profile(access_unit: bytes) -> tuple[int, int, int]:
    """(profile_idc, constraint flags byte, level_idc) of the access unit's SPS."""
    at = access_unit.index(b"\x00\x00\x01\x67") + 4
    return access_unit[at], access_unit[at + 1], access_unit[at + 2]


class Decoder:
    """FFmpeg's H.264 decoder, fed one access unit at a time, as a browser would."""

    def __init__(self) -> None:
        self.codec = av.CodecContext.create("h264", "r")
        self.codec.thread_type = "SLICE"  # frame threads would delay output by design

    def decode(self, frame: EncodedFrame) -> av.VideoFrame:
        packet = av.Packet(frame.data)
        packet.pts = frame.pts_us
        pictures = self.codec.decode(packet)
        # One picture out per access unit, at once and with its own pts: nothing is
        # reordered, so there are no B-frames.
        assert [p.pts for p in pictures] == [frame.pts_us]
        return pictures[0]


def colour_at(picture: av.VideoFrame, x: int, y: int) -> tuple[int, int, int]:
    return picture.to_image().getpixel((x, y))


def close_to(colour: tuple[int, int, int], expected: tuple[int, int, int]) -> bool:
    return all(abs(a - b) <= 40 for a, b in zip(colour, expected, strict=True))
