"""The control plane's side of the guest protocol: HTTP over the guest's Unix socket.

Guest errors arrive as `{"error": code, "detail": message}` and are raised again here as
the same `CubicleError` subclass; transport failures become `GuestUnreachable`.

Requests go straight to the lean transport as `httpx.Request`s: an `httpx.AsyncClient`
in front of it (URL merging, cookies, auth and redirect handling, none of which the guest
protocol uses) costs about as much Python again as the transport itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from desktop._http import raise_for_error, raise_for_status
from desktop._transport import LeanTransport, build_request, send
from desktop.errors import GuestUnreachable

_BASE = "http://guest"


class GuestClient:
    """One keep-alive HTTP connection pool to one guest daemon."""

    def __init__(self, socket_path: str, *, timeout_s: float = 120.0) -> None:
        self._transport = LeanTransport(uds=socket_path)
        self._timeout = httpx.Timeout(timeout_s, connect=5.0)
        self._timeouts = self._timeout.as_dict()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send one request; raise the guest's error, or GuestUnreachable."""
        request = build_request(method, _BASE + path, self._timeout, **kwargs)
        try:
            response = await send(self._transport, request)
        except httpx.TransportError as exc:
            raise GuestUnreachable(f"the desktop's guest daemon did not answer: {exc}") from exc
        raise_for_error(response)
        return response

    async def post_json(self, path: str, body: bytes) -> bytes:
        """POST a JSON body and return the answer's body (the hot path of every action)."""
        try:
            status, content = await self._transport.post(
                path, body, "application/json", self._timeouts
            )
        except httpx.TransportError as exc:
            raise GuestUnreachable(f"the desktop's guest daemon did not answer: {exc}") from exc
        raise_for_status(status, content)
        return content

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        """Send a request and hold the response open to read it as it arrives."""
        request = build_request(method, _BASE + path, self._timeout, **kwargs)
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.TransportError as exc:
            raise GuestUnreachable(f"the desktop's guest daemon did not answer: {exc}") from exc
        try:
            if response.status_code >= 400:
                await response.aread()
                raise_for_error(response)
            yield response
        except httpx.TransportError as exc:
            raise GuestUnreachable(f"the desktop's guest daemon did not answer: {exc}") from exc
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self._transport.aclose()
