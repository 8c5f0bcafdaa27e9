"""The control plane's side of the guest protocol: HTTP over the guest's Unix socket.

Guest errors arrive as `{"error": code, "detail": message}` and are raised again here as
the same `CubicleError` subclass; transport failures become `GuestUnreachable`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from desktop._http import raise_for_error
from desktop._transport import LeanTransport
from desktop.errors import GuestUnreachable


class GuestClient:
    """One keep-alive HTTP connection pool to one guest daemon."""

    def __init__(self, socket_path: str, *, timeout_s: float = 120.0) -> None:
        self._http = httpx.AsyncClient(
            transport=LeanTransport(uds=socket_path),
            base_url="http://guest",
            timeout=httpx.Timeout(timeout_s, connect=5.0),
        )

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send one request; raise the guest's error, or GuestUnreachable."""
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise GuestUnreachable(f"the desktop's guest daemon did not answer: {exc}") from exc
        if response.status_code >= 400:
            await response.aread()
            raise_for_error(response)
        return response

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        """Send a request and hold the response open to read it as it arrives."""
        try:
            async with self._http.stream(method, path, **kwargs) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise_for_error(response)
                yield response
        except httpx.TransportError as exc:
            raise GuestUnreachable(f"the desktop's guest daemon did not answer: {exc}") from exc

    async def close(self) -> None:
        await self._http.aclose()
