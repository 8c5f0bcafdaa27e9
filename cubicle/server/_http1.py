"""A lean HTTP/1.1 client connection pool on asyncio protocols, for the hop to a guest.

Each request goes out in one `send` and answers are parsed with httptools (the C parser
uvicorn uses); no request or response objects are built around them. A click crosses this
hop once, so its cost is part of every action's. It speaks plain HTTP over a Unix socket or
TCP, nothing else.

Bodies stream: a response's chunks are handed on as they arrive, reading pauses while more
than `_HIGH_WATER` bytes wait, and a connection goes back to the pool only once its answer
was read to the end (a stream closed early closes its connection).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httptools

_HIGH_WATER = 1 << 20
"""Bytes of a response body held unread before the connection stops reading."""
_MAX_IDLE = 8
"""Idle keep-alive connections kept per pool."""
_JOIN_BELOW = 64 * 1024
"""Request bodies up to this size go out in the same `send` as the head."""


class Http1Error(Exception):
    """The exchange failed below HTTP: no connection, a lost one, a timeout, a bad answer."""


@dataclass(frozen=True)
class Timeouts:
    """Seconds each stage of an exchange may take; None waits for ever."""

    connect: float | None
    write: float | None
    read: float | None
    """Between two pieces of the answer, not for the whole answer."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection carrying one exchange at a time."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._error: Http1Error | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.received_any = False
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(Http1Error(f"malformed HTTP answer: {exc}"))

    def eof_received(self) -> bool:
        self._fail(Http1Error("the server closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(Http1Error(f"the connection was lost: {exc or 'closed'}"))

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # --- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(bytes(body))
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # --- the exchange -----------------------------------------------------------------------

    @property
    def status_code(self) -> int:
        return self._parser.get_status_code()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, error: Http1Error) -> None:
        self.closed = True
        if self._error is None and not self.complete:
            self._error = error
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(error)

    async def _wait(self, timeout_s: float | None) -> None:
        if self._error is not None:
            raise self._error
        if self.closed:
            raise Http1Error("the connection is closed")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout_s):
                await self._waiter
        except TimeoutError:
            self.close()
            raise Http1Error(f"no answer within {timeout_s} s") from None
        finally:
            self._waiter = None

    async def send(self, head: bytes, body: bytes, timeout_s: float | None) -> None:
        assert self._transport is not None
        self._reset()
        if len(body) <= _JOIN_BELOW:
            self._transport.write(head + body)
        else:
            self._transport.write(head)
            self._transport.write(body)
        await self._drain(timeout_s)

    async def _drain(self, timeout_s: float | None) -> None:
        """Wait while the peer takes no more (the transport paused writing)."""
        if self._writable is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._writable
            except TimeoutError:
                self.close()
                raise Http1Error(f"could not send within {timeout_s} s") from None

    async def send_more(self, data: bytes, timeout_s: float | None) -> None:
        """More of the request body, after `send`; waits while the peer cannot take more."""
        assert self._transport is not None
        if self.closed:
            raise self._error or Http1Error("the connection is closed")
        self._transport.write(data)
        await self._drain(timeout_s)

    async def read_head(self, timeout_s: float | None) -> None:
        while not self.head_done:
            await self._wait(timeout_s)

    async def next_chunk(self, timeout_s: float | None) -> bytes | None:
        """The next piece of the body, or None at its end."""
        while not self._chunks:
            if self.complete:
                return None
            await self._wait(timeout_s)
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._paused and self._buffered <= _HIGH_WATER // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return chunk

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class Pool:
    """Keep-alive connections to one endpoint; `connect` opens a new one."""

    def __init__(
        self,
        connect: Callable[
            [Callable[[], _Connection]], Awaitable[tuple[asyncio.BaseTransport, _Connection]]
        ],
    ) -> None:
        self._connect = connect
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def exchange(self, head: bytes, body: bytes, timeouts: Timeouts) -> _Connection:
        """Send a request on a pooled connection and read its head; returns the connection,
        which goes back to the pool once the body is read (`release`)."""
        conn, reused = await self._acquire(timeouts.connect)
        try:
            try:
                await conn.send(head, body, timeouts.write)
                await conn.read_head(timeouts.read)
            except Http1Error:
                if not reused or conn.received_any:
                    raise
                # An idle connection the server closed as it was reused: nothing was read,
                # so nothing was done; send once more on a new connection.
                conn.close()
                conn, _ = await self._acquire(timeouts.connect, fresh=True)
                await conn.send(head, body, timeouts.write)
                await conn.read_head(timeouts.read)
        except BaseException:
            self._drop(conn)
            raise
        return conn

    async def exchange_streaming(
        self, head: bytes, body: AsyncIterator[bytes], timeouts: Timeouts
    ) -> _Connection:
        """`exchange` with a body sent as `body` yields it, on a new connection (a body
        read once cannot be sent again if a kept-alive one turns out closed)."""
        conn, _ = await self._acquire(timeouts.connect, fresh=True)
        try:
            await conn.send(head, b"", timeouts.write)
            async for piece in body:
                await conn.send_more(piece, timeouts.write)
            await conn.read_head(timeouts.read)
        except BaseException:
            self._drop(conn)
            raise
        return conn

    async def read_all(self, conn: _Connection, timeouts: Timeouts) -> bytes:
        """The rest of the answer's body; the connection goes back to the pool."""
        chunks: list[bytes] = []
        try:
            while (chunk := await conn.next_chunk(timeouts.read)) is not None:
                chunks.append(chunk)
        finally:
            self.release(conn)
        return b"".join(chunks)

    async def _acquire(
        self, timeout_s: float | None, *, fresh: bool = False
    ) -> tuple[_Connection, bool]:
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
            self._open.discard(conn)
        try:
            async with asyncio.timeout(timeout_s):
                transport, conn = await self._connect(_Connection)
        except TimeoutError:
            raise Http1Error(f"could not connect within {timeout_s} s") from None
        except OSError as exc:
            raise Http1Error(f"could not connect: {exc}") from exc
        conn.connection_made(transport)  # uvloop may call it only later
        self._open.add(conn)
        return conn, False

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    def release(self, conn: _Connection) -> None:
        if conn.complete and conn.keep_alive and not conn.closed and len(self._idle) < _MAX_IDLE:
            self._idle.append(conn)
        else:
            self._drop(conn)

    async def aclose(self) -> None:
        for conn in self._open:
            conn.close()
        self._open.clear()
        self._idle.clear()
