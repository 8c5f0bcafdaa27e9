"""Share links: a token that opens one desktop's live view, with an id, a list and a revoke.

A link's token is `share2.<id>.<secret>`; the service keeps the id, the desktop, the mode,
the expiry and a hash of the secret, never the secret. Links live as long as the service
and the desktop do: a desktop that ends takes its links with it. Revoking a link stops
every later request made with it, and the live view hangs up the viewers it opened
(`LinkRevoked`).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cubicle.protocol.errors import AuthError, CapacityReached, NotFound
from cubicle.protocol.service import AccessMode, ShareLink
from cubicle.server.events import DesktopEnded, DesktopEvent, Events, LinkRevoked

PREFIX = "share2"
MAX_LINKS_PER_DESKTOP = 100


@dataclass(frozen=True)
class Grant:
    """What one share link allows."""

    id: str
    desktop_id: str
    mode: AccessMode
    expires_at: datetime
    created_at: datetime
    digest: bytes = field(repr=False)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class ShareLinks:
    """Every share link of one service."""

    def __init__(self, events: Events) -> None:
        self._grants: dict[str, Grant] = {}
        self._events = events
        self._unsubscribe = events.subscribe(self._on_event)

    def close(self) -> None:
        self._unsubscribe()

    def _on_event(self, event: DesktopEvent) -> None:
        if isinstance(event, DesktopEnded):
            for grant in self.list(event.desktop_id):
                self._grants.pop(grant.id, None)

    def create(self, desktop_id: str, mode: AccessMode, ttl_s: int, base_url: str) -> ShareLink:
        if len(self.list(desktop_id)) >= MAX_LINKS_PER_DESKTOP:
            raise CapacityReached(
                f"desktop {desktop_id} has {MAX_LINKS_PER_DESKTOP} live share links: "
                "revoke some first (DELETE .../shares/{id})"
            )
        link_id, secret = secrets.token_hex(6), secrets.token_urlsafe(24)
        now = datetime.now(UTC)
        expires = now + timedelta(seconds=ttl_s)
        grant = Grant(link_id, desktop_id, mode, expires, now, _digest(secret))
        self._grants[link_id] = grant
        token = f"{PREFIX}.{link_id}.{secret}"
        return self.describe(grant, base_url, token)

    @staticmethod
    def describe(grant: Grant, base_url: str, token: str | None = None) -> ShareLink:
        url = f"{base_url}/view/{grant.desktop_id}" + (f"?token={token}" if token else "")
        return ShareLink(
            id=grant.id,
            desktop_id=grant.desktop_id,
            mode=grant.mode,
            token=token,
            url=url,
            expires_at=grant.expires_at,
            created_at=grant.created_at,
        )

    def list(self, desktop_id: str) -> list[Grant]:
        """The links of a desktop that still work, oldest first."""
        now = datetime.now(UTC)
        for grant in [g for g in self._grants.values() if g.expires_at <= now]:
            del self._grants[grant.id]
        return [g for g in self._grants.values() if g.desktop_id == desktop_id]

    def revoke(self, desktop_id: str, link_id: str) -> None:
        grant = self._grants.get(link_id)
        if grant is None or grant.desktop_id != desktop_id:
            raise NotFound(
                f"desktop {desktop_id} has no share link {link_id!r}: "
                f"list them with GET /api/desktops/{desktop_id}/shares"
            )
        del self._grants[link_id]
        self._events.emit(LinkRevoked(desktop_id, link_id))

    def verify(self, token: str) -> Grant:
        """The grant a share token carries; `AuthError` if it is unknown, revoked or expired."""
        parts = token.split(".")
        grant = self._grants.get(parts[1]) if len(parts) == 3 and parts[0] == PREFIX else None
        if grant is None or not secrets.compare_digest(grant.digest, _digest(parts[2])):
            raise AuthError("this share link is unknown or was revoked: ask for a new one")
        if grant.expires_at <= datetime.now(UTC):
            raise AuthError("this share link has expired: ask for a new one")
        return grant
