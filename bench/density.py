"""`density`: how many idle desktops run at once on this host, and what each one costs.

Desktops are created one after another through the REST API up to `--max-desktops` (40),
until a create fails, or until the host's MemAvailable falls under 2 GiB, on a service
without a warm pool (`CUBICLE_WARM_POOL=0`), so every running desktop is one we count. Each
is left idle for a few seconds, then measured; at the end all are measured again (the
steady state with N running: `final`, never used since created). Then every desktop is
used the way an agent starts: a screenshot, then clicks, round after round over all of
them (click p95 across all), and measured once more (`final_after_use`: the screenshot
loaded the guest's capture code and holds its last capture). Per desktop:

- PSS summed over the sandbox's processes (`/proc/<pid>/smaps_rollup`): the honest cost,
  since XFCE's libraries are shared between desktops and PSS splits shared pages fairly.
- the sandbox cgroup's `memory.usage_in_bytes`: what the kernel charges it, page cache
  included (a file is charged to the first desktop that reads it, so the first one is big).
- RSS summed, for reference: it counts every shared page once per process.

Also: the host's MemAvailable drop over all desktops (only meaningful when nothing else
runs on the host), whether every desktop still answers a screenshot at the end, and for
context one reference `startxfce4` session on the host (`bench._host`) measured the same
way at the end, while our desktops still run.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from bench._host import ReferenceSession, reference_session
from bench._run import Options, Target, meminfo_bytes, progress
from bench._service import Service, desktop_cgroup_memory_bytes, desktop_pids, running_service
from bench._stats import Summary, summarize

TARGET_COUNT = 40
TARGET_MB = 100.0
TARGET_CLICK_P95_MS = 50.0
CLICK_ROUNDS = 10
"""Clicks per desktop at the end, one desktop after the other in each round."""
CLICK_AT = (900, 500)
"""An empty spot of the desktop's backdrop."""
MIN_AVAILABLE = 2 * 2**30
"""Stop creating desktops when the host has less than this available, bytes."""
MB = 2**20
_LARGEST = 4


@dataclass(frozen=True)
class DesktopMemory:
    """One desktop's memory at one moment, MiB."""

    id: str
    processes: int
    pss_mb: float
    rss_mb: float
    cgroup_mb: float | None
    """cgroup memory.usage_in_bytes (page cache included); None without a cgroup."""


@dataclass(frozen=True)
class DensityResult:
    count: int
    """Desktops running at once at the end."""
    max_desktops: int
    stopped_because: str
    create: Summary
    """POST /api/desktops wall time while the host fills up."""
    load_avg_1m: tuple[float, float]
    """The host's 1-minute load average at the start and at the end of this benchmark."""
    pss_mb_median: float
    """Final snapshot, every desktop idle and never used, MiB."""
    pss_mb_median_after_use: float
    """Every desktop idle again after a screenshot and the clicks, MiB."""
    click: Summary
    """POST /api/desktops/{id}/actions (one click) → 200, over every desktop at the end."""
    rss_mb_median: float
    cgroup_mb_median: float | None
    host_used_mb_total: float
    """MemAvailable before the first desktop minus after the last settled, MiB."""
    host_used_mb_per_desktop: float
    host_available_mb_after: float
    all_answer_screenshot: bool
    screenshot_failures: tuple[str, ...]
    final: tuple[DesktopMemory, ...]
    """Every desktop measured at the end, with all of them running."""
    final_after_use: tuple[DesktopMemory, ...]
    pss_mb_at_creation: tuple[float, ...]
    """Each desktop's PSS once it settled, with only the earlier ones running, MiB."""
    largest_pss_ours: tuple[str, ...]
    """The last desktop's processes with the most PSS at the end, as "name: MiB"."""
    baseline_startxfce4: DesktopMemory
    """One host-side `startxfce4` session, measured at the end alongside ours."""
    largest_pss_baseline: tuple[str, ...]
    target: str
    target_met: bool
    targets: tuple[Target, ...]


def _pss_rss_of(pid: int) -> tuple[int, int]:
    """PSS and RSS of one process, bytes; a process that exited meanwhile holds none."""
    found = {"Pss": 0, "Rss": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                name, _, rest = line.partition(":")
                if name in found:
                    found[name] = int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0, 0
    return found["Pss"], found["Rss"]


def _name(pid: int) -> str:
    """The program name of a process, the script's name for a Python one."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return "?"
    name = Path(argv[0].decode(errors="replace")).name
    if name.startswith("python") and len(argv) > 2 and argv[1] == b"-m":
        name += f" -m {argv[2].decode(errors='replace')}"
    return name


def _memory(label: str, pids: list[int], cgroup_bytes: int | None) -> DesktopMemory:
    each = [_pss_rss_of(pid) for pid in pids]
    return DesktopMemory(
        id=label,
        processes=len(pids),
        pss_mb=round(sum(p for p, _ in each) / MB, 1),
        rss_mb=round(sum(r for _, r in each) / MB, 1),
        cgroup_mb=round(cgroup_bytes / MB, 1) if cgroup_bytes is not None else None,
    )


def _largest(pids: list[int]) -> tuple[str, ...]:
    """The processes with the most PSS, as "name: MiB"."""
    pss = {pid: _pss_rss_of(pid)[0] for pid in pids}
    largest = sorted(pss, key=pss.__getitem__, reverse=True)[:_LARGEST]
    return tuple(f"{_name(pid)}: {pss[pid] / MB:.1f}" for pid in largest)


def _measure(desktop_id: str) -> DesktopMemory:
    pids = desktop_pids(desktop_id)
    return _memory(desktop_id, pids, desktop_cgroup_memory_bytes(desktop_id))


def _measure_reference(session: ReferenceSession) -> DesktopMemory:
    cgroup = session.cgroup.memory_bytes() if session.cgroup else None
    return _memory(f"host{session.display}", session.pids(), cgroup)


def _fill(
    service: Service, limit: int, settle_s: float
) -> tuple[list[float], list[DesktopMemory], str]:
    """Create desktops until `limit`, a failure, or low memory; (create times, measures, why)."""
    created: list[float] = []
    measures: list[DesktopMemory] = []
    while len(created) < limit:
        available = meminfo_bytes("MemAvailable")
        if available < MIN_AVAILABLE:
            return created, measures, f"MemAvailable {available // MB} MiB < 2 GiB"
        started = time.perf_counter()
        try:
            info = service.create_desktop()
        except RuntimeError as exc:
            return created, measures, f"create {len(created) + 1} failed: {exc}"
        created.append(time.perf_counter() - started)
        time.sleep(settle_s)
        measures.append(_measure(info.id))
        progress(f"density: {len(created)} desktops, last: {measures[-1]}")
    return created, measures, f"reached --max-desktops {limit}"


def _screenshot_failures(service: Service, desktop_ids: list[str]) -> tuple[str, ...]:
    failures = []
    for desktop_id in desktop_ids:
        response = service.client.get(f"/api/desktops/{desktop_id}/screenshot")
        if response.status_code != 200 or not response.content.startswith(b"\x89PNG"):
            failures.append(f"{desktop_id}: {response.status_code} {response.text[:200]}")
    return tuple(failures)


def _clicks(service: Service, desktop_ids: list[str], rounds: int) -> list[float]:
    """Seconds each click took through the REST API, round after round over every desktop."""
    x, y = CLICK_AT
    body = {"type": "click", "x": x, "y": y}
    took = []
    for _ in range(rounds):
        for desktop_id in desktop_ids:
            started = time.perf_counter()
            response = service.client.post(f"/api/desktops/{desktop_id}/actions", json=body)
            took.append(time.perf_counter() - started)
            response.raise_for_status()
    return took


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def run(options: Options) -> DensityResult:
    load_start = os.getloadavg()[0]
    limit = min(2, options.max_desktops) if options.quick else options.max_desktops
    settle_s = 1.0 if options.quick else 3.0
    allowed = str(max(limit, 32))
    with running_service(CUBICLE_WARM_POOL="0", CUBICLE_MAX_DESKTOPS=allowed) as service:
        before = meminfo_bytes("MemAvailable")
        times, at_creation, why = _fill(service, limit, settle_s)
        after = meminfo_bytes("MemAvailable")
        ids = [m.id for m in at_creation]
        final = [_measure(desktop_id) for desktop_id in ids]
        failures = _screenshot_failures(service, ids)
        clicks = _clicks(service, ids, 2 if options.quick else CLICK_ROUNDS)
        time.sleep(settle_s)
        used = [_measure(desktop_id) for desktop_id in ids]
        largest_ours = _largest(desktop_pids(ids[-1])) if ids else ()
        with reference_session() as host:
            time.sleep(settle_s)
            baseline = _measure_reference(host)
            largest_baseline = _largest(host.pids())
    if not times:
        raise RuntimeError(f"no desktop could be created: {why}")
    pss = _median([m.pss_mb for m in final])
    pss_used = _median([m.pss_mb for m in used])
    click = summarize(clicks)
    cgroups = [m.cgroup_mb for m in final if m.cgroup_mb is not None]
    targets = (
        Target(f">= {TARGET_COUNT} idle desktops at once", len(times) >= TARGET_COUNT),
        Target(f"PSS per idle desktop <= {TARGET_MB:.0f} MB (median)", pss <= TARGET_MB),
        Target(
            f"PSS per idle desktop after a screenshot and clicks <= {TARGET_MB:.0f} MB (median)",
            pss_used <= TARGET_MB,
        ),
        Target(
            f"click p95 across all desktops <= {TARGET_CLICK_P95_MS:.0f} ms",
            click.p95_ms <= TARGET_CLICK_P95_MS,
        ),
        Target("every desktop answers a screenshot at the end", not failures),
    )
    return DensityResult(
        count=len(times),
        max_desktops=limit,
        stopped_because=why,
        create=summarize(times),
        load_avg_1m=(round(load_start, 2), round(os.getloadavg()[0], 2)),
        pss_mb_median=pss,
        pss_mb_median_after_use=pss_used,
        click=click,
        rss_mb_median=_median([m.rss_mb for m in final]),
        cgroup_mb_median=_median(cgroups) if cgroups else None,
        host_used_mb_total=round((before - after) / MB, 1),
        host_used_mb_per_desktop=round((before - after) / MB / len(times), 1),
        host_available_mb_after=round(after / MB, 1),
        all_answer_screenshot=not failures,
        screenshot_failures=failures,
        final=tuple(final),
        final_after_use=tuple(used),
        pss_mb_at_creation=tuple(m.pss_mb for m in at_creation),
        largest_pss_ours=largest_ours,
        baseline_startxfce4=baseline,
        largest_pss_baseline=largest_baseline,
        target="; ".join(t.description for t in targets),
        target_met=all(t.met for t in targets),
        targets=targets,
    )
