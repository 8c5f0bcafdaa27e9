"""`pause`: pause and resume a working desktop, against starting a fresh one.

(Without memory too: the disk kept, a boot on it at resume.)

Ours: a local desktop with an editor and a terminal open, `POST /api/desktops/{id}/pause`
then `…/resume` and its first answer after (a cursor read: the desktop is usable again),
each timed through the API with `http.client` on one keep-alive connection. Beside it, in
the same run and interleaved round by round: what a caller without pause does to get a
desktop back, a cold create (no warm pool) and its kill, which also loses every open
program. Also: the CPU the desktop's processes use in five idle seconds running and in
five seconds paused (their utime + stime from /proc), and the memory its cgroup holds
running and paused (what a paused local desktop still costs); and a create taken from the
warm pool (a service keeping one spare, drawn again before each create).

The microVM runtime, in a service of its own on the cached image
(`CUBICLE_BENCH_IMAGES_DIR`): pause and resume (QEMU `stop`/`cont`) beside a create
restored from the template and its kill; without memory (a cold boot on the kept disk);
and across a restart of the service: the stopping service saves the paused VM's RAM to
disk (timed from SIGTERM to exit, with the size written), the next one resumes it from
there. E2B publishes about 4 s per GB of RAM to pause and about 1 s to resume.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from bench._cpu import CLOCK_TICKS, cpu_ticks
from bench._run import Options, Target, progress
from bench._service import (
    Service,
    desktop_cgroup_memory_bytes,
    desktop_pids,
    running_service,
    started_service,
)
from bench._stats import Summary, ratio, summarize
from bench.microvm import CREATE_TIMEOUT_S, IMAGES_DIR


@dataclass(frozen=True)
class MicroVmPause:
    pause: Summary
    """`POST …/pause` of a microVM desktop: QEMU's `stop`."""
    resume_to_answer: Summary
    """`POST …/resume` (QEMU's `cont`) and the first answer after it."""
    create_and_kill: Summary
    """The baseline: a microVM desktop restored from its template (drawn), then its kill."""
    create_over_resume: float
    pause_without_memory: Summary
    """The guest syncs, QEMU ends, the disk layer is kept."""
    resume_without_memory_to_answer: Summary
    """A cold boot on the kept disk until drawn, and its first answer (TCG here)."""
    park_on_stop_s: float
    """A service stopping with one paused microVM: SIGTERM to exit, its RAM saved."""
    parked_state_mb: float
    """The saved RAM and devices (QEMU's migration stream), MB."""
    parked_state_mb_per_s: float
    resume_after_restart_to_answer_s: float
    """The next service: `POST …/resume` (restored from the saved state) and an answer."""
    memory_mb: int
    """The VM's RAM."""


@dataclass(frozen=True)
class PauseResult:
    pause: Summary
    """`POST …/pause` on a desktop with an editor and a terminal open."""
    resume_to_answer: Summary
    """`POST …/resume` and the desktop's first answer after it (a cursor read)."""
    pause_resume_round_trip: Summary
    """Both, back to back: what parking a desktop and taking it back costs."""
    cold_create_and_kill: Summary
    """The baseline: a fresh desktop without a warm pool (ready and drawn), then its kill."""
    cold_create_over_resume: float
    """The cold create's median over resume-to-answer's."""
    pool_create: Summary
    """Another baseline: `POST /api/desktops` served by the warm pool (one spare kept)."""
    pause_without_memory: Summary
    """`POST …/pause {"keep_memory": false}`: programs end, the disk is kept."""
    resume_without_memory_to_answer: Summary
    """`POST …/resume` of it (a boot on its disk, until drawn) and its first answer."""
    fork_4_s: float
    """`POST …/fork {"count": 4}` of the working desktop, until the four are drawn, s."""
    four_cold_creates_s: float
    """The baseline: four cold creates, one after the other, s."""
    ten_paused_memory_mb: float
    """Memory charged to ten desktops paused with their memory (cgroups), MB."""
    ten_parked_disk_mb: float
    """Host disk taken by the same ten paused without memory (their kept images), MB."""
    cpu_ms_per_s_running: float
    """CPU the idle running desktop's processes used, ms per second (5 s)."""
    cpu_ms_per_s_paused: float
    """The same while paused."""
    memory_mb_running: float
    """Memory charged to the desktop's cgroup, running, MB."""
    memory_mb_paused: float
    """The same while paused: a paused local desktop keeps its memory."""
    microvm: MicroVmPause | None
    """None with `--quick`: a microVM's cold boots take minutes under TCG."""
    targets: list[Target]


class _Rest:
    """One keep-alive connection, opened again after an idle spell (the server closes a
    connection idle for 5 s: the CPU measurements sleep that long)."""

    def __init__(self, service: Service) -> None:
        url = urlsplit(service.url)
        self._address = (url.hostname, url.port)
        self._http = http.client.HTTPConnection(*self._address, timeout=120)
        self._headers = {"Authorization": f"Bearer {service.token}"}
        self._used = time.monotonic()

    def call(self, method: str, path: str, body: dict | None = None) -> bytes:
        if time.monotonic() - self._used > 2.0:
            self._http.close()
            self._http = http.client.HTTPConnection(*self._address, timeout=120)
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        self._http.request(method, path, json.dumps(body) if body else None, headers)
        answer = self._http.getresponse()
        content = answer.read()
        self._used = time.monotonic()
        if answer.status >= 300:
            raise RuntimeError(f"{method} {path}: {answer.status} {content[:300]!r}")
        return content

    def close(self) -> None:
        self._http.close()


def _cpu_s(pids: list[int]) -> float:
    return sum(cpu_ticks(pid) or 0 for pid in pids) / CLOCK_TICKS


def _cpu_ms_per_s(desktop_id: str, seconds: float) -> float:
    pids = desktop_pids(desktop_id)
    before = _cpu_s(pids)
    time.sleep(seconds)
    return round((_cpu_s(pids) - before) * 1000 / seconds, 2)


def _memory_mb(desktop_id: str) -> float:
    return round((desktop_cgroup_memory_bytes(desktop_id) or 0) / 1e6, 1)


def _creates(service: Service, count: int) -> list[str]:
    return [service.create_desktop().id for _ in range(count)]


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _pool_creates(rounds: int) -> Summary:
    """Creates the warm pool serves, each once its spare is drawn again."""
    with running_service(CUBICLE_WARM_POOL="1") as service:
        times = []
        for _ in range(rounds):
            service.wait_for_warm_desktop()
            started = time.perf_counter()
            desktop = service.create_desktop()
            times.append(time.perf_counter() - started)
            service.kill_desktop(desktop.id)
    return summarize(times)


def _microvm(rounds: int) -> MicroVmPause:
    env = {"CUBICLE_WARM_POOL": "0", "CUBICLE_IMAGES_DIR": str(IMAGES_DIR)}
    with running_service(**env) as service:
        progress("pause/microvm: a desktop (the first of its shape cold-boots its template)")

        def create() -> str:
            answer = service.client.post(
                "/api/desktops", json={"runtime": "microvm"}, timeout=CREATE_TIMEOUT_S
            )
            if answer.status_code != 201:
                raise RuntimeError(f"microVM create: {answer.status_code} {answer.text[:300]}")
            service.desktop_ids.add(answer.json()["id"])
            return answer.json()["id"]

        desktop_id = create()
        metrics = service.client.get(f"/api/desktops/{desktop_id}/metrics").json()
        memory_mb = (metrics["memory_limit_bytes"] or 0) >> 20
        rest = _Rest(service)
        base = f"/api/desktops/{desktop_id}"

        def resume() -> None:
            rest.call("POST", f"{base}/resume")
            rest.call("GET", f"{base}/cursor")

        try:
            rest.call("POST", f"{base}/launch", {"app": "mousepad"})
            rest.call("POST", f"{base}/actions", {"type": "wait_for_settle", "quiet_ms": 500})
            progress(f"pause/microvm: {rounds} rounds of pause, resume and a create")
            pauses, resumes, creates = [], [], []
            for _ in range(rounds):
                pauses.append(_timed(lambda: rest.call("POST", f"{base}/pause", {})))
                resumes.append(_timed(resume))
                creates.append(_timed(lambda: service.kill_desktop(create())))
            progress("pause/microvm: two rounds without memory (cold boots)")
            cold_pauses, cold_resumes = [], []
            for _ in range(2):
                cold_pauses.append(
                    _timed(lambda: rest.call("POST", f"{base}/pause", {"keep_memory": False}))
                )
                cold_resumes.append(_timed(resume))
            progress("pause/microvm: paused, the service restarts")
            rest.call("POST", f"{base}/pause", {})
        finally:
            rest.close()
        service.client.close()
        park_s = _timed(lambda: service.launched.stop(timeout_s=600))
        state = service.data_dir / "parked" / f"{desktop_id}.vm" / "state"
        state_mb = state.stat().st_size / 1e6
        with started_service(service.data_dir, service.token, env) as again:
            rest = _Rest(again)
            try:
                after_restart_s = _timed(resume)
            finally:
                rest.close()
            again.kill_desktop(desktop_id)
    paused, created = summarize(resumes), summarize(creates)
    return MicroVmPause(
        pause=summarize(pauses),
        resume_to_answer=paused,
        create_and_kill=created,
        create_over_resume=ratio(created, paused),
        pause_without_memory=summarize(cold_pauses),
        resume_without_memory_to_answer=summarize(cold_resumes),
        park_on_stop_s=round(park_s, 2),
        parked_state_mb=round(state_mb, 1),
        parked_state_mb_per_s=round(state_mb / park_s, 1),
        resume_after_restart_to_answer_s=round(after_restart_s, 2),
        memory_mb=memory_mb,
    )


def run(options: Options) -> PauseResult:
    rounds = 5 if options.quick else 30
    settle_s = 1.0 if options.quick else 5.0
    with running_service(CUBICLE_WARM_POOL="0") as service:
        desktop = service.create_desktop()
        rest = _Rest(service)
        base = f"/api/desktops/{desktop.id}"
        try:
            for app in ("mousepad", "xfce4-terminal"):
                rest.call("POST", f"{base}/launch", {"app": app})
            rest.call("POST", f"{base}/actions", {"type": "wait_for_settle", "quiet_ms": 500})
            time.sleep(1.0)
            progress(f"pause: {rounds} rounds of pause, resume and a cold create")
            pauses, resumes, trips, colds = [], [], [], []
            for index in range(rounds):
                pauses.append(_timed(lambda: rest.call("POST", f"{base}/pause", {})))

                def resume() -> None:
                    rest.call("POST", f"{base}/resume")
                    rest.call("GET", f"{base}/cursor")

                resumes.append(_timed(resume))

                def round_trip() -> None:
                    rest.call("POST", f"{base}/pause", {})
                    resume()

                trips.append(_timed(round_trip))
                if index % 3 == 0:  # a cold create takes ~1 s: every third round

                    def cold() -> None:
                        other = service.create_desktop()
                        service.kill_desktop(other.id)

                    colds.append(_timed(cold))
            progress(f"pause: {max(3, rounds // 6)} rounds without memory")
            cold_pauses, cold_resumes = [], []
            for _ in range(max(3, rounds // 6)):
                cold_pauses.append(
                    _timed(lambda: rest.call("POST", f"{base}/pause", {"keep_memory": False}))
                )
                cold_resumes.append(_timed(resume))
            progress("pause: a fork of 4 beside 4 cold creates")
            forked: list[str] = []

            def fork() -> None:
                answer = json.loads(rest.call("POST", f"{base}/fork", {"count": 4}))
                forked.extend(d["id"] for d in answer["desktops"])

            fork_s = _timed(fork)
            for child in forked:
                service.kill_desktop(child)
            colds_s = _timed(lambda: [service.kill_desktop(d) for d in _creates(service, 4)])
            progress("pause: ten desktops paused, with memory and without")
            ten = _creates(service, 10)
            for desktop_id in ten:
                rest.call("POST", f"/api/desktops/{desktop_id}/pause", {})
            ten_memory = sum(_memory_mb(d) for d in ten)
            for desktop_id in ten:
                rest.call("POST", f"/api/desktops/{desktop_id}/resume")
                rest.call("POST", f"/api/desktops/{desktop_id}/pause", {"keep_memory": False})
            parked = service.data_dir / "parked"
            ten_disk = sum(f.stat().st_blocks * 512 for f in parked.glob("*.img")) / 1e6
            for desktop_id in ten:
                service.kill_desktop(desktop_id)
            progress("pause: CPU and memory, running and paused")
            time.sleep(1.0)
            running_cpu = _cpu_ms_per_s(desktop.id, settle_s)
            running_memory = _memory_mb(desktop.id)
            rest.call("POST", f"{base}/pause", {})
            paused_cpu = _cpu_ms_per_s(desktop.id, settle_s)
            paused_memory = _memory_mb(desktop.id)
            rest.call("POST", f"{base}/resume")
        finally:
            rest.close()
    progress(f"pause: {rounds // 3 + 1} creates from the warm pool")
    pooled = _pool_creates(rounds // 3 + 1)
    microvm = None if options.quick else _microvm(10)
    resumed, cold_summary = summarize(resumes), summarize(colds)
    speedup = ratio(cold_summary, resumed)
    return PauseResult(
        pause=summarize(pauses),
        resume_to_answer=resumed,
        pause_resume_round_trip=summarize(trips),
        cold_create_and_kill=cold_summary,
        cold_create_over_resume=speedup,
        pool_create=pooled,
        fork_4_s=round(fork_s, 2),
        four_cold_creates_s=round(colds_s, 2),
        ten_paused_memory_mb=round(ten_memory, 1),
        ten_parked_disk_mb=round(ten_disk, 1),
        pause_without_memory=summarize(cold_pauses),
        resume_without_memory_to_answer=summarize(cold_resumes),
        cpu_ms_per_s_running=running_cpu,
        cpu_ms_per_s_paused=paused_cpu,
        memory_mb_running=running_memory,
        memory_mb_paused=paused_memory,
        microvm=microvm,
        targets=[
            Target("a paused desktop uses no CPU", paused_cpu == 0),
            Target("resume answers >= 10x sooner than a cold create", speedup >= 10),
        ],
    )
