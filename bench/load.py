"""`load`: many clients at once on a few desktops; does a cheap call wait behind dear ones?

50 and then 200 concurrent clients share 4 desktops of one service (`CUBICLE_WARM_POOL=0`),
for 30 s each (10 s with `--quick`). Each client keeps one keep-alive connection and, as
fast as it is answered, cycles through three calls on its desktop (client n on desktop
n mod 4): a screenshot (`GET …/screenshot?format=png&max_width=640`), a pointer move
(`POST …/actions`) and the cursor (`GET …/cursor`). Reported per call kind: p50 and p99 in
milliseconds, and for the whole run requests per second and every answer that was not a
success, by status (429/503 carry `Retry-After`: a client that gets one waits that long).

Two probes, one request every 100 ms each, say where the time goes: `probe_healthz` is the
service's `GET /healthz` (its event loop and nothing else) and `probe_guest_cursor` is
`GET /cursor` sent straight to desktop 0's guest daemon over its Unix socket (the guest's
loop, skipping the service). The load average and the CPU seconds of the service process
and of the desktops' processes are taken around each level.

The clients are asyncio connections with httptools' parser (`cubicle.server._http1`), in this
process, so that the load generator costs little of the 2 cores it shares with the service.
Only loopback is used.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from bench import _inside
from bench._run import Options, Target, progress
from bench._service import Service, desktop_pids, running_service
from bench._stats import percentile
from cubicle.server._http1 import Http1Error, Pool, Timeouts

DESKTOPS = 4
LEVELS = (50, 200)
KINDS = ("screenshot", "move", "cursor")
TARGETS_MS = {"cursor": 50.0, "move": 100.0, "screenshot": 500.0}
"""p99 targets at 50 clients (issue 17), milliseconds."""
_TIMEOUTS = Timeouts(connect=10.0, write=60.0, read=60.0)
_PROBE_EVERY_S = 0.1


@dataclass(frozen=True)
class KindFigures:
    n: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class LevelResult:
    clients: int
    duration_s: float
    requests: int
    requests_per_s: float
    errors: int
    """Answers that were not 2xx, and exchanges that failed below HTTP."""
    statuses: dict[str, int]
    """Every answer's status (and `transport` for failed exchanges), counted."""
    retry_after_seen: bool
    """Whether every 429/503 carried `Retry-After`."""
    kinds: dict[str, KindFigures]
    """Each call kind, successful answers only, plus the two probes."""
    load_avg_1m_start: float
    load_avg_1m_end: float
    service_cpu_s: float
    """CPU seconds the service process used during the level."""
    desktops_cpu_s: float
    """CPU seconds the desktops' processes (guests, X, apps) used during the level."""


@dataclass(frozen=True)
class LoadResult:
    levels: list[LevelResult]
    target: str
    target_met: bool
    targets: tuple[Target, ...] = field(default=())


class _Client:
    """One keep-alive HTTP/1.1 connection to the service, as one user."""

    def __init__(self, host: str, port: int, token: str, uds: str | None = None) -> None:
        async def connect(protocol):
            loop = asyncio.get_running_loop()
            if uds is not None:
                return await loop.create_unix_connection(protocol, uds)
            return await loop.create_connection(protocol, host, port)

        self._pool = Pool(connect)
        auth = f"authorization: Bearer {token}\r\n" if token else ""
        self._fixed = f"host: {host}\r\n{auth}".encode()

    async def call(self, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, str]]:
        head = f"{method} {path} HTTP/1.1\r\n".encode() + self._fixed
        if body:
            head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        conn = await self._pool.exchange(head + b"\r\n", body, _TIMEOUTS)
        await self._pool.read_all(conn, _TIMEOUTS)
        headers = {k.decode().lower(): v.decode() for k, v in conn.headers}
        return conn.status_code, headers

    async def close(self) -> None:
        await self._pool.aclose()


@dataclass
class _Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter = field(default_factory=Counter)
    retry_after_missing: int = 0
    requests: int = 0


def _request(kind: str, desktop_id: str, rng: random.Random) -> tuple[str, str, bytes]:
    base = f"/api/desktops/{desktop_id}"
    if kind == "screenshot":
        return "GET", f"{base}/screenshot?format=png&max_width=640", b""
    if kind == "move":
        x, y = rng.randrange(100, 1180), rng.randrange(100, 700)
        return "POST", f"{base}/actions", json.dumps({"type": "move", "x": x, "y": y}).encode()
    return "GET", f"{base}/cursor", b""


async def _user(
    client: _Client, desktop_id: str, index: int, deadline: float, tally: _Tally
) -> None:
    rng = random.Random(index)
    turn = index % len(KINDS)
    while time.monotonic() < deadline:
        kind = KINDS[turn % len(KINDS)]
        turn += 1
        method, path, body = _request(kind, desktop_id, rng)
        started = time.perf_counter()
        try:
            status, headers = await client.call(method, path, body)
        except Http1Error:
            tally.statuses["transport"] += 1
            tally.requests += 1
            await asyncio.sleep(0.1)
            continue
        elapsed = time.perf_counter() - started
        tally.requests += 1
        tally.statuses[str(status)] += 1
        if 200 <= status < 300:
            tally.latencies[kind].append(elapsed)
        elif status in (429, 503):
            retry_after = headers.get("retry-after")
            if retry_after is None:
                tally.retry_after_missing += 1
            await asyncio.sleep(float(retry_after or 1))


async def _probe(client: _Client, path: str, name: str, deadline: float, tally: _Tally) -> None:
    while time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            status, _ = await client.call("GET", path)
        except Http1Error:
            status = 0
        if status == 200:
            tally.latencies[name].append(time.perf_counter() - started)
        await asyncio.sleep(_PROBE_EVERY_S)


def _cpu_s(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _figures(seconds: list[float]) -> KindFigures:
    ms = sorted(s * 1000 for s in seconds)
    if not ms:
        return KindFigures(0, 0.0, 0.0, 0.0)
    return KindFigures(
        len(ms), round(percentile(ms, 50), 1), round(percentile(ms, 99), 1), round(ms[-1], 1)
    )


async def _level(service: Service, desktop_ids: list[str], clients: int, seconds: float):
    url = service.url.removeprefix("http://")
    host, _, port = url.partition(":")
    tally = _Tally()
    users = [_Client(host, int(port), service.token) for _ in range(clients)]
    socket = str(_inside.guest_socket(service, desktop_ids[0]))
    probes = (_Client(host, int(port), ""), _Client("guest", 0, "", uds=socket))
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    try:
        await asyncio.gather(
            *(
                _user(user, desktop_ids[n % len(desktop_ids)], n, deadline, tally)
                for n, user in enumerate(users)
            ),
            _probe(probes[0], "/healthz", "probe_healthz", deadline, tally),
            _probe(probes[1], "/cursor", "probe_guest_cursor", deadline, tally),
        )
    finally:
        await asyncio.gather(*(c.close() for c in (*users, *probes)))
    return tally, time.monotonic() - started


def _measure(service: Service, desktop_ids: list[str], clients: int, seconds: float):
    desktops = [pid for d in desktop_ids for pid in desktop_pids(d)]
    load_start = os.getloadavg()[0]
    service_cpu, desktops_cpu = _cpu_s([service.launched.process.pid]), _cpu_s(desktops)
    # The clients' own heap (this process imported the service's code, the tests' and
    # more) is kept out of the collector's full passes: each stopped every client for up
    # to 150 ms, and counted as the service's latency.
    gc.collect()
    gc.freeze()
    tally, duration = asyncio.run(_level(service, desktop_ids, clients, seconds))
    service_cpu = _cpu_s([service.launched.process.pid]) - service_cpu
    desktops_cpu = _cpu_s(desktops) - desktops_cpu
    errors = sum(n for status, n in tally.statuses.items() if not status.startswith("2"))
    kinds = {kind: _figures(tally.latencies[kind]) for kind in sorted(tally.latencies)}
    return LevelResult(
        clients=clients,
        duration_s=round(duration, 1),
        requests=tally.requests,
        requests_per_s=round(tally.requests / duration, 1),
        errors=errors,
        statuses=dict(tally.statuses),
        retry_after_seen=tally.retry_after_missing == 0,
        kinds=kinds,
        load_avg_1m_start=round(load_start, 2),
        load_avg_1m_end=round(os.getloadavg()[0], 2),
        service_cpu_s=round(service_cpu, 1),
        desktops_cpu_s=round(desktops_cpu, 1),
    )


def run(options: Options) -> LoadResult:
    seconds = 10.0 if options.quick else 30.0
    levels: list[LevelResult] = []
    with running_service(CUBICLE_WARM_POOL="0", CUBICLE_MAX_DESKTOPS=str(DESKTOPS)) as service:
        desktop_ids = [service.create_desktop().id for _ in range(DESKTOPS)]
        progress(f"load: {DESKTOPS} desktops up")
        for clients in LEVELS:
            level = _measure(service, desktop_ids, clients, seconds)
            progress(
                f"load: {clients} clients: {level.requests_per_s} req/s, "
                f"{level.errors} errors, "
                + ", ".join(f"{k} p50/p99 {f.p50_ms}/{f.p99_ms}" for k, f in level.kinds.items())
            )
            levels.append(level)
    at_50 = levels[0]
    targets = (
        Target("0 errors at 50 clients", at_50.errors == 0),
        *(
            Target(
                f"{kind} p99 <= {limit:.0f} ms at 50 clients",
                kind in at_50.kinds and 0 < at_50.kinds[kind].p99_ms <= limit,
            )
            for kind, limit in TARGETS_MS.items()
        ),
    )
    return LoadResult(
        levels=levels,
        target="; ".join(t.description for t in targets),
        target_met=all(t.met for t in targets),
        targets=targets,
    )
