"""The port relay: a byte stream from the service to a TCP port inside the sandbox.

The service reaches a program listening inside a desktop (a dev server, Chromium's DevTools)
only through its guest, with the guest's own secret: it asks

    GET /relay/8000 HTTP/1.1
    Connection: Upgrade
    Upgrade: cubicle-relay
    Authorization: Bearer <secret>

and the guest connects to port 8000 on the sandbox's loopback (127.0.0.1, then ::1, where
Node's dev servers often listen), answers `101 Switching Protocols` and copies bytes both
ways until either side closes; or it answers an `ErrorBody` (401, 422, or 502 `port_closed`
when nothing listens there). What the bytes mean (HTTP, WebSocket, CDP) is the service's
business: the guest does not even read them. A thread per direction moves them from one
socket to the other with splice(2), in the kernel; each waits while the other side cannot
take more.

It rides on the guest's one HTTP listener: `relay_protocol` makes a subclass of uvicorn's
httptools protocol that takes this upgrade the way uvicorn takes a WebSocket one (the three
hooks it overrides are uvicorn's own; `tests/desktop/test_ports.py` pins them). Every runtime's
guest endpoint (a Unix socket, TCP to a microVM, TCP to a Ray node) carries it unchanged.

`listening()` reads which TCP ports something listens on, from `/proc/net/tcp{,6}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hmac
import ipaddress
import logging
import os
import re
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cubicle.protocol.errors import (
    AuthError,
    Busy,
    CubicleError,
    InvalidRequest,
    PortClosed,
    answer_for,
)
from cubicle.protocol.models import ListeningPort
from cubicle.protocol.routes import RELAY_UPGRADE

log = logging.getLogger("cubicle.guest")

_RELAY_PATH = re.compile(rb"^/relay/(\d{1,5})$")
_SWITCHED = (
    b"HTTP/1.1 101 Switching Protocols\r\n"
    b"connection: upgrade\r\nupgrade: " + RELAY_UPGRADE + b"\r\n\r\n"
)
_REASONS = {
    401: b"Unauthorized",
    422: b"Unprocessable Entity",
    429: b"Too Many Requests",
    502: b"Bad Gateway",
}


class SecretCheck:
    """Whether a request carries the guest's secret (`Authorization: Bearer <secret>`).

    A runtime that writes a new secret file (a microVM restored from a snapshot gets a new
    secret) is believed from then on: the file is read again when its stamp changes.
    """

    def __init__(self, secret: str, secret_file: Path | None = None) -> None:
        self._expected = f"Bearer {secret}".encode()
        self._file = secret_file
        self._file_stamp = self._stamp()

    def _stamp(self) -> int | None:
        try:
            return self._file.stat().st_mtime_ns if self._file else None
        except OSError:
            return None

    def _renewed(self) -> bool:
        stamp = self._stamp()
        if self._file is None or stamp == self._file_stamp:
            return False
        self._file_stamp = stamp
        secret = self._file.read_text().strip()
        self._expected = f"Bearer {secret}".encode()
        return bool(secret)

    def accepts(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether `headers` (lower-case names, as ASGI and uvicorn keep them) carry it."""
        authorization = next((v for k, v in headers if k == b"authorization"), b"")
        if hmac.compare_digest(authorization, self._expected):
            return True
        return self._renewed() and hmac.compare_digest(authorization, self._expected)


_SPLICE_BYTES = 1 << 20
"""Bytes one splice(2) call may move: the pipe between the two sockets is made this big."""
_F_SETPIPE_SZ = 1031
MAX_RELAYS = 128
"""Relays one guest keeps open at once (two threads each, counted against the desktop's
process limit): past it, a new one is refused `busy` (429) until one closes."""
_SOCKET_BUFFER = 4 << 20
"""Send buffer of the relay's socket toward the service (the kernel caps it at wmem_max)."""


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Move what arrives on `src` to `dst` until `src` ends, through a pipe, in the kernel
    (splice(2): no copy into this process); then end `dst`'s writing side."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # a smaller pipe only means more calls
        fcntl.fcntl(write_end, _F_SETPIPE_SZ, _SPLICE_BYTES)
    try:
        while moved := os.splice(src.fileno(), write_end, _SPLICE_BYTES, flags=os.SPLICE_F_MOVE):
            while moved:
                moved -= os.splice(read_end, dst.fileno(), moved, flags=os.SPLICE_F_MOVE)
    except OSError:
        pass  # a reset, or the relay closed under it: the other side hears it as an end
    finally:
        os.close(read_end)
        os.close(write_end)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class _Relay:
    """Two sockets joined: a thread per direction splices bytes from one to the other;
    when both directions have ended, both sockets close."""

    def __init__(self, relays: Relays, outside: socket.socket, inside: socket.socket) -> None:
        self._relays = relays
        self._sockets = (outside, inside)
        self._lock = threading.Lock()
        self._running = 2
        self.threads = [
            threading.Thread(target=self._run, args=(outside, inside), name="relay-in"),
            threading.Thread(target=self._run, args=(inside, outside), name="relay-out"),
        ]

    def start(self) -> None:
        self._relays.open.add(self)
        for thread in self.threads:
            thread.start()

    def _run(self, src: socket.socket, dst: socket.socket) -> None:
        _pump(src, dst)
        with self._lock:
            self._running -= 1
            if self._running:
                return
        for sock in self._sockets:
            sock.close()
        self._relays.open.discard(self)

    def stop(self) -> None:
        """End both directions now (the guest is stopping)."""
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@dataclass
class Relays:
    """The relays one guest daemon has open and the connects it is making: closed with it."""

    open: set[_Relay] = field(default_factory=set)
    connecting: set[asyncio.Task[None]] = field(default_factory=set)
    dialling: int = 0
    """Relays past the cap's check, still connecting inside: they count against it."""

    async def close(self) -> None:
        for task in self.connecting:
            task.cancel()
        await asyncio.gather(*self.connecting, return_exceptions=True)
        relays = list(self.open)
        for relay in relays:
            relay.stop()
        for relay in relays:
            for thread in relay.threads:
                await asyncio.to_thread(thread.join, 5.0)


async def _connect_inside(port: int) -> socket.socket:
    """A blocking socket connected to `port` on the sandbox's loopback, IPv4 first, then
    IPv6 (where Node's dev servers often listen)."""
    loop = asyncio.get_running_loop()
    failures = []
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:  # no IPv6 in this sandbox
            failures.append(f"{host}: {exc.strerror or exc}")
            continue
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (host, port))
        except OSError as exc:
            sock.close()
            failures.append(f"{host}: {exc.strerror or exc}")
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(True)
        return sock
    raise PortClosed(f"nothing listens on port {port} inside this desktop ({'; '.join(failures)})")


def _refusal(exc: CubicleError) -> bytes:
    answer = answer_for(exc, log_hint="the desktop's log")
    body = answer.json()
    reason = _REASONS.get(answer.status, b"Error")
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (answer.status, reason, len(body), body)
    )


def relay_protocol(check: SecretCheck | None, relays: Relays) -> type[HttpToolsProtocol]:
    """uvicorn's HTTP protocol, taking `Upgrade: cubicle-relay` as well as WebSockets."""

    class GuestHttp(HttpToolsProtocol):
        def _should_upgrade(self) -> bool:
            return self._get_upgrade() == RELAY_UPGRADE or super()._should_upgrade()

        def handle_websocket_upgrade(self) -> None:
            if self._get_upgrade() != RELAY_UPGRADE:
                super().handle_websocket_upgrade()
                return
            self.connections.discard(self)  # uvicorn's shutdown no longer waits for it
            self.transport.pause_reading()
            task = asyncio.get_running_loop().create_task(self._relay())
            relays.connecting.add(task)
            task.add_done_callback(relays.connecting.discard)

        async def _relay(self) -> None:
            outside = self.transport
            try:
                if check is not None and not check.accepts(self.headers):
                    raise AuthError("this desktop answers its runtime only")
                found = _RELAY_PATH.match(self.url)
                if found is None or not 0 < int(found[1]) < 65536:
                    raise InvalidRequest(f"no port to relay to in {self.url!r}: use /relay/PORT")
                if len(relays.open) + relays.dialling >= MAX_RELAYS:
                    raise Busy(
                        f"this desktop has {MAX_RELAYS} connections to its ports open: "
                        "close some, or retry in a moment"
                    )
                relays.dialling += 1
                try:
                    inside = await _connect_inside(int(found[1]))
                finally:
                    relays.dialling -= 1
            except CubicleError as exc:
                outside.write(_refusal(exc))
                outside.close()
                return
            except Exception:
                log.exception("relay to %r failed", self.url)
                outside.close()
                return
            if outside.is_closing():  # the service gave up while the connect went on
                inside.close()
                return
            # The connection leaves asyncio: a blocking copy of its socket goes to the
            # relay's threads, and the transport lets go of its own (nothing is buffered:
            # the service sends nothing before the 101).
            raw = outside.get_extra_info("socket")
            mine = socket.socket(fileno=os.dup(raw.fileno()))
            outside.close()
            mine.setblocking(True)
            # a deep buffer toward the service: fewer, larger reads there (a 200 MiB
            # download went from about 800 to 1200 MiB/s)
            mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
            try:
                mine.sendall(_SWITCHED)
            except OSError:
                mine.close()
                inside.close()
                return
            _Relay(relays, mine, inside).start()

    return GuestHttp


_LISTEN = "0A"
"""The state `/proc/net/tcp` gives a listening socket."""


def listening(proc: Path = Path("/proc")) -> list[ListeningPort]:
    """The TCP ports something listens on in this network namespace, with the process that
    holds each where it can be told (not the guest itself, which serves the service)."""
    sockets: dict[str, tuple[int, str]] = {}
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc / "self/net" / name).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == _LISTEN:
                    hex_address, _, hex_port = fields[1].partition(":")
                    sockets[fields[9]] = (int(hex_port, 16), _address(hex_address))
    owners = _owners(proc, set(sockets))
    me = os.getpid()
    found: dict[tuple[int, str], ListeningPort] = {}
    for inode, (port, address) in sockets.items():
        pid, process = owners.get(inode, (None, None))
        if pid == me:
            continue
        found[(port, address)] = ListeningPort(port=port, address=address, pid=pid, process=process)
    return sorted(found.values(), key=lambda p: (p.port, p.address))


def _address(hex_address: str) -> str:
    """`/proc/net/tcp`'s address (little-endian words) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def _owners(proc: Path, inodes: set[str]) -> dict[str, tuple[int, str]]:
    """Which process holds each socket inode, among those this process may look into."""
    owners: dict[str, tuple[int, str]] = {}
    if not inodes:
        return owners
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and (inode := target[8:-1]) in inodes:
                    comm = (entry / "comm").read_text().strip()
                    owners.setdefault(inode, (int(entry.name), comm))
    return owners
