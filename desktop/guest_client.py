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

from desktop._http import raise_for_error
from desktop._transport import LeanTransport
from desktop.errors import GuestUnreachable

_BASE = "http://guest"


class GuestClient:
    """One keep-alive HTTP connection pool to one guest daemon."""

    def __init__(self, socket_path: str, *, timeout_s: float = 120.0) -> None:
        self._transport = LeanTransport(uds=socket_path)
        self._timeout = httpx.Timeout(timeout_s, connect=5.0)

    def _build(self, method: str, path: str, **kwargs: Any) -> httpx.Request:
        """The request, with `timeout=` (seconds or `httpx.Timeout`) as httpx's client takes it."""
        limits = httpx.Timeout(kwargs.pop("timeout")) if "timeout" in kwargs else self._timeout
        request = httpx.Request(method, _BASE + path, **kwargs)
        request.extensions["timeout"] = limits.as_dict()
        return request

    async def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.TransportError as exc:
            raise GuestUnreachable(f"the desktop's guest daemon did not answer: {exc}") from exc
        response.request = request
        return response

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send one request; raise the guest's error, or GuestUnreachable."""
        response = await self._send(self._build(method, path, **kwargs))
        try:
            await response.aread()
        except httpx.TransportError as exc:
            raise GuestUnreachable(f"the desktop's guest daemon did not answer: {exc}") from exc
        finally:
            await response.aclose()
        raise_for_error(response)
        return response

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        """Send a request and hold the response open to read it as it arrives."""
        response = await self._send(self._build(method, path, **kwargs))
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
