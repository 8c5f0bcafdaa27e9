"""Inside a microVM: the host's channel, the VM's identity, and the guest daemon.

`images/microvm/cubicle-init` mounts the filesystems and execs this as PID 1. It opens
the virtio-serial port that QEMU joins to a Unix socket on the host, and serves the
channel (`cubicle.protocol.channel`) on it: each session starts with the host's `HELLO`,
which carries the desktop's configuration (screen, file size limit) and a fresh identity
(hostname, machine id, random seed, clock, the daemon's secret). The first `HELLO` after
a cold boot starts the guest daemon (as the desktop's user, on a Unix socket inside the
VM); a `HELLO` after a restore from a snapshot gives the same running desktop a new
identity. Each stream the host opens becomes a connection to the daemon; the daemon's
progress events go to the host as `EVENT` frames (and are replayed to each new session).

As PID 1 it also reaps orphans, and powers the VM off when the daemon ends, so the host
sees the desktop end.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cubicle.protocol.channel import (
    MAGIC,
    ChannelBroken,
    Kind,
    Link,
    Mux,
    find_session,
    frame,
    serve_frames,
)

log = logging.getLogger("cubicle.vm")

PORT_NAME = "cubicle.0"
DAEMON_SOCKET = "/run/cubicle/guest.sock"
SECRET_FILE = "/run/cubicle/secret"
IDENTITY_DIR = Path("/run/identity")
GUEST_UID = 1000
HOME = "/home/user"
_HIGH_WATER = 4 << 20
"""Bytes queued for the port before writers wait (the host is not reading)."""
_RNDADDENTROPY = 0x40085203
_POWER_OFF = 0x4321FEDC


def _find_port(timeout_s: float = 10.0) -> str:
    """The device of the channel's virtio-serial port (udev is not running to name it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in Path("/sys/class/virtio-ports").glob("*"):
            with contextlib.suppress(OSError):
                if (entry / "name").read_text().strip() == PORT_NAME:
                    return f"/dev/{entry.name}"
        time.sleep(0.02)
    raise ChannelBroken(f"no virtio-serial port named {PORT_NAME} (is virtio_console loaded?)")


class PortLink(Link):
    """The virtio-serial port, non-blocking, as a stream of bytes each way.

    While no host is connected a read returns nothing at once: the link then waits a
    moment and looks again, and hands the next reader a clean buffer.
    """

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._loop = asyncio.get_running_loop()
        self.reader = asyncio.StreamReader(limit=1 << 20)
        self._out = bytearray()
        self._drained = asyncio.Event()
        self._drained.set()
        self._loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError as exc:
            data = b""
            log.warning("port read failed: %s", exc)
        if data:
            self.reader.feed_data(data)
            return
        # The host is not connected: whatever the old session left is gone.
        self._loop.remove_reader(self._fd)
        self.reader.feed_eof()
        self.reader = asyncio.StreamReader(limit=1 << 20)
        self._loop.call_later(0.01, self._loop.add_reader, self._fd, self._readable)

    def write(self, data: bytes) -> None:
        self._out += data
        self._flush()

    def _flush(self) -> None:
        while self._out:
            try:
                sent = os.write(self._fd, self._out)
            except BlockingIOError:
                break
            del self._out[:sent]
        if self._out:
            self._drained.clear()
            self._loop.add_writer(self._fd, self._flush)
        else:
            self._loop.remove_writer(self._fd)
            self._drained.set()

    def discard(self) -> None:
        """Forget bytes not yet sent: they belong to a session that ended."""
        self._out.clear()
        self._flush()

    async def drain(self) -> None:
        if len(self._out) > _HIGH_WATER:
            await self._drained.wait()


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.write_text(text)
    path.chmod(mode)


def apply_identity(identity: dict[str, Any], *, network: bool) -> None:
    """Hostname, machine id, random seed, clock and secret, fresh for this desktop."""
    hostname = identity["hostname"]
    socket.sethostname(hostname)
    IDENTITY_DIR.mkdir(parents=True, exist_ok=True)
    _write(IDENTITY_DIR / "hostname", hostname + "\n")
    _write(IDENTITY_DIR / "hosts", f"127.0.0.1 localhost {hostname}\n::1 localhost\n")
    _write(IDENTITY_DIR / "machine-id", identity["machine_id"] + "\n", 0o444)
    _write(IDENTITY_DIR / "resolv.conf", "nameserver 10.0.2.3\n" if network else "")
    seed = bytes.fromhex(identity["seed"])
    with open("/dev/urandom", "wb", buffering=0) as urandom:  # mixed in and credited
        fcntl.ioctl(urandom, _RNDADDENTROPY, struct.pack("ii", len(seed) * 8, len(seed)) + seed)
    time.clock_settime(time.CLOCK_REALTIME, float(identity["clock"]))
    secret = Path(SECRET_FILE)
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text(identity["secret"])
    os.chown(secret, GUEST_UID, GUEST_UID)
    secret.chmod(0o400)


def _bring_up_network() -> bool:
    """Loopback always; the user-mode NIC (QEMU's slirp addresses) when the VM has one."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    if not Path("/sys/class/net/eth0").exists():
        return False
    for argv in (
        ["ip", "addr", "add", "10.0.2.15/24", "dev", "eth0"],
        ["ip", "link", "set", "eth0", "up"],
        ["ip", "route", "add", "default", "via", "10.0.2.2"],
    ):
        subprocess.run(argv, check=False)
    return True


class Agent:
    """The VM's side of the channel, and the guest daemon it starts."""

    def __init__(self, link: PortLink, network: bool) -> None:
        self.link = link
        self.network = network
        self.mux = Mux(link)
        self.events: list[bytes] = []
        self.daemon: subprocess.Popen | None = None
        self.desktop: dict[str, Any] | None = None
        self._tasks: set[asyncio.Task] = set()

    def _spawn(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def event(self, payload: bytes) -> None:
        self.events.append(payload)
        self.link.write(frame(Kind.EVENT, 0, payload))

    async def on_control(self, kind: Kind, number: int, payload: bytes) -> None:
        if kind is Kind.HELLO:
            await self._hello(json.loads(payload))
        elif kind is Kind.OPEN:
            stream = self.mux.open(number)
            self._spawn(self._connect(stream), f"connect-{number}")
        elif kind is Kind.PING:
            self.link.write(frame(Kind.PONG, 0, payload))

    async def _connect(self, stream) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(DAEMON_SOCKET)
        except OSError:
            self.mux.close(stream.number)
            return
        self.mux.attach(stream, reader, writer)

    async def _hello(self, hello: dict[str, Any]) -> None:
        """A new session: drop the old one's streams, take the new identity, answer."""
        self.mux.reset()
        self.link.discard()
        error = None
        try:
            await asyncio.to_thread(apply_identity, hello["identity"], network=self.network)
            desktop = hello["desktop"]
            if self.desktop is None:
                self.desktop = desktop
                self._start_daemon(desktop)
            elif (desktop["width"], desktop["height"]) != (
                self.desktop["width"],
                self.desktop["height"],
            ):
                error = "this VM's desktop has another screen size than the one asked for"
        except (OSError, KeyError, ValueError) as exc:
            error = f"the VM could not take its identity: {exc}"
        answer = {"session": hello.get("session"), "error": error, "restored": bool(self.events)}
        self.link.write(MAGIC + frame(Kind.HELLO, 0, json.dumps(answer).encode()))
        for event in self.events:
            self.link.write(frame(Kind.EVENT, 0, event))

    def _start_daemon(self, desktop: dict[str, Any]) -> None:
        status_r, status_w = os.pipe()
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": HOME,
            "USER": "user",
            "LANG": "C.UTF-8",
            "XDG_RUNTIME_DIR": f"/run/user/{GUEST_UID}",
            "PYTHONPATH": os.environ.get("PYTHONPATH", "/opt/cubicle"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        Path(DAEMON_SOCKET).parent.mkdir(parents=True, exist_ok=True)
        os.chown(Path(DAEMON_SOCKET).parent, GUEST_UID, GUEST_UID)
        self.daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cubicle.guest",
                f"--listen=unix:{DAEMON_SOCKET}",
                f"--secret-file={SECRET_FILE}",
                f"--width={desktop['width']}",
                f"--height={desktop['height']}",
                f"--home={HOME}",
                f"--status-fd={status_w}",
                f"--max-file-bytes={desktop['max_file_bytes']}",
                "--ready-timeout=300",
            ],
            cwd=HOME,
            env=env,
            user=GUEST_UID,
            group=GUEST_UID,
            extra_groups=[],
            pass_fds=(status_w,),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(status_w)
        self._spawn(self._relay_status(status_r), "relay-status")

    async def _relay_status(self, fd: int) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
        )
        async for line in reader:
            if line.strip():
                self.event(line.strip())

    def daemon_ended(self, status: int) -> None:
        """The daemon is gone: tell the host why, then power off."""
        code = os.waitstatus_to_exitcode(status)
        if self.daemon is not None:
            self.daemon.returncode = code
        reason = f"the guest daemon exited with status {code}"
        self.event(json.dumps({"event": "failed", "reason": reason}).encode())
        print(f"cubicle-vm: {reason}; powering off", file=sys.stderr, flush=True)
        asyncio.get_running_loop().call_later(0.5, power_off)

    async def serve(self) -> None:
        """Serve sessions for as long as the VM runs: after a hang-up (the link's next
        reader) or garbage (the same reader), look for the next session's mark."""
        while True:
            try:
                await find_session(self.link.reader)
                await serve_frames(self.link.reader, self.mux, self.on_control)
            except (asyncio.IncompleteReadError, ChannelBroken) as exc:
                log.info("session ended: %s", exc)
                self.mux.reset()


def power_off() -> None:
    os.sync()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.reboot(_POWER_OFF)


def _reaper(agent: Agent) -> None:
    """As PID 1, collect every exited process; the daemon's end is the VM's end."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if agent.daemon is not None and pid == agent.daemon.pid:
            agent.daemon_ended(status)


async def main() -> None:
    network = await asyncio.to_thread(_bring_up_network)
    link = PortLink(await asyncio.to_thread(_find_port))
    agent = Agent(link, network)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGCHLD, _reaper, agent)
    await agent.serve()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="cubicle-vm %(levelname)s %(message)s")
    try:
        asyncio.run(main())
    finally:
        power_off()
