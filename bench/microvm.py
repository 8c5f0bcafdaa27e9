"""`microvm`: the microVM runtime beside the local one, in one service, in one run.

- create: `POST /api/desktops {"runtime": …}` → 201 (drawn), client wall time, warm pool
  off, each desktop killed before the next: microVMs restore from the template of their
  shape; local desktops boot in bubblewrap. Target: microVM p50 ≤ 1.0 s.
- cold boot: the template's boot, from QEMU's start to the desktop drawn (`cold_boot_s` of
  the template this run makes: its templates are removed first), and the first create's
  wall time (cold boot, save, restore).
- click and JPEG screenshot through the REST API (keep-alive `http.client`, as
  `bench/click` does), on one desktop of each runtime. Targets: microVM click p50 ≤ 20 ms,
  JPEG p50 ≤ 60 ms; ratios microVM / local.
- idle density: N microVM desktops at once, idle; PSS of each QEMU process
  (`smaps_rollup`: pages shared through the template's memory file are divided among the
  VMs that map them, so shared pages count once in the sum). Target: ≥ 10 at ≤ 300 MB.
- image build: cached (the inputs' hash found: what every service start pays) and, unless
  `--quick`, cold (an empty images directory: Debian packages and wheels downloaded).

Images live in `CUBICLE_BENCH_IMAGES_DIR` (default `/var/tmp/cubicle-bench-images`).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._run import Options, Target, progress
from bench._service import Service, running_service
from bench._stats import Summary, summarize
from cubicle.server.runtime.microvm.image import build_image

IMAGES_DIR = Path(os.environ.get("CUBICLE_BENCH_IMAGES_DIR", "/var/tmp/cubicle-bench-images"))
CREATE_TIMEOUT_S = 900


@dataclass(frozen=True)
class MicroVmResult:
    create_microvm: Summary
    """POST /api/desktops → 201, restored from the template, warm pool off."""
    create_local: Summary
    """The same for the local runtime, in the same service."""
    cold_boot_s: float
    """The template's cold boot: QEMU start → desktop drawn (TCG here)."""
    first_create_s: float
    """The first microVM create of the run: cold boot, save the template, restore."""
    click_microvm: Summary
    click_local: Summary
    click_ratio: float
    """microVM p50 / local p50."""
    jpeg_microvm: Summary
    jpeg_local: Summary
    jpeg_ratio: float
    idle_vms: int
    pss_mb_per_vm: float
    """Median PSS of one idle microVM's QEMU process, MB."""
    pss_mb_total: float
    rss_mb_per_vm: float
    """Median RSS (shared pages counted in full in each), MB: what PSS saves."""
    image_build_cached_s: float
    image_build_cold_s: float | None
    accel: str
    targets: tuple[Target, ...]


class _Api:
    """Keep-alive HTTP/1.1 to the service, as a lean client would call it."""

    IDLE_S = 2.0
    """The service closes a keep-alive connection idle for 5 s: reconnect before that."""

    def __init__(self, service: Service) -> None:
        host, _, port = service.url.removeprefix("http://").partition(":")
        self._address = (host, int(port))
        self._conn = http.client.HTTPConnection(*self._address, timeout=CREATE_TIMEOUT_S)
        self._auth = {"Authorization": f"Bearer {service.token}"}
        self._last = time.monotonic()

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        if time.monotonic() - self._last > self.IDLE_S:
            self._conn.close()
            self._conn = http.client.HTTPConnection(*self._address, timeout=CREATE_TIMEOUT_S)
        try:
            return self._call(method, path, body)
        finally:
            self._last = time.monotonic()

    def _call(self, method: str, path: str, body: dict | None) -> tuple[int, bytes]:
        headers = dict(self._auth)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self._conn.request(method, path, body=data, headers=headers)
        response = self._conn.getresponse()
        return response.status, response.read()


def _create(api: _Api, runtime: str) -> tuple[str, float]:
    started = time.perf_counter()
    status, body = api.call("POST", "/api/desktops", {"runtime": runtime})
    elapsed = time.perf_counter() - started
    if status != 201:
        raise RuntimeError(f"create {runtime}: {status} {body[:300]!r}")
    return json.loads(body)["id"], elapsed


def _kill(api: _Api, desktop_id: str) -> None:
    api.call("DELETE", f"/api/desktops/{desktop_id}")


def _timed(api: _Api, n: int, method: str, path: str, body: dict | None = None) -> Summary:
    samples = []
    for i in range(n):
        payload = None if body is None else {**body, "x": 200 + i % 50, "y": 300}
        started = time.perf_counter()
        status, content = api.call(method, path, payload)
        samples.append(time.perf_counter() - started)
        if status != 200:
            raise RuntimeError(f"{method} {path}: {status} {content[:200]!r}")
    return summarize(samples)


def _pss_rss_mb(pid: int) -> tuple[float, float]:
    found = {"Pss": 0, "Rss": 0}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            name, _, rest = line.partition(":")
            if name in found:
                found[name] = int(rest.split()[0])
    return found["Pss"] / 1024, found["Rss"] / 1024


def _qemu_pid(desktop_id: str) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"qemu-system-x86_64") and f"cubicle-{desktop_id}".encode() in argv:
            return int(entry.name)
    raise RuntimeError(f"no QEMU process for desktop {desktop_id}")


def _image_builds(quick: bool) -> tuple[float, float | None]:
    started = time.perf_counter()
    asyncio.run(build_image(IMAGES_DIR, progress=lambda line: None))
    cached = time.perf_counter() - started
    if quick:
        return cached, None
    scratch = Path(tempfile.mkdtemp(prefix="cubicle-cold-image-", dir="/var/tmp"))
    try:
        progress("microvm: cold image build into an empty directory")
        started = time.perf_counter()
        asyncio.run(build_image(scratch, progress=lambda line: None))
        return cached, time.perf_counter() - started
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(scratch)], check=False)  # sealed layers
        shutil.rmtree(scratch, ignore_errors=True)


def run(options: Options) -> MicroVmResult:
    rounds = 4 if options.quick else 12
    clicks, shots = (30, 10) if options.quick else (200, 40)
    idle = 3 if options.quick else min(max(options.max_desktops, 10), 12)
    progress(f"microvm: image (in {IMAGES_DIR})")
    asyncio.run(build_image(IMAGES_DIR, progress=progress))
    shutil.rmtree(IMAGES_DIR / "templates", ignore_errors=True)  # this run makes its own
    env = {
        "CUBICLE_WARM_POOL": "0",
        "CUBICLE_IMAGES_DIR": str(IMAGES_DIR),
        "CUBICLE_MAX_DESKTOPS": str(idle + 4),
    }
    with running_service(**env) as service:
        api = _Api(service)
        progress("microvm: first create (cold boot of the template)")
        first_id, first_create = _create(api, "microvm")
        meta = next((IMAGES_DIR / "templates").glob("*/meta.json"))
        cold_boot = json.loads(meta.read_text())["cold_boot_s"]
        log = (service.data_dir / "service.log").read_text()
        accel = "tcg" if "runs with TCG" in log else "kvm"
        _kill(api, first_id)
        progress(f"microvm: {rounds} creates of each runtime, side by side")
        times: dict[str, list[float]] = {"microvm": [], "local": []}
        for i in range(rounds):
            for runtime in ("microvm", "local") if i % 2 == 0 else ("local", "microvm"):
                desktop_id, elapsed = _create(api, runtime)
                times[runtime].append(elapsed)
                _kill(api, desktop_id)
                time.sleep(0.5)
        progress("microvm: click and JPEG through the REST API")
        ids = {runtime: _create(api, runtime)[0] for runtime in ("microvm", "local")}
        time.sleep(2)
        click, jpeg = {}, {}
        for runtime, desktop_id in ids.items():
            base = f"/api/desktops/{desktop_id}"
            _timed(api, 10, "POST", f"{base}/actions", {"type": "click"})  # warm-up
            _timed(api, 3, "GET", f"{base}/screenshot?format=jpeg")
            click[runtime] = _timed(api, clicks, "POST", f"{base}/actions", {"type": "click"})
            jpeg[runtime] = _timed(api, shots, "GET", f"{base}/screenshot?format=jpeg")
        for desktop_id in ids.values():
            _kill(api, desktop_id)
        progress(f"microvm: {idle} idle microVMs at once")
        crowd = [_create(api, "microvm")[0] for _ in range(idle)]
        time.sleep(10)
        usage = [_pss_rss_mb(_qemu_pid(desktop_id)) for desktop_id in crowd]
        for desktop_id in crowd:
            _kill(api, desktop_id)
    cached, cold = _image_builds(options.quick)
    create_vm, create_local = summarize(times["microvm"]), summarize(times["local"])
    pss = statistics.median(u[0] for u in usage)
    targets = (
        Target("microVM create from snapshot p50 ≤ 1.0 s", create_vm.p50_ms <= 1000),
        Target("microVM click p50 ≤ 20 ms through REST", click["microvm"].p50_ms <= 20),
        Target("microVM JPEG p50 ≤ 60 ms through REST", jpeg["microvm"].p50_ms <= 60),
        Target("≥ 10 idle microVMs at ≤ 300 MB PSS each", idle >= 10 and pss <= 300),
    )
    return MicroVmResult(
        create_microvm=create_vm,
        create_local=create_local,
        cold_boot_s=cold_boot,
        first_create_s=round(first_create, 2),
        click_microvm=click["microvm"],
        click_local=click["local"],
        click_ratio=round(click["microvm"].p50_ms / click["local"].p50_ms, 2),
        jpeg_microvm=jpeg["microvm"],
        jpeg_local=jpeg["local"],
        jpeg_ratio=round(jpeg["microvm"].p50_ms / jpeg["local"].p50_ms, 2),
        idle_vms=idle,
        pss_mb_per_vm=round(pss, 1),
        pss_mb_total=round(sum(u[0] for u in usage), 1),
        rss_mb_per_vm=round(statistics.median(u[1] for u in usage), 1),
        image_build_cached_s=round(cached, 2),
        image_build_cold_s=None if cold is None else round(cold, 1),
        accel=accel,
        targets=targets,
    )
