"""Per-sandbox limits on memory, processes and CPU with cgroup v1 controllers.

Used where the host lets us write `/sys/fs/cgroup/{memory,pids,cpu}` (as root on a host
with cgroup v1). Elsewhere the local runtime falls back to rlimits and says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
PARENT = "cubicle"


def available() -> bool:
    """True when every controller is mounted (v1) and writable by this process."""
    return all(
        (ROOT / name / "cgroup.procs").is_file() and os.access(ROOT / name, os.W_OK)
        for name in CONTROLLERS
    )


@dataclass(frozen=True)
class Cgroup:
    """The cgroups of one sandbox, one directory per controller."""

    paths: tuple[Path, ...]

    @classmethod
    def create(cls, name: str, *, memory_mb: int, max_pids: int, cpu_cores: float | None) -> Cgroup:
        """Make the sandbox's cgroups; it joins the cpu controller only to get a CPU cap.

        Outside a cpu cgroup a sandbox's processes compete one by one with the host's, as
        any program does; inside one, every desktop together would weigh as one process.
        """
        controllers = CONTROLLERS if cpu_cores is not None else CONTROLLERS[:2]
        paths = tuple(ROOT / controller / PARENT / name for controller in controllers)
        for path in paths:
            path.mkdir(parents=True, exist_ok=True)
        memory, pids = paths[:2]
        (memory / "memory.limit_in_bytes").write_text(str(memory_mb * 1024 * 1024))
        with contextlib.suppress(OSError):  # absent without swap accounting
            (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_mb * 1024 * 1024))
        (pids / "pids.max").write_text(str(max_pids))
        if cpu_cores is not None:
            cpu = paths[2]
            (cpu / "cpu.cfs_period_us").write_text("100000")
            (cpu / "cpu.cfs_quota_us").write_text(str(int(cpu_cores * 100_000)))
        return cls(paths)

    @property
    def procs_files(self) -> list[str]:
        """The files a process writes its pid into to join every controller."""
        return [str(path / "cgroup.procs") for path in self.paths]

    def pids(self) -> list[int]:
        """Every process in the sandbox's cgroup."""
        text = (self.paths[1] / "cgroup.procs").read_text()
        return [int(line) for line in text.split()]

    def memory_bytes(self) -> int:
        """Memory charged to the sandbox now, in bytes (page cache included)."""
        return int((self.paths[0] / "memory.usage_in_bytes").read_text())

    def kill_all(self, timeout_s: float = 3.0) -> None:
        """SIGKILL everything in the cgroup until it is empty, then remove it."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pids = self.pids()
            except FileNotFoundError:
                return
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError, OSError):
                path.rmdir()
