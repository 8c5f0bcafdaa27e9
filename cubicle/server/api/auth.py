"""Tokens: the service's admin token for every `/api` route, and scoped share links.

A request proves who it is with `Authorization: Bearer <token>` (programs) or a cookie
(the pages). Tokens never travel in API URLs: a page opened with `?token=` (the link the
service prints, or a share link) gets the token back as an HttpOnly, SameSite=Strict
cookie (`cubicle.server.api.security`), and the page drops it from its address.

A share token opens the live view of one desktop (`cubicle.server.shares`), either to watch
(`view`) or to watch and take control (`control`). A cookie-authenticated request that
changes something must come from the service's own pages (its `Origin` is the service's).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from cubicle.protocol.errors import AuthError, Forbidden
from cubicle.protocol.service import AccessMode
from cubicle.server.inside import is_inside
from cubicle.server.services import Services, services_of
from cubicle.server.shares import PREFIX as SHARE_PREFIX

ADMIN_COOKIE = "cubicle_admin"
SHARE_COOKIE = "cubicle_share_"
"""A share token's cookie is named after its desktop: `cubicle_share_<desktop id>`."""
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def load_or_create_token(data_dir: Path, configured: str | None) -> str:
    """The configured token, else the one kept in `data_dir/token`, else a new one kept there."""
    if configured:
        return configured
    path = data_dir / "token"
    if path.is_file() and (token := path.read_text().strip()):
        return token
    data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return token


@dataclass(frozen=True)
class Access:
    """What a request's token allows."""

    desktop_id: str | None
    """The one desktop a share token opens; None for the admin token (every desktop)."""
    mode: AccessMode
    expires_at: datetime | None = None
    """When a share token stops working; None for the admin token."""
    link_id: str | None = None
    """The share link the request came with, if any."""

    @property
    def admin(self) -> bool:
        return self.desktop_id is None


def is_admin_token(services: Services, token: str) -> bool:
    """Whether `token` is the service's admin token (compared in constant time)."""
    return secrets.compare_digest(token.encode(), services.token.encode())


def read_token(connection: HTTPConnection, token: str) -> Access:
    """What `token` allows on this service; `AuthError` if it allows nothing."""
    services = services_of(connection)
    if token.startswith(SHARE_PREFIX + "."):
        grant = services.shares.verify(token)
        return Access(grant.desktop_id, grant.mode, grant.expires_at, grant.id)
    if not is_admin_token(services, token):
        raise AuthError("wrong token: use the one printed when the service started")
    return Access(None, "control")


def _same_origin(connection: HTTPConnection) -> bool:
    """Whether a browser request comes from the service's own pages."""
    origin = connection.headers.get("origin")
    if origin is None:
        return connection.headers.get("sec-fetch-site") in (None, "same-origin")
    scheme = "https" if connection.url.scheme in ("https", "wss") else "http"
    return origin == f"{scheme}://{connection.headers.get('host', '')}"


def access_of(connection: HTTPConnection, desktop_id: str | None = None) -> Access:
    """Read `Authorization: Bearer <token>`, else the pages' cookies (the admin's, or the
    share link's of `desktop_id`). The service's own requests (`cubicle.server.inside`)
    carry no token: they are the admin."""
    if is_inside(connection.scope):
        return Access(None, "control")
    header = connection.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() == "bearer" and given:
        return read_token(connection, given)
    cookies = connection.cookies
    given = cookies.get(ADMIN_COOKIE) or (desktop_id and cookies.get(SHARE_COOKIE + desktop_id))
    if not given:
        raise AuthError("missing token: send `Authorization: Bearer <token>` (printed at start)")
    method = connection.scope.get("method", "GET")
    if (method not in _SAFE_METHODS or connection.scope["type"] == "websocket") and not (
        _same_origin(connection)
    ):
        raise Forbidden("a request with the service's cookie must come from its own pages")
    return read_token(connection, given)


def admin_access(request: HTTPConnection) -> Access:
    """The caller's access if it holds the service's token; else `AuthError` or `Forbidden`."""
    access = access_of(request)
    if not access.admin:
        raise Forbidden(
            f"a share link only opens the live view of desktop {access.desktop_id}: "
            "this call needs the service's token"
        )
    return access


# The dependencies are `async def` although they never wait: FastAPI runs a plain `def`
# dependency on its thread pool, a thread hop per request for a string comparison.


async def require_admin(request: Request) -> Access:
    """Admit the admin token only: share links open nothing but their desktop's live view."""
    return admin_access(request)


async def require_token(request: Request) -> None:
    """The dependency of every route that only the admin token may call."""
    admin_access(request)


def check_access(access: Access, desktop_id: str, mode: AccessMode) -> None:
    """Raise `Forbidden` unless `access` allows `mode` on `desktop_id`."""
    if access.admin:
        return
    if access.desktop_id != desktop_id:
        raise Forbidden(f"this share link opens desktop {access.desktop_id}, not {desktop_id}")
    if mode == "control" and access.mode != "control":
        raise Forbidden("this share link is view-only: ask for a controlling link")


async def require_view(desktop_id: str, request: Request) -> Access:
    access = access_of(request, desktop_id)
    check_access(access, desktop_id, "view")
    return access


async def require_control(desktop_id: str, request: Request) -> Access:
    access = access_of(request, desktop_id)
    check_access(access, desktop_id, "control")
    return access


ViewAccess = Annotated[Access, Depends(require_view)]
"""The admin token, or a share token (view or control) for the desktop in the path."""
ControlAccess = Annotated[Access, Depends(require_control)]
"""The admin token, or a controlling share token for the desktop in the path."""
AdminAccess = Annotated[Access, Depends(require_admin)]
