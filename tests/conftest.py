"""Fixtures that run the real service: `cubicle serve` in a subprocess, real desktops.

Nothing here is a stand-in: the service runs as users run it, desktops are bubblewrap
sandboxes with Xvfb and XFCE, and tests talk to them over real sockets.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, sync_playwright

from tests.agent.fake_model import FakeModelServer
from tests.agent.fake_vendors import FakeVendorServer


@dataclass
class Service:
    url: str
    token: str
    data_dir: Path
    process: subprocess.Popen

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=120,
            **kwargs,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(
    data_dir: Path | None = None, token: str | None = None, **env_overrides: str
) -> Service:
    """Start `cubicle serve` on a free port with its own data directory and token (or
    those given, to restart a service on its data)."""
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="cubicle-test-"))
    token = token or secrets.token_urlsafe(16)
    port = _free_port()
    env = {
        **os.environ,
        "CUBICLE_DATA_DIR": str(data_dir),
        "CUBICLE_TOKEN": token,
        "CUBICLE_PORT": str(port),
        "CUBICLE_REAP_INTERVAL_S": "0.5",
        **env_overrides,
    }
    log = open(data_dir / "service.log", "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        [sys.executable, "-m", "desktop.cli", "serve"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"service exited: {(data_dir / 'service.log').read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return Service(url, token, data_dir, process)
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("service did not answer within 30 s")


def stop_service(service: Service) -> None:
    service.process.send_signal(signal.SIGTERM)
    try:
        service.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        service.process.kill()
        service.process.wait()


@pytest.fixture(scope="session")
def service() -> Iterator[Service]:
    """One service for the whole run, with a 1 MiB upload limit to test the limit."""
    svc = start_service(CUBICLE_MAX_UPLOAD_MB="1")
    try:
        yield svc
    finally:
        stop_service(svc)


@pytest.fixture(scope="session")
def api(service: Service) -> Iterator[httpx.Client]:
    with service.client() as client:
        yield client


def create_desktop(api: httpx.Client, **body) -> dict:
    response = api.post("/api/desktops", json=body)
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture(scope="module")
def desktop(api: httpx.Client) -> Iterator[dict]:
    """A desktop shared by the tests of one module."""
    info = create_desktop(api)
    try:
        yield info
    finally:
        api.delete(f"/api/desktops/{info['id']}")


def wait_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.05, what: str = ""):
    """Poll `predicate` until it returns something truthy; fail with `what` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what or predicate}")
        time.sleep(interval_s)


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
"""Debian's chromium, headless, as root and offline."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless, for one module's page tests."""
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path="/usr/bin/chromium",
            headless=True,
            args=[*CHROMIUM_ARGS, "--use-fake-ui-for-media-stream"],
        )
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def fake_model_server() -> Iterator[FakeModelServer]:
    """One scripted OpenAI-compatible model server for the whole run; use `fake_model`."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def fake_model(fake_model_server: FakeModelServer) -> FakeModelServer:
    """The shared model server, with no script and no recorded requests."""
    fake_model_server.reset()
    return fake_model_server


@pytest.fixture(scope="session")
def fake_vendor_server() -> Iterator[FakeVendorServer]:
    """One scripted Anthropic Messages + OpenAI Responses server for the run; use `fake_vendor`."""
    with FakeVendorServer() as server:
        yield server


@pytest.fixture
def fake_vendor(fake_vendor_server: FakeVendorServer) -> FakeVendorServer:
    """The shared vendor server, with no script and no recorded requests."""
    fake_vendor_server.reset()
    return fake_vendor_server


@pytest.fixture
def board(api: httpx.Client, fake_model: FakeModelServer) -> Iterator[httpx.Client]:
    """The session service's task board on the fake model, one task at a time, emptied
    after the test."""
    from tests.agent.board_api import empty_board, set_board, use_fake_model

    use_fake_model(api, fake_model)
    set_board(api, concurrency=1, record=True, keep_desktop_s=0)
    yield api
    empty_board(api)
