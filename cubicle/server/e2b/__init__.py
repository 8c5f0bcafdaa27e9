"""E2B's protocol, answered by Cubicle: the unmodified `e2b` SDKs run against the service.

- `control.py`: E2B's control plane (`POST /v2/sandboxes`, list, get, kill, timeout,
  connect) on the service's own port, authenticated by `X-API-KEY` (the admin token).
- `envd.py`: E2B's in-sandbox daemon (port 49983 of a sandbox, reached with E2B's
  `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers through the port proxy): health, processes
  (Connect RPC, JSON codec), the filesystem service and `/files`, each done by the
  desktop's guest as the desktop's user.
- `Sandboxes` (here): what E2B knows of a sandbox that Cubicle's desktop does not carry
  (its template name, metadata, environment, access token, end time).

A sandbox is a Cubicle desktop; its id is the desktop's. What Cubicle cannot honour
(pause, snapshots, volumes, template builds) is answered with an error naming it.
"""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime, timedelta

from cubicle.server.e2b.envd import Envd
from cubicle.server.e2b.sandboxes import (
    CLIENT_ID,
    CODE_INTERPRETER_PORT,
    ENVD_PORT,
    ENVD_VERSION,
    TEMPLATES,
    Sandbox,
)
from cubicle.server.events import DesktopEnded, DesktopEvent, Events

__all__ = [
    "CLIENT_ID",
    "CODE_INTERPRETER_PORT",
    "ENVD_PORT",
    "ENVD_VERSION",
    "TEMPLATES",
    "Sandbox",
    "Sandboxes",
]


class Sandboxes:
    """Every sandbox made through E2B's API, until its desktop ends."""

    def __init__(self, events: Events) -> None:
        self._by_id: dict[str, Sandbox] = {}
        self._envd: dict[str, Envd] = {}
        self._closing: set[asyncio.Future[None]] = set()
        self._unsubscribe = events.subscribe(self._on_event)

    def _on_event(self, event: DesktopEvent) -> None:
        if isinstance(event, DesktopEnded):
            self._by_id.pop(event.desktop_id, None)
            envd = self._envd.pop(event.desktop_id, None)
            if envd is not None:  # its commands' streams end with the desktop
                closing = asyncio.ensure_future(envd.aclose())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Stop hearing of desktops; end every command an envd started, and wait."""
        self._unsubscribe()
        envds, self._envd = list(self._envd.values()), {}
        await asyncio.gather(*(envd.aclose() for envd in envds), *self._closing)

    def add(
        self,
        sandbox_id: str,
        template: str,
        timeout_s: int,
        metadata: dict[str, str],
        env: dict[str, str],
    ) -> Sandbox:
        now = datetime.now(UTC)
        sandbox = Sandbox(
            sandbox_id=sandbox_id,
            template=template,
            access_token=secrets.token_urlsafe(24),
            started_at=now,
            end_at=now + timedelta(seconds=timeout_s),
            metadata=metadata,
            env=env,
        )
        self._by_id[sandbox_id] = sandbox
        self._envd[sandbox_id] = Envd(sandbox)
        return sandbox

    def get(self, sandbox_id: str) -> Sandbox | None:
        return self._by_id.get(sandbox_id)

    def envd(self, sandbox_id: str) -> Envd | None:
        """The envd that answers for sandbox `sandbox_id`, if it is one."""
        return self._envd.get(sandbox_id)

    def all(self) -> list[Sandbox]:
        return list(self._by_id.values())

    def owns(self, sandbox_id: str, token: str) -> bool:
        """Whether `token` is the access token of sandbox `sandbox_id`."""
        sandbox = self._by_id.get(sandbox_id)
        return sandbox is not None and secrets.compare_digest(
            sandbox.access_token.encode(), token.encode()
        )
