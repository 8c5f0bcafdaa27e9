"""`Guard`: the one ASGI middleware every request of the service passes through.

- A cap on every request body, declared or chunked: `413` before the app reads past it
  (`CUBICLE_MAX_BODY_MB`; the files upload `CUBICLE_MAX_UPLOAD_MB`; rooms raise it for
  their own routes with `Room.body_limits`).
- Security headers on every answer: a Content-Security-Policy (scripts, styles, media
  and frames from the service only; `frame-ancestors 'self'`), `Referrer-Policy:
  no-referrer`, `X-Content-Type-Options: nosniff`.
- A page opened with `?token=` (the URL the service prints, or a share link) answers with
  the token as an HttpOnly, SameSite=Strict cookie; the page then drops it from its
  address (`web/api.js`), and every request it makes carries the cookie instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import parse_qs

from fastapi import HTTPException
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cubicle.protocol.errors import CubicleError, PayloadTooLarge, answer_for
from cubicle.server.api.auth import ADMIN_COOKIE, SHARE_COOKIE, Access, read_token

PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' blob:; connect-src 'self'; frame-src 'self'; frame-ancestors 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'"
)
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; img-src 'self' data: https:; "
    "frame-ancestors 'self'; object-src 'none'; base-uri 'none'"
)
"""FastAPI's `/docs` and `/redoc` load their scripts from jsDelivr and start them inline;
they carry no token."""
_DOCS = ("/docs", "/redoc", "/docs/oauth2-redirect")
_HEADERS = [
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"SAMEORIGIN"),
]
_PAGES = re.compile(r"^/$|^/view/[^/]+$|^/web/[^/]+\.html$")
"""Where `?token=` becomes a cookie."""
_BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


class BodyLimits:
    """The largest body each request may send, in bytes: `default`, or the first of
    `routes` ((method, path pattern) → bytes) that matches."""

    def __init__(self, default: int, routes: Mapping[tuple[str, str], int]) -> None:
        self.default = default
        self._routes = [(m, re.compile(p), n) for (m, p), n in routes.items()]

    def of(self, method: str, path: str) -> int:
        for wanted, pattern, limit in self._routes:
            if method == wanted and pattern.fullmatch(path):
                return limit
        return self.default


class BodyTooLarge(HTTPException):
    """Raised while the app reads a body past its limit: FastAPI lets an `HTTPException`
    through its body parsing, and the service answers it as `payload_too_large` (413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, _too_large(None, limit))


class Guard:
    """The service's ASGI middleware (module docstring)."""

    def __init__(self, app: ASGIApp, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        extra = list(_HEADERS)
        csp = DOCS_CSP if path in _DOCS else PAGE_CSP
        extra.append((b"content-security-policy", csp.encode()))
        if method == "GET" and b"token=" in scope.get("query_string", b"") and _PAGES.match(path):
            extra += self._cookie_for(scope)
        if method in _BODY_METHODS:
            limit = self.limits.of(method, path)
            declared = _content_length(scope)
            if declared is not None and declared > limit:
                await _refuse(send, extra, declared, limit)
                return
            receive = _Counted(receive, limit)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in extra if n == b"set-cookie" or n not in present]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)

    @staticmethod
    def _cookie_for(scope: Scope) -> list[tuple[bytes, bytes]]:
        """The Set-Cookie header that swaps a page's `?token=` for a cookie, if it is good."""
        query = parse_qs(scope.get("query_string", b"").decode(errors="replace"))
        token = (query.get("token") or [""])[0]
        try:
            access = read_token(HTTPConnection(scope), token)
        except CubicleError:  # a wrong link replaces what the browser held before
            names = [ADMIN_COOKIE]
            if scope["path"].startswith("/view/"):
                names.append(SHARE_COOKIE + scope["path"].rsplit("/", 1)[1])
            return [(b"set-cookie", _expired(name).encode()) for name in names]
        return [(b"set-cookie", session_cookie(scope, access, token).encode())]


def session_cookie(scope: Scope, access: Access, token: str) -> str:
    """The Set-Cookie value that keeps `token` for the pages."""
    name = ADMIN_COOKIE if access.admin else f"{SHARE_COOKIE}{access.desktop_id}"
    attributes = [f"{name}={token}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if access.expires_at is not None:
        attributes.append(f"Expires={access.expires_at.strftime('%a, %d %b %Y %H:%M:%S GMT')}")
    if scope.get("scheme") == "https":
        attributes.append("Secure")
    return "; ".join(attributes)


def _expired(name: str) -> str:
    return f"{name}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


class _Counted:
    """`receive` that raises `BodyTooLarge` as soon as the body passes the limit."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self._receive = receive
        self._limit = self._left = limit

    async def __call__(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self._left -= len(message.get("body", b""))
            if self._left < 0:
                raise BodyTooLarge(self._limit)
        return message


def _too_large(size: int | None, limit: int) -> str:
    what = f"{size} bytes" if size is not None else "larger"
    return (
        f"the request body is {what}, over this call's limit of {limit} bytes "
        "(CUBICLE_MAX_BODY_MB, or CUBICLE_MAX_UPLOAD_MB for file uploads)"
    )


async def _refuse(send: Send, extra: list, size: int, limit: int) -> None:
    answer = answer_for(PayloadTooLarge(_too_large(size, limit)), log_hint="")
    body = answer.json()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
