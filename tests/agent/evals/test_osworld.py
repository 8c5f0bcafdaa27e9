"""OSWorld's own harness on a Cubicle desktop: the real `desktop-env` package from PyPI (its
`PythonController` and `SetupController`, not copies) drives a desktop through the OSWorld
surface, and one of its metric functions scores what it left behind. Then the provider
`DesktopEnv` uses: a fresh desktop per machine, a fresh one again on revert."""

from __future__ import annotations

import io
import time
from pathlib import Path

import httpx
import pytest
from desktop_env.controllers.python import PythonController
from PIL import Image

from cubicle.evals.osworld.provider import CubicleProvider, load_metric, setup_controller
from tests.conftest import Service, create_desktop, wait_until

NOTE = "hello from osworld"


def _until(read, timeout_s: float = 20.0):
    """The first truthy `read()`, polled; None after the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := read():
            return value
        time.sleep(0.2)
    return None


@pytest.fixture
def surface(api: httpx.Client):
    desktop = create_desktop(api)
    opened = api.post(f"/api/desktops/{desktop['id']}/osworld")
    assert opened.status_code == 200, opened.text
    yield desktop, opened.json()
    api.delete(f"/api/desktops/{desktop['id']}")


def test_osworld_controllers_and_a_metric_work_on_a_cubicle_desktop(
    api: httpx.Client, surface, tmp_path: Path
):
    desktop, info = surface
    assert info["url"] == f"http://127.0.0.1:{info['port']}"
    again = api.post(f"/api/desktops/{desktop['id']}/osworld").json()
    assert again == info  # opening twice is the same surface
    controller = PythonController("127.0.0.1", info["port"])
    setup = setup_controller()(
        "127.0.0.1", info["port"], cache_dir=str(tmp_path), screen_width=1280, screen_height=800
    )

    shot = controller.get_screenshot()
    assert Image.open(io.BytesIO(shot)).size == (1280, 800)
    assert controller.get_vm_screen_size() == {"width": 1280, "height": 800}

    assert setup.setup([
        {"type": "execute", "parameters": {
            "command": ["python", "-c", "open('/home/user/osworld.txt', 'w').write('')"]}},
        {"type": "launch", "parameters": {"command": ["mousepad", "/home/user/osworld.txt"]}},
    ])  # fmt: skip
    tree = _until(
        lambda: (at := controller.get_accessibility_tree()) and "osworld.txt" in at and at
    )
    assert tree, "mousepad's window never showed in the accessibility tree"
    assert setup.setup([{"type": "activate_window", "parameters": {"window_name": "osworld.txt"}}])

    ran = controller.execute_python_command(
        f"pyautogui.typewrite({NOTE!r}); pyautogui.hotkey('ctrl', 's')"
    )
    assert ran is not None and ran["returncode"] == 0, ran
    saved = _until(lambda: controller.get_file("/home/user/osworld.txt") == NOTE.encode())
    assert saved, controller.get_file("/home/user/osworld.txt")

    check_include_exclude = load_metric("check_include_exclude")
    text = controller.get_file("/home/user/osworld.txt").decode()
    assert check_include_exclude(text, {"include": [NOTE]}) == 1.0
    assert check_include_exclude(text, {"include": ["something else"]}) == 0.0
    check_tree = load_metric("check_accessibility_tree")
    tree = controller.get_accessibility_tree()
    window = "//frame[contains(@name, 'osworld.txt')]"
    assert check_tree(tree, [{"xpath": window}]) == 1.0
    assert check_tree(tree, [{"xpath": "//frame[contains(@name, 'no-such')]"}]) == 0.0


def test_the_surface_records_and_runs_scripts(api: httpx.Client, surface, tmp_path: Path):
    _, info = surface
    base = info["url"]
    assert httpx.post(f"{base}/start_recording").status_code == 200
    bash = httpx.post(f"{base}/run_bash_script", json={"script": "echo $((6 * 7))"}).json()
    assert bash["returncode"] == 0 and bash["output"].strip() == "42"
    code = "import pyautogui; print(pyautogui.size())"
    python = httpx.post(f"{base}/run_python", json={"code": code}).json()
    assert python["status"] == "success" and "1280" in python["output"]
    time.sleep(1)
    video = httpx.post(f"{base}/end_recording", timeout=60)
    assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
    assert video.content[4:8] == b"ftyp"
    missing = httpx.post(f"{base}/file", data={"file_path": "/home/user/nothing-here"})
    assert missing.status_code == 404
    outside = httpx.post(f"{base}/file", data={"file_path": "/etc/shadow"})
    assert outside.status_code == 404  # only home and /tmp are served


def test_a_surface_is_opt_in_behind_the_token_and_closes_with_its_desktop(
    api: httpx.Client, service: Service
):
    assert httpx.post(f"{service.url}/api/desktops/x/osworld").status_code == 401
    assert api.post("/api/desktops/no-such-desktop/osworld").status_code == 404
    odd = api.post("/api/desktops/%3E%C3%9C%1E/osworld")  # found by Schemathesis: was a 500
    assert odd.status_code == 404 and odd.json()["error"] == "desktop_not_found", odd.text
    desktop = create_desktop(api)
    assert all(s["desktop_id"] != desktop["id"] for s in api.get("/api/osworld").json())
    port = api.post(f"/api/desktops/{desktop['id']}/osworld").json()["port"]
    assert httpx.get(f"http://127.0.0.1:{port}/platform").text == "Linux"
    api.delete(f"/api/desktops/{desktop['id']}")

    def closed() -> bool:
        try:
            httpx.get(f"http://127.0.0.1:{port}/platform", timeout=1)
        except httpx.TransportError:
            return True
        return False

    wait_until(closed, 20, 0.5, "the surface to close with its desktop")
    assert all(s["desktop_id"] != desktop["id"] for s in api.get("/api/osworld").json())
    assert api.get("/healthz").status_code == 200


def test_the_provider_gives_desktop_env_a_fresh_desktop_per_machine(
    api: httpx.Client, service: Service
):
    provider = CubicleProvider(base_url=service.url, token=service.token, resolution=(1280, 800))
    provider.start_emulator("cubicle", headless=True)
    first = provider.desktop_id
    try:
        host, port, *_ = provider.get_ip_address("cubicle").split(":")
        controller = PythonController(host, int(port))
        assert Image.open(io.BytesIO(controller.get_screenshot())).size == (1280, 800)
        assert provider.revert_to_snapshot("cubicle", "init_state") == "cubicle"
        assert api.get(f"/api/desktops/{first}").status_code == 404
        provider.start_emulator("cubicle", headless=True)
        assert provider.desktop_id not in (None, first)
        host, port, *_ = provider.get_ip_address("cubicle").split(":")
        assert PythonController(host, int(port)).get_vm_screen_size()["width"] == 1280
    finally:
        second = provider.desktop_id
        provider.stop_emulator("cubicle")
    assert api.get(f"/api/desktops/{second}").status_code == 404
