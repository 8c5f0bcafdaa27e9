"""Run `cubicle serve` in a subprocess with its own data directory and token, as users do.

`running_service()` starts it and, however the benchmark ends, kills every desktop the
service holds, stops the service, and SIGKILLs whatever is left in those desktops' cgroups.
Settings go in as `CUBICLE_*` variables, e.g. `running_service(CUBICLE_WARM_POOL="0")` for
a service that keeps no spare desktop booted (so nothing boots behind a measurement).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench._run import progress
from cubicle.protocol.service import DesktopInfo
from cubicle.server.launcher import ServiceProcess
from cubicle.server.runtime import cgroups


@dataclass
class Service:
    """A running service and a keep-alive client authenticated to it."""

    launched: ServiceProcess
    client: httpx.Client
    desktop_ids: set[str] = field(default_factory=set)
    """Every desktop this benchmark asked for, to be killed at the end."""

    @property
    def url(self) -> str:
        return self.launched.url

    @property
    def token(self) -> str:
        return self.launched.token

    @property
    def data_dir(self) -> Path:
        return self.launched.data_dir

    def create_desktop(self) -> DesktopInfo:
        """POST /api/desktops with the defaults (1280×800); raises unless it answers 201."""
        response = self.client.post("/api/desktops", json={})
        if response.status_code != 201:
            raise RuntimeError(f"create failed: {response.status_code} {response.text}")
        info = DesktopInfo.model_validate_json(response.content)
        self.desktop_ids.add(info.id)
        return info

    def kill_desktop(self, desktop_id: str) -> None:
        response = self.client.delete(f"/api/desktops/{desktop_id}")
        if response.status_code not in (204, 404):
            raise RuntimeError(f"kill failed: {response.status_code} {response.text}")

    def wait_for_warm_desktop(self, timeout_s: float = 180.0) -> None:
        """Block until every spare the warm pool keeps is drawn (`GET /api/pool`), so that
        no boot is under way."""
        deadline = time.monotonic() + timeout_s
        while True:
            pool = self.client.get("/api/pool").json()
            if pool["ready"] >= pool["target"] > 0 and pool["booting"] == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the warm pool was not drawn within {timeout_s:.0f} s: {pool}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 15) -> str:
        return self.launched.log_tail(lines)


def desktop_pids(desktop_id: str) -> list[int]:
    """The processes of a desktop, from its pids cgroup (empty when it has none)."""
    cgroup = cgroups.find(desktop_id)
    try:
        return cgroup.pids() if cgroup else []
    except FileNotFoundError:
        return []


def desktop_cgroup_memory_bytes(desktop_id: str) -> int | None:
    """Memory charged to a desktop's cgroup (page cache included), when it has one."""
    cgroup = cgroups.find(desktop_id)
    try:
        return cgroup.memory_bytes() if cgroup else None
    except FileNotFoundError:
        return None


def _start(env_overrides: dict[str, str]) -> Service:
    data_dir = Path(tempfile.mkdtemp(prefix="cubicle-bench-"))
    process = ServiceProcess.start(data_dir=data_dir, env=env_overrides)
    return Service(process, process.client())


def _kill_listed(service: Service) -> None:
    """DELETE every desktop the service still lists as starting or ready."""
    with contextlib.suppress(httpx.HTTPError):
        for item in service.client.get("/api/desktops", timeout=10).json():
            service.desktop_ids.add(item["id"])
            if item["status"] in ("starting", "ready"):
                service.client.delete(f"/api/desktops/{item['id']}", timeout=30)


def _sweep_cgroups(desktop_ids: set[str]) -> list[int]:
    """SIGKILL anything left in the desktops' cgroups; returns the pids that were left."""
    left: list[int] = []
    for desktop_id in desktop_ids:
        for pid in desktop_pids(desktop_id):
            left.append(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return left


def _stop(service: Service) -> None:
    if service.launched.process.poll() is None:
        _kill_listed(service)
        service.launched.stop()
    service.client.close()
    left = _sweep_cgroups(service.desktop_ids)
    if left:
        progress(f"killed {len(left)} processes the service left in desktop cgroups: {left}")


@contextlib.contextmanager
def started_service(data_dir: Path, token: str, env: dict[str, str]) -> Iterator[Service]:
    """A service started again on another's data directory (which the caller removes)."""
    process = ServiceProcess.start(data_dir=data_dir, token=token, env=env)
    service = Service(process, process.client())
    try:
        yield service
    finally:
        _stop(service)


@contextlib.contextmanager
def running_service(**env_overrides: str) -> Iterator[Service]:
    """A fresh service for one benchmark; everything it started is gone afterwards."""
    service = _start(env_overrides)
    progress(f"service up at {service.url} (data {service.data_dir})")
    failed = False
    try:
        yield service
    except BaseException:
        failed = True
        raise
    finally:
        _stop(service)
        if failed:
            progress(f"service log tail:\n{service.log_tail()}")
        shutil.rmtree(service.data_dir, ignore_errors=True)
