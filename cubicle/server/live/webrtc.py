"""WebRTC viewers with aiortc: the hub's H.264 packets go out as they are, never re-encoded.

Each browser gets its own `RTCPeerConnection` (signalled over one HTTP offer/answer, no
trickle; host candidates only, so no STUN or TURN on loopback or a LAN). Its video track
hands aiortc ready-encoded `av.Packet`s, which aiortc only splits into RTP packets; H.264 is
forced through the transceiver's codec preferences. The page's data channel carries its
input to the desktop's `Control` and brings back who controls.

aiortc answers a receiver's PLI or FIR by flagging its own encoder for a keyframe, which
ready-encoded packets never pass through; so each sender's hook is wrapped to also ask the
hub (which asks the guest, rate-limited) for a keyframe.

Every video packet carries the playout-delay header extension with a minimum and maximum of
zero, when the browser offers it (Chromium does): the receiver then shows each frame as soon
as it is decoded instead of holding it in its jitter buffer for smooth motion, which on a
remote desktop is tens of milliseconds of lag for nothing. aiortc neither negotiates nor
writes this extension, so the answer gets it added and the sender writes it through its own
`_PlayoutDelayExtensions`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from fractions import Fraction

import av
from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
    rtp,
)
from aiortc import sdp as aiortc_sdp
from aiortc.exceptions import InternalError, InvalidAccessError, InvalidStateError, OperationError
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtcrtpparameters import (
    RTCRtpCodecCapability,
    RTCRtpHeaderExtensionParameters,
    RTCRtpParameters,
)

from cubicle.protocol.errors import InvalidRequest
from cubicle.protocol.frames import Subscription
from cubicle.server.live.control import Control, Viewer
from cubicle.server.live.hub import FrameHub

log = logging.getLogger("cubicle.streaming")

RTP_TIME_BASE = Fraction(1, 90_000)
"""The RTP clock of video: 90 kHz."""

PLAYOUT_DELAY_URI = "http://www.webrtc.org/experiments/rtp-hdrext/playout-delay"
"""RTP header extension: the receiver's playout delay, 12 bits minimum and 12 bits maximum
in units of 10 ms."""
ZERO_PLAYOUT_DELAY = bytes(3)
"""Minimum 0, maximum 0: show every frame as soon as it is decoded."""

_NO_H264 = (
    "the browser offers no H.264 video this service can send (it needs H.264 with "
    "packetization-mode=1, profile 42e01f): open the viewer with ?transport=mjpeg"
)


class PacketTrack(MediaStreamTrack):
    """A video track whose frames are the hub's H.264 access units, as `av.Packet`s.

    It subscribes on the first `recv()`, that is once the connection is up, so the viewer
    starts at a fresh keyframe.
    """

    kind = "video"

    def __init__(self, hub: FrameHub, name: str) -> None:
        super().__init__()
        self._hub = hub
        self._name = name
        self._subscription: Subscription | None = None

    @property
    def dropped(self) -> int:
        return self._subscription.dropped if self._subscription else 0

    async def recv(self) -> av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        if self._subscription is None:
            self._subscription = self._hub.subscribe(self._name)
        frame = await anext(self._subscription, None)
        if frame is None:
            self.stop()
            raise MediaStreamError
        packet = av.Packet(frame.data)
        packet.pts = packet.dts = frame.pts_us * 9 // 100
        packet.time_base = RTP_TIME_BASE
        return packet

    def stop(self) -> None:
        super().stop()
        if self._subscription is not None:
            self._subscription.close()


class _DataChannelOut:
    """A viewer's way back: the page's data channel once it is open; until then, queued."""

    def __init__(self) -> None:
        self._channel: RTCDataChannel | None = None
        self._pending: list[str] = []

    def attach(self, channel: RTCDataChannel) -> None:
        self._channel = channel
        for text in self._pending:
            channel.send(text)
        self._pending.clear()

    def send_text(self, text: str, *, droppable: bool = False) -> None:
        if self._channel is None:
            if not droppable:
                self._pending = [*self._pending[-15:], text]
        elif self._channel.readyState == "open":
            self._channel.send(text)

    def close(self) -> None:
        """Nothing to do: the peer connection, which carries the channel, is closed apart."""


class _PlayoutDelayExtensions(rtp.HeaderExtensionsMap):
    """aiortc's header extensions, plus a zero playout delay when it was negotiated."""

    def __init__(self) -> None:
        super().__init__()
        self._playout_delay_id: int | None = None

    def configure(self, parameters: RTCRtpParameters) -> None:
        super().configure(parameters)
        self._playout_delay_id = next(
            (x.id for x in parameters.headerExtensions if x.uri == PLAYOUT_DELAY_URI), None
        )

    def set(self, values: rtp.HeaderExtensions) -> tuple[int, bytes]:
        profile, value = super().set(values)
        if self._playout_delay_id is None:
            return profile, value
        extensions = rtp.unpack_header_extensions(profile, value) if value else []
        extensions.append((self._playout_delay_id, ZERO_PLAYOUT_DELAY))
        return rtp.pack_header_extensions(extensions)


def _offered_playout_delay(offer: aiortc_sdp.SessionDescription) -> int | None:
    """The id the offer's video section gives the playout-delay extension, if any."""
    for media in offer.media:
        if media.kind == "video":
            for extension in media.rtp.headerExtensions:
                if extension.uri == PLAYOUT_DELAY_URI:
                    return extension.id
    return None


def h264_preferences() -> list[RTCRtpCodecCapability]:
    """aiortc's H.264 codecs, constrained baseline first, then RTX for retransmissions."""
    codecs = RTCRtpSender.getCapabilities("video").codecs
    h264 = [c for c in codecs if c.mimeType == "video/H264"]
    h264.sort(key=lambda c: c.parameters.get("profile-level-id") != "42e01f")
    return h264 + [c for c in codecs if c.mimeType == "video/rtx"]


def _check_offer(text: str) -> aiortc_sdp.SessionDescription:
    if not text.lstrip().startswith("v=0"):
        raise InvalidRequest(
            "the offer is not SDP (SDP starts with v=0): send the `sdp` of the browser's "
            "RTCPeerConnection.createOffer()"
        )
    try:
        offer = aiortc_sdp.SessionDescription.parse(text)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"the offer is not valid SDP: {exc}") from exc
    if not any(media.kind == "video" for media in offer.media):
        raise InvalidRequest(
            "the offer has no video section: add a receive-only video transceiver "
            "(pc.addTransceiver('video', {direction: 'recvonly'})) before createOffer()"
        )
    return offer


class WebRtcViewer:
    """One browser watching over WebRTC: its peer connection, video track and input channel."""

    def __init__(
        self,
        hub: FrameHub,
        control: Control,
        *,
        can_control: bool,
        on_closed: Callable[[WebRtcViewer], None],
    ) -> None:
        self._out = _DataChannelOut()
        self.viewer = Viewer(self._out, "webrtc", can_control=can_control)
        self.keyframe_requests = 0
        """PLI and FIR messages from the browser, each passed on to the hub."""
        self._hub = hub
        self._control = control
        self._on_closed = on_closed
        self._track = PacketTrack(hub, f"webrtc-{self.viewer.id}")
        self._pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self._closed = False
        self._pc.on("datachannel", self._on_datachannel)
        self._pc.on("connectionstatechange", self._on_state)

    @property
    def id(self) -> str:
        return self.viewer.id

    @property
    def state(self) -> str:
        return self._pc.connectionState

    @property
    def dropped(self) -> int:
        return self._track.dropped

    async def answer(self, offer_sdp: str) -> str:
        """Take the browser's offer and give the answer (all candidates included)."""
        offer = _check_offer(offer_sdp)
        transceiver = self._pc.addTransceiver(self._track, direction="sendonly")
        transceiver.setCodecPreferences(h264_preferences())
        self._forward_keyframe_requests(transceiver.sender)
        # The sender configures its extensions once the answer is set: swap the writer first.
        transceiver.sender._RTCRtpSender__rtp_header_extensions_map = _PlayoutDelayExtensions()
        try:
            await self._pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        except OperationError as exc:
            raise InvalidRequest(_NO_H264) from exc
        except (ValueError, InvalidAccessError, InvalidStateError, InternalError) as exc:
            raise InvalidRequest(f"the offer cannot be used: {exc}") from exc
        if (playout_delay_id := _offered_playout_delay(offer)) is not None:
            transceiver._headerExtensions.append(  # what the answer and the sender use
                RTCRtpHeaderExtensionParameters(id=playout_delay_id, uri=PLAYOUT_DELAY_URI)
            )
        await self._pc.setLocalDescription(await self._pc.createAnswer())
        self._control.join(self.viewer)
        return self._pc.localDescription.sdp

    def _forward_keyframe_requests(self, sender: RTCRtpSender) -> None:
        # aiortc calls `_send_keyframe()` on this sender for every PLI and FIR it receives.
        flag_own_encoder = sender._send_keyframe

        def on_keyframe_request() -> None:
            flag_own_encoder()
            self.keyframe_requests += 1
            self._hub.request_keyframe()

        sender._send_keyframe = on_keyframe_request  # type: ignore[method-assign]

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        self._out.attach(channel)

        @channel.on("message")
        def on_message(message: str | bytes) -> None:
            if isinstance(message, bytes):
                message = message.decode("utf-8", "replace")
            self._control.handle(self.viewer, message)

    async def _on_state(self) -> None:
        log.debug("viewer %s: %s", self.id, self._pc.connectionState)
        if self._pc.connectionState in ("failed", "closed"):
            await self.close()

    async def close(self) -> None:
        """Hang up; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._control.leave(self.viewer)
        self._track.stop()
        self._on_closed(self)
        await self._pc.close()
