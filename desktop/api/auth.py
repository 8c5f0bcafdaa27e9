"""Tokens: the service's admin token for every `/api` route, and scoped share tokens.

A share token opens the live view of one desktop until it expires, either to watch
(`view`) or to watch and take control (`control`). It is signed with the admin token
(HMAC-SHA256), so it needs no storage and a new admin token revokes every link.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from desktop.models import AccessMode
from desktop.protocol.errors import AuthError, Forbidden
from desktop.services import services_of

_SHARE_PREFIX = "share1"


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

    @property
    def admin(self) -> bool:
        return self.desktop_id is None


def _signature(secret: str, message: str) -> str:
    digest = hmac.new(secret.encode(), message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:18]).decode()


def share_token(secret: str, desktop_id: str, mode: AccessMode, expires_at: datetime) -> str:
    """A token that opens one desktop's live view in `mode` until `expires_at`."""
    message = f"{_SHARE_PREFIX}.{desktop_id}.{mode}.{int(expires_at.timestamp())}"
    return f"{message}.{_signature(secret, message)}"


def _read_share(secret: str, token: str) -> Access:
    parts = token.split(".")
    if len(parts) != 5 or parts[2] not in ("view", "control") or not parts[3].isdigit():
        raise AuthError("wrong token: use the one printed when the service started")
    message = ".".join(parts[:4])
    if not secrets.compare_digest(parts[4].encode(), _signature(secret, message).encode()):
        raise AuthError("wrong token: this share link was not made by this service")
    expires = int(parts[3])
    if expires < time.time():
        raise AuthError("this share link has expired: ask for a new one")
    mode: AccessMode = "control" if parts[2] == "control" else "view"
    return Access(parts[1], mode, datetime.fromtimestamp(expires, UTC))


def access_of(connection: HTTPConnection) -> Access:
    """Read `Authorization: Bearer <token>`, or `?token=` for links opened in a browser."""
    expected = services_of(connection).token
    header = connection.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        given = connection.query_params.get("token", "")
    if not given:
        raise AuthError("missing token: send `Authorization: Bearer <token>` (printed at start)")
    if given.startswith(_SHARE_PREFIX + "."):
        return _read_share(expected, given)
    if not secrets.compare_digest(given.encode(), expected.encode()):
        raise AuthError("wrong token: use the one printed when the service started")
    return Access(None, "control")


def admin_access(request: Request) -> Access:
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
    access = access_of(request)
    check_access(access, desktop_id, "view")
    return access


async def require_control(desktop_id: str, request: Request) -> Access:
    access = access_of(request)
    check_access(access, desktop_id, "control")
    return access


ViewAccess = Annotated[Access, Depends(require_view)]
"""The admin token, or a share token (view or control) for the desktop in the path."""
ControlAccess = Annotated[Access, Depends(require_control)]
"""The admin token, or a controlling share token for the desktop in the path."""
AdminAccess = Annotated[Access, Depends(require_admin)]
