"""`soak`: a long run of everything a service does, and what it leaves behind.

For a bounded time (10 minutes; 60 s with `--quick`, or `--soak-seconds`), one service
(`CUBICLE_WARM_POOL=0`, so that nothing is booted behind the figures) goes round a cycle:
create a desktop, watch it (the MJPEG stream, a few frames), record it while a few actions
run and a screenshot is taken, stop the recording, delete the desktop; every third cycle a
board task runs too (a fresh desktop, recorded, on a scripted model that answers `done`).

Before the first measured cycle (after one cycle of warm-up) and after the last one, with
no desktop left running, it counts what the service holds on the host: its processes (the
service and every descendant), its open file descriptors, the cgroup directories of the
desktops it created that still exist, the mounts under its data directory, the sandbox
directories and host temp files left, and the service's resident memory. It also reports
the create p50 of the first and the last cycles. Growth in anything but memory is a leak;
memory may grow a little as Python's caches warm (reported as a ratio).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench._run import Options, Target, progress
from bench._service import Service, running_service
from tests.agent.fake_model import FakeModelServer, RecordedRequest

QUICK_S = 60.0
FULL_S = 600.0
_SETTLE_S = 3.0
"""Seconds given to processes and cgroups to go once the last desktop was deleted."""
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_SANDBOX_UIDS = 200_000
"""Host user ids of sandboxes start here (`cubicle.server.runtime.local.HOST_UID_BASE`)."""


@dataclass(frozen=True)
class Snapshot:
    processes: int
    """The service process and all its descendants (sandboxes, their programs, helpers)."""
    open_fds: int
    """File descriptors the service process holds."""
    cgroups: int
    """Cgroup directories still there of desktops this run created and deleted."""
    mounts: int
    """Host mounts under the service's data directory."""
    sandbox_dirs: int
    """Directories left under `<data>/desktops`."""
    tmp_files: int
    """Entries in the host's /tmp owned by a sandbox user id."""
    service_rss_mb: float
    """Resident memory of the service process."""


@dataclass(frozen=True)
class SoakResult:
    seconds: float
    cycles: int
    tasks: int
    start: Snapshot
    end: Snapshot
    grew: dict[str, float]
    """End minus start, for every count that grew (empty: nothing leaked)."""
    rss_ratio: float
    """Service memory at the end / at the start."""
    create_p50_ms_first: float
    """Median create time of the first five cycles."""
    create_p50_ms_last: float
    """Median create time of the last five cycles."""
    errors: list[str]
    """Calls that did not answer as expected, with what they answered."""
    target: str
    target_met: bool


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, pending = {root}, [root]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def _cgroups_left(desktop_ids: set[str]) -> int:
    """Cgroup directories named after these desktops, anywhere under the hierarchies."""
    if not desktop_ids:
        return 0
    left = 0
    for directory, subdirs, _ in os.walk(_CGROUP_ROOT):
        left += len(desktop_ids.intersection(subdirs))
        if len(Path(directory).relative_to(_CGROUP_ROOT).parts) >= 6:
            subdirs.clear()
    return left


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def snapshot(service: Service, desktop_ids: set[str]) -> Snapshot:
    pid = service.launched.process.pid
    data = str(service.data_dir)
    with open("/proc/self/mountinfo") as mountinfo:
        mounts = sum(data in line for line in mountinfo)
    tmp = 0
    for entry in os.scandir("/tmp"):
        try:
            tmp += entry.stat(follow_symlinks=False).st_uid >= _SANDBOX_UIDS
        except FileNotFoundError:
            continue
    desktops = service.data_dir / "desktops"
    return Snapshot(
        processes=len(_descendants(pid)),
        open_fds=len(os.listdir(f"/proc/{pid}/fd")),
        cgroups=_cgroups_left(desktop_ids),
        mounts=mounts,
        sandbox_dirs=len(list(desktops.iterdir())) if desktops.is_dir() else 0,
        tmp_files=tmp,
        service_rss_mb=round(_rss_mb(pid), 1),
    )


def _planner(request: RecordedRequest) -> str:
    return '{"thought": "Nothing to do.", "action": {"type": "done", "summary": "soaked"}}'


class _Cycle:
    """One round of everything, on a desktop of its own."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.api = service.client
        self.errors: list[str] = []
        self.created: set[str] = set()
        self.create_ms: list[float] = []

    def _check(self, response: httpx.Response, *expected: int) -> httpx.Response:
        if response.status_code not in expected:
            self.errors.append(
                f"{response.request.method} {response.request.url.path}: "
                f"{response.status_code} {response.text[:200]}"
            )
        return response

    def run(self) -> None:
        started = time.perf_counter()
        created = self._check(self.api.post("/api/desktops", json={}), 201)
        if created.status_code != 201:
            return
        self.create_ms.append((time.perf_counter() - started) * 1000)
        desktop_id = created.json()["id"]
        self.created.add(desktop_id)
        base = f"/api/desktops/{desktop_id}"
        try:
            with self.api.stream("GET", f"{base}/mjpeg", timeout=30) as feed:
                self._check(feed, 200)
                received = 0
                for chunk in feed.iter_bytes():
                    received += len(chunk)
                    if received > 20_000:  # a frame of the desktop, or most of one
                        break
            self._check(self.api.post(f"{base}/recording/start"), 200)
            for x, y in ((300, 300), (600, 400), (900, 500)):
                move = {"type": "move", "x": x, "y": y}
                self._check(self.api.post(f"{base}/actions", json=move), 200)
            self._check(self.api.post(f"{base}/launch", json={"app": "mousepad"}), 200)
            time.sleep(1.0)
            self._check(self.api.get(f"{base}/screenshot", params={"max_width": 640}), 200)
            self._check(self.api.post(f"{base}/recording/stop"), 200)
        finally:
            self._check(self.api.delete(base), 204)

    def task(self) -> None:
        added = self._check(self.api.post("/api/tasks", json={"text": "soak"}), 201)
        if added.status_code != 201:
            return
        task_id = added.json()["id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            task = self.api.get(f"/api/tasks/{task_id}").json()
            if task["desktop_id"]:
                self.created.add(task["desktop_id"])
            if task["status"] in ("done", "failed", "cancelled", "interrupted"):
                if task["status"] != "done":
                    self.errors.append(f"task {task_id} ended {task['status']}: {task['result']}")
                return
            time.sleep(0.2)
        self.errors.append(f"task {task_id} did not finish within 120 s")


def _idle(service: Service, timeout_s: float = 60.0) -> None:
    """Wait until no desktop runs and no task holds one, then a little more."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        desktops = service.client.get("/api/desktops").json()
        alive = [d for d in desktops if d["status"] in ("starting", "ready")]
        active = service.client.get("/api/tasks", params={"status": "running,paused"}).json()
        if not alive and not active["total"]:
            break
        time.sleep(0.2)
    time.sleep(_SETTLE_S)


def soak(seconds: float) -> SoakResult:
    """Run the soak for `seconds` (plus one warm-up cycle) on a fresh service."""
    with running_service(CUBICLE_WARM_POOL="0") as service, FakeModelServer() as model:
        profile = {"base_url": model.url, "planner_model": "fake-model", "grounder": "a11y"}
        service.client.put("/api/board/profiles/default", json=profile).raise_for_status()
        settings = service.client.get("/api/board/settings").json()
        service.client.put(
            "/api/board/settings", json=settings | {"concurrency": 1, "record": True}
        ).raise_for_status()
        model.respond_with(_planner)
        cycle = _Cycle(service)
        cycle.run()
        cycle.task()
        _idle(service)
        start = snapshot(service, cycle.created)
        warmup_creates = len(cycle.create_ms)
        progress(f"soak: start {start}")
        began = time.monotonic()
        cycles = tasks = 0
        while time.monotonic() - began < seconds:
            cycle.run()
            cycles += 1
            if cycles % 3 == 0:
                cycle.task()
                tasks += 1
            if cycles % 5 == 0:
                progress(f"soak: {cycles} cycles, {tasks} tasks, {len(cycle.errors)} errors")
        _idle(service)
        end = snapshot(service, cycle.created)
        progress(f"soak: end {end}")
        elapsed = time.monotonic() - began
    grew = {
        name: round(getattr(end, name) - value, 1)
        for name, value in asdict(start).items()
        if name != "service_rss_mb" and getattr(end, name) > value
    }
    creates = cycle.create_ms[warmup_creates:]
    rss_ratio = round(end.service_rss_mb / start.service_rss_mb, 2)
    targets = (
        Target("no process, fd, cgroup, mount or file left behind", not grew),
        Target("no call failed", not cycle.errors),
    )
    return SoakResult(
        seconds=round(elapsed, 1),
        cycles=cycles,
        tasks=tasks,
        start=start,
        end=end,
        grew=grew,
        rss_ratio=rss_ratio,
        create_p50_ms_first=round(statistics.median(creates[:5]), 1) if creates else 0.0,
        create_p50_ms_last=round(statistics.median(creates[-5:]), 1) if creates else 0.0,
        errors=cycle.errors[:20],
        target="; ".join(t.description for t in targets),
        target_met=all(t.met for t in targets),
    )


def run(options: Options) -> SoakResult:
    seconds = options.soak_seconds or (QUICK_S if options.quick else FULL_S)
    return soak(seconds)
