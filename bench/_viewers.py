"""Extra viewers that cost the server what a browser costs it, and the client next to nothing.

`python -m bench._viewers webrtc URL TOKEN DESKTOP N` connects N aiortc peers to our
service (`POST /api/desktops/{id}/webrtc`), receive-only H.264 like the viewer page. Their
receivers run the whole RTP path (SRTP, jitter buffer, RTCP reports, NACK, PLI) but their
decoder is replaced by a counter: the service does the same work for them as for a
browser, and this process stays light on a machine the measurement shares.

`python -m bench._viewers vnc WS_URL N` connects N RFB clients through websockify, each
declaring noVNC 1.3's pixel format and encodings (Tight, JPEG quality 6, compression 2, …)
and asking for an incremental update whenever data arrives (noVNC asks after each update),
without decoding: x11vnc encodes for each of them as for a noVNC page.

Once every viewer received its first picture the process prints `ready`; then each line
`report` on its stdin gets one JSON line back: pictures (WebRTC) and bytes received so far,
summed over the viewers. It ends when stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx

from bench._run import REPO

_counts = {"pictures": 0, "bytes": 0}
_lock = threading.Lock()


def _count(pictures: int = 0, nbytes: int = 0) -> None:
    with _lock:
        _counts["pictures"] += pictures
        _counts["bytes"] += nbytes


class _CountingDecoder:
    """Stands in for aiortc's H.264 decoder: counts the access units, returns no frames."""

    def decode(self, encoded_frame) -> list:
        _count(pictures=1, nbytes=len(encoded_frame.data))
        return []


async def _webrtc_viewer(client: httpx.AsyncClient, desktop_id: str):
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("input")
    await pc.setLocalDescription(await pc.createOffer())
    answer = await client.post(
        f"/api/desktops/{desktop_id}/webrtc", json={"sdp": pc.localDescription.sdp}
    )
    answer.raise_for_status()
    await pc.setRemoteDescription(RTCSessionDescription(answer.json()["sdp"], "answer"))
    return pc


async def _run_webrtc(url: str, token: str, desktop_id: str, count: int) -> None:
    from aiortc import rtcrtpreceiver

    rtcrtpreceiver.get_decoder = lambda codec: _CountingDecoder()
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        peers = [await _webrtc_viewer(client, desktop_id) for _ in range(count)]
        try:
            await _until_pictures(count)
            await _serve_reports()
        finally:
            await asyncio.gather(*(pc.close() for pc in peers))


# --- RFB (VNC) -------------------------------------------------------------------------------

NOVNC_ENCODINGS = [1, 7, -260, 5, 2, 0, -32 + 6, -256 + 2, -223, -224, -258, -308, -309, -312,
                   -313, -307, 0xC0A1E5CE - 2**32, 0x574D5664, -239]  # fmt: skip
"""noVNC 1.3's `_sendEncodings()` at depth 24: CopyRect, Tight, TightPNG, Hextile, RRE, Raw,
quality 6, compression 2, then its pseudo-encodings, in its order."""
NOVNC_PIXEL_FORMAT = struct.pack(">BBBBHHHBBB3x", 32, 24, 0, 1, 255, 255, 255, 0, 8, 16)
"""noVNC's `pixelFormat(depth 24, true colour)`: 32 bpp, little-endian, RGB shifts 0/8/16."""
REQUEST_EVERY_S = 0.005
"""Seconds: at most one update request this often while data arrives."""
KEEP_ASKING_S = 0.02
"""Seconds: a request at least this often, whatever arrives."""


class _Reader:
    """Bytes from a WebSocket, taken a number at a time (RFB's handshake)."""

    def __init__(self, ws) -> None:
        self._ws = ws
        self._buffer = b""

    async def take(self, n: int) -> bytes:
        while len(self._buffer) < n:
            self._buffer += await self._ws.recv()
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out


async def _vnc_viewer(url: str, first: asyncio.Event) -> None:
    import websockets

    async with websockets.connect(url, subprotocols=["binary"], max_size=None) as ws:
        reader = _Reader(ws)
        await reader.take(12)
        await ws.send(b"RFB 003.008\n")
        types = await reader.take((await reader.take(1))[0])
        if 1 not in types:
            raise RuntimeError(f"x11vnc offers no 'None' security type: {list(types)}")
        await ws.send(b"\x01")
        if struct.unpack(">I", await reader.take(4))[0] != 0:
            raise RuntimeError("x11vnc refused the connection")
        await ws.send(b"\x01")  # shared
        width, height = struct.unpack(">HH", await reader.take(4))
        await reader.take(16)
        await reader.take(struct.unpack(">I", await reader.take(4))[0])
        await ws.send(b"\x00\x00\x00\x00" + NOVNC_PIXEL_FORMAT)
        encodings = struct.pack(
            f">BxH{len(NOVNC_ENCODINGS)}i", 2, len(NOVNC_ENCODINGS), *NOVNC_ENCODINGS
        )
        await ws.send(encodings)
        await ws.send(struct.pack(">BBHHHH", 3, 0, 0, 0, width, height))
        incremental = struct.pack(">BBHHHH", 3, 1, 0, 0, width, height)
        asked = [time.monotonic()]

        async def ask(after_s: float) -> None:
            if time.monotonic() - asked[0] >= after_s:
                asked[0] = time.monotonic()
                await ws.send(incremental)

        async def keep_asking() -> None:  # in case the last update came right after a request
            while True:
                await asyncio.sleep(KEEP_ASKING_S)
                await ask(KEEP_ASKING_S)

        asker = asyncio.create_task(keep_asking())
        try:
            async for message in ws:
                _count(nbytes=len(message))
                first.set()
                await ask(REQUEST_EVERY_S)
        finally:
            asker.cancel()


async def _run_vnc(url: str, count: int) -> None:
    firsts = [asyncio.Event() for _ in range(count)]
    tasks = [asyncio.create_task(_vnc_viewer(url, first)) for first in firsts]
    try:
        everyone = asyncio.ensure_future(asyncio.gather(*(first.wait() for first in firsts)))
        done, _ = await asyncio.wait([*tasks, everyone], timeout=30, return_when="FIRST_COMPLETED")
        everyone.cancel()
        for task in done - {everyone}:
            task.result()  # a viewer that failed raises here
            raise RuntimeError("a VNC viewer's connection ended")
        if not all(first.is_set() for first in firsts):
            raise RuntimeError("not every VNC viewer got a picture within 30 s")
        print("ready", flush=True)
        await _serve_reports()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# --- both --------------------------------------------------------------------------------------


async def _until_pictures(count: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while _counts["pictures"] < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{_counts['pictures']} pictures for {count} viewers in 30 s")
        await asyncio.sleep(0.05)
    print("ready", flush=True)


async def _serve_reports() -> None:
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        if line.strip() == "report":
            with _lock:
                report = {"at_s": time.monotonic(), **_counts}
            print(json.dumps(report), flush=True)


# --- the host side ----------------------------------------------------------------------------


class ExtraViewers:
    """A running `python -m bench._viewers` process."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._process = process

    def _line(self, timeout_s: float) -> str:
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        if not ready:
            raise RuntimeError(f"the extra viewers said nothing within {timeout_s:.0f} s")
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the extra viewers exited ({self._process.wait()})")
        return line.strip()

    def report(self) -> dict[str, float]:
        """`at_s` (monotonic), and `pictures` and `bytes` received so far by them all."""
        assert self._process.stdin is not None
        self._process.stdin.write("report\n")
        self._process.stdin.flush()
        return json.loads(self._line(10))


@contextlib.contextmanager
def extra_viewers(argv: list[str]) -> Iterator[ExtraViewers]:
    """Run `python -m bench._viewers *argv` until the block ends; yields once all are ready."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench._viewers", *argv],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        viewers = ExtraViewers(process)
        if (line := viewers._line(45)) != "ready":
            raise RuntimeError(f"the extra viewers said {line!r} instead of ready")
        yield viewers
    finally:
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()  # type: ignore[union-attr]
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: list[str]) -> None:
    if argv[0] == "webrtc":
        asyncio.run(_run_webrtc(argv[1], argv[2], argv[3], int(argv[4])))
    elif argv[0] == "vnc":
        asyncio.run(_run_vnc(argv[1], int(argv[2])))
    else:
        raise SystemExit("usage: python -m bench._viewers webrtc URL TOKEN DESKTOP N | vnc URL N")


if __name__ == "__main__":
    main(sys.argv[1:])
