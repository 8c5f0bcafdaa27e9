"""`screenshot`: a 1280×800 screenshot of a changing screen, ours against scrot per request.

Ours, end to end: `GET /api/desktops/{id}/screenshot` (JPEG quality 80, and PNG) through
the REST API with a keep-alive httpx client, on a sandboxed desktop: HTTP to the service,
its hop to the guest daemon over a Unix socket, capture (XShm) and encode in the guest.
The service keeps no warm pool (`CUBICLE_WARM_POOL=0`), so no spare boots behind this.

The screen changes all the time while the headline figures are taken: the time marker
(`bench._marker_app`, `small` mode) redraws a code on both desktops every 5 ms. The guest
reuses an encoding only when X DAMAGE says nothing was drawn since (an agent looking twice
at a settled screen), and a changing screen is what a benchmark of capture + encode must
show. A sample the guest answered from that reuse anyway (`X-Screenshot-Cache: hit`: the
marker had not drawn in between) is left out of the changing-screen figures and counted
(`fresh_samples`). Afterwards, with both markers stopped, the still screen's figures
(`unchanged_*`, answered from the reuse) are taken too, and reported apart.

Baseline: what E2B Desktop and the computer-use demo servers do per screenshot: run
`scrot -o file.png` as a subprocess, then read the file back. The sandboxed desktop's X
socket is private to its sandbox, so scrot runs against a host-side reference desktop with
the same XFCE settings (`bench._host`) and the same marker, with no HTTP in front of it
(favours the baseline).

Apples to apples on that one host display: our capture path (`ScreenCapture.screenshot`,
what the guest runs per request) against the scrot path. Rounds interleave all five
measurements; five warm-up requests of each are dropped.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from bench import _inside, _marker, _marker_app
from bench._host import ReferenceSession, reference_session
from bench._run import Options, Target, progress
from bench._service import Service, running_service
from bench._stats import Summary, ratio, summarize
from cubicle.guest.screen import ScreenCapture
from cubicle.protocol.models import ImageFormat

TARGET_JPEG_MS = 15.0
TARGET_PNG_MS = 80.0
TARGET_SPEEDUP = 5.0
_WARMUP = 5
_SETTLE_S = 1.0
"""Idle time after start-up, and after stopping the markers, so that screens hold still."""

Sample = tuple[float, int, bool]
"""(seconds, encoded bytes, answered from the guest's reuse of an unchanged screen)."""


@dataclass(frozen=True)
class ImageBytes:
    """Median encoded size of each kind of screenshot, bytes: a check the pictures compare."""

    rest_jpeg: int
    rest_png: int
    capture_jpeg: int
    capture_png: int
    scrot_png: int


@dataclass(frozen=True)
class FreshSamples:
    """Of the changing-screen samples of each kind, how many were fresh captures (kept)."""

    rest_jpeg: int
    rest_png: int
    capture_jpeg: int
    capture_png: int
    of: int
    """Samples taken of each kind."""


@dataclass(frozen=True)
class ScreenshotResult:
    rest_jpeg: Summary
    """REST end to end on a sandboxed desktop, changing screen, JPEG quality 80."""
    rest_png: Summary
    """REST end to end on a sandboxed desktop, changing screen, PNG."""
    capture_jpeg: Summary
    """Our in-guest capture path, called in-process on the host reference display."""
    capture_png: Summary
    baseline_scrot_png: Summary
    """`scrot -o file.png` subprocess + reading the file, on the host reference display."""
    unchanged_rest_jpeg: Summary
    """REST JPEG of a still screen: the guest answers with its encoding of the last grab."""
    unchanged_rest_png: Summary
    """REST PNG of a still screen: the guest answers with its encoding of the last grab."""
    ratio_p50_jpeg: float
    """scrot p50 / REST JPEG p50."""
    ratio_p50_png: float
    """scrot p50 / REST PNG p50."""
    ratio_p50_capture_jpeg: float
    """scrot p50 / capture-path JPEG p50, same display."""
    ratio_p50_capture_png: float
    """scrot p50 / capture-path PNG p50, same display."""
    ratio_p50_unchanged_png: float
    """scrot p50 / REST PNG p50 of a still screen."""
    image_bytes: ImageBytes
    fresh_samples: FreshSamples
    target: str
    target_met: bool
    targets: tuple[Target, ...]


class _Shots:
    """The five ways of taking a screenshot, each returning a `Sample`."""

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

    def rest(self, fmt: str) -> Sample:
        started = time.perf_counter()
        response = self._service.client.get(self._path, params={"format": fmt, "quality": 80})
        elapsed = time.perf_counter() - started
        if response.status_code != 200 or response.headers["x-image-width"] != "1280":
            raise RuntimeError(f"screenshot failed: {response.status_code} {response.text[:200]}")
        return elapsed, len(response.content), response.headers["x-screenshot-cache"] == "hit"

    def capture(self, fmt: ImageFormat) -> Sample:
        started = time.perf_counter()
        encoded = self._runner.run(self._capture.screenshot(fmt, quality=80))
        return time.perf_counter() - started, len(encoded.data), encoded.cached

    def scrot(self) -> Sample:
        started = time.perf_counter()
        subprocess.run(["scrot", "-o", str(self._file)], env=self._host.env, check=True)
        data = self._file.read_bytes()
        return time.perf_counter() - started, len(data), False

    def round(self) -> dict[str, Sample]:
        return {
            "rest_jpeg": self.rest("jpeg"),
            "rest_png": self.rest("png"),
            "capture_jpeg": self.capture("jpeg"),
            "capture_png": self.capture("png"),
            "scrot_png": self.scrot(),
        }

    def still_round(self) -> dict[str, Sample]:
        return {"rest_jpeg": self.rest("jpeg"), "rest_png": self.rest("png")}


def _measure(shots: _Shots, rounds: int) -> list[dict[str, Sample]]:
    for _ in range(_WARMUP):
        shots.round()
    samples = []
    for index in range(rounds):
        samples.append(shots.round())
        if (index + 1) % 10 == 0:
            progress(f"screenshot: {index + 1}/{rounds} rounds")
    return samples


def _measure_still(shots: _Shots, rounds: int) -> dict[str, list[float]]:
    """Seconds of the still screen's reused answers (one the clock redrew is left out)."""
    samples = [shots.still_round() for _ in range(_WARMUP + rounds)][_WARMUP:]
    reused = {key: [t for t, _, hit in (s[key] for s in samples) if hit] for key in samples[0]}
    if not all(reused.values()):
        raise RuntimeError("the still screen kept changing: no screenshot reused an encoding")
    return reused


def _fresh(samples: list[dict[str, Sample]], key: str) -> list[Sample]:
    kept = [s[key] for s in samples if not s[key][2]]
    if not kept:
        raise RuntimeError(f"no fresh {key} capture: the marker did not change the screen")
    return kept


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


def _host_marker(host: ReferenceSession) -> subprocess.Popen[bytes]:
    mode = "small"
    argv = [_marker_app.__file__, mode, str(_marker.X), str(_marker.Y)]
    argv.append(f"{_marker.PERIOD_MS[mode]:.3f}")
    return subprocess.Popen([sys.executable, *argv], env=host.env)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run(options: Options) -> ScreenshotResult:
    rounds, still_rounds = (15, 5) if options.quick else (50, 20)
    with running_service(CUBICLE_WARM_POOL="0") as service, reference_session() as host:
        info = service.create_desktop()
        progress(f"screenshot: desktop {info.id} and host display {host.display} up")
        inside = _marker.start_marker(service, info.id, "small")
        outside = _host_marker(host)
        shots = _Shots(service, info.id, host)
        try:
            time.sleep(_SETTLE_S)
            samples = _measure(shots, rounds)
            _inside.stop(service, inside)
            _stop(outside)
            time.sleep(_SETTLE_S)
            still = _measure_still(shots, still_rounds)
        finally:
            shots.close()
            _stop(outside)
    kept = {key: _fresh(samples, key) for key in samples[0]}
    summaries = {key: summarize([t for t, _, _ in kept[key]]) for key in kept}
    sizes = {key: int(statistics.median(n for _, n, _ in kept[key])) for key in kept}
    unchanged = {key: summarize(seconds) for key, seconds in still.items()}
    jpeg, png, scrot = summaries["rest_jpeg"], summaries["rest_png"], summaries["scrot_png"]
    targets = _targets(jpeg, png, scrot)
    return ScreenshotResult(
        rest_jpeg=jpeg,
        rest_png=png,
        capture_jpeg=summaries["capture_jpeg"],
        capture_png=summaries["capture_png"],
        baseline_scrot_png=scrot,
        unchanged_rest_jpeg=unchanged["rest_jpeg"],
        unchanged_rest_png=unchanged["rest_png"],
        ratio_p50_jpeg=ratio(scrot, jpeg),
        ratio_p50_png=ratio(scrot, png),
        ratio_p50_capture_jpeg=ratio(scrot, summaries["capture_jpeg"]),
        ratio_p50_capture_png=ratio(scrot, summaries["capture_png"]),
        ratio_p50_unchanged_png=ratio(scrot, unchanged["rest_png"]),
        image_bytes=ImageBytes(**sizes),
        fresh_samples=FreshSamples(
            **{key: len(kept[key]) for key in kept if key != "scrot_png"}, of=len(samples)
        ),
        target="; ".join(t.description for t in targets),
        target_met=all(t.met for t in targets),
        targets=targets,
    )
