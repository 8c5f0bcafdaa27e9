"""The node's side of the `ray` runtime: one `DesktopActor` per desktop.

Ray places the actor on a node that has a free `cubicle_desktop` and the desktop's memory
(the control plane's `cubicle.server.runtime.raycluster` asks for them); there it starts the
desktop with the node's own runtime (`local`, or another registered one) and opens a
`TcpDoor` on the node's address, through which the control plane speaks the guest
protocol, secret included.

The actor is named and detached: it outlives the service that made it, and a restarted
service finds it again by its name. It may be placed ahead of its desktop (a spare, whose
worker process is up when a create comes), and is given its desktop by `start`. So that
nothing is left running for ever when no service comes back, the actor stops by itself
once no service has asked after it for the desktop's idle timeout (a minute at least).

Every call the control plane makes is short or a bounded long-poll (`poll_*`), so a service
that dies leaves nothing hanging here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import ray

from cubicle.server.guest_client import GuestEndpoint
from cubicle.server.runtime import Runtime, Sandbox, SandboxSpec, make_runtime
from cubicle.server.runtime.base import NodePlace
from cubicle.server.runtime.forward import TcpDoor
from cubicle.server.settings import Settings

log = logging.getLogger("cubicle.runtime.raynode")

ORPHAN_MIN_S = 60.0
"""Seconds without a service before an orphaned desktop stops itself, at the least."""


@dataclass(frozen=True)
class Polled:
    """The guest's events from the index asked, and whether more may come."""

    events: tuple[str, ...]
    """`GuestEvent` JSON lines, in order."""
    events_done: bool
    """The guest reports no more events."""


@dataclass(frozen=True)
class Described:
    """A desktop actor's state, for a service that finds it again."""

    spec: SandboxSpec | None
    """None until the desktop started (a spare)."""
    endpoint: GuestEndpoint | None
    """None until the desktop started."""
    node: NodePlace
    timeout_s: int
    created_at: datetime
    ended: str | None


class DesktopActor:
    """One desktop on this node (a Ray actor: `ray.remote(DesktopActor)`)."""

    def __init__(self, runtime: str) -> None:
        self.spec: SandboxSpec | None = None
        """The desktop's, once started (a spare waits without one)."""
        self.runtime_name = runtime
        self.timeout_s = 0
        self.created_at = datetime.now(UTC)
        context = ray.get_runtime_context()
        self.node = NodePlace(id=context.get_node_id(), address=ray.util.get_node_ip_address())
        self._runtime: Runtime | None = None
        self._sandbox: Sandbox | None = None
        self._door: TcpDoor | None = None
        self._events: list[str] = []
        self._events_done = False
        self._settled = -1
        """Index of the last event that settled the desktop (`ready` or `failed`)."""
        self._ended: str | None = None
        self._changed = asyncio.Event()
        self._last_seen = time.monotonic()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping: asyncio.Task[None] | None = None

    def _make_runtime(self) -> Runtime:
        """The node's runtime, for this actor's one desktop (so it keeps no spare disk); it
        shares the node's data directory with the other actors' runtimes."""
        return make_runtime(self.runtime_name, Settings(max_desktops=1))

    async def place(self) -> NodePlace:
        """Where Ray put the actor (answers once it is placed, its process runs and the
        node's runtime is loaded)."""
        self._last_seen = time.monotonic()
        if not self._tasks:
            self._tasks.append(asyncio.create_task(self._watch_for_orphan(), name="orphan"))
        if self._runtime is None:
            self._runtime = await asyncio.to_thread(self._make_runtime)
        return self.node

    async def start(self, spec: SandboxSpec) -> GuestEndpoint:
        """Start the desktop and open its door; returns where the service reaches it."""
        if self.spec is not None:
            raise RuntimeError("this actor holds a desktop already")
        self.spec = spec
        self._last_seen = time.monotonic()
        if self._runtime is None:
            self._runtime = await asyncio.to_thread(self._make_runtime)
        self._sandbox = await self._runtime.start(spec)
        self._door = TcpDoor(self._sandbox.endpoint, self.node.address)
        await self._door.start()
        self._tasks.append(asyncio.create_task(self._pump(self._sandbox), name="pump-events"))
        return self._door.endpoint

    async def _pump(self, sandbox: Sandbox) -> None:
        try:
            async for event in sandbox.events():
                self._events.append(event.model_dump_json(exclude_none=True))
                if event.event in ("ready", "failed"):
                    self._settled = len(self._events) - 1
                self._changed.set()
        finally:
            self._events_done = True
            self._changed.set()
        self._ended = await sandbox.wait()
        self._changed.set()

    async def _until(self, done, lease_s: float) -> None:
        """Wait until `done()` or for `lease_s`; each call tells the actor that a service
        still looks after it."""
        self._last_seen = time.monotonic()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(lease_s):
                while not done():
                    self._changed.clear()
                    await self._changed.wait()
        self._last_seen = time.monotonic()

    async def poll_events(self, index: int, lease_s: float) -> Polled:
        """The guest's events from `index` on; waits up to `lease_s` for one that settles
        the desktop (`ready`, `failed`) or for their end: one call per start, not one per
        stage."""

        await self._until(lambda: self._events_done or self._settled >= index, lease_s)
        return Polled(tuple(self._events[index:]), self._events_done)

    async def poll_end(self, lease_s: float) -> str | None:
        """Why the sandbox ended, once it has; waits up to `lease_s` for it."""
        await self._until(lambda: self._ended is not None, lease_s)
        return self._ended

    async def foreground(self) -> None:
        """Raise a desktop started `nice` (a warm pool's spare) to normal priority."""
        if self._sandbox is not None:
            await self._sandbox.foreground()

    async def pause(self) -> None:
        """Pause the desktop with its memory (the node's runtime: its cgroup frozen)."""
        if self._sandbox is None:
            raise RuntimeError("this actor holds no desktop")
        await self._sandbox.pause()

    async def resume(self) -> None:
        if self._sandbox is not None:
            await self._sandbox.resume()

    async def keep(self, timeout_s: int, created_at: datetime) -> None:
        """The service's idle timeout for the desktop from now on (0: in the warm pool),
        and when the desktop was handed out."""
        self.timeout_s = timeout_s
        self.created_at = created_at
        self._last_seen = time.monotonic()

    async def describe(self) -> Described:
        self._last_seen = time.monotonic()
        endpoint = self._door.endpoint if self._door is not None else None
        spec = replace(self.spec, secret=None) if self.spec else None  # the endpoint has it
        return Described(spec, endpoint, self.node, self.timeout_s, self.created_at, self._ended)

    async def stop(self) -> None:
        """Stop the desktop and free what it holds on this node; idempotent. The service
        then ends the actor itself (`ray.kill`), which frees its Ray resources."""
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._stop(), name="stop-desktop")
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._door is not None:
            await self._door.stop()
        if self._sandbox is not None:
            await self._sandbox.stop()
        self._ended = self._ended or "stopped"
        self._changed.set()

    async def _watch_for_orphan(self) -> None:
        while True:
            await asyncio.sleep(5)
            alone_s = time.monotonic() - self._last_seen
            if alone_s > max(float(self.timeout_s), ORPHAN_MIN_S):
                break
        what = f"desktop {self.spec.id}" if self.spec else "spare"
        log.warning("%s: no service asked after it for %.0f s: stopping it", what, alone_s)
        self._tasks.remove(asyncio.current_task())  # type: ignore[arg-type]
        await self.stop()
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
