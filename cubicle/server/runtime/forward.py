"""`TcpDoor`: a sandbox's guest, reachable over TCP on a node's address.

A desktop started by the `local` runtime serves the guest protocol on a Unix socket inside
its own network namespace; a control plane on another host reaches it through this door:
a TCP listener on the node's address that pipes each connection, byte for byte, to the
guest's socket. The door reads nothing: the guest itself checks the desktop's secret on
every request (`SandboxSpec.secret`), so the door needs none of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from cubicle.server.guest_client import GuestEndpoint

log = logging.getLogger("cubicle.runtime.forward")

_CHUNK = 1 << 18
"""Bytes read at once: a screenshot or a burst of frames crosses in a few reads."""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


class TcpDoor:
    """A TCP listener on `host` (a free port) that leads to a guest's own endpoint."""

    def __init__(self, inner: GuestEndpoint, host: str) -> None:
        self.inner = inner
        self.host = host
        self.port: int | None = None
        """The port it listens on, once started."""
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()

    @property
    def endpoint(self) -> GuestEndpoint:
        """Where another host reaches the guest: this door, with the guest's secret."""
        if self.port is None:
            raise RuntimeError("start() the door first")
        return GuestEndpoint(host=self.host, port=self.port, secret=self.inner.secret)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._link, self.host, 0, limit=_CHUNK)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _open_inner(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.inner.uds is not None:
            return await asyncio.open_unix_connection(self.inner.uds, limit=_CHUNK)
        return await asyncio.open_connection(self.inner.host, self.inner.port, limit=_CHUNK)

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        inner_writer = None
        try:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                inner_reader, inner_writer = await self._open_inner()
            except OSError as exc:
                log.warning("guest %s does not answer: %s", self.inner, exc)
                return
            await asyncio.gather(_pipe(reader, inner_writer), _pipe(inner_reader, writer))
        finally:
            for w in (writer, inner_writer):
                if w is not None:
                    w.close()
            self._links.discard(task)

    async def stop(self) -> None:
        """Stop listening and cut every open connection; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        links = list(self._links)
        for task in links:
            task.cancel()
        await asyncio.gather(*links, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
