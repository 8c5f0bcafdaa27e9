"""`RaySandbox`: the control plane's handle on one desktop of the `ray` runtime.

Its actor answers bounded long-polls (`poll_events`, `poll_end`); a poll that fails because
Ray reports the actor dead, or that gets no answer within a lease plus `SILENT_S`, means the
desktop's node is lost, and `wait()` says so. Stopping asks the actor to stop its desktop,
then kills the actor, which frees its resources in the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from cubicle.protocol.errors import CubicleError, NotSupported, SandboxError
from cubicle.protocol.models import GuestEvent
from cubicle.server.guest_client import GuestEndpoint
from cubicle.server.runtime.base import NodePlace, Sandbox
from cubicle.server.runtime.rayspares import kill_actor

LEASE_S = 5.0
"""Longest a poll of a desktop's actor waits for news before it answers anyway."""
SILENT_S = 15.0
"""Seconds past a poll's lease without an answer after which the desktop's node counts as
lost, whatever Ray says (Ray's own health checks usually tell sooner)."""
STOP_S = 15.0
"""Longest wait for an actor to stop its desktop before it is killed regardless."""


class ActorLost(Exception):
    """The desktop's actor is gone or does not answer; the message says why."""


def _actor_gone(exc: BaseException, node: NodePlace) -> str:
    """Why an actor died, in one line, from Ray's error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    cause = lines[-1] if lines else type(exc).__name__
    return f"its node {node.address} (Ray node {node.id[:12]}) was lost: {cause}"


class RaySandbox(Sandbox):
    """A desktop held by an actor on some node of the cluster."""

    detached = True

    def __init__(
        self,
        actor: Any,
        spec_id: str,
        endpoint: GuestEndpoint,
        node: NodePlace,
        *,
        booted: Callable[[str], None] | None = None,
    ) -> None:
        self.id = spec_id
        self.endpoint = endpoint
        self.node = node
        self._actor = actor
        self._booted = booted
        """Told once the desktop is drawn, failed or gone."""
        self._index = 0
        self._lost: str | None = None
        self._stopped = False

    async def _call(self, method: str, *args: Any) -> Any:
        """Call the actor, waiting at most a lease plus `SILENT_S`; `ActorLost` if it is
        gone; the node's `CubicleError` as it was raised there."""
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

        for _attempt in range(3):
            try:
                async with asyncio.timeout(LEASE_S + SILENT_S):
                    return await getattr(self._actor, method).remote(*args)
            except RayTaskError as exc:
                if isinstance(exc.cause, CubicleError):
                    raise exc.cause from None
                raise
            except TimeoutError:
                raise ActorLost(
                    f"its node {self.node.address} (Ray node {self.node.id[:12]}) did not "
                    f"answer for {LEASE_S + SILENT_S:.0f} s"
                ) from None
            except ActorUnavailableError:  # Ray is still finding out: ask again
                await asyncio.sleep(1)
            except RayActorError as exc:
                raise ActorLost(_actor_gone(exc, self.node)) from None
        raise ActorLost(
            f"its node {self.node.address} (Ray node {self.node.id[:12]}) is unavailable"
        )

    def _settled(self) -> None:
        booted, self._booted = self._booted, None
        if booted is not None:
            booted(self.id)

    async def events(self) -> AsyncIterator[GuestEvent]:
        try:
            while self._lost is None:
                try:
                    polled = await self._call("poll_events", self._index, LEASE_S)
                except ActorLost as exc:
                    self._lost = str(exc)
                    return
                self._index += len(polled.events)
                for line in polled.events:
                    event = GuestEvent.model_validate_json(line)
                    if event.event in ("ready", "failed"):
                        self._settled()
                    yield event
                if polled.events_done:
                    return
        finally:
            self._settled()

    async def wait(self) -> str:
        while self._lost is None and not self._stopped:
            try:
                ended = await self._call("poll_end", LEASE_S)
            except ActorLost as exc:
                self._lost = str(exc)
                break
            if ended is not None:
                return ended
        return "stopped" if self._stopped else str(self._lost)

    def kept(self, timeout_s: int, created_at: datetime) -> None:
        if not self._stopped and self._lost is None:  # fire and forget, in call order
            self._actor.keep.remote(timeout_s, created_at)

    async def foreground(self) -> None:
        if not self._stopped and self._lost is None:
            with contextlib.suppress(ActorLost):
                await self._call("foreground")

    async def pause(self) -> None:
        """Freeze it where it stands on its node (the node's runtime pauses it)."""
        try:
            await self._call("pause")
        except ActorLost as exc:
            raise SandboxError(f"desktop {self.id} could not be paused: {exc}") from exc

    async def resume(self) -> None:
        try:
            await self._call("resume")
        except ActorLost as exc:
            raise SandboxError(f"desktop {self.id} could not be resumed: {exc}") from exc

    async def park(self, *, keep_memory: bool = False) -> Path:
        raise NotSupported(
            "a ray desktop pauses with its memory only (on its node): its disk cannot be "
            "kept apart from it, so it cannot pause without memory or outlive the service "
            "paused; use the local or microvm runtime for that"
        )

    def pids(self) -> list[int]:
        return []  # its processes run on another host

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._settled()
        if self._lost is None:
            with contextlib.suppress(ActorLost, TimeoutError):
                async with asyncio.timeout(STOP_S):
                    await self._call("stop")
        kill_actor(self._actor)
