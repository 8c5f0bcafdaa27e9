"""Links: tokens scoped to one desktop, with an id, a list, an expiry and a revoke.

A share link opens one desktop's live view (`share2.<id>.<secret>`); a preview link opens
one port of one desktop through the port proxy (`preview1.<id>.<secret>`,
`cubicle.server.ports`). The service keeps a link's id, desktop, scope, expiry and a hash
of its secret, never the secret. Links live as long as the service and the desktop do: a
desktop that ends takes its links with it. Revoking a link stops
every later request made with it; the live view hangs up the viewers a revoked share link
opened (`LinkRevoked`).
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Generic, TypeVar

from cubicle.protocol.errors import AuthError, CapacityReached, NotFound
from cubicle.protocol.service import AccessMode, ShareLink
from cubicle.server.events import DesktopEnded, DesktopEvent, Events, LinkRevoked

PREFIX = "share2"
PREVIEW_PREFIX = "preview1"
MAX_LINKS_PER_DESKTOP = 100


@dataclass(frozen=True)
class Grant:
    """What one link allows: its desktop until it expires (kinds add what else)."""

    id: str
    desktop_id: str
    expires_at: datetime
    created_at: datetime
    digest: bytes = field(repr=False)


@dataclass(frozen=True)
class ShareGrant(Grant):
    """A share link's grant: the live view of its desktop, to watch or to control."""

    mode: AccessMode = "view"


@dataclass(frozen=True)
class PreviewGrant(Grant):
    """A preview link's grant: one port of its desktop, through the port proxy."""

    port: int = 0


G = TypeVar("G", bound=Grant)


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class Links(Generic[G]):
    """Every link of one kind: tokens `<prefix>.<id>.<secret>`, kept as hashes, dropped
    when they expire, are revoked, or their desktop ends."""

    def __init__(self, events: Events, prefix: str, noun: str) -> None:
        self._grants: dict[str, G] = {}
        self._events = events
        self._prefix = prefix
        self._noun = noun
        self._unsubscribe = events.subscribe(self._on_event)

    def close(self) -> None:
        self._unsubscribe()

    def _on_event(self, event: DesktopEvent) -> None:
        if isinstance(event, DesktopEnded):
            for grant in self.list(event.desktop_id):
                self._grants.pop(grant.id, None)

    def issue(self, desktop_id: str, ttl_s: int, make: Callable[..., G]) -> tuple[G, str]:
        """A new grant built by `make(id=, desktop_id=, expires_at=, created_at=, digest=)`,
        and its token (shown once: only its hash is kept)."""
        if len(self.list(desktop_id)) >= MAX_LINKS_PER_DESKTOP:
            raise CapacityReached(
                f"desktop {desktop_id} has {MAX_LINKS_PER_DESKTOP} live {self._noun}s: "
                "revoke some first"
            )
        link_id, secret = secrets.token_hex(6), secrets.token_urlsafe(24)
        now = datetime.now(UTC)
        grant = make(
            id=link_id,
            desktop_id=desktop_id,
            expires_at=now + timedelta(seconds=ttl_s),
            created_at=now,
            digest=_digest(secret),
        )
        self._grants[link_id] = grant
        return grant, f"{self._prefix}.{link_id}.{secret}"

    def list(self, desktop_id: str) -> list[G]:
        """The links of a desktop that still work, oldest first."""
        now = datetime.now(UTC)
        for grant in [g for g in self._grants.values() if g.expires_at <= now]:
            del self._grants[grant.id]
        return [g for g in self._grants.values() if g.desktop_id == desktop_id]

    def revoke(self, desktop_id: str, link_id: str) -> G:
        grant = self._grants.get(link_id)
        if grant is None or grant.desktop_id != desktop_id:
            raise NotFound(f"desktop {desktop_id} has no {self._noun} {link_id!r}")
        del self._grants[link_id]
        return grant

    def owns(self, token: str) -> bool:
        """Whether `token` is of this kind (valid or not)."""
        return token.startswith(self._prefix + ".")

    def verify(self, token: str) -> G:
        """The grant a token carries; `AuthError` if it is unknown, revoked or expired."""
        parts = token.split(".")
        grant = self._grants.get(parts[1]) if len(parts) == 3 and parts[0] == self._prefix else None
        if grant is None or not secrets.compare_digest(grant.digest, _digest(parts[2])):
            raise AuthError(f"this {self._noun} is unknown or was revoked: ask for a new one")
        if grant.expires_at <= datetime.now(UTC):
            raise AuthError(f"this {self._noun} has expired: ask for a new one")
        return grant


class ShareLinks(Links[ShareGrant]):
    """Every share link of one service."""

    def __init__(self, events: Events) -> None:
        super().__init__(events, PREFIX, "share link")

    def create(self, desktop_id: str, mode: AccessMode, ttl_s: int, base_url: str) -> ShareLink:
        grant, token = self.issue(desktop_id, ttl_s, functools.partial(ShareGrant, mode=mode))
        return self.describe(grant, base_url, token)

    @staticmethod
    def describe(grant: ShareGrant, base_url: str, token: str | None = None) -> ShareLink:
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

    def revoke(self, desktop_id: str, link_id: str) -> ShareGrant:
        grant = super().revoke(desktop_id, link_id)
        self._events.emit(LinkRevoked(desktop_id, link_id))
        return grant


class PreviewLinks(Links[PreviewGrant]):
    """Every preview link of one service: each opens one port of one desktop."""

    def __init__(self, events: Events) -> None:
        super().__init__(events, PREVIEW_PREFIX, "preview link")

    def create(self, desktop_id: str, port: int, ttl_s: int) -> tuple[PreviewGrant, str]:
        return self.issue(desktop_id, ttl_s, functools.partial(PreviewGrant, port=port))
