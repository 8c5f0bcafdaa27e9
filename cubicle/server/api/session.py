"""`/api/session`: what the pages' cookie allows, and a way to sign in without a URL token.

A page opened without a token (or whose cookie expired) asks for one and posts it here;
the answer sets the same HttpOnly cookie a `?token=` link would have.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from cubicle.protocol.service import AccessMode
from cubicle.server.api.auth import ADMIN_COOKIE, SHARE_COOKIE, access_of, read_token
from cubicle.server.api.security import session_cookie

router = APIRouter(prefix="/api/session", tags=["session"])


class SessionInfo(BaseModel):
    admin: bool
    desktop_id: str | None = None
    """The one desktop a share link opens."""
    mode: AccessMode
    expires_at: datetime | None = None


class SignIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str = Field(min_length=1, max_length=256)


@router.get("")
async def session(request: Request, desktop_id: str | None = None) -> SessionInfo:
    """What this request's token or cookie allows (`desktop_id`: a share link's desktop)."""
    access = access_of(request, desktop_id)
    return SessionInfo(
        admin=access.admin,
        desktop_id=access.desktop_id,
        mode=access.mode,
        expires_at=access.expires_at,
    )


@router.post("", status_code=204)
async def sign_in(body: SignIn, request: Request) -> Response:
    """Check a token and keep it as the pages' HttpOnly, SameSite=Strict cookie."""
    access = read_token(request, body.token)
    response = Response(status_code=204)
    response.headers["set-cookie"] = session_cookie(request.scope, access, body.token)
    return response


@router.delete("", status_code=204)
async def sign_out(request: Request) -> Response:
    """Forget the pages' cookies (admin and share links)."""
    response = Response(status_code=204)
    for name in request.cookies:
        if name == ADMIN_COOKIE or name.startswith(SHARE_COOKIE):
            response.delete_cookie(name, path="/", httponly=True, samesite="strict")
    return response
