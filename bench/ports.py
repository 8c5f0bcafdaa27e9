"""`ports`: a desktop's port through the service, beside a direct connection to the same
program.

The program is `tests/desktop/port_app.py` under uvicorn, run twice with the same
interpreter: inside a desktop (reached through the service: its port proxy, the desktop's
guest relay) and on the host (reached directly, the baseline). Measured in one run:

- a small GET on one keep-alive connection (`http.client`), p50/p95, by E2B's headers and by
  host name, beside direct; the target is at most 1 ms added at the median;
- a 200 MiB download (`http.client`, 1 MiB reads), MB/s, by headers and by host name,
  beside direct; the target is at least half of direct's;
- a WebSocket echo round trip, by headers, beside direct;
- Playwright `connect_over_cdp` to the desktop's Chromium plus one `page.goto`.

The egress proxy's added latency (rules by name, a secret injected) is `bench egress`'s.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from websockets.sync.client import connect as ws_connect

from bench._run import Options, Target, progress
from bench._service import Service, running_service
from bench._stats import Summary, summarize, timed

APP = Path(__file__).resolve().parents[1] / "tests" / "desktop" / "port_app.py"
INSIDE_PORT = 8000
TARGET_ADDED_P50_MS = 1.0
TARGET_THROUGHPUT = 0.5


@dataclass(frozen=True)
class Throughput:
    mb_per_s: float
    """Median of the runs, MiB/s."""
    runs: list[float]


@dataclass(frozen=True)
class PortsResult:
    get_direct: Summary
    get_headers: Summary
    get_host: Summary
    added_p50_ms_headers: float
    added_p50_ms_host: float
    download_mb: int
    download_direct: Throughput
    download_headers: Throughput
    download_host: Throughput
    ws_echo_direct: Summary
    ws_echo_headers: Summary
    cdp_connect_and_goto: Summary
    """`connect_over_cdp(url)` and one `page.goto` of a small page, through the service."""
    targets: list[Target]


class _Way:
    """One way to the program: a keep-alive connection and the headers that address it."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.port = port
        self.headers = headers
        self.http = http.client.HTTPConnection("127.0.0.1", port)

    def get(self, path: str) -> bytes:
        self.http.request("GET", path, headers=self.headers)
        answer = self.http.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"GET {path}: {answer.status} {body[:200]!r}")
        return body

    def download(self, mb: int) -> float:
        """Seconds to read `mb` MiB on a fresh connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port)
        started = time.perf_counter()
        conn.request("GET", f"/big?mb={mb}", headers=self.headers)
        answer = conn.getresponse()
        size = 0
        while chunk := answer.read(1 << 20):
            size += len(chunk)
        elapsed = time.perf_counter() - started
        conn.close()
        if size != mb << 20:
            raise RuntimeError(f"downloaded {size} bytes of {mb << 20}")
        return elapsed

    def close(self) -> None:
        self.http.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_inside(service: Service, desktop_id: str) -> None:
    client = service.client
    files = f"/api/desktops/{desktop_id}/files"
    client.put(files, params={"path": "/tmp/port_app.py"}, content=APP.read_bytes())
    command = (
        f"cd /tmp && (setsid {sys.executable} -m uvicorn port_app:app --host 127.0.0.1 "
        f"--port {INSIDE_PORT} --log-level warning > /tmp/port_app.log 2>&1 &)"
    )
    client.post(f"/api/desktops/{desktop_id}/exec", json={"command": command}).raise_for_status()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ports = client.get(f"/api/desktops/{desktop_id}/ports").json()
        if any(p["port"] == INSIDE_PORT for p in ports):
            return
        time.sleep(0.2)
    raise RuntimeError("port_app did not start inside the desktop")


def _throughput(way: _Way, mb: int, runs: int) -> Throughput:
    speeds = sorted(round(mb / way.download(mb), 1) for _ in range(runs))
    return Throughput(mb_per_s=speeds[len(speeds) // 2], runs=speeds)


def _ws_echo(url: str, headers: dict[str, str], n: int) -> list[float]:
    with ws_connect(url, additional_headers=headers) as ws:
        for _ in range(10):
            ws.send("warm")
            ws.recv(timeout=10)
        return timed(lambda: (ws.send("ping"), ws.recv(timeout=10)), n)


def _cdp(service: Service, desktop_id: str, n: int) -> list[float]:
    from playwright.sync_api import sync_playwright

    url = service.client.post(f"/api/desktops/{desktop_id}/browser/cdp", json={}, timeout=120)
    url.raise_for_status()
    endpoint = url.json()["url"]
    samples = []
    with sync_playwright() as playwright:
        for _ in range(n + 1):  # the first opens the tab the others reuse: not counted
            started = time.perf_counter()
            browser = playwright.chromium.connect_over_cdp(endpoint, timeout=60_000)
            context = browser.contexts[0]
            page = context.pages[0] if context.pages else context.new_page()
            page.goto("data:text/html,<h1>cubicle</h1>")
            samples.append(time.perf_counter() - started)
            browser.close()
    return samples[1:]


def run(options: Options) -> PortsResult:
    n = 200 if options.quick else 2000
    mb, runs = (50, 3) if options.quick else (200, 5)
    direct_port = _free_port()
    argv = [sys.executable, "-m", "uvicorn", "port_app:app", "--app-dir", str(APP.parent)]
    host_app = subprocess.Popen(
        [*argv, "--host", "127.0.0.1", "--port", str(direct_port), "--log-level", "warning"],
        start_new_session=True,
    )
    try:
        with running_service(CUBICLE_WARM_POOL="0") as service:
            desktop = service.create_desktop()
            _start_inside(service, desktop.id)
            service_port = urlsplit(service.url).port
            assert service_port is not None
            token = {"X-Access-Token": service.token}
            by_headers = {
                "E2b-Sandbox-Id": desktop.id,
                "E2b-Sandbox-Port": str(INSIDE_PORT),
                **token,
            }
            by_host = {"Host": f"{INSIDE_PORT}-{desktop.id}.cubicle.localhost:{service_port}"}
            ways = {
                "direct": _Way(direct_port, {}),
                "headers": _Way(service_port, by_headers),
                "host": _Way(service_port, {**by_host, **token}),
            }
            for way in ways.values():
                for _ in range(50):
                    way.get("/")
            progress(f"ports: {n} small GETs each way, interleaved")
            samples: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(n):
                for name, way in ways.items():
                    samples[name] += timed(lambda way=way: way.get("/"), 1)
            progress(f"ports: {runs} downloads of {mb} MiB each way")
            speeds = {name: _throughput(way, mb, runs) for name, way in ways.items()}
            for way in ways.values():
                way.close()
            progress("ports: WebSocket echo")
            ws_n = n // 4
            ws_direct = _ws_echo(f"ws://127.0.0.1:{direct_port}/ws", {}, ws_n)
            ws_headers = _ws_echo(f"ws://127.0.0.1:{service_port}/ws", by_headers, ws_n)
            progress("ports: CDP")
            cdp = _cdp(service, desktop.id, 3 if options.quick else 10)
    finally:
        os.killpg(host_app.pid, signal.SIGTERM)
        host_app.wait(timeout=10)
    get = {name: summarize(values) for name, values in samples.items()}
    added_headers = round(get["headers"].p50_ms - get["direct"].p50_ms, 3)
    added_host = round(get["host"].p50_ms - get["direct"].p50_ms, 3)
    direct_speed = speeds["direct"].mb_per_s
    return PortsResult(
        get_direct=get["direct"],
        get_headers=get["headers"],
        get_host=get["host"],
        added_p50_ms_headers=added_headers,
        added_p50_ms_host=added_host,
        download_mb=mb,
        download_direct=speeds["direct"],
        download_headers=speeds["headers"],
        download_host=speeds["host"],
        ws_echo_direct=summarize(ws_direct),
        ws_echo_headers=summarize(ws_headers),
        cdp_connect_and_goto=summarize(cdp),
        targets=[
            Target(
                f"added p50 <= {TARGET_ADDED_P50_MS} ms (headers and host)",
                max(added_headers, added_host) <= TARGET_ADDED_P50_MS,
            ),
            Target(
                f"download >= {TARGET_THROUGHPUT:.0%} of direct (headers and host)",
                min(speeds["headers"].mb_per_s, speeds["host"].mb_per_s)
                >= TARGET_THROUGHPUT * direct_speed,
            ),
        ],
    )
