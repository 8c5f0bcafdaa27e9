"""Where a desktop's start-up time goes: when each stage the guest reports was reached.

Our sandbox is started through the local runtime in-process, exactly as the service starts
it (same spec from the service's default settings), and the guest's progress events are
timed: `sandbox_spawned`, `x_server`, `window_manager`, `shell_mapped`, `desktop_drawn`,
`ready`. No HTTP and no warm pool: the bare boot.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from cubicle.server.runtime.base import SandboxSpec
from cubicle.server.runtime.local import LocalRuntime
from cubicle.server.settings import Settings

_PAUSE_S = 0.5
"""Idle time after each stop, so one start's teardown does not slow the next."""


async def _stages_once(runtime: LocalRuntime, settings: Settings) -> dict[str, float]:
    """Start one sandbox and time each progress event it reports, in seconds from the start."""
    spec = SandboxSpec(
        id=uuid.uuid4().hex[:12],
        width=1280,
        height=800,
        network=False,
        memory_mb=settings.memory_mb,
        max_pids=settings.max_pids,
        cpu_cores=settings.cpu_cores,
        disk_mb=settings.disk_mb,
        max_file_bytes=settings.max_upload_bytes,
    )
    started = time.perf_counter()
    sandbox = await runtime.start(spec)
    stages = {"sandbox_spawned": time.perf_counter() - started}
    try:
        async for event in sandbox.events():
            stages[event.event] = time.perf_counter() - started
            if event.event in ("ready", "failed"):
                break
    finally:
        await sandbox.stop()
    if "ready" not in stages:
        raise RuntimeError(f"sandbox did not get ready: {await sandbox.wait()}")
    await asyncio.sleep(_PAUSE_S)
    return stages


async def _stages(count: int) -> list[dict[str, float]]:
    data_dir = Path(tempfile.mkdtemp(prefix="cubicle-bench-stages-"))
    try:
        runtime = LocalRuntime(data_dir)
        return [await _stages_once(runtime, Settings()) for _ in range(count)]
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def sandbox_stages(count: int) -> list[dict[str, float]]:
    """Stage times of `count` sandbox starts, one after another, in seconds."""
    return asyncio.run(_stages(count)) if count else []


def stage_medians_ms(runs: list[dict[str, float]]) -> dict[str, float]:
    """The median time each stage was reached over `runs`, milliseconds, in stage order."""
    if not runs:
        return {}
    names = sorted({name for run in runs for name in run}, key=lambda n: runs[0].get(n, 0))
    return {
        name: round(statistics.median(run[name] for run in runs if name in run) * 1000, 1)
        for name in names
    }
