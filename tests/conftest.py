"""Fixtures that run the real service: `cubicle serve` in a subprocess, real desktops.

Nothing here is a stand-in: the service runs as users run it, desktops are bubblewrap
sandboxes with Xvfb and XFCE, and tests talk to them over real sockets.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, sync_playwright

from desktop.launcher import ServiceProcess
from tests.agent.fake_model import FakeModelServer
from tests.agent.fake_vendors import FakeVendorServer

Service = ServiceProcess


def start_service(
    data_dir: Path | None = None, token: str | None = None, **env_overrides: str
) -> Service:
    """Start `cubicle serve` on a free port with its own data directory and token (or
    those given, to restart a service on its data)."""
    env = {"CUBICLE_REAP_INTERVAL_S": "0.5", **env_overrides}
    return ServiceProcess.start(data_dir=data_dir, token=token, env=env)


def stop_service(service: Service) -> None:
    service.stop()


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
