"""Fixtures that run the real service: `cubicle serve` in a subprocess, real desktops.

Nothing here is a stand-in: the service runs as users run it, desktops are bubblewrap
sandboxes with Xvfb and XFCE, and tests talk to them over real sockets.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, sync_playwright

from cubicle.server.launcher import ServiceProcess
from tests.agent.fake_model import FakeModelServer
from tests.agent.fake_vendors import FakeVendorServer

Service = ServiceProcess

RUNTIMES = ("local", "microvm")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """In a module that sets `BOTH_RUNTIMES = True`, every test that uses a desktop (the
    `runtime` fixture, through `desktop` or directly) runs once per runtime; other modules
    use the service's default, `local`."""
    if "runtime" in metafunc.fixturenames and getattr(metafunc.module, "BOTH_RUNTIMES", False):
        local_only = metafunc.definition.get_closest_marker("local_only") is not None
        runtimes = ("local",) if local_only else RUNTIMES
        metafunc.parametrize("runtime", runtimes, indirect=True, scope="module")


MICROVM_CREATE_TIMEOUT_S = 900
"""The first microVM desktop of a shape waits for its template: a cold boot under TCG."""


MICROVM_TEST_TIMEOUT_S = 1500
"""pytest-timeout for a microVM test: the first desktop of a shape cold-boots its template
(minutes under TCG on a busy 2-core host), inside the setup of the test that asks first."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_microvm = callspec is not None and callspec.params.get("runtime") == "microvm"
        if on_microvm or item.nodeid.startswith("tests/desktop/test_microvm.py"):
            item.add_marker(pytest.mark.timeout(MICROVM_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def images_dir() -> Iterator[Path]:
    """Where this run keeps microVM images and templates: CUBICLE_TEST_IMAGES_DIR (to reuse
    them between runs), else a directory of its own, removed after the run, so that a run
    builds the image it tests."""
    if given := os.environ.get("CUBICLE_TEST_IMAGES_DIR"):
        yield Path(given)
        return
    path = Path(tempfile.mkdtemp(prefix="cubicle-images-", dir="/var/tmp"))
    try:
        yield path
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def microvm_image(images_dir: Path) -> Path:
    """The microVM image, built once for the run the way a user's first microVM desktop
    builds it: asked of a running `cubicle serve`, whose event loop is uvloop (a build step
    that loop refused once answered 500 on every fresh machine while the CLI's build passed)."""
    assert importlib.util.find_spec("uvloop"), "cubicle serve runs on uvloop: install it"
    svc = start_service(CUBICLE_IMAGES_DIR=str(images_dir))
    try:
        with svc.client() as client:
            answer = client.post("/api/desktops", json={"runtime": "microvm"}, timeout=1500)
            assert answer.status_code == 201, answer.text
            client.delete(f"/api/desktops/{answer.json()['id']}").raise_for_status()
    finally:
        stop_service(svc)
    return images_dir


@pytest.fixture(scope="module")
def runtime(request: pytest.FixtureRequest) -> str:
    """The runtime of this module's desktops (see `both_runtimes`)."""
    name = getattr(request, "param", "local")
    if name == "microvm":
        request.getfixturevalue("microvm_image")
    return name


_DATA_DIRS: list[Path] = []
"""Data directories `start_service` made, removed when the run ends."""


@pytest.fixture(scope="session", autouse=True)
def _remove_services_data() -> Iterator[None]:
    """Remove the services' data directories once the run ends (set up first, so torn down
    after every fixture that stops a service). A microVM service's holds its snapshots, GBs:
    left behind, a few runs filled the host's disk."""
    yield
    from cubicle.server.runtime import disk

    for data_dir in _DATA_DIRS:
        disk.sweep(data_dir / "desktops")
        shutil.rmtree(data_dir, ignore_errors=True)


def start_service(
    data_dir: Path | None = None, token: str | None = None, **env_overrides: str
) -> Service:
    """Start `cubicle serve` on a free port with its own data directory and token (or
    those given, to restart a service on its data)."""
    if data_dir is None:
        data_dir = Path(tempfile.mkdtemp(prefix="cubicle-test-"))
        _DATA_DIRS.append(data_dir)
    env = {"CUBICLE_REAP_INTERVAL_S": "0.5", **env_overrides}
    return ServiceProcess.start(data_dir=data_dir, token=token, env=env)


def stop_service(service: Service) -> None:
    service.stop()


@pytest.fixture(scope="session")
def service(images_dir: Path) -> Iterator[Service]:
    """One service for the whole run, with a 1 MiB upload limit to test the limit."""
    svc = start_service(CUBICLE_MAX_UPLOAD_MB="1", CUBICLE_IMAGES_DIR=str(images_dir))
    try:
        yield svc
    finally:
        stop_service(svc)


@pytest.fixture(scope="session")
def api(service: Service) -> Iterator[httpx.Client]:
    with service.client() as client:
        yield client


@pytest.fixture(scope="module")
def e2b_env(service: Service) -> Iterator[None]:
    """E2B's SDKs pointed at the session's service, as `cubicle e2b env` points them."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("E2B_API_URL", service.url)
        patch.setenv("E2B_SANDBOX_URL", service.url)
        patch.setenv("E2B_API_KEY", service.token)
        patch.delenv("E2B_DOMAIN", raising=False)
        patch.delenv("E2B_DEBUG", raising=False)
        yield


def create_desktop(api: httpx.Client, **body) -> dict:
    timeout = MICROVM_CREATE_TIMEOUT_S if body.get("runtime") == "microvm" else None
    response = api.post("/api/desktops", json=body, **({"timeout": timeout} if timeout else {}))
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture(scope="module")
def desktop(api: httpx.Client, runtime: str) -> Iterator[dict]:
    """A desktop shared by the tests of one module, in the module's runtime."""
    info = create_desktop(api, runtime=runtime)
    try:
        yield info
    finally:
        api.delete(f"/api/desktops/{info['id']}")


def patience(desktop: dict, seconds: float) -> float:
    """How long to wait for a program to start or draw on this desktop: a microVM here
    emulates its CPU (TCG, no usable KVM), so programs start several times slower in it."""
    return seconds * (8 if desktop.get("runtime") == "microvm" else 1)


TICKER = (
    "import os, time\n"
    "n = 0\n"
    "while True:\n"
    "    n += 1\n"
    "    open('/tmp/tick.new', 'w').write(f'{os.getpid()} {n}')\n"
    "    os.replace('/tmp/tick.new', '/tmp/tick')\n"
    "    time.sleep(0.2)\n"
)
"""A program that holds a number in memory only and writes it to /tmp/tick (`pid count`) five
times a second: the count going on from where it was, not from 1, shows the same process,
memory and all (pause, park and restore tests)."""


def editable_text(api: httpx.Client, desktop_id: str, app: str = "mousepad") -> str | None:
    """The text of the app's first editable field, as its accessibility tree reads it (no
    focus, no keys: what a screen reader would say)."""
    tree = api.get(f"/api/desktops/{desktop_id}/a11y", params={"app": app}).json()
    stack = list(tree["nodes"])
    while stack:
        node = stack.pop()
        if node.get("text") is not None and "editable" in node["states"]:
            return node["text"]
        stack.extend(node["children"])
    return None


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
