"""The port proxy: requests for a program inside a desktop, answered by that program.

An ASGI middleware in front of the whole app. A request is for a desktop's port when it is
addressed one of three ways; anything else goes on to the app:

- **headers** (E2B's SDKs): `E2b-Sandbox-Id: <desktop id>` and `E2b-Sandbox-Port: <port>`,
  any host and path;
- **host name** (browsers): `Host: <port>-<desktop id>.<domain>` (`CUBICLE_DOMAIN`);
- **path**, WebSockets only (a program handed one URL, such as a CDP client):
  `/ports/<desktop id>/<port>/<path inside>`.

It must prove itself with `X-Access-Token` (the admin token, or a preview link's token for
this desktop and port), a preview link's `?cubicle_token=` (a browser is sent on to the same
address without it and keeps it in a cookie for that one host), or not at all for a port
made public. `Authorization` is never looked at: it reaches the program inside untouched.
The credentials the proxy read (`X-Access-Token`, the query token, its cookie) are taken off
before the request goes in.

HTTP is carried over keep-alive connections to the port (`GuestClient.relay_pool`), bodies
streamed both ways, never held whole; WebSockets are carried message by message, with the
subprotocol the program picks. Errors before the answer starts are Cubicle's `ErrorBody`
(401/403 for access, 404 for an unknown desktop, 502 `port_closed` when nothing listens).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Literal
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from cubicle.protocol.errors import (
    AuthError,
    CubicleError,
    DesktopPaused,
    Forbidden,
    GuestUnreachable,
    InvalidRequest,
    answer_for,
)
from cubicle.server import inside
from cubicle.server._http1 import Http1Error, Timeouts, _Connection
from cubicle.server.api.auth import is_admin_token
from cubicle.server.e2b import CODE_INTERPRETER_PORT, ENVD_PORT
from cubicle.server.guest_client import GuestClient
from cubicle.server.ports import Ports
from cubicle.server.services import Services

log = logging.getLogger("cubicle.ports")

TOKEN_PARAM = "cubicle_token"
"""The query parameter a preview link carries its token in."""
COOKIE = "cubicle_preview"
"""The cookie a browser keeps a preview link's token in, for the one host it opened."""
_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
}
_NOT_INSIDE = _HOP_BY_HOP | {
    b"expect",  # the service already answered `100 Continue` as it read the body
    b"x-access-token",
    b"e2b-traffic-access-token",
    b"e2b-sandbox-id",
    b"e2b-sandbox-port",
    b"content-length",  # set again from the body that goes in
}
_NOT_OUTSIDE = _HOP_BY_HOP | {b"date", b"server"}  # uvicorn sets its own date
_WS_OWN = {
    b"host",
    b"sec-websocket-key",
    b"sec-websocket-version",
    b"sec-websocket-extensions",
    b"sec-websocket-protocol",
}
_CODE_INTERPRETER_PATH = re.compile(
    rb"^/(execute|health|contexts(/[A-Za-z0-9_-]{1,64}(/restart)?)?)/?$"
)
"""The paths of E2B's code interpreter (port 49999): nothing else goes in."""
_TIMEOUTS = Timeouts(connect=10.0, write=60.0, read=None)
"""A program inside may take its time to answer (a long poll, a server-sent stream)."""
_WHOLE_BODY = 1 << 20
"""A request body up to this size is read whole and sent in one piece (and retried on a
fresh connection if a kept-alive one turns out closed); a larger one is streamed in."""


@dataclass(frozen=True)
class Target:
    """A desktop's port a request is for, and the path it asks there."""

    desktop_id: str
    port: int
    form: Literal["headers", "host", "path"]
    path: bytes
    """The path and query to send inside, without the proxy's own token."""
    token: str | None
    """The preview token the query carried, if any."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k == name), None)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidRequest(f"{text!r} is not a TCP port (1-65535)")
    return int(text)


def _split_query(query: bytes) -> tuple[bytes, str | None]:
    """The query without the proxy's token parameter, and that token."""
    if TOKEN_PARAM.encode() not in query:
        return query, None
    pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
    token = next((v for k, v in pairs if k == TOKEN_PARAM), None)
    rest = urlencode([(k, v) for k, v in pairs if k != TOKEN_PARAM]).encode("latin-1")
    return rest, token


class PortProxy:
    """ASGI middleware: requests addressed to a desktop's port go there, others to `app`."""

    def __init__(self, app: ASGIApp, domain_name: str) -> None:
        """`domain_name`: the ports' domain without a port (`Settings.port_domain_name`)."""
        self.app = app
        self._host = re.compile(
            rb"^(\d{1,5})-([a-z0-9]{1,63})\." + re.escape(domain_name.encode()) + rb"(?::\d+)?$",
            re.IGNORECASE,
        )

    def route(self, scope: Scope) -> Target | None:
        """The port a request is addressed to, or None when it is for the service itself."""
        raw_path = scope.get("raw_path") or scope["path"].encode()
        query, token = _split_query(scope.get("query_string", b""))
        path = raw_path + (b"?" + query if query else b"")
        sandbox, port = _header(scope, b"e2b-sandbox-id"), _header(scope, b"e2b-sandbox-port")
        if sandbox is not None or port is not None:
            if sandbox is None or port is None:
                raise InvalidRequest("E2b-Sandbox-Id and E2b-Sandbox-Port go together")
            desktop_id, port_text = sandbox.decode("latin-1"), port.decode("latin-1")
            return Target(desktop_id, _port(port_text), "headers", path, token)
        host = _header(scope, b"host")
        if host is not None and (found := self._host.match(host)):
            return Target(found[2].decode().lower(), _port(found[1].decode()), "host", path, token)
        if scope["type"] == "websocket" and raw_path.startswith(b"/ports/"):
            parts = raw_path.split(b"/", 4)
            if len(parts) < 4:
                raise InvalidRequest("a port's WebSocket path is /ports/<desktop id>/<port>/...")
            inside = b"/" + (parts[4] if len(parts) > 4 else b"")
            path = inside + (b"?" + query if query else b"")
            desktop_id, port_text = parts[2].decode("latin-1"), parts[3].decode("latin-1")
            return Target(desktop_id, _port(port_text), "path", path, token)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            target = self.route(scope)
        except CubicleError as exc:
            await _refuse(scope, receive, send, exc)
            return
        if target is None:
            await self.app(scope, receive, send)
            return
        services: Services = scope["state"]["services"]
        if target.port == ENVD_PORT and target.form == "headers":
            await _envd(services, target, scope, receive, send)
            return
        if target.port == CODE_INTERPRETER_PORT and services.e2b.get(target.desktop_id):
            await self._code_interpreter(services, target, scope, receive, send)
            return
        try:
            redirect = _authorize(services, target, scope)
            if redirect is not None:
                await redirect(scope, receive, send)
                return
            guest = await services.manager.awake(target.desktop_id)
        except CubicleError as exc:
            await _refuse(scope, receive, send, exc)
            return
        if scope["type"] == "http":
            await _Exchange(guest, target, scope, receive, send).run()
        else:
            await _carry_websocket(guest, target, scope, receive, send)

    async def _code_interpreter(
        self, services: Services, target: Target, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """E2B's code interpreter (port 49999) of a sandbox made through E2B's API: the
        service's own surface over the desktop's code contexts, reached in process."""
        if not _e2b_token_ok(services, target.desktop_id, scope):
            await _refuse_e2b(scope, receive, send, 401, "the sandbox's access token is missing")
            return
        path, _, query = target.path.partition(b"?")
        if not _CODE_INTERPRETER_PATH.match(path):  # the request goes in as the service's
            await _refuse_e2b(scope, receive, send, 404, "the code interpreter has no such path")
            return
        inner_path = b"/api/desktops/%s/e2b-code-interpreter%s" % (
            target.desktop_id.encode(),
            path.rstrip(b"/"),
        )
        headers = [
            (key, value)
            for key, value in scope["headers"]
            if key not in (b"authorization", b"x-access-token", b"e2b-traffic-access-token")
        ]
        inner = inside.marked({**_at(scope, inner_path, query), "headers": headers})
        await self.app(inner, receive, send)


async def _envd(
    services: Services, target: Target, scope: Scope, receive: Receive, send: Send
) -> None:
    """E2B's envd of a sandbox made through E2B's API, answered by the service
    (`cubicle.server.e2b.envd`); E2B's own answer for any other id (502, "was not found")."""
    envd = services.e2b.envd(target.desktop_id)
    if envd is None:
        await _refuse_e2b(
            scope, receive, send, 502, f"The sandbox {target.desktop_id} was not found"
        )
        return
    path, _, query = target.path.partition(b"?")
    inner = _at(scope, path, query)
    if path != b"/health" and not _e2b_token_ok(services, target.desktop_id, scope):
        await _refuse_e2b(scope, receive, send, 401, "the sandbox's access token is missing")
        return
    try:
        guest = await services.manager.awake(target.desktop_id)
    except DesktopPaused as exc:
        await _refuse_e2b(scope, receive, send, 502, str(exc))
        return
    except CubicleError:
        await _refuse_e2b(
            scope, receive, send, 502, f"The sandbox {target.desktop_id} was not found"
        )
        return
    await envd(guest, inner, receive, send)


def _at(scope: Scope, path: bytes, query: bytes) -> Scope:
    """`scope` addressed to `path?query` (a port's own path, or the service route that
    answers for it)."""
    return {**scope, "path": path.decode("latin-1"), "raw_path": path, "query_string": query}


def _e2b_token_ok(services: Services, desktop_id: str, scope: Scope) -> bool:
    """Whether the request carries sandbox `desktop_id`'s E2B token (`X-Access-Token` or
    `E2B-Traffic-Access-Token`), or the admin token as `X-Access-Token`."""
    for name in (b"x-access-token", b"e2b-traffic-access-token"):
        given = _header(scope, name)
        if given is None:
            continue
        token = given.decode("latin-1")
        if services.e2b.owns(desktop_id, token):
            return True
        if name == b"x-access-token" and is_admin_token(services, token):
            return True
    return False


async def _refuse_e2b(scope: Scope, receive: Receive, send: Send, status: int, text: str) -> None:
    body = json.dumps({"code": status, "message": text}).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse(scope: Scope, receive: Receive, send: Send, exc: CubicleError) -> None:
    """Answer with `exc`'s `ErrorBody` (a WebSocket is refused with it before it opens)."""
    answer = answer_for(exc, log_hint="the service's log")
    headers = [(b"content-type", b"application/json")]
    headers += [(k.lower().encode(), v.encode()) for k, v in answer.headers.items()]
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        start = "websocket.http.response.start"
        body = "websocket.http.response.body"
    else:
        start, body = "http.response.start", "http.response.body"
    await send({"type": start, "status": answer.status, "headers": headers})
    await send({"type": body, "body": answer.json()})


# --- who may ---------------------------------------------------------------------------------


class _Redirect:
    """Send a browser on to the same address without the token, which it keeps in a cookie
    for this one host (HttpOnly: the page inside cannot read it)."""

    def __init__(self, target: Target, token: str, secure: bool) -> None:
        self.location = target.path
        cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax"
        self.cookie = cookie + ("; Secure" if secure else "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"location", self.location),
            (b"set-cookie", self.cookie.encode()),
            (b"cache-control", b"no-store"),
            (b"referrer-policy", b"no-referrer"),
        ]
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


def _authorize(services: Services, target: Target, scope: Scope) -> _Redirect | None:
    """Raise unless the request may reach `target`; a redirect for a browser that brought a
    preview token in its address."""
    ports = services.ports
    if _e2b_token_ok(services, target.desktop_id, scope):
        return None  # a sandbox made through E2B's API, with its own token
    given = _header(scope, b"x-access-token")
    if given is not None:
        token = given.decode("latin-1")
        if is_admin_token(services, token):
            return None
        if not ports.previews.owns(token):
            raise AuthError("X-Access-Token is not a token of this service")
        _check_grant(ports, token, target)
        return None
    if target.token is not None:
        if not ports.previews.owns(target.token):
            raise AuthError(
                "only a preview link's token goes in an address: send the admin token as "
                "X-Access-Token, or make a preview link (POST /api/desktops/{id}/ports/{port}/"
                "previews)"
            )
        _check_grant(ports, target.token, target)
        navigating = scope["type"] == "http" and scope["method"] in ("GET", "HEAD")
        if target.form == "host" and navigating:
            return _Redirect(target, target.token, scope.get("scheme") == "https")
        return None
    if ports.is_public(target.desktop_id, target.port):
        return None
    cookie = _cookie(scope)
    if cookie is not None and target.form == "host":
        _check_grant(ports, cookie, target)
        site = _header(scope, b"sec-fetch-site")
        mode = _header(scope, b"sec-fetch-mode")
        if site in (b"same-site", b"cross-site") and mode != b"navigate":
            # another preview's page (same site: *.<domain>) may not use this one's cookie
            raise Forbidden("a preview's cookie works for its own pages and navigations only")
        return None
    raise AuthError(
        f"port {target.port} of desktop {target.desktop_id} needs a token: send "
        "X-Access-Token (the admin token or a preview link's), or open a preview link "
        f"(POST /api/desktops/{target.desktop_id}/ports/{target.port}/previews)"
    )


def _check_grant(ports: Ports, token: str, target: Target) -> None:
    grant = ports.previews.verify(token)
    if grant.desktop_id != target.desktop_id or grant.port != target.port:
        raise Forbidden(
            f"this preview link opens port {grant.port} of desktop {grant.desktop_id}, "
            f"not port {target.port} of desktop {target.desktop_id}"
        )


def _cookie(scope: Scope) -> str | None:
    raw = _header(scope, b"cookie")
    if raw is None or COOKIE.encode() not in raw:
        return None
    morsel = SimpleCookie(raw.decode("latin-1")).get(COOKIE)
    return morsel.value if morsel is not None else None


def _without_own_cookie(value: bytes) -> bytes | None:
    """A `Cookie` header without the proxy's cookie (None when nothing else is left)."""
    if COOKIE.encode() not in value:
        return value
    kept = [c for c in value.split(b";") if c.strip().split(b"=", 1)[0] != COOKIE.encode()]
    return b";".join(kept).strip() or None


def _inside_headers(scope: Scope, drop: set[bytes]) -> list[tuple[bytes, bytes]]:
    """The request's headers as the program inside gets them, plus `X-Forwarded-*`."""
    headers: list[tuple[bytes, bytes]] = []
    for name, value in scope["headers"]:
        if name in drop:
            continue
        if name == b"cookie":
            kept = _without_own_cookie(value)
            if kept is None:
                continue
            value = kept
        headers.append((name, value))
    client = scope.get("client")
    if client:
        headers.append((b"x-forwarded-for", client[0].encode()))
    scheme = str(scope.get("scheme") or "http")
    proto = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    headers.append((b"x-forwarded-proto", proto.encode()))
    if (host := _header(scope, b"host")) is not None:
        headers.append((b"x-forwarded-host", host))
    return headers


# --- HTTP ------------------------------------------------------------------------------------


class _Exchange:
    """One HTTP request carried to a port inside and its answer carried back."""

    def __init__(
        self, guest: GuestClient, target: Target, scope: Scope, receive: Receive, send: Send
    ) -> None:
        self.pool = guest.relay_pool(target.port)
        self.target = target
        self.scope = scope
        self.receive = receive
        self.send = send
        self.started = False

    async def run(self) -> None:
        try:
            conn = await self._ask()
        except CubicleError as exc:
            await _refuse(self.scope, self.receive, self.send, exc)
            return
        except Http1Error as exc:
            error = GuestUnreachable(f"port {self.target.port} did not answer: {exc}")
            await _refuse(self.scope, self.receive, self.send, error)
            return
        await self._answer(conn)

    def _head(self, body_length: int | None) -> bytes:
        method = self.scope["method"].encode()
        lines = [b"%s %s HTTP/1.1" % (method, self.target.path)]
        lines += [b"%s: %s" % pair for pair in _inside_headers(self.scope, _NOT_INSIDE)]
        if body_length is None:
            lines.append(b"transfer-encoding: chunked")
        elif body_length or method in (b"POST", b"PUT", b"PATCH"):
            lines.append(b"content-length: %d" % body_length)
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _ask(self) -> _Connection:
        """Send the request (its body as it arrives) and read the answer's head."""
        first = await self.receive()
        body = first.get("body", b"")
        declared = _header(self.scope, b"content-length")
        whole = not first.get("more_body", False)
        while not whole and len(body) < _WHOLE_BODY:
            message = await self.receive()
            body += message.get("body", b"")
            whole = not message.get("more_body", False)
        if whole:
            return await self.pool.exchange(self._head(len(body)), body, _TIMEOUTS)
        length = int(declared) if declared is not None and declared.isdigit() else None
        return await self.pool.exchange_streaming(
            self._head(length), self._rest(body, chunked=length is None), _TIMEOUTS
        )

    async def _rest(self, first: bytes, *, chunked: bool) -> AsyncIterator[bytes]:
        """The request body from `first` on, framed for the connection inside."""
        chunk, more = first, True
        while True:
            if chunk:
                yield b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk
            if not more:
                break
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise Http1Error("the client went away while sending its body")
            chunk, more = message.get("body", b""), message.get("more_body", False)
        if chunked:
            yield b"0\r\n\r\n"

    async def _answer(self, conn: _Connection) -> None:
        status = conn.status_code
        headers = [(k.lower(), v) for k, v in conn.headers if k.lower() not in _NOT_OUTSIDE]
        no_body = self.scope["method"] == "HEAD" or status in (204, 304)
        watcher = asyncio.get_running_loop().create_task(self._watch_disconnect(conn))
        try:
            await self.send({"type": "http.response.start", "status": status, "headers": headers})
            if no_body:
                conn.close()  # its parser would wait for a body a HEAD answer never has
            else:
                while (chunk := await conn.next_chunk(None)) is not None:
                    await self.send(
                        {"type": "http.response.body", "body": chunk, "more_body": True}
                    )
            await self.send({"type": "http.response.body", "body": b""})
        except Http1Error as exc:  # the client sees its answer cut short
            where = f"port {self.target.port} of desktop {self.target.desktop_id}"
            log.info("%s broke off its answer: %s", where, exc)
            conn.close()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            self.pool.release(conn)

    async def _watch_disconnect(self, conn: _Connection) -> None:
        """Close the connection inside when the client goes away mid-answer."""
        while (await self.receive())["type"] != "http.disconnect":
            pass
        conn.close()


# --- WebSockets ------------------------------------------------------------------------------


async def _carry_websocket(
    guest: GuestClient, target: Target, scope: Scope, receive: Receive, send: Send
) -> None:
    """Open the same WebSocket on the port inside, then carry messages both ways."""
    await receive()  # websocket.connect
    host = (_header(scope, b"host") or b"localhost").decode("latin-1")
    if target.form == "path":
        host = f"127.0.0.1:{target.port}"  # DevTools answers only to a loopback name
    headers = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in _inside_headers(scope, _NOT_INSIDE | _WS_OWN)
    ]
    try:
        sock = await guest.open_relay(target.port)
    except CubicleError as exc:
        await _deny(scope, send, exc)
        return
    try:
        inside = await connect(
            f"ws://{host}{target.path.decode('latin-1')}",
            sock=sock,
            subprotocols=scope.get("subprotocols") or None,  # type: ignore[arg-type]
            additional_headers=headers,
            user_agent_header=None,
            compression=None,
            max_size=None,
            ping_interval=None,
            open_timeout=30,
        )
    except InvalidStatus as exc:
        sock.close()
        await _deny(scope, send, None, exc.response.status_code, bytes(exc.response.body or b""))
        return
    except (InvalidHandshake, OSError, TimeoutError) as exc:
        sock.close()
        await _deny(scope, send, GuestUnreachable(f"port {target.port} refused a WebSocket: {exc}"))
        return
    async with inside:
        await send({"type": "websocket.accept", "subprotocol": inside.subprotocol})
        outward = asyncio.get_running_loop().create_task(_outward(inside, send))
        try:
            await _inward(inside, receive)
        finally:
            await inside.close()
            await asyncio.gather(outward, return_exceptions=True)


async def _inward(inside: ClientConnection, receive: Receive) -> None:
    """The client's messages, to the program inside, until either side closes."""
    while True:
        message: Message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("bytes")
        try:
            await inside.send(data if data is not None else message.get("text", ""))
        except ConnectionClosed:
            return


async def _outward(inside: ClientConnection, send: Send) -> None:
    """The program's messages, to the client; its close, passed on."""
    try:
        async for data in inside:
            kind = "bytes" if isinstance(data, bytes) else "text"
            await send({"type": "websocket.send", kind: data})
    except ConnectionClosed:
        pass
    code = inside.close_code if inside.close_code not in (None, 1005, 1006) else 1000
    with contextlib.suppress(OSError, RuntimeError):  # the client may be gone already
        await send({"type": "websocket.close", "code": code, "reason": inside.close_reason or ""})


async def _deny(
    scope: Scope, send: Send, exc: CubicleError | None, status: int = 0, body: bytes = b""
) -> None:
    """Refuse a WebSocket that has not opened: with `exc`, or the program's own answer."""
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if exc is not None:
        answer = answer_for(exc, log_hint="the service's log")
        status, body = answer.status, answer.json()
        headers = [(b"content-type", b"application/json")]
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1011})
        return
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})
