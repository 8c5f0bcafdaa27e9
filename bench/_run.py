"""What every benchmark shares: its options, progress lines, targets, the machine's description."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Options:
    quick: bool
    """A smoke run: fewer samples, shorter settling."""
    max_desktops: int
    """Most desktops the density benchmark starts."""
    soak_seconds: float | None = None
    """How long the soak runs; None: 10 minutes (60 s with `quick`)."""


@dataclass(frozen=True)
class Target:
    """One target from the issue and whether this run met it."""

    description: str
    met: bool


@dataclass(frozen=True)
class Machine:
    """The host the figures were measured on."""

    nproc: int
    cpu_model: str
    mem_total_mb: int
    mem_available_mb: int
    """At the start of the run."""
    load_avg_1m: float
    """At the start of the run: more than ~0.5 means something else was busy."""
    kernel: str
    python: str
    commit: str | None
    """The checked-out commit of the code measured (uncommitted changes not included)."""


def progress(message: str) -> None:
    """A progress line on stderr; stdout is kept for the JSON document."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def meminfo_bytes(field: str) -> int:
    """One field of /proc/meminfo (e.g. `MemAvailable`), in bytes."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            name, _, rest = line.partition(":")
            if name == field:
                return int(rest.split()[0]) * 1024
    raise KeyError(f"/proc/meminfo has no {field}")


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor()


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
        )
    except FileNotFoundError:
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def machine() -> Machine:
    return Machine(
        nproc=os.cpu_count() or 1,
        cpu_model=_cpu_model(),
        mem_total_mb=meminfo_bytes("MemTotal") // 2**20,
        mem_available_mb=meminfo_bytes("MemAvailable") // 2**20,
        load_avg_1m=os.getloadavg()[0],
        kernel=platform.release(),
        python=platform.python_version(),
        commit=_commit(),
    )
