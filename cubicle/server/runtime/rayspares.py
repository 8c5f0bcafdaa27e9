"""`Spares`: desktop actors Ray has placed, and whose processes run, before a create needs one.

Placing an actor is quick; starting the Python worker process that runs it is not (about a
second, more on a busy node). The `ray` runtime therefore keeps `CUBICLE_RAY_SPARES` actors
placed ahead, each holding the resources of one default desktop: a create of that kind
takes one and only starts the desktop on it. A create that finds none places its own actor
and takes whichever comes first, its own or the next spare, so a spare never makes a
create wait. Spares are placed while no desktop of the service boots (a worker process
starting takes CPU a booting desktop wants). A spare nobody asks after for a minute (its
service died) ends itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cubicle.server.runtime.base import NodePlace

log = logging.getLogger("cubicle.runtime.ray")

RENEW_S = 20.0
"""How often the service tells its waiting spares it still looks after them."""


@dataclass(frozen=True)
class Spare:
    actor: Any
    """The actor's Ray handle."""
    node: NodePlace


class Spares:
    """Keeps `count` spare actors placed; `make()` creates one (pending until placed), once
    `quiet()` returns: starting a worker process takes CPU a booting desktop wants."""

    def __init__(
        self, count: int, make: Callable[[], Any], quiet: Callable[[], Awaitable[None]]
    ) -> None:
        self.count = count
        self._make = make
        self._quiet = quiet
        self._ready: list[Spare] = []
        self._added = asyncio.Event()
        self._taken = asyncio.Event()
        self._keeping: asyncio.Task[None] | None = None
        self._adopting: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Begin placing spares (once connected to the cluster); idempotent."""
        if self.count > 0 and self._keeping is None:
            self._keeping = asyncio.create_task(self._keep(), name="ray-spares")

    def take_now(self) -> Spare | None:
        """A placed spare, if one waits."""
        if not self._ready:
            return None
        self._taken.set()
        return self._ready.pop(0)

    async def next(self) -> Spare:
        """The next spare that is placed."""
        while not self._ready:
            self._added.clear()
            await self._added.wait()
        spare = self.take_now()
        assert spare is not None
        return spare

    def adopt(self, actor: Any, placing: asyncio.Future[NodePlace]) -> None:
        """Make a spare of an actor a create placed and then did not need."""
        task = asyncio.ensure_future(self._adopt(actor, placing))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    async def _adopt(self, actor: Any, placing: asyncio.Future[NodePlace]) -> None:
        try:
            node = await placing
        except BaseException:
            kill_actor(actor)
            if not placing.cancelled():
                return
            raise
        self._ready.append(Spare(actor, node))
        self._added.set()

    def put_back(self, spare: Spare) -> None:
        """Return a spare taken but not used."""
        self._ready.insert(0, spare)
        self._added.set()

    async def _keep(self) -> None:
        from ray.exceptions import RayActorError

        while True:
            if len(self._ready) >= self.count:
                self._taken.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RENEW_S):
                        await self._taken.wait()
                now = datetime.now(UTC)
                for spare in self._ready:
                    spare.actor.keep.remote(0, now)  # fire and forget
                continue
            await self._quiet()
            actor = self._make()
            try:
                node = await actor.place.remote()
            except RayActorError as exc:  # its node died before it was placed
                log.warning("a spare actor died before it was placed: %s", exc)
                kill_actor(actor)
                await asyncio.sleep(1)
                continue
            except BaseException:
                kill_actor(actor)
                raise
            self._ready.append(Spare(actor, node))
            self._added.set()

    async def stop(self) -> None:
        """Stop placing spares and end the waiting ones; idempotent."""
        keeping, self._keeping = self._keeping, None
        if keeping is not None:
            keeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeping
        adopting, self._adopting = list(self._adopting), set()
        for task in adopting:
            task.cancel()
        await asyncio.gather(*adopting, return_exceptions=True)
        ready, self._ready = self._ready, []
        for spare in ready:
            kill_actor(spare.actor)


def kill_actor(actor: Any) -> None:
    import ray

    with contextlib.suppress(Exception):  # an actor already gone has nothing to kill
        ray.kill(actor, no_restart=True)
