"""The host's end of a microVM's channel: a per-desktop Unix socket for the guest client.

`HostChannel` connects to the Unix socket QEMU joins to the VM's virtio-serial port,
starts a session (`HELLO` with the desktop's configuration and fresh identity), and
serves an ordinary Unix socket in the desktop's private directory: every connection to
it becomes one stream to the guest daemon inside the VM, so the guest client speaks
plain HTTP as with any other runtime. The guest's progress events arrive as `EVENT`
frames and are handed to whoever reads `events()`.

Nothing inside the VM can reach the host socket (there is no path out but the port), and
on the host it lives in a directory only the service's user may enter.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path

from cubicle.protocol.channel import (
    MAGIC,
    ChannelBroken,
    Kind,
    Mux,
    close_writer,
    find_session,
    frame,
    serve_frames,
)
from cubicle.protocol.errors import SandboxStartError

log = logging.getLogger("cubicle.runtime.microvm")


@dataclass(frozen=True)
class Identity:
    """What makes one desktop distinct from its siblings restored from the same snapshot."""

    hostname: str
    machine_id: str
    """32 hex digits."""
    seed: str
    """Random bytes for the guest's pool, hex."""
    clock: float
    """Host time when sent, seconds since the epoch."""
    secret: str
    """What the guest daemon asks of every request (`Authorization: Bearer …`)."""

    @classmethod
    def fresh(cls, desktop_id: str, time_now: float) -> Identity:
        return cls(
            hostname=f"cubicle-{desktop_id}",
            machine_id=secrets.token_hex(16),
            seed=secrets.token_hex(64),
            clock=time_now,
            secret=secrets.token_urlsafe(32),
        )


@dataclass(frozen=True)
class DesktopConfig:
    """What the guest daemon is started with (on a cold boot; a restore must match)."""

    width: int
    height: int
    max_file_bytes: int


class _WriterLink:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()


class HostChannel:
    """One VM's channel seen from the host."""

    def __init__(self, channel_socket: Path, guest_socket: Path) -> None:
        self.channel_socket = channel_socket
        self.guest_socket = guest_socket
        self._events: asyncio.Queue[dict | None] = asyncio.Queue()
        self._ids = itertools.count(1)
        self._mux: Mux | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._server: asyncio.Server | None = None
        self._hello: asyncio.Future[dict] | None = None
        self.last_pong = time.monotonic()
        """When the VM last answered a ping (monotonic seconds)."""

    async def start(
        self,
        identity: Identity,
        desktop: DesktopConfig,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Begin a session over a connected channel socket and serve the guest socket."""
        self._writer = writer
        self._mux = Mux(_WriterLink(writer))
        self._hello = asyncio.get_running_loop().create_future()
        session = {"identity": asdict(identity), "desktop": asdict(desktop)}
        writer.write(MAGIC + frame(Kind.HELLO, 0, json.dumps(session).encode()))
        await writer.drain()
        self._reader_task = asyncio.create_task(self._read(reader), name="channel-reader")
        self._server = await asyncio.start_unix_server(self._accept, str(self.guest_socket))
        self.guest_socket.chmod(0o600)

    async def hello(self) -> dict:
        """The guest's answer to this session's HELLO (raises if the link ended first)."""
        assert self._hello is not None
        answer = await asyncio.shield(self._hello)
        if answer.get("error"):
            raise SandboxStartError(answer["error"])
        return answer

    async def _read(self, reader: asyncio.StreamReader) -> None:
        assert self._mux is not None and self._hello is not None
        try:
            await find_session(reader)
            await serve_frames(reader, self._mux, self._control)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            log.debug("channel ended: %s", exc)
        except ChannelBroken as exc:
            log.warning("channel broken: %s", exc)
        finally:
            if not self._hello.done():
                self._hello.set_exception(SandboxStartError("the VM's channel closed"))
            self._events.put_nowait(None)

    def _control(self, kind: Kind, number: int, payload: bytes) -> None:
        assert self._hello is not None
        if kind is Kind.HELLO:
            if not self._hello.done():
                self._hello.set_result(json.loads(payload))
        elif kind is Kind.EVENT:
            with contextlib.suppress(ValueError):
                self._events.put_nowait(json.loads(payload))
        elif kind is Kind.PONG:
            self.last_pong = time.monotonic()

    def ping(self) -> None:
        """Ask the VM for a sign of life (`last_pong` moves when it answers)."""
        if self._mux is not None:
            self._mux.send(Kind.PING, 0, b"?")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._mux is None:
            writer.close()
            return
        number = next(self._ids)
        stream = self._mux.open(number)
        self._mux.send(Kind.OPEN, number)
        self._mux.attach(stream, reader, writer)

    async def events(self) -> AsyncIterator[dict]:
        """The guest's progress events, until the channel ends."""
        while (event := await self._events.get()) is not None:
            yield event

    def streams(self) -> int:
        return self._mux.streams if self._mux else 0

    async def quiesce(self) -> None:
        """Close every stream (before the VM's state is saved: none may be mid-flight)."""
        if self._mux is not None:
            await self._mux.aclose()

    async def stop(self) -> None:
        """Close the guest socket, every stream and the channel; idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
            self.guest_socket.unlink(missing_ok=True)
        if self._mux is not None:
            await self._mux.aclose()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
            self._reader_task = None
        if self._writer is not None:
            await close_writer(self._writer)
            self._writer = None
