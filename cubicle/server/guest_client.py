"""The control plane's side of the guest protocol: `GuestClient`, one per desktop.

It reaches a guest daemon at a `GuestEndpoint` (a Unix socket on this host, or TCP for a
guest on another kernel or host, with the desktop's secret) over a pool of keep-alive
HTTP/1.1 connections (`cubicle.server._http1`). Guest errors arrive as `ErrorBody` and are raised
again here as the same `CubicleError` subclass; transport failures become
`GuestUnreachable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlencode

from pydantic import BaseModel

from cubicle.protocol.errors import DesktopGone, GuestUnreachable, raise_for_status
from cubicle.protocol.routes import RELAY_UPGRADE, GuestPath
from cubicle.server._http1 import Http1Error, Pool, Timeouts, _Connection

M = TypeVar("M", bound=BaseModel)
JSON = "application/json"
_RELAY_BUFFER = 4 << 20
"""Receive buffer of a relay's socket (a port's answers arrive in larger reads)."""
_MAX_RELAY_HEAD = 16 * 1024
"""Bytes of the guest's answer to a relay request before its end of head must show."""


@dataclass(frozen=True)
class GuestEndpoint:
    """Where a desktop's guest daemon listens, as the control plane reaches it."""

    uds: str | None = None
    """A Unix socket path on the control plane's host."""
    host: str | None = None
    port: int | None = None
    secret: str | None = None
    """Sent as `Authorization: Bearer <secret>` on every request, when set."""

    def __post_init__(self) -> None:
        if (self.uds is None) == (self.host is None or self.port is None):
            raise ValueError("a guest endpoint is a Unix socket or a host and port, not both")

    def __str__(self) -> str:
        return f"unix:{self.uds}" if self.uds else f"tcp:{self.host}:{self.port}"


@dataclass(frozen=True)
class GuestAnswer:
    """A guest's whole answer to one request."""

    status: int
    headers: dict[str, str]
    """Header names in lower case."""
    content: bytes

    def model(self, model: type[M]) -> M:
        return model.model_validate_json(self.content)


class GuestStream:
    """A guest's answer read as it arrives (`GuestClient.stream`)."""

    def __init__(self, conn: _Connection, read_timeout_s: float | None) -> None:
        self._conn = conn
        self._timeout_s = read_timeout_s
        self.headers = _headers(conn)

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            while (chunk := await self._conn.next_chunk(self._timeout_s)) is not None:
                yield chunk
        except Http1Error as exc:
            raise GuestUnreachable(f"the desktop's guest stopped answering: {exc}") from exc


def _headers(conn: _Connection) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in conn.headers}


class GuestClient:
    """Keep-alive HTTP connections to one guest daemon."""

    def __init__(self, endpoint: GuestEndpoint, *, timeout_s: float = 120.0) -> None:
        self.endpoint = endpoint
        self._timeouts = Timeouts(connect=5.0, write=timeout_s, read=timeout_s)
        self._pool = Pool(self._connect)
        fixed = b"host: guest\r\n"
        if endpoint.secret:
            fixed += b"authorization: Bearer %s\r\n" % endpoint.secret.encode()
        self._fixed_headers = fixed
        self._ended: str | None = None
        """Why the desktop ended, once `close` was told: later failures say that."""
        self._relays: dict[int, Pool] = {}
        """Keep-alive HTTP connections to ports inside, each over its own relay."""

    def _unreachable(self, what: str, exc: Http1Error) -> Exception:
        """The error for a failed exchange: the desktop's end, if that is what cut it."""
        if self._ended is not None:
            return DesktopGone(self._ended)
        return GuestUnreachable(f"{what}: {exc}")

    async def _connect(self, protocol):
        loop = asyncio.get_running_loop()
        if self.endpoint.uds is not None:
            return await loop.create_unix_connection(protocol, self.endpoint.uds)
        return await loop.create_connection(protocol, self.endpoint.host, self.endpoint.port)

    def _head(
        self, method: str, path: str, params: dict | None, content_type: str | None, length: int
    ) -> bytes:
        if params:
            fields = {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}
            path = f"{path}?{urlencode(fields)}"
        head = b"%s %s HTTP/1.1\r\n" % (method.encode(), path.encode()) + self._fixed_headers
        if content_type:
            head += b"content-type: %s\r\n" % content_type.encode()
        if length or method in ("POST", "PUT", "PATCH"):
            head += b"content-length: %d\r\n" % length
        return head + b"\r\n"

    async def _open(
        self,
        method: str,
        path: str,
        params: dict | None,
        json: BaseModel | None,
        content: bytes,
        content_type: str | None,
        timeouts: Timeouts,
    ) -> _Connection:
        if json is not None:
            content, content_type = json.model_dump_json().encode(), JSON
        head = self._head(method, path, params, content_type, len(content))
        try:
            return await self._pool.exchange(head, content, timeouts)
        except Http1Error as exc:
            what = f"the desktop's guest daemon did not answer ({self.endpoint})"
            raise self._unreachable(what, exc) from exc

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict | None = None,
        json: BaseModel | None = None,
        content: bytes = b"",
        content_type: str | None = None,
        timeout_s: float | None = None,
    ) -> GuestAnswer:
        """Send one request and read the whole answer; raise the guest's error, or
        `GuestUnreachable`. `timeout_s` overrides the client's read timeout."""
        timeouts = self._timeouts
        if timeout_s is not None:
            timeouts = Timeouts(timeouts.connect, timeout_s, timeout_s)
        conn = await self._open(method, path, params, json, content, content_type, timeouts)
        body = await self._read_all(conn, timeouts)
        return GuestAnswer(conn.status_code, _headers(conn), body)

    async def _read_all(self, conn: _Connection, timeouts: Timeouts) -> bytes:
        """The rest of an answer (the connection goes back to the pool); raise its error."""
        try:
            body = await self._pool.read_all(conn, timeouts)
        except Http1Error as exc:
            raise self._unreachable("the desktop's guest stopped answering", exc) from exc
        raise_for_status(conn.status_code, body)
        return body

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: dict | None = None,
        json: BaseModel | None = None,
        read_timeout_s: float | None,
    ) -> AsyncIterator[GuestStream]:
        """Send a request and hold its answer open to read it as it arrives; `None` as the
        read timeout waits for ever between pieces (a still screen sends no frames)."""
        timeouts = Timeouts(self._timeouts.connect, self._timeouts.write, read_timeout_s)
        conn = await self._open(method, path, params, json, b"", None, timeouts)
        if conn.status_code >= 400:
            await self._read_all(conn, timeouts)  # raises the guest's error
        try:
            yield GuestStream(conn, read_timeout_s)
        finally:
            self._pool.release(conn)

    async def open_relay(self, port: int) -> socket.socket:
        """A connected socket whose bytes reach `port` inside the desktop and back
        (`cubicle.guest.relay`); `PortClosed` when nothing listens there."""
        loop = asyncio.get_running_loop()
        if self._ended is not None:
            raise DesktopGone(self._ended)
        head = (
            b"GET %s HTTP/1.1\r\n" % GuestPath.RELAY.format(port=port).encode()
            + self._fixed_headers
            + b"connection: upgrade\r\nupgrade: %s\r\n\r\n" % RELAY_UPGRADE
        )
        sock = await self._dial()
        try:
            async with asyncio.timeout(self._timeouts.connect):
                await loop.sock_sendall(sock, head)
                status, body = await _relay_answer(loop, sock)
        except (OSError, TimeoutError) as exc:
            sock.close()
            what = f"the desktop's guest daemon did not relay port {port} ({self.endpoint})"
            raise self._unreachable(what, Http1Error(str(exc) or type(exc).__name__)) from exc
        except BaseException:
            sock.close()
            raise
        if status != 101:
            sock.close()
            raise_for_status(status, body)
            raise GuestUnreachable(f"the guest answered {status} to a relay request")
        return sock

    async def _dial(self) -> socket.socket:
        """A new non-blocking socket connected to the guest daemon."""
        loop = asyncio.get_running_loop()
        address: str | tuple
        if self.endpoint.uds is not None:
            family, address = socket.AF_UNIX, self.endpoint.uds
        else:
            infos = await loop.getaddrinfo(
                self.endpoint.host, self.endpoint.port, type=socket.SOCK_STREAM
            )
            family, address = infos[0][0], infos[0][4]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RELAY_BUFFER)
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            async with asyncio.timeout(self._timeouts.connect):
                await loop.sock_connect(sock, address)
        except (OSError, TimeoutError) as exc:
            sock.close()
            what = f"the desktop's guest daemon did not answer ({self.endpoint})"
            raise self._unreachable(what, Http1Error(str(exc) or "timed out")) from exc
        return sock

    def relay_pool(self, port: int) -> Pool:
        """Keep-alive HTTP/1.1 connections to `port` inside, for the port proxy."""
        pool = self._relays.get(port)
        if pool is None:

            async def connect(protocol):
                sock = await self.open_relay(port)
                loop = asyncio.get_running_loop()
                return await loop.create_connection(protocol, sock=sock)

            pool = self._relays[port] = Pool(connect)
        return pool

    async def close(self, reason: str | None = None) -> None:
        """Close every connection; `reason` (why the desktop ended) becomes the
        `DesktopGone` of requests cut short by it or sent after it."""
        if reason is not None and self._ended is None:
            self._ended = reason
        await self._pool.aclose()
        for pool in self._relays.values():
            await pool.aclose()
        self._relays.clear()


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


async def _relay_answer(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> tuple[int, bytes]:
    """The status of the guest's answer to a relay request and, unless it is 101, its body.

    Reads the head with `MSG_PEEK` first, then takes exactly the head off the socket: what
    follows a 101 is the inside program's, and stays for whoever reads the socket next.
    """
    seen = 0
    while True:
        await _readable(loop, sock)
        peeked = sock.recv(_MAX_RELAY_HEAD, socket.MSG_PEEK)
        if not peeked:
            raise ConnectionResetError("the guest closed the relay before answering")
        end = peeked.find(b"\r\n\r\n")
        if end >= 0:
            break
        if len(peeked) >= _MAX_RELAY_HEAD:
            raise ConnectionError("the guest's answer to a relay request has no end of head")
        if len(peeked) == seen:
            await asyncio.sleep(0.001)  # the rest of the head is on its way
        seen = len(peeked)
    head = sock.recv(end + 4)
    status_line = head.split(b"\r\n", 1)[0].split()
    status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
    if status == 101:
        return status, b""
    body = bytearray()
    while chunk := await loop.sock_recv(sock, 65536):  # the guest closes after an error
        body += chunk
        if len(body) > _MAX_RELAY_HEAD:
            break
    return status, bytes(body)
