"""`click`: one left click, ours against a subprocess per action (xdotool, pyautogui).

Ours, end to end: `POST /api/desktops/{id}/actions` with one `click` on an empty part of a
sandboxed desktop, answered once the guest daemon has sent the XTest events to the X server,
on a service without a warm pool (`CUBICLE_WARM_POOL=0`: no spare boots behind this). The
client is the standard library's `http.client` on one keep-alive connection, so the figure
is the API's and not a client library's. Beside it, the same click through httpx (a
keep-alive `httpx.Client`: what httpx adds) and through the Python SDK (`Desktop.left_click`,
blocking, which runs the async client on its loop thread: what an SDK user sees). To show
where the time goes, the same click is also sent straight to the guest daemon's Unix socket
(skipping the service), the service's bare `GET /healthz` is timed, both with `http.client`,
and the guest's own `elapsed_ms` for each REST click is kept.

Baselines, on a host-side reference desktop (`bench._host`; the sandbox's X socket is not
reachable from the host), with no HTTP in front of them (favours the baselines):
- E2B Desktop / computer-use demo: `xdotool mousemove X Y click 1` as a subprocess.
- OSWorld: `python -c "import pyautogui; import time; pyautogui.FAILSAFE = False;
  pyautogui.click(X, Y)"` as a subprocess, OSWorld's exact command prefix. pyautogui's
  default 0.1 s pause after each call is part of that command, as in OSWorld. Where
  tkinter is missing, `import pyautogui` exits (its `mouseinfo` import calls sys.exit), so
  the command first blocks `mouseinfo`, which skips importing tkinter: that favours the
  baseline. The command run is in the result.

Apples to apples on that one host display: our `InputController.click` in-process. Clicks
alternate between two points 40 px apart so no two make a double click. Each round takes
one sample of every way, in an order that turns by one from round to round; pyautogui, at
~0.5 s per click, runs in every few rounds only.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx
from Xlib.display import Display

from bench._host import ReferenceSession, reference_session
from bench._run import Options, Target, progress
from bench._service import Service, running_service
from bench._stats import Summary, ratio, summarize
from cubicle.client.sdk import Desktop
from cubicle.guest.input import InputController

TARGET_P50_MS = 3.0
TARGET_SPEEDUP = 5.0
POINTS = ((620, 420), (660, 420))
"""Screen pixels in the empty middle of the desktop, 40 px apart."""
_WARMUP = 5
_OSWORLD_PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; "
_NO_MOUSEINFO = "import sys; sys.modules['mouseinfo'] = None; "
"""Lets pyautogui import without tkinter (mouseinfo, which needs it, is optional to it)."""


def pyautogui_command(x: int, y: int) -> str:
    """OSWorld's command for a click at (x, y), made importable where tkinter is missing."""
    command = f"{_OSWORLD_PREFIX}pyautogui.click({x}, {y})"
    return command if importlib.util.find_spec("_tkinter") else _NO_MOUSEINFO + command


@dataclass(frozen=True)
class ClickResult:
    ours: Summary
    """REST end to end on a sandboxed desktop, with `http.client`."""
    ours_httpx: Summary
    """The same REST click with httpx."""
    ours_sdk: Summary
    """The same through the SDK: `Desktop.left_click(x, y)`."""
    ours_guest_elapsed: Summary
    """The guest's own time for the click (XTest + X round trip), from the same requests."""
    breakdown_guest_socket: Summary
    """The same click POSTed straight to the guest daemon's socket: the guest's HTTP share."""
    breakdown_service_healthz: Summary
    """`GET /healthz` of the service: its bare HTTP round trip."""
    inprocess_xtest: Summary
    """`InputController.click` in-process on the host reference display."""
    baseline_xdotool: Summary
    """`xdotool mousemove X Y click 1` subprocess on the host reference display."""
    baseline_pyautogui_osworld: Summary
    """OSWorld's `python -c "import pyautogui; …; pyautogui.click(X, Y)"` subprocess."""
    ratio_p50_xdotool: float
    """xdotool p50 / ours (REST) p50."""
    ratio_p50_pyautogui: float
    """pyautogui p50 / ours (REST) p50."""
    ratio_p50_inprocess_xdotool: float
    """xdotool p50 / in-process XTest p50, same display."""
    pyautogui_command: str
    """The command the pyautogui baseline ran, for (X, Y) = (0, 0)."""
    target: str
    target_met: bool
    targets: tuple[Target, ...]


class _UnixConnection(http.client.HTTPConnection):
    """`http.client` over a Unix socket (the guest daemon's)."""

    def __init__(self, path: str) -> None:
        super().__init__("guest")
        self._socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._socket_path)


def _exchange(
    connection: http.client.HTTPConnection,
    method: str,
    path: str,
    body: str | None,
    headers: dict[str, str],
) -> tuple[int, bytes]:
    """One request on a keep-alive connection: (status, body)."""
    connection.request(method, path, body, headers)
    response = connection.getresponse()
    return response.status, response.read()


class _Clicks:
    """Every way of clicking, each returning seconds; each display alternates its points."""

    def __init__(self, service: Service, desktop_id: str, host: ReferenceSession) -> None:
        self._service = service
        self._path = f"/api/desktops/{desktop_id}/actions"
        self._env = host.env
        self._display = Display(host.display)
        self._input = InputController(self._display)
        guest_socket = service.data_dir / "desktops" / desktop_id / "guest.sock"
        self._guest = _UnixConnection(str(guest_socket))
        self._sdk = Desktop.connect(desktop_id, base_url=service.url, token=service.token)
        url = httpx.URL(service.url)
        self._http = http.client.HTTPConnection(url.host, url.port)
        self._headers = {
            "authorization": f"Bearer {service.token}",
            "content-type": "application/json",
        }
        self._sandbox_clicks = self._host_clicks = 0

    def close(self) -> None:
        self._http.close()
        self._sdk.close()
        self._guest.close()
        self._input.close()
        self._display.close()

    def _sandbox_point(self) -> tuple[int, int]:
        self._sandbox_clicks += 1
        return POINTS[self._sandbox_clicks % 2]

    def _host_point(self) -> tuple[int, int]:
        self._host_clicks += 1
        return POINTS[self._host_clicks % 2]

    def rest(self) -> tuple[float, float]:
        """(wall seconds, the guest's own seconds) of one REST click with `http.client`."""
        x, y = self._sandbox_point()
        body = json.dumps({"type": "click", "x": x, "y": y})
        started = time.perf_counter()
        status, content = _exchange(self._http, "POST", self._path, body, self._headers)
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"click failed: {status} {content[:200]!r}")
        return elapsed, json.loads(content)["results"][0]["elapsed_ms"] / 1000

    def rest_httpx(self) -> float:
        x, y = self._sandbox_point()
        started = time.perf_counter()
        response = self._service.client.post(self._path, json={"type": "click", "x": x, "y": y})
        elapsed = time.perf_counter() - started
        if response.status_code != 200:
            raise RuntimeError(f"click failed: {response.status_code} {response.text[:200]}")
        return elapsed

    def sdk(self) -> float:
        x, y = self._sandbox_point()
        started = time.perf_counter()
        self._sdk.left_click(x, y)
        return time.perf_counter() - started

    def guest_socket(self) -> float:
        x, y = self._sandbox_point()
        body = json.dumps([{"type": "click", "x": x, "y": y}])
        headers = {"content-type": "application/json"}
        started = time.perf_counter()
        status, content = _exchange(self._guest, "POST", "/actions", body, headers)
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"guest click failed: {status} {content[:200]!r}")
        return elapsed

    def healthz(self) -> float:
        started = time.perf_counter()
        status, _ = _exchange(self._http, "GET", "/healthz", None, {})
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"/healthz answered {status}")
        return elapsed

    def inprocess(self) -> float:
        x, y = self._host_point()
        started = time.perf_counter()
        self._input.click(x, y, button="left", count=1, modifiers=[])
        return time.perf_counter() - started

    def xdotool(self) -> float:
        x, y = self._host_point()
        started = time.perf_counter()
        argv = ["xdotool", "mousemove", str(x), str(y), "click", "1"]
        subprocess.run(argv, env=self._env, check=True)
        return time.perf_counter() - started

    def pyautogui(self) -> float:
        command = pyautogui_command(*self._host_point())
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", command], env=self._env, check=True)
        return time.perf_counter() - started


@dataclass
class _Samples:
    rest: list[float] = field(default_factory=list)
    rest_httpx: list[float] = field(default_factory=list)
    sdk: list[float] = field(default_factory=list)
    guest: list[float] = field(default_factory=list)
    guest_socket: list[float] = field(default_factory=list)
    healthz: list[float] = field(default_factory=list)
    inprocess: list[float] = field(default_factory=list)
    xdotool: list[float] = field(default_factory=list)
    pyautogui: list[float] = field(default_factory=list)


def _round(clicks: _Clicks, samples: _Samples, index: int, with_pyautogui: bool) -> None:
    """One sample of each way; the order turns by one each round, so none is always first
    after the previous round's subprocesses (whose exits leave the machine's caches cold)."""

    def rest() -> None:
        wall, guest = clicks.rest()
        samples.rest.append(wall)
        samples.guest.append(guest)

    ways = [
        rest,
        lambda: samples.rest_httpx.append(clicks.rest_httpx()),
        lambda: samples.sdk.append(clicks.sdk()),
        lambda: samples.guest_socket.append(clicks.guest_socket()),
        lambda: samples.healthz.append(clicks.healthz()),
        lambda: samples.inprocess.append(clicks.inprocess()),
        lambda: samples.xdotool.append(clicks.xdotool()),
    ]
    turn = index % len(ways)
    for way in ways[turn:] + ways[:turn]:
        way()
    if with_pyautogui:
        samples.pyautogui.append(clicks.pyautogui())


def _measure(clicks: _Clicks, rounds: int, pyautogui_rounds: int) -> _Samples:
    _round(clicks, _Samples(), 0, with_pyautogui=True)
    for index in range(1, _WARMUP):
        _round(clicks, _Samples(), index, with_pyautogui=False)
    samples = _Samples()
    every = max(1, rounds // pyautogui_rounds)
    for index in range(rounds):
        pyautogui = index % every == 0 and len(samples.pyautogui) < pyautogui_rounds
        _round(clicks, samples, index, pyautogui)
        if (index + 1) % 25 == 0:
            progress(f"click: {index + 1}/{rounds} rounds")
    return samples


def run(options: Options) -> ClickResult:
    rounds, pyautogui_rounds = (20, 4) if options.quick else (100, 20)
    with running_service(CUBICLE_WARM_POOL="0") as service, reference_session() as host:
        info = service.create_desktop()
        progress(f"click: desktop {info.id} and host display {host.display} up")
        clicks = _Clicks(service, info.id, host)
        try:
            samples = _measure(clicks, rounds, pyautogui_rounds)
        finally:
            clicks.close()
    ours, xdotool = summarize(samples.rest), summarize(samples.xdotool)
    pyautogui, inprocess = summarize(samples.pyautogui), summarize(samples.inprocess)
    targets = (
        Target(f"REST p50 <= {TARGET_P50_MS:.0f} ms", ours.p50_ms <= TARGET_P50_MS),
        Target(
            f"REST >= {TARGET_SPEEDUP:.0f}x faster than xdotool (p50)",
            ratio(xdotool, ours) >= TARGET_SPEEDUP,
        ),
    )
    return ClickResult(
        ours=ours,
        ours_httpx=summarize(samples.rest_httpx),
        ours_sdk=summarize(samples.sdk),
        ours_guest_elapsed=summarize(samples.guest),
        breakdown_guest_socket=summarize(samples.guest_socket),
        breakdown_service_healthz=summarize(samples.healthz),
        inprocess_xtest=inprocess,
        baseline_xdotool=xdotool,
        baseline_pyautogui_osworld=pyautogui,
        ratio_p50_xdotool=ratio(xdotool, ours),
        ratio_p50_pyautogui=ratio(pyautogui, ours),
        ratio_p50_inprocess_xdotool=ratio(xdotool, inprocess),
        pyautogui_command=pyautogui_command(0, 0),
        target="; ".join(t.description for t in targets),
        target_met=all(t.met for t in targets),
        targets=targets,
    )
