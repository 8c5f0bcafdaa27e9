"""`ServiceProcess`: `cubicle serve` in a subprocess, as users run it, for tests and benchmarks.

Each gets a free port, its own data directory and token (or those given, to restart a
service on its data) and answers `/healthz` before `start` returns. Settings go in as
`CUBICLE_*` variables, e.g. `ServiceProcess.start(env={"CUBICLE_WARM_POOL": "0"})`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ServiceProcess:
    """A running `cubicle serve`."""

    url: str
    token: str
    data_dir: Path
    process: subprocess.Popen[bytes]

    @classmethod
    def start(
        cls,
        *,
        data_dir: Path | None = None,
        token: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        prefix: Sequence[str] = (),
    ) -> ServiceProcess:
        """Start the service and return once it answers; its log is `data_dir/service.log`.

        `prefix` runs it through another command, e.g. `setpriv --reuid=…` for a service
        of another user."""
        data_dir = data_dir or Path(tempfile.mkdtemp(prefix="cubicle-"))
        token = token or secrets.token_urlsafe(16)
        port = free_port()
        environment = {
            **os.environ,
            "CUBICLE_DATA_DIR": str(data_dir),
            "CUBICLE_TOKEN": token,
            "CUBICLE_PORT": str(port),
            **(env or {}),
        }
        with open(data_dir / "service.log", "ab") as log:
            process = subprocess.Popen(
                [*prefix, sys.executable, "-m", "cubicle.cli", "serve"],
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        service = cls(f"http://127.0.0.1:{port}", token, data_dir, process)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the service exited:\n{service.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{service.url}/healthz", timeout=1).status_code == 200:
                    return service
            time.sleep(0.1)
        service.stop()
        raise RuntimeError(f"the service did not answer within {timeout_s:.0f} s")

    def client(self, **kwargs) -> httpx.Client:
        """A keep-alive client carrying the service's token."""
        kwargs.setdefault("timeout", 120)
        headers = {"Authorization": f"Bearer {self.token}"}
        return httpx.Client(base_url=self.url, headers=headers, **kwargs)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (the service stops its desktops), then SIGKILL after `timeout_s`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = (self.data_dir / "service.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
