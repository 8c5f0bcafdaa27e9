"""WebRTC viewers against real aiortc client peers, fed by a real H.264 pattern stream."""

from __future__ import annotations

import asyncio
import struct

import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.rtp import unpack_header_extensions

from cubicle.protocol import actions as a
from cubicle.protocol.errors import InvalidRequest
from cubicle.server.live.control import Control
from cubicle.server.live.hub import FrameHub
from cubicle.server.live.webrtc import PLAYOUT_DELAY_URI, WebRtcViewer
from tests.streaming.pattern_source import PatternFrames

pytestmark = pytest.mark.fast


class Client:
    """A browser stand-in: a real aiortc peer that receives and decodes the video."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.addTransceiver("video", direction="recvonly")
        self.channel = self.pc.createDataChannel("input")
        self.messages: list[str] = []
        self._arrived = asyncio.Event()

        @self.channel.on("message")
        def on_message(message: str) -> None:
            self.messages.append(message)
            self._arrived.set()

    async def message(self, number: int, timeout_s: float = 10.0) -> str:
        """The `number`th message from the service (1 is the first), once it arrived."""
        async with asyncio.timeout(timeout_s):
            while len(self.messages) < number:
                self._arrived.clear()
                await self._arrived.wait()
        return self.messages[number - 1]

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def accept(self, answer: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))

    @property
    def receiver(self):
        return self.pc.getTransceivers()[0].receiver

    def keep_rtp(self) -> list[bytes]:
        """From now on, every RTP packet that arrives (decrypted), in a list."""
        transport, packets = self.receiver.transport, []
        handle = transport._handle_rtp_data

        async def keep(data: bytes, arrival_time_ms: int) -> None:
            packets.append(data)
            await handle(data, arrival_time_ms)

        transport._handle_rtp_data = keep
        return packets

    async def frames(self, count: int, timeout_s: float = 60.0) -> list:
        got: list = []
        try:
            async with asyncio.timeout(timeout_s):
                while len(got) < count:
                    got.append(await self.receiver.track.recv())
        except TimeoutError:
            state = self.pc.connectionState
            pytest.fail(f"{len(got)} of {count} frames in {timeout_s} s; connection {state}")
        return got


@pytest.fixture
async def hub():
    source = PatternFrames(320, 240)
    hub = FrameHub(source)
    hub.source = source
    yield hub
    await hub.stop()


async def connect(hub: FrameHub, control: Control, closed: list) -> tuple[Client, WebRtcViewer]:
    client = Client()
    viewer = WebRtcViewer(hub, control, can_control=True, on_closed=closed.append)
    await client.accept(await viewer.answer(await client.offer()))
    return client, viewer


async def nothing(actions: list[a.Action]) -> None:
    pass


async def test_five_peers_decode_the_one_stream(hub):
    control, closed = Control(nothing), []
    peers = [await connect(hub, control, closed) for _ in range(5)]
    try:
        decoded = await asyncio.gather(*(client.frames(10) for client, _ in peers))
        for frames in decoded:
            assert [(f.width, f.height) for f in frames] == [(320, 240)] * 10
        assert hub.source.opens == 1
        assert hub.stats().subscribers == 5
        # H.264 was negotiated, packet mode 1.
        for client, _ in peers:
            codec = client.pc.getTransceivers()[0].receiver._RTCRtpReceiver__codecs
            assert {c.mimeType for c in codec.values()} <= {"video/H264", "video/rtx"}
    finally:
        for client, viewer in peers:
            await client.pc.close()
            await viewer.close()
    assert len(closed) == 5
    await asyncio.sleep(0.2)
    assert hub.stats().subscribers == 0 and hub.source.open_now == 0


async def test_a_picture_loss_report_asks_the_source_for_a_keyframe(hub):
    control, closed = Control(nothing), []
    client, viewer = await connect(hub, control, closed)
    try:
        await client.frames(5)
        hub.source.keyframe_requested.clear()
        ssrc = viewer._pc.getTransceivers()[0].sender._ssrc
        await client.receiver._send_rtcp_pli(ssrc)  # what a decoder that lost a frame sends
        await asyncio.wait_for(hub.source.keyframe_requested.wait(), 5)
        assert viewer.keyframe_requests == 1
    finally:
        await client.pc.close()
        await viewer.close()


async def test_input_on_the_data_channel_reaches_the_desktop_only_from_the_controller(hub):
    ran: list[a.Action] = []
    two_ran = asyncio.Event()

    async def run(actions: list[a.Action]) -> None:
        ran.extend(actions)
        if len(ran) >= 2:
            two_ran.set()

    control, closed = Control(run), []
    client, viewer = await connect(hub, control, closed)
    try:
        assert f'"viewer_id":"{viewer.id}"' in await client.message(1)
        client.channel.send('{"type": "button", "x": 5, "y": 6, "button": "left", "down": true}')
        assert '"take control first"' in await client.message(2)
        assert not ran

        control.take(viewer.id)
        client.channel.send('{"type": "button", "x": 5, "y": 6, "button": "left", "down": true}')
        client.channel.send('{"type": "button", "x": 5, "y": 6, "button": "left", "down": false}')
        await asyncio.wait_for(two_ran.wait(), 5)
        assert ran == [a.MouseDown(x=5, y=6), a.MouseUp(x=5, y=6)]
    finally:
        await client.pc.close()
        await viewer.close()
        await control.stop()


def header_extensions(packet: bytes) -> dict[int, bytes]:
    """The RTP header extensions of a packet, by id (RFC 3550 header, RFC 8285 block)."""
    if not packet[0] & 0x10:
        return {}
    at = 12 + 4 * (packet[0] & 0x0F)  # after the fixed header and the CSRCs
    profile, words = struct.unpack_from("!HH", packet, at)
    return dict(unpack_header_extensions(profile, packet[at + 4 : at + 4 + 4 * words]))


def with_playout_delay(offer: str, extension_id: int) -> str:
    """The offer as Chromium makes it: playout-delay among the video's header extensions."""
    line = f"a=extmap:{extension_id} {PLAYOUT_DELAY_URI}\r\n"
    return offer.replace("a=mid:0\r\n", "a=mid:0\r\n" + line, 1)


@pytest.mark.parametrize("offered", [True, False])
async def test_frames_go_out_with_zero_playout_delay_when_offered(hub, offered):
    # Zero playout delay tells the browser to show each frame once it is decoded, without
    # holding it in a jitter buffer.
    control, closed = Control(nothing), []
    client = Client()
    viewer = WebRtcViewer(hub, control, can_control=False, on_closed=closed.append)
    try:
        offer = await client.offer()
        answer = await viewer.answer(with_playout_delay(offer, 9) if offered else offer)
        assert (f"a=extmap:9 {PLAYOUT_DELAY_URI}" in answer) is offered
        await client.accept(answer)
        packets = client.keep_rtp()
        await client.frames(3)
        assert packets
        for packet in packets:
            extensions = header_extensions(packet)
            assert extensions.get(9) == (b"\0\0\0" if offered else None)
            assert len(extensions) >= 2  # aiortc's own (mid, abs-send-time) are still there
    finally:
        await client.pc.close()
        await viewer.close()


@pytest.mark.parametrize(
    ("sdp", "says"),
    [
        ("hello", "not SDP"),
        ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n", "no video section"),
        (
            "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
            "m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=recvonly\r\n"
            "a=rtcp-mux\r\na=rtpmap:96 VP8/90000\r\n"
            "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
            "a=fingerprint:sha-256 " + ":".join(["AA"] * 32) + "\r\na=setup:actpass\r\n",
            "no H.264",
        ),
    ],
)
async def test_an_unusable_offer_is_refused_with_a_reason(hub, sdp, says):
    viewer = WebRtcViewer(hub, Control(nothing), can_control=False, on_closed=lambda v: None)
    try:
        with pytest.raises(InvalidRequest, match=says):
            await viewer.answer(sdp)
    finally:
        await viewer.close()
