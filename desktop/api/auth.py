"""Bearer-token auth for every `/api` route."""

from __future__ import annotations

import secrets
from pathlib import Path

from fastapi import Request

from desktop.errors import AuthError


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


def require_token(request: Request) -> None:
    """Accept `Authorization: Bearer <token>`, or `?token=` for links opened in a browser."""
    expected: str = request.app.state.token
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        given = request.query_params.get("token", "")
    if not given:
        raise AuthError("missing token: send `Authorization: Bearer <token>` (printed at start)")
    if not secrets.compare_digest(given.encode(), expected.encode()):
        raise AuthError("wrong token: use the one printed when the service started")
