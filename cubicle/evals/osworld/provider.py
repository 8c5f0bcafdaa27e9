"""A provider for OSWorld's `DesktopEnv`: each environment is a fresh Cubicle desktop whose
OSWorld surface is open, so `reset`, `step` and `evaluate` work unchanged.

    from cubicle.evals.osworld.provider import cubicle_desktop_env
    env = cubicle_desktop_env(action_space="pyautogui", screen_size=(1280, 800))
    obs = env.reset(task_config=task)
    obs, reward, done, info = env.step("pyautogui.click(640, 400)")
    score = env.evaluate()
    env.close()

`DesktopEnv` knows its providers by name; Cubicle's stands in under the name `docker`, the
provider whose contract it shares (a machine that starts clean, reached at
`host:server:chromium:vnc:vlc` ports). Reverting to a snapshot is a fresh desktop.
Chromium's DevTools stay inside the desktop: OSWorld's getters and setup steps that drive
Chrome over CDP from the harness (`chrome_open_tabs`, `active_tab_info`…) do not reach it;
Cubicle's own runner (`cubicle eval`) has them.

Importing this module imports `desktop_env` (install `.[osworld]` and desktop-env; see
docs/evals.md). `DesktopEnv` itself needs OSWorld's whole evaluator stack, torch included;
`load_metric` loads one metric function without the rest.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from desktop_env.providers.base import Provider, VMManager
from pydantic import JsonValue

from cubicle import DesktopNotFound, ServiceClient
from cubicle.protocol.evals import SurfaceInfo
from cubicle.protocol.service import DesktopInfo

VM_PATH = "cubicle"
"""What `DesktopEnv` calls the machine: Cubicle has no image files."""


class CubicleVMManager(VMManager):
    """Nothing to register: every machine is a fresh desktop."""

    def initialize_registry(self, **kwargs: Any) -> None:
        pass

    def add_vm(self, vm_path: str, **kwargs: Any) -> None:
        pass

    def delete_vm(self, vm_path: str, **kwargs: Any) -> None:
        pass

    def occupy_vm(self, vm_path: str, pid: int, **kwargs: Any) -> None:
        pass

    def list_free_vms(self, **kwargs: Any) -> list[str]:
        return [VM_PATH]

    def check_and_clean(self, **kwargs: Any) -> None:
        pass

    def get_vm_path(self, **kwargs: Any) -> str:
        return VM_PATH


class CubicleProvider(Provider):
    """Desktops of a Cubicle service as OSWorld machines (blocking, as OSWorld calls them)."""

    def __init__(
        self,
        region: str | None = None,
        *,
        base_url: str | None = None,
        token: str | None = None,
        resolution: tuple[int, int] = (1920, 1080),
        network: bool = False,
    ) -> None:
        super().__init__(region)
        self._service = ServiceClient(base_url=base_url, token=token)
        self.resolution = resolution
        self.network = network
        self.desktop_id: str | None = None
        self.port: int | None = None

    def start_emulator(self, path_to_vm: str, headless: bool, os_type: str = "Ubuntu") -> None:
        """A fresh desktop with its OSWorld surface open (nothing when one runs)."""
        if self.desktop_id is not None:
            return
        body: dict[str, JsonValue] = {
            "resolution": list(self.resolution),
            "network": self.network,
            "timeout_s": 3600,
        }
        info = self._service.request("POST", "/api/desktops", json=body, model=DesktopInfo)
        self.desktop_id = info.id
        path = f"/api/desktops/{self.desktop_id}/osworld"
        self.port = self._service.request("POST", path, model=SurfaceInfo).port

    def get_ip_address(self, path_to_vm: str) -> str:
        """`127.0.0.1:<surface>:<chromium>:<vnc>:<vlc>`; only the surface is served."""
        if self.port is None:
            raise RuntimeError("start_emulator() first")
        return f"127.0.0.1:{self.port}:9222:8006:8080"

    def save_state(self, path_to_vm: str, snapshot_name: str) -> None:
        raise NotImplementedError("Cubicle's local runtime keeps no snapshots")

    def revert_to_snapshot(self, path_to_vm: str, snapshot_name: str) -> str:
        """Drop the desktop: the next `start_emulator` makes a fresh one."""
        self.stop_emulator(path_to_vm)
        return path_to_vm

    def stop_emulator(self, path_to_vm: str, *args: Any, **kwargs: Any) -> None:
        if self.desktop_id is None:
            return
        desktop_id, self.desktop_id, self.port = self.desktop_id, None, None
        with contextlib.suppress(DesktopNotFound):  # ended already (its idle timeout)
            self._service.request("DELETE", f"/api/desktops/{desktop_id}")


@contextmanager
def _as_docker(provider: CubicleProvider) -> Iterator[None]:
    module: Any = importlib.import_module("desktop_env.desktop_env")  # untyped; patched
    original = module.create_vm_manager_and_provider

    def create(name: str, region: str, use_proxy: bool = False) -> Any:
        if name == "docker":
            return CubicleVMManager(), provider
        return original(name, region, use_proxy=use_proxy)

    module.create_vm_manager_and_provider = create
    try:
        yield
    finally:
        module.create_vm_manager_and_provider = original


def cubicle_desktop_env(
    *, base_url: str | None = None, token: str | None = None, **kwargs: Any
) -> Any:
    """OSWorld's `DesktopEnv` on a Cubicle desktop; `kwargs` go to `DesktopEnv`."""
    from desktop_env.desktop_env import DesktopEnv

    screen = tuple(kwargs.get("screen_size", (1920, 1080)))
    provider = CubicleProvider(base_url=base_url, token=token, resolution=screen)  # type: ignore[arg-type]
    with _as_docker(provider):
        return DesktopEnv(provider_name="docker", path_to_vm=VM_PATH, **kwargs)


_METRICS = "desktop_env.evaluators.metrics"


def _metrics_one_by_one() -> None:
    """Let `desktop_env.evaluators.metrics.<module>` import alone: its package's `__init__`
    imports every metric module, easyocr and so torch among them. Nothing happens once the
    real package is imported."""
    if _METRICS not in sys.modules:
        evaluators = importlib.import_module("desktop_env.evaluators")
        assert evaluators.__file__ is not None  # a regular package, not a namespace one
        shell = types.ModuleType(_METRICS)
        shell.__path__ = [str(Path(evaluators.__file__).parent / "metrics")]
        sys.modules[_METRICS] = shell


def load_metric(name: str, module: str = "general") -> Callable[..., float]:
    """One of OSWorld's metric functions, from `desktop_env.evaluators.metrics.<module>`."""
    _metrics_one_by_one()
    return getattr(importlib.import_module(f"{_METRICS}.{module}"), name)


def setup_controller() -> type:
    """OSWorld's `SetupController` class (its module imports `metrics.utils`)."""
    _metrics_one_by_one()
    return importlib.import_module("desktop_env.controllers.setup").SetupController
