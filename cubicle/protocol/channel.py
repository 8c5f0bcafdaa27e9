"""Many byte streams over one serial link: how the host reaches a microVM's guest daemon.

A microVM without a network device has one way in and out: a virtio-serial port, which
QEMU joins to a Unix socket on the host. The guest protocol needs several connections at
once (a frame stream stays open while actions go), so both ends run a `Mux` that carries
numbered streams over the link, each with its own flow control, in frames:

    header (9 bytes, network order): kind u8, stream u32, length u32; then `length` bytes

The host opens streams (`OPEN`), one per connection to its per-desktop socket; the guest
joins each to a connection to its daemon. `DATA` carries bytes, at most `WINDOW` of them
unacknowledged per stream (`CREDIT` gives room back once written on), `EOF` ends one
direction, `CLOSE` both. `HELLO` starts a session: the host sends it first thing after
connecting, with the desktop's configuration and identity; the guest answers it. A
session starts with `MAGIC` on each side, so a reader that lost its place (a host that
reconnected, a VM restored from a snapshot) finds the next session by scanning for it.
`EVENT` carries the guest's progress events (JSON) to the host; the host's `PING`s, each
answered by a `PONG` with the same payload, tell it the VM still runs.

Only the standard library: the guest imports this inside the VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import struct
from collections.abc import Awaitable, Callable

from cubicle.protocol.errors import SandboxError

HEADER = struct.Struct("!BII")
MAGIC = HEADER.pack(0xFF, 0x43554249, 0x434C4530)
"""Starts every session ("CUBICLE0" in a header's clothes)."""
WINDOW = 1 << 20
"""Bytes a stream may have in flight before the receiver gives credit back."""
CHUNK = 64 << 10
"""Largest payload of one DATA frame."""
CREDIT_BATCH = WINDOW // 4
"""Bytes written on before the receiver gives them back as credit."""
MAX_CONTROL = 1 << 20
"""Largest HELLO or EVENT payload."""


class Kind(enum.IntEnum):
    HELLO = 1
    OPEN = 2
    DATA = 3
    EOF = 4
    CLOSE = 5
    CREDIT = 6
    EVENT = 7
    PING = 8
    PONG = 9


class ChannelBroken(SandboxError):
    """The link to a microVM carried something that is not a frame, or went away."""

    code = "channel_broken"


class Link:
    """Where a mux writes frames: anything with `write(bytes)` and `async drain()`."""

    def write(self, data: bytes) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def drain(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def frame(kind: Kind, stream: int = 0, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, stream, len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[Kind, int, bytes]:
    """The next frame; skips session marks; `ChannelBroken` on anything else."""
    while True:
        header = await reader.readexactly(HEADER.size)
        if header == MAGIC:
            continue
        kind, stream, length = HEADER.unpack(header)
        try:
            kind = Kind(kind)
        except ValueError:
            raise ChannelBroken(f"unknown frame kind {kind}") from None
        limit = CHUNK if kind is Kind.DATA else MAX_CONTROL
        if length > limit:
            raise ChannelBroken(f"{kind.name} frame of {length} bytes (at most {limit})")
        return kind, stream, await reader.readexactly(length) if length else b""


async def find_session(reader: asyncio.StreamReader) -> None:
    """Skip whatever comes before the next session's `MAGIC`."""
    while True:
        try:
            await reader.readuntil(MAGIC)
            return
        except asyncio.LimitOverrunError as exc:  # keep the tail: MAGIC may straddle
            await reader.readexactly(max(1, exc.consumed - len(MAGIC)))


class _Stream:
    def __init__(self, number: int) -> None:
        self.number = number
        self.credit = WINDOW
        self.room = asyncio.Event()
        self.inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.writer: asyncio.StreamWriter | None = None


class Mux:
    """The streams of one session over one link; the same on both ends."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._streams: dict[int, _Stream] = {}

    def send(self, kind: Kind, stream: int = 0, payload: bytes = b"") -> None:
        self._link.write(frame(kind, stream, payload))

    @property
    def streams(self) -> int:
        return len(self._streams)

    def open(self, number: int) -> _Stream:
        """A new stream; `attach` joins it to a local connection."""
        if number in self._streams:
            raise ChannelBroken(f"stream {number} opened twice")
        stream = self._streams[number] = _Stream(number)
        return stream

    def attach(
        self, stream: _Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Carry a local connection's bytes over the stream both ways until both end."""
        if self._streams.get(stream.number) is not stream:  # closed meanwhile
            writer.close()
            return
        stream.writer = writer
        stream.tasks = [
            asyncio.create_task(self._outbound(stream, reader), name=f"mux-out-{stream.number}"),
            asyncio.create_task(self._inbound(stream, writer), name=f"mux-in-{stream.number}"),
        ]
        for task in stream.tasks:
            task.add_done_callback(lambda _: self._maybe_done(stream))

    def deliver(self, kind: Kind, number: int, payload: bytes) -> None:
        """Hand a received stream frame to its stream (frames of unknown streams are dropped:
        they belong to a stream one side already closed)."""
        stream = self._streams.get(number)
        if stream is None:
            return
        if kind is Kind.DATA:
            stream.inbox.put_nowait(payload)
        elif kind is Kind.EOF:
            stream.inbox.put_nowait(None)
        elif kind is Kind.CREDIT:
            stream.credit += int.from_bytes(payload, "big")
            stream.room.set()
        elif kind is Kind.CLOSE:
            self._drop(stream, tell_peer=False)

    def close(self, number: int) -> None:
        """Drop a stream and tell the other end."""
        if stream := self._streams.get(number):
            self._drop(stream, tell_peer=True)

    def reset(self) -> None:
        """Drop every stream without a word to the peer (a new session begins)."""
        for stream in list(self._streams.values()):
            self._drop(stream, tell_peer=False)

    async def aclose(self) -> None:
        """Drop every stream and wait until their tasks ended."""
        tasks = [t for s in self._streams.values() for t in s.tasks]
        self.reset()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _drop(self, stream: _Stream, *, tell_peer: bool) -> None:
        if self._streams.get(stream.number) is not stream:
            return
        del self._streams[stream.number]
        if tell_peer:
            self.send(Kind.CLOSE, stream.number)
        for task in stream.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        if stream.writer is not None:
            stream.writer.close()

    def _maybe_done(self, stream: _Stream) -> None:
        failed = any(t.done() and not t.cancelled() and t.exception() for t in stream.tasks)
        if failed:
            self._drop(stream, tell_peer=True)
        elif all(t.done() for t in stream.tasks):
            self._drop(stream, tell_peer=False)

    async def _outbound(self, stream: _Stream, reader: asyncio.StreamReader) -> None:
        while True:
            while stream.credit <= 0:
                stream.room.clear()
                await stream.room.wait()
            data = await reader.read(min(CHUNK, stream.credit))
            if not data:
                self.send(Kind.EOF, stream.number)
                return
            stream.credit -= len(data)
            self.send(Kind.DATA, stream.number, data)
            await self._link.drain()

    async def _inbound(self, stream: _Stream, writer: asyncio.StreamWriter) -> None:
        consumed = 0
        while (data := await stream.inbox.get()) is not None:
            writer.write(data)
            await writer.drain()
            consumed += len(data)
            # Credit goes back in quarter windows: a request and its answer cost one frame
            # each way, not two, while a bulk transfer never waits on a full window.
            if consumed >= CREDIT_BATCH or (stream.inbox.empty() and consumed >= CHUNK):
                self.send(Kind.CREDIT, stream.number, consumed.to_bytes(4, "big"))
                consumed = 0
        if writer.can_write_eof():
            writer.write_eof()


async def serve_frames(
    reader: asyncio.StreamReader,
    mux: Mux,
    on_control: Callable[[Kind, int, bytes], Awaitable[None] | None],
) -> None:
    """Read frames until the link ends: stream frames to the mux, the rest to `on_control`."""
    while True:
        kind, number, payload = await read_frame(reader)
        if kind in (Kind.DATA, Kind.EOF, Kind.CREDIT, Kind.CLOSE):
            mux.deliver(kind, number, payload)
            continue
        result = on_control(kind, number, payload)
        if result is not None:
            await result


async def close_writer(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError, ConnectionError):
        await writer.wait_closed()
