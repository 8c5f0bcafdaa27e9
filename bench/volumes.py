"""`volumes`: write and read throughput of a volume beside the desktop's own disk.

One desktop with a read-write volume at /mnt/v. Inside it, `dd` writes 256 MiB (flushed:
`conv=fsync`) to its home (its own disk) and to the volume, then reads each back after the
host dropped its page cache (as root; otherwise the reads may come from memory, and the
result says so). Interleaved, three rounds; medians in MB/s.
"""

from __future__ import annotations

import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from bench._run import Options, Target, progress
from bench._service import running_service

_MIB = 256
_SPEED = re.compile(r"([\d.,]+) ([kMG]?B)/s")
_UNITS = {"B": 1e-6, "kB": 1e-3, "MB": 1.0, "GB": 1e3}


@dataclass(frozen=True)
class VolumesResult:
    mib: int
    rounds: int
    home_write_mb_s: float
    volume_write_mb_s: float
    home_read_mb_s: float
    volume_read_mb_s: float
    cold_reads: bool
    """Whether the host's page cache was dropped before each read."""
    targets: list[Target]


def _mb_s(dd_stderr: str) -> float:
    found = _SPEED.findall(dd_stderr)
    if not found:
        raise RuntimeError(f"dd said no speed: {dd_stderr[-300:]}")
    number, unit = found[-1]
    return float(number.replace(",", ".")) * _UNITS[unit]


def _drop_caches() -> bool:
    if os.geteuid() != 0:
        return False
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    return True


def run(options: Options) -> VolumesResult:
    rounds = 1 if options.quick else 3
    mib = 64 if options.quick else _MIB
    with running_service(CUBICLE_WARM_POOL="0") as service:
        client = service.client
        name = "bench-volume"
        made = client.post("/api/volumes", json={"name": name, "size_mb": mib * 2 + 64})
        made.raise_for_status()
        response = client.post("/api/desktops", json={"volumes": {"/mnt/v": name}})
        response.raise_for_status()
        desktop_id = response.json()["id"]
        service.desktop_ids.add(desktop_id)

        def run_inside(command: str) -> str:
            answer = client.post(
                f"/api/desktops/{desktop_id}/exec", json={"command": command, "timeout_s": 300}
            )
            answer.raise_for_status()
            result = answer.json()
            if result["exit_code"] != 0:
                raise RuntimeError(f"{command}: {result['stderr'][-300:]}")
            return result["stderr"]  # where dd says how fast it went

        samples: dict[str, list[float]] = {k: [] for k in ("hw", "vw", "hr", "vr")}
        cold = True
        for index in range(rounds):
            progress(f"volumes: round {index + 1}/{rounds}")
            for key, path in (("h", "/home/user/bench.bin"), ("v", "/mnt/v/bench.bin")):
                write = f"dd if=/dev/zero of={path} bs=1M count={mib} conv=fsync"
                samples[f"{key}w"].append(_mb_s(run_inside(write)))
                cold = _drop_caches() and cold
                samples[f"{key}r"].append(_mb_s(run_inside(f"dd if={path} of=/dev/null bs=1M")))
                run_inside(f"rm -f {path}")
        client.delete(f"/api/desktops/{desktop_id}")
        client.delete(f"/api/volumes/{name}")
    median = {key: round(statistics.median(values), 1) for key, values in samples.items()}
    return VolumesResult(
        mib=mib,
        rounds=rounds,
        home_write_mb_s=median["hw"],
        volume_write_mb_s=median["vw"],
        home_read_mb_s=median["hr"],
        volume_read_mb_s=median["vr"],
        cold_reads=cold,
        targets=[
            Target(
                "a volume writes at >= 80 % of the desktop's own disk",
                median["vw"] >= 0.8 * median["hw"],
            )
        ],
    )
