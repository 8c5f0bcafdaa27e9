"""A lean HTTP/1.1 transport for httpx: keep-alive connections on asyncio protocols.

httpx's own async transport (httpcore over anyio) costs about a millisecond of Python per
request, several times the request itself on a Unix socket (bench `click`). This one writes
each request with one `send` and parses answers with httptools, the C parser uvicorn uses.
It speaks plain HTTP over a Unix socket or TCP, nothing else: `https`, proxies and HTTP/2
stay with httpx's default transport (see `lean_transport_for`).

Bodies stream: a response's chunks are handed on as they arrive, reading pauses while more
than `_HIGH_WATER` bytes wait, and a connection goes back to the pool only once its answer
was read to the end (a stream closed early closes its connection).
"""

from __future__ import annotations

import asyncio
import collections
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import httptools
import httpx

_HIGH_WATER = 1 << 20
"""Bytes of a response body held unread before the connection stops reading."""
_MAX_IDLE = 8
"""Idle keep-alive connections kept per endpoint."""
_JOIN_BELOW = 64 * 1024
"""Request bodies up to this size go out in the same `send` as the head."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection carrying one exchange at a time."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._error: httpx.TransportError | None = None
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
            self._fail(httpx.RemoteProtocolError(f"malformed HTTP answer: {exc}"))

    def eof_received(self) -> bool:
        self._fail(httpx.RemoteProtocolError("the server closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(httpx.ReadError(f"the connection was lost: {exc or 'closed'}"))

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

    def _fail(self, error: httpx.TransportError) -> None:
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
            raise httpx.ReadError("the connection is closed")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout_s):
                await self._waiter
        except TimeoutError:
            self.close()
            raise httpx.ReadTimeout(f"no answer within {timeout_s} s") from None
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
        if self._writable is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._writable
            except TimeoutError:
                self.close()
                raise httpx.WriteTimeout(f"could not send within {timeout_s} s") from None

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


class _Body(httpx.AsyncByteStream):
    def __init__(
        self, pool: LeanTransport, key: object, conn: _Connection, timeout_s: float | None
    ):
        self._pool, self._key, self._conn, self._timeout_s = pool, key, conn, timeout_s
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (chunk := await self._conn.next_chunk(self._timeout_s)) is not None:
            yield chunk

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._pool._release(self._key, self._conn)


class LeanTransport(httpx.AsyncBaseTransport):
    """Plain HTTP/1.1 with keep-alive, over the Unix socket `uds` or TCP to the URL's host."""

    def __init__(self, uds: str | None = None) -> None:
        self._uds = uds
        self._idle: dict[object, list[_Connection]] = {}
        self._open: set[_Connection] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(
                f"the lean transport speaks plain http only: {request.url}"
            )
        if request.method == "HEAD":
            raise httpx.UnsupportedProtocol("the lean transport does not send HEAD requests")
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head = _head(request, len(body))
        key = self._uds or (request.url.host, request.url.port or 80)
        conn = await self._exchange(key, head, body, timeouts)
        return httpx.Response(
            conn.status_code,
            headers=conn.headers,
            stream=_Body(self, key, conn, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def post(
        self, path: str, body: bytes, content_type: str, timeouts: dict[str, float | None]
    ) -> tuple[int, bytes]:
        """POST `body` to `path` over the Unix socket and read the whole answer: (status,
        body). Neither httpx's request nor its response is built: for a click, the hop to
        the guest, they cost as much Python as the rest of the exchange."""
        if self._uds is None:
            raise httpx.UnsupportedProtocol("post() goes over a Unix socket only")
        head = b"POST %s HTTP/1.1\r\nhost: guest\r\ncontent-type: %s\r\n" % (
            path.encode(),
            content_type.encode(),
        )
        head += b"content-length: %d\r\n\r\n" % len(body)
        conn = await self._exchange(self._uds, head, body, timeouts)
        chunks: list[bytes] = []
        try:
            while (chunk := await conn.next_chunk(timeouts.get("read"))) is not None:
                chunks.append(chunk)
        finally:
            self._release(self._uds, conn)
        return conn.status_code, b"".join(chunks)

    async def _exchange(
        self, key: object, head: bytes, body: bytes, timeouts: dict[str, float | None]
    ) -> _Connection:
        """Send a request on a pooled connection and read its head; returns the connection,
        which goes back to the pool once the body is read (`_release`)."""
        conn, reused = await self._acquire(key, timeouts.get("connect"))
        try:
            try:
                await conn.send(head, body, timeouts.get("write"))
                await conn.read_head(timeouts.get("read"))
            except (httpx.ReadError, httpx.RemoteProtocolError):
                if not reused or conn.received_any:
                    raise
                # An idle connection the server closed as it was reused: nothing was read,
                # so nothing was done; send once more on a new connection.
                conn.close()
                conn, _ = await self._acquire(key, timeouts.get("connect"), fresh=True)
                await conn.send(head, body, timeouts.get("write"))
                await conn.read_head(timeouts.get("read"))
        except BaseException:
            conn.close()
            self._open.discard(conn)
            raise
        return conn

    async def _acquire(
        self, key: object, timeout_s: float | None, *, fresh: bool = False
    ) -> tuple[_Connection, bool]:
        idle = self._idle.get(key, [])
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed:
                return conn, True
            self._open.discard(conn)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                if isinstance(key, str):
                    transport, conn = await loop.create_unix_connection(_Connection, key)
                else:
                    host, port = key  # type: ignore[misc]
                    transport, conn = await loop.create_connection(_Connection, host, port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"could not connect within {timeout_s} s") from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        conn.connection_made(transport)  # uvloop may call it only later
        self._open.add(conn)
        return conn, False

    def _release(self, key: object, conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if conn.complete and conn.keep_alive and not conn.closed and len(idle) < _MAX_IDLE:
            idle.append(conn)
        else:
            conn.close()
            self._open.discard(conn)

    async def aclose(self) -> None:
        for conn in self._open:
            conn.close()
        self._open.clear()
        self._idle.clear()


def _head(request: httpx.Request, length: int) -> bytes:
    lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
    for name, value in request.headers.raw:
        if name.lower() not in (b"content-length", b"transfer-encoding"):
            lines.append(b"%s: %s\r\n" % (name, value))
    if length or request.method in ("POST", "PUT", "PATCH"):
        lines.append(b"content-length: %d\r\n" % length)
    lines.append(b"\r\n")
    return b"".join(lines)


def build_request(
    method: str, url: str, default_timeout: httpx.Timeout, **kwargs: Any
) -> httpx.Request:
    """A request to hand to `LeanTransport` directly, without an `httpx.AsyncClient`.

    Takes `httpx.Request`'s arguments; `timeout=` (seconds or `httpx.Timeout`, as the
    client takes it) overrides `default_timeout`.
    """
    limits = httpx.Timeout(kwargs.pop("timeout")) if "timeout" in kwargs else default_timeout
    request = httpx.Request(method, url, **kwargs)
    request.extensions["timeout"] = limits.as_dict()
    return request


async def send(transport: LeanTransport, request: httpx.Request) -> httpx.Response:
    """Send `request` and read the whole answer (the connection goes back to the pool)."""
    response = await transport.handle_async_request(request)
    response.request = request
    try:
        await response.aread()
    finally:
        await response.aclose()
    return response


def lean_transport_for(base_url: str) -> LeanTransport | None:
    """The lean transport for plain `http://` without a proxy; else None (httpx's own)."""
    url = httpx.URL(base_url)
    if url.scheme != "http":
        return None
    if urllib.request.getproxies().get("http") and not urllib.request.proxy_bypass(url.host):
        return None
    return LeanTransport()
