"""`ray`: desktops placed through a Ray cluster, beside the local runtime on the same machine.

A real cluster on this host (`tests.desktop.ray_cluster`: a head that offers no desktops and
two worker nodes of six desktops each) and three services, none with a warm pool (every
create starts a desktop): the local runtime, the ray runtime as configured by default (one
spare actor placed ahead), and the ray runtime without spares (`CUBICLE_RAY_SPARES=0`).

- create: `POST /api/desktops` until it answers 201 (the desktop drawn), the three services
  in turn, in an order that turns round by round, each desktop killed before the next. What
  Ray adds is the difference of the medians, and (steadier on a busy host) the median of
  each round's difference.
  Through Ray a create takes the spare actor (placed while the other services created), or
  without spares places an actor and waits for Ray to start its worker process.
- click: one `click` action through `POST /api/desktops/{id}/actions` with `http.client` on
  a keep-alive connection, alternating a local desktop and a desktop on a worker node
  (the service reaches that one over TCP through the node's door).
- bursts: 1, 2, 4, 8 and 12 creates at once through Ray: the wall time until all answered,
  each create's own time, and where Ray put them.
- memory: while the 12 run, what Ray's own processes take on each node (proportional set
  size: shared pages split between the processes that share them), and each desktop's
  actor process.
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench._run import Options, Target, progress
from bench._service import Service, running_service
from bench._stats import Summary, summarize
from tests.desktop.ray_cluster import LocalCluster, local_cluster

TARGET_ADDED_MS = 150.0
TARGET_CLICK_RATIO = 2.0
BURSTS = (1, 2, 4, 8, 12)
DESKTOPS_PER_NODE = 6
POINTS = ((620, 420), (660, 420))
"""Screen pixels in the empty middle of the desktop, 40 px apart (no double clicks)."""


@dataclass(frozen=True)
class Burst:
    desktops: int
    """Creates sent at once."""
    wall_ms: float
    """Milliseconds from the first request to the last answer."""
    create: Summary
    """Each create's own time."""
    per_node: tuple[int, ...]
    """How many of them each worker node got."""


@dataclass(frozen=True)
class NodeMemory:
    node: str
    """`head`, or `worker` and the first characters of its node id."""
    ray_pss_mb: float
    """Ray's own processes on the node (raylet, agents, on the head the GCS), MiB."""
    processes: tuple[tuple[str, float], ...]
    """Each of those processes: its name and MiB."""
    desktop_actors: int
    """Desktop actors running on the node when measured."""


@dataclass(frozen=True)
class RayResult:
    create_local: Summary
    create_ray: Summary
    """Through Ray with a spare actor placed ahead (the default)."""
    create_ray_without_spares: Summary
    """Through Ray, each create placing its own actor (`CUBICLE_RAY_SPARES=0`)."""
    added_p50_ms: float
    """Ray's create p50 minus the local runtime's, milliseconds."""
    added_paired_ms: float
    """The median over rounds of Ray's create minus the local one of the same round,
    milliseconds: less swayed by the host's load, which moves both alike."""
    added_without_spares_p50_ms: float
    click_local: Summary
    click_ray: Summary
    click_ratio_p50: float
    """Ray's click p50 / the local runtime's."""
    bursts: tuple[Burst, ...]
    node_memory: tuple[NodeMemory, ...]
    actor_pss_mb: float
    """Median memory of one desktop's actor process (a Ray worker), MiB."""
    targets: tuple[Target, ...]


def _timed_create(service: Service) -> tuple[float, str, str | None]:
    """(seconds, desktop id, node id) of one create."""
    started = time.perf_counter()
    info = service.create_desktop()
    return time.perf_counter() - started, info.id, info.node.id if info.node else None


def _creates(services: list[Service], rounds: int) -> list[list[float]]:
    samples: list[list[float]] = [[] for _ in services]
    for index in range(rounds):
        turn = index % len(services)
        for which in [*range(turn, len(services)), *range(turn)]:
            seconds, desktop_id, _ = _timed_create(services[which])
            samples[which].append(seconds)
            services[which].kill_desktop(desktop_id)
        figures = ", ".join(f"{s[-1]:.2f} s" for s in samples)
        progress(
            f"ray: create round {index + 1}/{rounds} (local, ray, ray without spares): {figures}"
        )
    return samples


class _Clicker:
    """One keep-alive `http.client` connection clicking on one desktop."""

    def __init__(self, service: Service, desktop_id: str) -> None:
        url = urlsplit(service.url)
        self._http = http.client.HTTPConnection(url.hostname, url.port)
        self._path = f"/api/desktops/{desktop_id}/actions"
        self._headers = {
            "Authorization": f"Bearer {service.token}",
            "Content-Type": "application/json",
        }
        self._turn = 0

    def click(self) -> float:
        x, y = POINTS[self._turn % 2]
        self._turn += 1
        body = json.dumps({"type": "click", "x": x, "y": y})
        started = time.perf_counter()
        self._http.request("POST", self._path, body, self._headers)
        response = self._http.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"click answered {response.status}")
        return elapsed

    def close(self) -> None:
        self._http.close()


def _clicks(local: Service, ray: Service, rounds: int) -> tuple[list[float], list[float]]:
    clickers = [_Clicker(local, local.create_desktop().id), _Clicker(ray, ray.create_desktop().id)]
    try:
        for clicker in clickers:  # warm the connections and the guests
            for _ in range(5):
                clicker.click()
        local_s, ray_s = [], []
        for index in range(rounds):
            first, second = clickers if index % 2 == 0 else reversed(clickers)
            a, b = first.click(), second.click()
            local_s.append(a if first is clickers[0] else b)
            ray_s.append(b if first is clickers[0] else a)
        return local_s, ray_s
    finally:
        for clicker in clickers:
            clicker.close()


def _burst(ray: Service, cluster: LocalCluster, count: int) -> tuple[Burst, list[str]]:
    started = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        done = list(pool.map(lambda _: _timed_create(ray), range(count)))
    wall = time.perf_counter() - started
    placed = Counter(node for _, _, node in done)
    per_node = tuple(placed.get(worker.node_id, 0) for worker in cluster.workers)
    burst = Burst(count, round(wall * 1000, 1), summarize([s for s, _, _ in done]), per_node)
    progress(f"ray: burst of {count}: {wall:.1f} s, per node {per_node}")
    return burst, [desktop_id for _, desktop_id, _ in done]


def _pss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().rsplit("/", 1)[-1]
    except OSError:
        return "?"


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _memory(cluster: LocalCluster) -> tuple[list[NodeMemory], list[float]]:
    """Ray's own processes per node, and each desktop actor's process."""
    nodes, actors = [], []
    head = cluster.cluster.head_node
    for label, node in [("head", head), *(("worker", w) for w in cluster.workers)]:
        daemons: dict[int, str] = {}
        for kind, infos in node.all_processes.items():
            for info in infos:
                daemons[info.process.pid] = kind
        raylet = node.all_processes["raylet"][0].process.pid
        workers = [pid for pid in _children(raylet) if pid not in daemons]
        desktop_actors = [pid for pid in workers if "DesktopActor" in _name(pid)]
        for pid in workers:
            if pid not in desktop_actors:  # the node's own helpers (agents) started by raylet
                daemons[pid] = _name(pid)
        actors += [_pss_mb(pid) for pid in desktop_actors]
        shares = tuple((kind, round(_pss_mb(pid), 1)) for pid, kind in daemons.items())
        nodes.append(
            NodeMemory(
                node=label if node is head else f"{label} {node.node_id[:8]}",
                ray_pss_mb=round(sum(mb for _, mb in shares), 1),
                processes=shares,
                desktop_actors=len(desktop_actors),
            )
        )
    return nodes, actors


def run(options: Options) -> RayResult:
    rounds, click_rounds = (3, 40) if options.quick else (8, 200)
    bursts = BURSTS[:3] if options.quick else BURSTS
    measured: list[Burst] = []
    memory: list[NodeMemory] = []
    actors: list[float] = []
    with local_cluster(2, DESKTOPS_PER_NODE) as cluster:
        progress(f"ray: cluster up at {cluster.address}")
        ray_env = {
            "CUBICLE_WARM_POOL": "0",
            "CUBICLE_RUNTIME": "ray",
            "CUBICLE_RAY_ADDRESS": cluster.address,
            "CUBICLE_MAX_DESKTOPS": "16",
            "CUBICLE_START_TIMEOUT_S": "120",
        }
        with running_service(**ray_env, CUBICLE_RAY_NAMESPACE="bench") as ray:
            with (
                running_service(CUBICLE_WARM_POOL="0") as local,
                running_service(
                    **ray_env, CUBICLE_RAY_NAMESPACE="bench-cold", CUBICLE_RAY_SPARES="0"
                ) as cold,
            ):
                for service in (local, ray, cold):  # first creates warm caches: no samples
                    service.kill_desktop(_timed_create(service)[1])
                local_create, ray_create, cold_create = _creates([local, ray, cold], rounds)
                local_click, ray_click = _clicks(local, ray, click_rounds)
            for desktop_id in list(ray.desktop_ids):
                ray.kill_desktop(desktop_id)
            for count in bursts:
                burst, ids = _burst(ray, cluster, count)
                measured.append(burst)
                if count == bursts[-1]:
                    memory, actors = _memory(cluster)
                for desktop_id in ids:
                    ray.kill_desktop(desktop_id)
    create_local, create_ray = summarize(local_create), summarize(ray_create)
    create_cold = summarize(cold_create)
    click_local, click_ray = summarize(local_click), summarize(ray_click)
    added = round(create_ray.p50_ms - create_local.p50_ms, 1)
    paired = statistics.median(r - lo for r, lo in zip(ray_create, local_create, strict=True))
    click_ratio = round(click_ray.p50_ms / click_local.p50_ms, 2)
    return RayResult(
        create_local=create_local,
        create_ray=create_ray,
        create_ray_without_spares=create_cold,
        added_p50_ms=added,
        added_paired_ms=round(paired * 1000, 1),
        added_without_spares_p50_ms=round(create_cold.p50_ms - create_local.p50_ms, 1),
        click_local=click_local,
        click_ray=click_ray,
        click_ratio_p50=click_ratio,
        bursts=tuple(measured),
        node_memory=tuple(memory),
        actor_pss_mb=round(statistics.median(actors), 1) if actors else 0.0,
        targets=(
            Target(
                f"Ray adds <= {TARGET_ADDED_MS:.0f} ms to a create (p50)", added <= TARGET_ADDED_MS
            ),
            Target(
                f"click p50 through Ray <= {TARGET_CLICK_RATIO:g} x local",
                click_ratio <= TARGET_CLICK_RATIO,
            ),
        ),
    )
