"""`live`: the live view against x11vnc + noVNC, on the same desktop, in the same Chromium.

`python -m bench live [--quick]` (or `python -m bench.live`) prints the JSON result.

One sandboxed desktop (1280×800) is watched two ways, in rounds that alternate which goes
first: ours (the service's viewer page: WebRTC, H.264 encoded once in the guest) and the
reference products' (x11vnc inside the desktop with the options E2B Desktop passes it,
websockify and noVNC 1.3 on the host, see `bench._novnc`), each page in headless Chromium
(`/usr/bin/chromium`), only one at a time. Last, noVNC's latency is measured once more with
x11vnc on its own defaults (`novnc_x11vnc_defaults`), which poll the screen more often than
any reference product lets it.

- Latency: a marker program in the desktop (`bench._marker_app`) draws the wall-clock time
  (ms) as black/white squares every 5 ms; the page reads them back off the picture it shows
  on every animation frame and takes `now − drawn` each time the code changes (same
  clock: the sandbox shares the host's). The rest of the screen holds still. Samples are
  also taken while the whole screen scrolls (`latency_while_moving`).
- Frame rate and bandwidth: the marker's `full` mode scrolls a busy full-screen texture at
  60 Hz (every pixel changes every frame). `page_fps` is distinct codes seen by the page
  per second (the same count for both; at most one per page frame); ours also reports
  `<video>` frames presented (requestVideoFrameCallback). Bandwidth is what the page
  received: RTP payload + headers, or WebSocket message payloads.
- CPU: utime + stime of the service's process tree and of every process in the desktop's
  pids cgroup (split by program), plus websockify's for noVNC, over fixed windows: with the
  page as the one viewer, then with four extra viewers (`bench._viewers`: aiortc peers, or
  RFB clients with noVNC's encodings, neither decoding), then with the page alone again;
  `five_over_one` divides by the mean of both one-viewer windows, so that drift in the
  machine's load evens out. Browsers and extra viewers are not counted. `whole` is all of
  a stack: ours = service + desktop (x11vnc excluded: it idles); noVNC = desktop (guest
  daemon idle) + x11vnc + websockify (our service, idle, excluded). `streaming` is the
  transport alone: service + guest daemon, or x11vnc + websockify. `static`: marker
  stopped, one viewer.

A page that leaves closes its peer connection (or socket) first, and the next page opens
only once nothing streams any more (`teardown_s`), so each window measures one transport.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from playwright.sync_api import Browser, sync_playwright

from bench import _inside
from bench._cpu import CpuWindow, cmdline, descendants
from bench._live_report import (
    encoder_delta,
    latency_figures,
    per_frame,
    targets,
    transport_figures,
)
from bench._marker import start_marker
from bench._novnc import VncStack, vnc_stack
from bench._pages import CHROMIUM_ARGS, KINDS, Kind, ViewerPage, open_page
from bench._run import progress
from bench._service import Service, desktop_pids, running_service
from bench._viewers import extra_viewers

EXTRA_VIEWERS = 4
DEFINITIONS = {
    "latency": "page-read time minus drawn time of the marker (ms), marker alone on a still "
    "screen; latency_while_moving: the same with the whole screen scrolling",
    "latency_stages": "ours, per latency sample: drawn → last packet of the frame received, "
    "→ frame presented to the compositor (requestVideoFrameCallback receiveTime and "
    "presentationTime), → read by the page (the latency itself)",
    "page_fps": "distinct marker codes the page saw per second, whole screen scrolling at 60 Hz",
    "video_fps": "<video> frames presented per second (requestVideoFrameCallback)",
    "kbit_per_s": "what the page received: RTP payload + headers, or WebSocket payloads",
    "cpu_cores.whole": "ours: service tree + desktop cgroup without x11vnc; noVNC: desktop "
    "cgroup (x11vnc included) + websockify; browsers and extra viewers not counted",
    "cpu_cores.streaming": "ours: service + guest daemon; noVNC: x11vnc + websockify",
    "five_viewers": "the page plus 4 non-decoding clients (aiortc peers, or RFB clients with "
    "noVNC's encodings through websockify)",
    "five_over_one": "whole CPU with 5 viewers over the mean of the one-viewer windows before "
    "and after; ..._per_encoded_frame: the same per frame the guest encoded in each window "
    "(discounts windows in which the machine's load starved the encoder)",
    "static": "marker stopped, one page connected",
    "clock_check_ms": "page Date.now() minus host time.time(), per page, from the quickest "
    "of 5 calls (same kernel clock: expect ~0, within half a round trip)",
}
_DEFAULTS = "novnc_x11vnc_defaults"
IDLE_TIMEOUT_S = 40.0
"""Seconds to wait, after a page left, for the streaming to stop."""


@dataclass(frozen=True)
class Plan:
    latency_rounds: int
    samples_per_round: int
    static_rounds: int
    motion_rounds: int
    window_s: float
    """Seconds of each CPU / frame-rate window."""
    settle_s: float

    @classmethod
    def of(cls, quick: bool) -> Plan:
        return cls(1, 40, 1, 1, 4.0, 1.0) if quick else cls(3, 80, 2, 2, 10.0, 2.0)


def _cpu_groups(service: Service, desktop_id: str, vnc: VncStack) -> dict[str, Any]:
    def desktop(name: str):
        return lambda: [p for p in desktop_pids(desktop_id) if _program(p) == name]

    def service_tree() -> set[int]:
        return descendants(service.launched.process.pid) - set(desktop_pids(desktop_id))

    programs = ("guest", "xvfb", "marker", "x11vnc", "desktop_other")
    return {
        "service": service_tree,
        **{name: desktop(name) for name in programs},
        "websockify": vnc.websockify_pids,
    }


def _program(pid: int) -> str:
    line = cmdline(pid)
    if "cubicle.guest" in line:
        return "guest"
    if line.startswith("Xvfb"):
        return "xvfb"
    if "bench-marker" in line:
        return "marker"
    if line.startswith("x11vnc"):
        return "x11vnc"
    return "desktop_other"


def _totals(kind: Kind, cores: dict[str, float]) -> tuple[float, float]:
    """(whole stack, streaming alone) in cores."""
    common = cores["guest"] + cores["xvfb"] + cores["marker"] + cores["desktop_other"]
    if kind == "ours":
        return cores["service"] + common, cores["service"] + cores["guest"]
    vnc = cores["x11vnc"] + cores["websockify"]
    return vnc + common, vnc


def _rate(a: float, b: float, seconds: float) -> float:
    return (b - a) / seconds if seconds > 0 else 0.0


def _clock_offset_ms(page: ViewerPage, tries: int = 5) -> float:
    """The page's `Date.now()` minus the host's `time.time()`, from the quickest of a few
    round trips (so it is off by at most half that round trip)."""
    best = (float("inf"), 0.0)
    for _ in range(tries):
        before = time.time()
        page_now = page.page.evaluate("Date.now()")
        after = time.time()
        best = min(best, (after - before, page_now - (before + after) / 2 * 1000))
    return best[1]


def _order(round_number: int, kinds: tuple[Kind, ...] = KINDS) -> Iterable[Kind]:
    return kinds if round_number % 2 == 0 else tuple(reversed(kinds))


class _Run:
    """One benchmark run: the service, its desktop, the VNC stack and the browser."""

    def __init__(self, plan: Plan, service: Service, desktop_id: str, vnc: VncStack) -> None:
        self.plan, self.service, self.desktop_id, self.vnc = plan, service, desktop_id, vnc
        self.groups = _cpu_groups(service, desktop_id, vnc)
        self.browser: Browser | None = None
        self.data: dict[str, dict[str, list]] = {k: {} for k in KINDS}
        """Samples by kind, and by a label of its own for a second noVNC configuration."""
        self.clock_checks_ms: list[float] = []

    def close(self, kind: Kind, page: ViewerPage) -> None:
        """Close the page, then wait until nothing streams any more (so that the next
        window measures one transport only); keeps how long that took."""
        page.close()
        started = time.monotonic()
        while time.monotonic() - started < IDLE_TIMEOUT_S:
            live = self.service.client.get(f"/api/desktops/{self.desktop_id}/live").json()
            streaming = live["viewers"] or (live["encoder"] or {}).get("encoder_running")
            if not streaming and len(self.vnc.websockify_pids()) <= 1:
                break
            time.sleep(0.1)
        else:
            progress(f"live: still streaming {IDLE_TIMEOUT_S:.0f} s after the {kind} page left")
        self.keep(kind, "teardown_s", round(time.monotonic() - started, 2))

    def keep(self, kind: str, name: str, value: Any) -> None:
        self.data.setdefault(kind, {}).setdefault(name, []).append(value)

    def open(self, kind: Kind, *, marker: bool = True) -> ViewerPage:
        assert self.browser is not None
        browser, service, desktop_id = self.browser, self.service, self.desktop_id
        page = open_page(kind, browser, service, desktop_id, self.vnc, marker=marker)
        self.clock_checks_ms.append(_clock_offset_ms(page))
        return page

    def cpu(self, kind: Kind, name: str, window_s: float) -> tuple[float, float]:
        """Measure one CPU window and keep it; returns the whole stack's cores and the
        frames per second the guest's encoder produced meanwhile (0 for noVNC)."""
        window = CpuWindow(self.groups)
        encoded = self.encoder_stats()["frames_encoded"]
        window.start()
        started = time.monotonic()
        time.sleep(window_s)
        cores = window.stop()
        encoded_fps = (self.encoder_stats()["frames_encoded"] - encoded) / (
            time.monotonic() - started
        )
        whole, streaming = _totals(kind, cores)
        self.keep(kind, f"cpu_{name}", cores)
        self.keep(kind, f"whole_{name}", whole)
        self.keep(kind, f"streaming_{name}", streaming)
        self.keep(kind, f"encoded_fps_{name}", encoded_fps)
        return whole, encoded_fps

    def connections(self, kind: Kind) -> int:
        """Viewers of the service, or websockify's processes (one per connection, HTTP
        keep-alive ones of the page included, plus websockify itself)."""
        if kind == "ours":
            live = self.service.client.get(f"/api/desktops/{self.desktop_id}/live").json()
            return len(live["viewers"])
        return len(self.vnc.websockify_pids())

    def wait_for_connections(self, kind: Kind, count: int, timeout_s: float = 20) -> None:
        """Until at most `count` connections are left (the extra viewers are gone)."""
        deadline = time.monotonic() + timeout_s
        while (now := self.connections(kind)) > count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{now} {kind} connections after {timeout_s} s, not {count}")
            time.sleep(0.1)

    def latency_rounds(self, kinds: tuple[Kind, ...] = KINDS, label: str = "") -> None:
        """Latency samples of each kind in turn; kept under `label` instead if given."""
        marker = start_marker(self.service, self.desktop_id, "small")
        for number in range(self.plan.latency_rounds):
            for kind in _order(number, kinds):
                progress(f"live: latency round {number + 1}, {label or kind}")
                page = self.open(kind)
                try:
                    time.sleep(self.plan.settle_s)
                    start, encoder = page.reading(), self.encoder_stats()
                    receiver = page.receiver() if kind == "ours" else {}
                    count = start.latencies_ms + self.plan.samples_per_round
                    page.wait_for_samples(count, timeout_s=self.plan.samples_per_round / 4 + 10)
                    end = page.reading()
                    latencies = page.latencies_ms(start, end)
                    self.keep(label or kind, "latency", latencies)
                    self.keep(label or kind, "latency_p50", statistics.median(latencies))
                    self.keep(label or kind, "invalid_reads", end.invalid - start.invalid)
                    if kind == "ours":
                        self.keep(kind, "latency_stages", page.latency_stages_ms(start, end))
                        self.keep(kind, "receiver_still", per_frame(receiver, page.receiver()))
                        self.keep(
                            kind, "encoder_still", encoder_delta(encoder, self.encoder_stats())
                        )
                finally:
                    self.close(kind, page)
        _inside.stop(self.service, marker)

    def static_rounds(self) -> None:
        for number in range(self.plan.static_rounds):
            for kind in _order(number):
                progress(f"live: static screen round {number + 1}, {kind}")
                page = self.open(kind, marker=False)
                try:
                    time.sleep(self.plan.settle_s)
                    self.cpu(kind, "static", self.plan.window_s)
                finally:
                    self.close(kind, page)

    def motion_rounds(self) -> None:
        marker = start_marker(self.service, self.desktop_id, "full")
        for number in range(self.plan.motion_rounds):
            for kind in _order(number):
                progress(f"live: moving screen round {number + 1}, {kind}: 1, 5, 1 viewers")
                page = self.open(kind)
                try:
                    self.motion_round(kind, page)
                finally:
                    self.close(kind, page)
        _inside.stop(self.service, marker)

    def motion_round(self, kind: Kind, page: ViewerPage) -> None:
        window = self.plan.window_s
        time.sleep(self.plan.settle_s)
        start, encoder = page.reading(), self.encoder_stats()
        receiver = page.receiver() if kind == "ours" else {}
        one, one_fps = self.cpu(kind, "one", window)
        end = page.reading()
        if kind == "ours":
            self.keep(kind, "encoder_moving", encoder_delta(encoder, self.encoder_stats()))
            self.keep(kind, "receiver_moving", per_frame(receiver, page.receiver()))
        seconds = end.at_s - start.at_s
        self.keep(kind, "page_fps", _rate(start.changes, end.changes, seconds))
        self.keep(kind, "video_fps", _rate(start.presented, end.presented, seconds))
        self.keep(kind, "kbit_per_s", _rate(start.bytes, end.bytes, seconds) * 8 / 1000)
        self.keep(kind, "latency_moving", page.latencies_ms(start, end))
        if kind == "ours":
            argv = ["webrtc", self.service.url, self._token(), self.desktop_id]
        else:
            argv = ["vnc", self.vnc.ws_url]
        connections = self.connections(kind)
        with extra_viewers([*argv, str(EXTRA_VIEWERS)]) as extra:
            progress(f"live: {EXTRA_VIEWERS} extra {kind} viewers connected")
            time.sleep(self.plan.settle_s)
            start, extra_start = page.reading(), extra.report()
            five, five_fps = self.cpu(kind, "five", window)
            end, extra_end = page.reading(), extra.report()
        seconds = end.at_s - start.at_s
        extra_s = extra_end["at_s"] - extra_start["at_s"]
        self.keep(kind, "page_fps_five", _rate(start.changes, end.changes, seconds))
        pictures = _rate(extra_start["pictures"], extra_end["pictures"], extra_s)
        self.keep(kind, "extra_pictures_per_s", pictures / EXTRA_VIEWERS)
        kbits = _rate(extra_start["bytes"], extra_end["bytes"], extra_s) * 8 / 1000
        self.keep(kind, "extra_kbit_per_s", kbits / EXTRA_VIEWERS)
        # One viewer again (A-B-A), so that drift in the machine's load evens out.
        self.wait_for_connections(kind, connections)
        time.sleep(self.plan.settle_s)
        again, again_fps = self.cpu(kind, "one", window)
        self.keep(kind, "five_over_one", five / ((one + again) / 2))
        if kind == "ours" and min(one_fps, five_fps, again_fps) > 0:  # per frame encoded
            one_per_frame = (one / one_fps + again / again_fps) / 2
            self.keep(kind, "five_over_one_per_frame", five / five_fps / one_per_frame)

    def _token(self) -> str:
        return self.service.client.headers["authorization"].split()[1]

    def encoder_stats(self) -> dict[str, float]:
        """The guest's `GET /frames/stats` (all of it: the service passes on only a part)."""
        socket = _inside.guest_socket(self.service, self.desktop_id)
        transport = httpx.HTTPTransport(uds=str(socket))
        with httpx.Client(transport=transport, base_url="http://guest", timeout=10) as guest:
            return guest.get("/frames/stats").raise_for_status().json()


def run(quick: bool = False) -> dict[str, Any]:
    """The whole comparison; `quick`: one round of each, shorter windows (under 2 min)."""
    plan = Plan.of(quick)
    load_start = os.getloadavg()
    with (
        running_service(CUBICLE_WARM_POOL="0") as service,
        sync_playwright() as playwright,
    ):
        desktop = service.create_desktop()
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
        )
        try:
            with vnc_stack(service, desktop.id, "reference") as vnc:
                run = _Run(plan, service, desktop.id, vnc)
                run.browser = browser
                run.latency_rounds()
                run.static_rounds()
                run.motion_rounds()
                commands = {
                    "x11vnc": " ".join(vnc.x11vnc.argv),
                    "websockify": " ".join(vnc.websockify_argv),
                    "novnc_page": vnc.page_url,
                    "chromium": ["/usr/bin/chromium", "--headless", *CHROMIUM_ARGS],
                }
            with vnc_stack(service, desktop.id, "defaults") as vnc:
                run.vnc = vnc
                run.latency_rounds(kinds=("novnc",), label=_DEFAULTS)
                commands["x11vnc_defaults"] = " ".join(vnc.x11vnc.argv)
        finally:
            browser.close()
    ours, novnc = (transport_figures(kind, run.data[kind]) for kind in KINDS)
    defaults = latency_figures(run.data[_DEFAULTS])
    return {
        "screen": "1280x800",
        "plan": asdict(plan),
        "load_avg_start": [round(x, 2) for x in load_start],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "clock_check_ms": [round(x, 1) for x in run.clock_checks_ms],
        "ours": ours,
        "novnc": novnc,
        _DEFAULTS: defaults,
        "novnc_over_ours": {
            "latency_p50": round(novnc["latency"]["p50_ms"] / ours["latency"]["p50_ms"], 2),
            "latency_p50_x11vnc_defaults": round(
                defaults["latency"]["p50_ms"] / ours["latency"]["p50_ms"], 2
            ),
            "page_fps": round(novnc["page_fps"] / ours["page_fps"], 2),
            "kbit_per_s": round(novnc["kbit_per_s"] / ours["kbit_per_s"], 2),
            "cpu_one_viewer": round(
                novnc["cpu_cores"]["one_viewer"] / ours["cpu_cores"]["one_viewer"], 2
            ),
            "cpu_five_viewers": round(
                novnc["cpu_cores"]["five_viewers"] / ours["cpu_cores"]["five_viewers"], 2
            ),
        },
        "commands": commands,
        "definitions": DEFINITIONS,
        "targets": [asdict(t) for t in targets(ours, novnc)],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.live")
    parser.add_argument("--quick", action="store_true")
    result = run(parser.parse_args().quick)
    json.dump(result, sys.stdout, indent=2)
    print()
