"""The `ray` runtime: desktops placed on the nodes of a Ray cluster.

Ray does the cluster's work (membership, placement, resource accounting, failure
detection); this module only asks. Each desktop is a named, detached actor
(`cubicle.server.runtime.raynode.DesktopActor`) that reserves one `cubicle_desktop` and the
desktop's memory on a node, starts the desktop there with the node's runtime, and opens a
TCP door to its guest on the node's address. The control plane then speaks the guest
protocol straight to that door (frames included), with the desktop's own secret: Ray
carries no desktop traffic.

- A create that no node can take waits in Ray's queue for `CUBICLE_START_TIMEOUT_S`, then
  fails with `NoNodeAvailable` (503), naming what the cluster lacks.
- A node that dies fails its desktops only: Ray reports their actors dead, and `wait()`
  answers why (a node that stops answering altogether counts as lost after `SILENT_S`).
- The actors outlive the service: a restarted service finds them again among the named
  actors of its namespace (`recover`), and an actor no service asks after ends by itself.
- Spare actors placed ahead (`cubicle.server.runtime.rayspares`) spare a create the wait for
  Ray to start a worker process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import replace
from typing import Any

from cubicle.protocol.errors import InvalidRequest, NoNodeAvailable, SandboxStartError
from cubicle.server.guest_client import GuestEndpoint
from cubicle.server.runtime.base import Found, NodePlace, Runtime, Sandbox, SandboxSpec
from cubicle.server.runtime.raysandbox import STOP_S, ActorLost, RaySandbox
from cubicle.server.runtime.rayspares import Spare, Spares, kill_actor
from cubicle.server.settings import Settings

log = logging.getLogger("cubicle.runtime.ray")

ACTOR_PREFIX = "cubicle-desktop-"
"""Actor names are this and a token: an actor may be placed ahead of its desktop (a spare),
so it is found by its prefix and tells its desktop itself (`describe`)."""
FIND_S = 10.0
"""Longest wait for a found actor to describe itself on recovery."""
MiB = 1024 * 1024


class RayRuntime(Runtime):
    """Places each desktop on a node of the Ray cluster at `CUBICLE_RAY_ADDRESS`."""

    name = "ray"
    places_on_nodes = True
    can_pause = True
    """With memory only: the node's local runtime freezes the desktop's cgroup."""
    disks_on_this_host = False  # on the nodes

    def __init__(self, settings: Settings) -> None:
        if not settings.ray_address:
            raise InvalidRequest(
                "the ray runtime needs the cluster's address: set CUBICLE_RAY_ADDRESS to the "
                "head's HOST:PORT (or `auto` on a node of the cluster)"
            )
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise InvalidRequest(
                "the ray runtime needs Ray: pip install 'cubicle[ray]' on the service's host "
                "and every node"
            ) from exc
        self.settings = settings
        self._spares = Spares(settings.ray_spares, self._make_spare, self._quiet)
        self._booting: set[str] = set()
        """Desktops started and not drawn (or failed) yet."""
        self._none_booting = asyncio.Event()
        self._none_booting.set()
        self._actor_class: Any = None
        self._connecting: asyncio.Lock | None = None
        self._connected_here = False

    async def _connect(self) -> Any:
        """The Ray actor class, once this process is connected to the cluster."""
        if self._actor_class is not None:
            return self._actor_class
        self._connecting = self._connecting or asyncio.Lock()
        async with self._connecting:
            if self._actor_class is None:
                self._actor_class = await asyncio.to_thread(self._connect_blocking)
        return self._actor_class

    def _connect_blocking(self) -> Any:
        import ray

        from cubicle.server.runtime.raynode import DesktopActor

        if not ray.is_initialized():
            try:
                ray.init(
                    address=self.settings.ray_address,
                    namespace=self.settings.ray_namespace,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise SandboxStartError(
                    f"cannot reach the Ray cluster at {self.settings.ray_address}: {exc}"
                ) from exc
            self._connected_here = True
        return ray.remote(DesktopActor)

    def _options(
        self, name: str, memory_mb: int, labels: tuple[tuple[str, str], ...] = ()
    ) -> dict[str, Any]:
        spread = self.settings.ray_placement == "spread"
        return {
            "name": name,
            "namespace": self.settings.ray_namespace,
            "lifetime": "detached",
            "num_cpus": 0,
            "resources": {self.settings.ray_resource: 1},
            "memory": memory_mb * MiB,
            "max_restarts": 0,
            "max_task_retries": 0,
            "scheduling_strategy": "SPREAD" if spread else "DEFAULT",
            "label_selector": dict(labels) or None,
        }

    def _make_actor(self, memory_mb: int, labels: tuple[tuple[str, str], ...] = ()) -> Any:
        options = self._options(f"{ACTOR_PREFIX}{secrets.token_hex(6)}", memory_mb, labels)
        return self._actor_class.options(**options).remote(self.settings.ray_node_runtime)

    def _make_spare(self) -> Any:
        return self._make_actor(self.settings.memory_mb)

    def _booted(self, desktop_id: str) -> None:
        self._booting.discard(desktop_id)
        if not self._booting:
            self._none_booting.set()

    async def _quiet(self) -> None:
        """Return once no desktop of this runtime is booting."""
        await self._none_booting.wait()

    def _fits_spares(self, spec: SandboxSpec) -> bool:
        return not spec.node_labels and spec.memory_mb == self.settings.memory_mb

    async def start(self, spec: SandboxSpec) -> Sandbox:
        await self._connect()
        self._spares.start()
        spec = replace(spec, secret=secrets.token_urlsafe(32))
        self._booting.add(spec.id)
        self._none_booting.clear()
        try:
            for _attempt in range(3):
                actor, node = await self._placed_actor(spec)
                try:
                    endpoint = await self._start_on(actor, spec)
                except ActorLost as exc:  # a spare whose node died meanwhile: place anew
                    log.warning("desktop %s: %s; placing it again", spec.id, exc)
                    continue
                log.info("desktop %s on node %s (%s)", spec.id, node.address, node.id[:12])
                return RaySandbox(actor, spec.id, endpoint, node, booted=self._booted)
        except BaseException:
            self._booted(spec.id)
            raise
        self._booted(spec.id)
        raise SandboxStartError("its actor died three times before the desktop could start")

    async def _placed_actor(self, spec: SandboxSpec) -> tuple[Any, NodePlace]:
        """An actor placed for the desktop: a spare, or its own, whichever is placed first
        within the start timeout; `NoNodeAvailable` when neither is."""
        spares = self._spares if self._fits_spares(spec) else None
        if spares is not None and (spare := spares.take_now()) is not None:
            return spare.actor, spare.node
        actor = self._make_actor(spec.memory_mb, spec.node_labels)
        own = asyncio.ensure_future(actor.place.remote())
        other = asyncio.ensure_future(spares.next()) if spares is not None else None
        waiting = {own} if other is None else {own, other}
        try:
            done, _ = await asyncio.wait(
                waiting, timeout=self.settings.start_timeout_s, return_when="FIRST_COMPLETED"
            )
        except BaseException:
            own.cancel()
            kill_actor(actor)
            _settle(other, spares)
            raise
        if spares is not None and other is not None and other in done and own not in done:
            # Its own actor becomes a spare once placed: ending it would cost its process
            # start and nudge Ray's round robin (`spread`) back to the node the spare was on.
            spares.adopt(actor, own)
            spare = other.result()
            return spare.actor, spare.node
        _settle(other, spares)
        if own in done:
            try:
                return actor, own.result()
            except Exception as exc:
                kill_actor(actor)
                raise SandboxStartError(f"its actor died before it was placed: {exc}") from exc
        own.cancel()
        kill_actor(actor)
        raise NoNodeAvailable(await self._shortfall(spec))

    async def _start_on(self, actor: Any, spec: SandboxSpec) -> GuestEndpoint:
        """Start the desktop on a placed actor; `ActorLost` if the actor is gone."""
        from ray.exceptions import RayActorError, RayTaskError

        try:
            async with asyncio.timeout(self.settings.start_timeout_s):
                return await actor.start.remote(spec)
        except RayTaskError as exc:
            kill_actor(actor)
            cause = exc.cause if isinstance(exc.cause, Exception) else exc
            raise SandboxStartError(f"on its node: {cause}") from exc
        except RayActorError as exc:
            kill_actor(actor)
            raise ActorLost(f"its actor died: {exc}") from exc
        except BaseException:
            kill_actor(actor)
            raise

    async def _shortfall(self, spec: SandboxSpec) -> str:
        """Why no node took the desktop: what it needs against what the cluster has free."""
        import ray

        total, free, nodes = await asyncio.to_thread(
            lambda: (ray.cluster_resources(), ray.available_resources(), ray.nodes())
        )
        resource = self.settings.ray_resource
        need_gib = spec.memory_mb / 1024
        waited = f"no node could take the desktop within {self.settings.start_timeout_s:g} s"
        if not total.get(resource):
            why = (
                f"no node offers the resource {resource!r}: start nodes with "
                f"`ray start --resources='{{\"{resource}\": N}}'`"
            )
        elif free.get(resource, 0) < 1:
            why = (
                f"all {total[resource]:g} {resource!r} of the cluster are taken: kill a desktop "
                "or add nodes"
            )
        elif free.get("memory", 0) < spec.memory_mb * MiB:
            why = (
                f"it needs {need_gib:g} GiB of the 'memory' resource and the cluster has "
                f"{free.get('memory', 0) / 1024**3:.1f} GiB free: ask for less (memory_mb) "
                "or add nodes"
            )
        elif spec.node_labels:
            wanted = dict(spec.node_labels)
            matching = [
                n
                for n in nodes
                if n.get("Alive")
                and all(n.get("Labels", {}).get(k) == v for k, v in wanted.items())
            ]
            shown = ", ".join(f"{k}={v}" for k, v in wanted.items())
            why = (
                f"no node labelled {shown} has a free {resource!r} and {need_gib:g} GiB of "
                f"memory ({len(matching)} alive node(s) carry those labels)"
            )
        else:
            why = (
                f"no single node has both a free {resource!r} and {need_gib:g} GiB of memory "
                f"({free.get(resource, 0):g} {resource!r} free in the cluster)"
            )
        return f"{waited}: {why}"

    async def recover(self) -> list[Found]:
        import ray

        await self._connect()
        names = await asyncio.to_thread(ray.util.list_named_actors)
        found = await asyncio.gather(
            *(self._find(name) for name in names if name.startswith(ACTOR_PREFIX))
        )
        self._spares.start()  # after the search: it ends every spare it finds
        return [f for f in found if f is not None]

    async def _find(self, name: str) -> Found | None:
        import ray

        try:
            actor = await asyncio.to_thread(
                ray.get_actor, name, namespace=self.settings.ray_namespace
            )
        except ValueError:  # gone meanwhile
            return None
        try:
            async with asyncio.timeout(FIND_S):
                described = await actor.describe.remote()
        except (TimeoutError, ray.exceptions.RayError) as exc:
            log.warning("actor %s does not describe itself (%r): killing it", name, exc)
            kill_actor(actor)
            return None
        if described.ended is not None or described.endpoint is None or not described.spec:
            log.info("actor %s holds no running desktop: ending it", name)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(STOP_S):
                    await actor.stop.remote()
            kill_actor(actor)
            return None
        sandbox = RaySandbox(actor, described.spec.id, described.endpoint, described.node)
        return Found(sandbox, described.spec, described.timeout_s, described.created_at)

    async def close(self) -> None:
        await self._spares.stop()
        if self._connected_here:
            import ray

            self._connected_here = False
            self._actor_class = None
            await asyncio.to_thread(ray.shutdown)


def _settle(waiting: asyncio.Future[Spare] | None, spares: Spares | None) -> None:
    """Stop waiting for a spare; one that came meanwhile goes back."""
    if waiting is None or spares is None:
        return
    if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
        spares.put_back(waiting.result())
    waiting.cancel()
