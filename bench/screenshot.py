"""`screenshot`: a 1280×800 screenshot, ours against the scrot-per-request way.

Ours, end to end: `GET /api/desktops/{id}/screenshot` (JPEG quality 80, and PNG) through
the REST API with a keep-alive httpx client, on a sandboxed desktop: HTTP to the service,
its hop to the guest daemon over a Unix socket, capture (XShm) and encode in the guest.
The service keeps no warm pool (`CUBICLE_WARM_POOL=0`), so no spare boots behind this.

Baseline: what E2B Desktop and the computer-use demo servers do per screenshot: run
`scrot -o file.png` as a subprocess, then read the file back. The sandboxed desktop's X
socket is private to its sandbox, so scrot runs against a host-side reference desktop with
the same XFCE settings (`bench._host`), with no HTTP in front of it (favours the baseline).

Apples to apples on that one host display: our capture path (`ScreenCapture.screenshot`,
what the guest runs per request) against the scrot path. Rounds interleave all five
measurements; five warm-up requests of each are dropped.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time
from dataclasses import dataclass

from bench._host import ReferenceSession, reference_session
from bench._run import Options, Target, progress
from bench._service import Service, running_service
from bench._stats import Summary, ratio, summarize
from desktop.guest.screen import ImageFormat, ScreenCapture

TARGET_JPEG_MS = 15.0
TARGET_PNG_MS = 80.0
TARGET_SPEEDUP = 5.0
_WARMUP = 5
_SETTLE_S = 1.0
"""Idle time after start-up before measuring, so both screens hold still."""


@dataclass(frozen=True)
class ImageBytes:
    """Median encoded size of each kind of screenshot, bytes: a check the pictures compare."""

    rest_jpeg: int
    rest_png: int
    capture_jpeg: int
    capture_png: int
    scrot_png: int


@dataclass(frozen=True)
class ScreenshotResult:
    rest_jpeg: Summary
    """REST end to end on a sandboxed desktop, JPEG quality 80."""
    rest_png: Summary
    """REST end to end on a sandboxed desktop, PNG."""
    capture_jpeg: Summary
    """Our in-guest capture path, called in-process on the host reference display."""
    capture_png: Summary
    baseline_scrot_png: Summary
    """`scrot -o file.png` subprocess + reading the file, on the host reference display."""
    ratio_p50_jpeg: float
    """scrot p50 / REST JPEG p50."""
    ratio_p50_png: float
    """scrot p50 / REST PNG p50."""
    ratio_p50_capture_jpeg: float
    """scrot p50 / capture-path JPEG p50, same display."""
    ratio_p50_capture_png: float
    """scrot p50 / capture-path PNG p50, same display."""
    image_bytes: ImageBytes
    target: str
    target_met: bool
    targets: tuple[Target, ...]


class _Shots:
    """The five ways of taking a screenshot, each returning (seconds, encoded bytes)."""

    def __init__(self, service: Service, desktop_id: str, host: ReferenceSession) -> None:
        self._service = service
        self._path = f"/api/desktops/{desktop_id}/screenshot"
        self._host = host
        self._file = host.root / "scrot.png"
        self._runner = asyncio.Runner()
        self._capture = ScreenCapture(host.display)

    def close(self) -> None:
        self._capture.close()
        self._runner.close()

    def rest(self, fmt: str) -> tuple[float, int]:
        started = time.perf_counter()
        response = self._service.client.get(self._path, params={"format": fmt, "quality": 80})
        elapsed = time.perf_counter() - started
        if response.status_code != 200 or response.headers["x-image-width"] != "1280":
            raise RuntimeError(f"screenshot failed: {response.status_code} {response.text[:200]}")
        return elapsed, len(response.content)

    def capture(self, fmt: ImageFormat) -> tuple[float, int]:
        started = time.perf_counter()
        encoded = self._runner.run(self._capture.screenshot(fmt, quality=80))
        return time.perf_counter() - started, len(encoded.data)

    def scrot(self) -> tuple[float, int]:
        started = time.perf_counter()
        subprocess.run(["scrot", "-o", str(self._file)], env=self._host.env, check=True)
        data = self._file.read_bytes()
        return time.perf_counter() - started, len(data)

    def round(self) -> dict[str, tuple[float, int]]:
        return {
            "rest_jpeg": self.rest("jpeg"),
            "rest_png": self.rest("png"),
            "capture_jpeg": self.capture("jpeg"),
            "capture_png": self.capture("png"),
            "scrot_png": self.scrot(),
        }


def _measure(shots: _Shots, rounds: int) -> list[dict[str, tuple[float, int]]]:
    for _ in range(_WARMUP):
        shots.round()
    samples = []
    for index in range(rounds):
        samples.append(shots.round())
        if (index + 1) % 10 == 0:
            progress(f"screenshot: {index + 1}/{rounds} rounds")
    return samples


def _targets(jpeg: Summary, png: Summary, scrot: Summary) -> tuple[Target, Target, Target, Target]:
    return (
        Target(f"REST JPEG p50 <= {TARGET_JPEG_MS:.0f} ms", jpeg.p50_ms <= TARGET_JPEG_MS),
        Target(f"REST PNG p50 <= {TARGET_PNG_MS:.0f} ms", png.p50_ms <= TARGET_PNG_MS),
        Target(
            f"REST JPEG >= {TARGET_SPEEDUP:.0f}x faster than scrot (p50)",
            ratio(scrot, jpeg) >= TARGET_SPEEDUP,
        ),
        Target(
            f"REST PNG >= {TARGET_SPEEDUP:.0f}x faster than scrot (p50)",
            ratio(scrot, png) >= TARGET_SPEEDUP,
        ),
    )


def run(options: Options) -> ScreenshotResult:
    rounds = 15 if options.quick else 50
    with running_service(CUBICLE_WARM_POOL="0") as service, reference_session() as host:
        info = service.create_desktop()
        progress(f"screenshot: desktop {info.id} and host display {host.display} up")
        time.sleep(_SETTLE_S)
        shots = _Shots(service, info.id, host)
        try:
            samples = _measure(shots, rounds)
        finally:
            shots.close()
    summaries = {key: summarize([s[key][0] for s in samples]) for key in samples[0]}
    sizes = {key: int(statistics.median(s[key][1] for s in samples)) for key in samples[0]}
    jpeg, png, scrot = summaries["rest_jpeg"], summaries["rest_png"], summaries["scrot_png"]
    targets = _targets(jpeg, png, scrot)
    return ScreenshotResult(
        rest_jpeg=jpeg,
        rest_png=png,
        capture_jpeg=summaries["capture_jpeg"],
        capture_png=summaries["capture_png"],
        baseline_scrot_png=scrot,
        ratio_p50_jpeg=ratio(scrot, jpeg),
        ratio_p50_png=ratio(scrot, png),
        ratio_p50_capture_jpeg=ratio(scrot, summaries["capture_jpeg"]),
        ratio_p50_capture_png=ratio(scrot, summaries["capture_png"]),
        image_bytes=ImageBytes(**sizes),
        target="; ".join(t.description for t in targets),
        target_met=all(t.met for t in targets),
        targets=targets,
    )
