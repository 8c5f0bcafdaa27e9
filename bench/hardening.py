"""`hardening`: what the sandbox's hardening costs, and how fast it contains a bomb.

1. Create time and idle memory with the hardening on (the default: seccomp filter, a
   cgroup per desktop below the service's own, a capped ext4 disk, the host-made guest
   socket) against the same service with it off (`CUBICLE_UNSAFE_NO_HARDENING=1`: plain
   directories, no filter, rlimits only). Two services side by side, warm pools off, the
   order rotated each round; one warm-up of each dropped. Idle memory is the PSS of the
   desktop's processes a few seconds after it is drawn (the same measure for both), and,
   with the hardening on, what its cgroup is charged (page cache included).
2. Three bombs in one desktop (fork, memory, disk), one after the other, each in a fresh
   desktop, while a second desktop takes clicks through the API: how long from the bomb's
   start until the kernel first refuses it (a fork refused at `pids.max`, an OOM kill at
   `memory.max`, the disk full), and the second desktop's click p95 from the bomb's start
   until 3 s after it was contained, against its p95 in the seconds just before (the host
   may be busy with other work: both are measured under the same conditions).

Targets (issue 11): create p50 with the hardening at most 5 % over without; each bomb
contained while the neighbour's click p95 stays within 2x its quiet value.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench._run import Options, Target, progress
from bench._service import Service, desktop_cgroup_memory_bytes, running_service
from bench._stats import Summary, summarize
from cubicle.server.runtime import cgroups

MB = 1024 * 1024
CREATE_TARGET = 1.05
QUIET_S = 4.0
"""Seconds of clicks on the neighbour just before each bomb: its quiet p95."""
AFTER_S = 3.0
"""Clicks go on this long after the bomb was contained."""
CLICK_TARGET = 2.0
BOMB_VICTIM = {"memory_mb": 512, "max_pids": 256, "disk_mb": 512}
BOMBS: dict[str, str] = {
    "fork": "bomb() { bomb | bomb & }; bomb",
    "memory": 'python3 -c "x = []\nwhile True: x.append(bytearray(32 << 20))"',
    "disk": "dd if=/dev/zero of=$HOME/fill bs=1M",
}
"""Each started in the background (`setsid`), as code an agent found might be."""


@dataclass(frozen=True)
class BombResult:
    contained_ms: float | None
    """From the bomb's start until the kernel first refused it; None if it never did."""
    quiet_click: Summary
    during_click: Summary
    click_p95_ratio: float
    """The neighbour's click p95 during the bomb over its quiet p95 (target <= 2)."""


@dataclass
class HardeningResult:
    create_on: Summary
    create_off: Summary
    create_p50_overhead_pct: float
    create_mean_overhead_pct: float
    """The same on the means: with the host as busy as this one, medians of ten move."""
    idle_pss_on_mb: float
    idle_pss_off_mb: float
    idle_cgroup_on_mb: float | None
    bombs: dict[str, BombResult] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def sandbox_pids(desktop_id: str) -> list[int]:
    """Every process of a desktop's sandbox, cgroup or not: bwrap's tree."""
    roots = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"bwrap") and f"cubicle-{desktop_id}".encode() in argv:
                roots.append(int(entry.name))
    tree, found = _children(), []
    while roots:
        pid = roots.pop()
        found.append(pid)
        roots += tree.get(pid, [])
    return found


def _pss(pids: list[int]) -> int:
    total = 0
    for pid in set(pids):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def _create(service: Service, **body) -> tuple[str, float]:
    started = time.perf_counter()
    response = service.client.post("/api/desktops", json=body)
    took = time.perf_counter() - started
    if response.status_code != 201:
        raise RuntimeError(f"create failed: {response.status_code} {response.text}")
    desktop_id = response.json()["id"]
    service.desktop_ids.add(desktop_id)
    return desktop_id, took


def _creates(on: Service, off: Service, rounds: int, settle_s: float) -> dict:
    samples: dict[str, list[float]] = {"on": [], "off": []}
    pss: dict[str, list[float]] = {"on": [], "off": []}
    charged: list[float] = []
    services = {"on": on, "off": off}
    for index in range(rounds + 1):  # round 0 is the warm-up (templates, page cache)
        order = ["on", "off"] if index % 2 else ["off", "on"]
        for name in order:
            desktop_id, took = _create(services[name])
            time.sleep(settle_s)
            if index:
                samples[name].append(took)
                pss[name].append(_pss(sandbox_pids(desktop_id)) / MB)
                if name == "on" and (bytes_ := desktop_cgroup_memory_bytes(desktop_id)):
                    charged.append(bytes_ / MB)
            services[name].kill_desktop(desktop_id)
            time.sleep(0.5)
        if index:
            progress(f"hardening: round {index}/{rounds}: on {samples['on'][-1]:.2f} s, "
                     f"off {samples['off'][-1]:.2f} s")  # fmt: skip
    return {"samples": samples, "pss": pss, "charged": charged}


def _clicks(service: Service, desktop_id: str, until: Callable[[], bool]) -> list[float]:
    """Click the desktop again and again until `until()`; each round trip, seconds."""
    url = f"/api/desktops/{desktop_id}/actions"
    taken: list[float] = []
    while not until():
        x, y = 100 + len(taken) % 400, 300
        started = time.perf_counter()
        service.client.post(url, json={"type": "click", "x": x, "y": y}).raise_for_status()
        taken.append(time.perf_counter() - started)
        time.sleep(0.02)
    return taken


def _contained(kind: str, service: Service, desktop_id: str) -> Callable[[], bool]:
    """Whether the kernel has refused the bomb yet."""
    if kind == "disk":
        mount = service.data_dir / "desktops" / desktop_id / "disk"

        def full() -> bool:
            room = os.statvfs(mount)
            return room.f_bavail * room.f_frsize < MB  # dd's next 1 MiB block fails

        return full
    cgroup = cgroups.find(desktop_id)
    assert cgroup is not None, "a hardened desktop has a cgroup"
    if kind == "fork":
        return lambda: cgroup.stats().pids_refused > 0
    return lambda: cgroup.stats().oom_kills > 0


def _bomb(service: Service, kind: str, neighbour: str, window_s: float) -> BombResult:
    victim, _ = _create(service, **BOMB_VICTIM)
    refused = _contained(kind, service, victim)
    time.sleep(2)
    calm_until = time.perf_counter() + QUIET_S
    quiet = summarize(_clicks(service, neighbour, lambda: time.perf_counter() > calm_until))
    started = time.perf_counter()
    stop_at = started + window_s
    during: list[float] = []
    clicker = threading.Thread(
        target=lambda: during.extend(
            _clicks(service, neighbour, lambda: time.perf_counter() > stop_at)
        )
    )
    clicker.start()
    command = f"setsid sh -c '{BOMBS[kind]}' > /dev/null 2>&1 < /dev/null &"
    service.client.post(f"/api/desktops/{victim}/exec", json={"command": command, "timeout_s": 10})
    contained_ms = None
    while time.perf_counter() < stop_at:
        if refused():
            contained_ms = (time.perf_counter() - started) * 1000
            stop_at = min(stop_at, time.perf_counter() + AFTER_S)
            break
        time.sleep(0.01)
    clicker.join()
    service.kill_desktop(victim)
    summary = summarize(during)
    ratio = round(summary.p95_ms / quiet.p95_ms, 2)
    progress(f"hardening: {kind} bomb contained in {contained_ms} ms, click p95 x{ratio}")
    return BombResult(contained_ms and round(contained_ms, 1), quiet, summary, ratio)


def run(options: Options) -> HardeningResult:
    rounds, settle_s, window_s = (3, 1.0, 12.0) if options.quick else (16, 3.0, 20.0)
    with (
        running_service(CUBICLE_WARM_POOL="0") as on,
        running_service(CUBICLE_WARM_POOL="0", CUBICLE_UNSAFE_NO_HARDENING="1") as off,
    ):
        measured = _creates(on, off, rounds, settle_s)
        neighbour, _ = _create(on)
        time.sleep(settle_s)
        bombs = {kind: _bomb(on, kind, neighbour, window_s) for kind in BOMBS}
    create_on = summarize(measured["samples"]["on"])
    create_off = summarize(measured["samples"]["off"])
    overhead = round((create_on.p50_ms / create_off.p50_ms - 1) * 100, 1)
    charged = measured["charged"]
    result = HardeningResult(
        create_on=create_on,
        create_off=create_off,
        create_p50_overhead_pct=overhead,
        create_mean_overhead_pct=round((create_on.mean_ms / create_off.mean_ms - 1) * 100, 1),
        idle_pss_on_mb=round(statistics.median(measured["pss"]["on"]), 1),
        idle_pss_off_mb=round(statistics.median(measured["pss"]["off"]), 1),
        idle_cgroup_on_mb=round(statistics.median(charged), 1) if charged else None,
        bombs=bombs,
    )
    result.targets = [
        Target(
            f"create p50 with hardening <= {CREATE_TARGET:.2f}x without ({overhead:+.1f} %)",
            create_on.p50_ms <= CREATE_TARGET * create_off.p50_ms,
        ),
        *(
            Target(
                f"{kind} bomb contained ({bomb.contained_ms} ms), neighbour click p95 <= "
                f"{CLICK_TARGET:g}x quiet (x{bomb.click_p95_ratio})",
                bomb.contained_ms is not None and bomb.click_p95_ratio <= CLICK_TARGET,
            )
            for kind, bomb in bombs.items()
        ),
    ]
    return result
