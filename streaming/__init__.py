"""Live view: encode a desktop once, fan it out to viewers, record it.

In the guest: `capture` (DAMAGE-driven grabs), `encoder` (libx264), `source` (one encoder
for every reader of `GET /frames`). The wire between them: `frames`. On the host: `hub`
(one reader per desktop, a bounded queue per subscriber), `webrtc` (aiortc peers sending
the packets as they are), `mjpeg` (the fallback), `control` and `keys` (browser input),
`recording` (MP4 without re-encoding, with an action log) and `live`, which holds them per
desktop for the service.

Names load on first use, so the guest daemon, which imports `streaming.source`, does not
pay for the host's imports (aiortc).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from desktop._lazy import lazy_names

if TYPE_CHECKING:
    from streaming.frames import EncodedFrame
    from streaming.hub import FrameHub, Subscription
    from streaming.live import LiveDesktops
    from streaming.recording import ActionLog, Recorder, RecordingInfo

_HOMES = {
    "streaming.frames": ("EncodedFrame",),
    "streaming.hub": ("FrameHub", "Subscription"),
    "streaming.live": ("LiveDesktops",),
    "streaming.recording": ("ActionLog", "Recorder", "RecordingInfo"),
}
__all__ = [
    "ActionLog",
    "EncodedFrame",
    "FrameHub",
    "LiveDesktops",
    "Recorder",
    "RecordingInfo",
    "Subscription",
]


__getattr__ = lazy_names("streaming", _HOMES)
