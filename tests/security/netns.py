"""Network namespaces the egress tests build, so that nothing leaves this machine.

    service netns "T"                          netns "W": the rest of the world
    ┌────────────────────────────┐  veth   ┌────────────────────────────────────────┐
    │ cubicle serve, slirp4netns │─────────│ 203.0.113.10-11  "the internet"          │
    │ 192.168.77.1 (this host)   │         │ 10.77.0.10 172.16.0.10 (RFC 1918)       │
    │ a listener on 0.0.0.0      │         │ 100.64.0.10 (CGNAT) 169.254.169.254     │
    └────────────────────────────┘         │ 192.168.77.2; a listener on every one   │
                                           └────────────────────────────────────────┘

The test's own calls to the service run on a thread that entered T (`NetnsThread`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx

from cubicle.server.launcher import ServiceProcess, free_port

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
LISTENER = Path(__file__).with_name("listener.py")

WORLD_ADDRESSES = {
    "internet": "203.0.113.10",
    "denied_by_operator": "203.0.113.11",
    "allowed_by_operator": "10.77.0.10",
    "rfc1918": "172.16.0.10",
    "cgnat": "100.64.0.10",
    "metadata": "169.254.169.254",
    "neighbour": "192.168.77.2",
}
HOST_ADDRESS = "192.168.77.1"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Namespaces:
    """T and W, made and removed by the test."""

    def __init__(self, tag: str) -> None:
        self.t, self.w = f"cubsec-t-{tag}", f"cubsec-w-{tag}"

    def __enter__(self) -> Namespaces:
        ip("netns", "add", self.t)
        ip("netns", "add", self.w)
        try:
            ip(
                "-n",
                self.t,
                "link",
                "add",
                "vt",
                "type",
                "veth",
                "peer",
                "name",
                "vw",
                "netns",
                self.w,
            )
            for ns, dev, address in ((self.t, "vt", HOST_ADDRESS), (self.w, "vw", "192.168.77.2")):
                ip("-n", ns, "link", "set", "lo", "up")
                ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
                ip("-n", ns, "link", "set", dev, "up")
            ip("-n", self.t, "route", "add", "default", "via", "192.168.77.2")
            for address in WORLD_ADDRESSES.values():
                if address != "192.168.77.2":
                    ip("-n", self.w, "addr", "add", f"{address}/32", "dev", "lo")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_) -> None:
        for name in (self.t, self.w):
            with contextlib.suppress(subprocess.CalledProcessError):
                ip("netns", "delete", name)

    def listener(self, ns: str, port: int, log: Path) -> subprocess.Popen:
        """Accept TCP and UDP on every address of `ns` on `port`; one line per arrival."""
        out = open(log, "w")  # noqa: SIM115 - the listener writes to it until killed
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, str(LISTENER), str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def run_in(self, ns: str, args: list[str]) -> subprocess.Popen:
        """Run a Python script with `args` in namespace `ns`."""
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


class NetnsThread:
    """Runs calls on one thread that lives in a network namespace."""

    def __init__(self, name: str) -> None:
        def enter() -> None:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)

        self._pool = ThreadPoolExecutor(1, initializer=enter, thread_name_prefix=name)

    def call(self, fn: Callable[[], T]) -> T:
        return self._pool.submit(fn).result(timeout=180)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _nsenter(namespace: str) -> list[str]:
    return ["nsenter", f"--net=/run/netns/{namespace}", "--"]


@contextlib.contextmanager
def service_inside(
    namespace: str, thread: NetnsThread, env: dict[str, str]
) -> Iterator[tuple[ServiceProcess, httpx.Client]]:
    """A service of its own inside `namespace`, with `env` on top of a test's defaults;
    its client makes its calls on `thread` (which entered the namespace)."""
    data_dir = Path(tempfile.mkdtemp(prefix="cubicle-netns-"))  # traversable, as /tmp is
    token, port = secrets.token_urlsafe(16), free_port()
    full_env = {
        **os.environ,
        "CUBICLE_DATA_DIR": str(data_dir),
        "CUBICLE_TOKEN": token,
        "CUBICLE_PORT": str(port),
        "CUBICLE_WARM_POOL": "0",
        **env,
    }
    with open(data_dir / "service.log", "ab") as log:
        process = subprocess.Popen(
            [*_nsenter(namespace), sys.executable, "-m", "cubicle.cli", "serve"],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    service = ServiceProcess(f"http://127.0.0.1:{port}", token, data_dir, process)
    client = thread.call(lambda: service.client())

    def healthy() -> bool:
        try:
            return client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    deadline = time.monotonic() + 30
    while not thread.call(healthy):
        assert process.poll() is None and time.monotonic() < deadline, service.log_tail()
        time.sleep(0.2)
    try:
        yield service, client
    finally:
        thread.call(client.close)
        service.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


class Via:
    """An httpx-like client whose calls run on the thread inside a namespace."""

    def __init__(self, thread: NetnsThread, client: httpx.Client) -> None:
        self._thread, self._client = thread, client

    def __getattr__(self, name: str):
        method = getattr(self._client, name)
        return lambda *a, **k: self._thread.call(lambda: method(*a, **k))
