"""Turning error answers back into `CubicleError`s, for every client of the API."""

from __future__ import annotations

import json

import httpx

from desktop.errors import AuthError, CubicleError, from_code


def raise_for_error(response: httpx.Response) -> None:
    """Raise the error an answer carries as `{"error": code, "detail": message}`."""
    if response.status_code >= 400:
        raise_for_status(response.status_code, response.content)


def raise_for_status(status: int, content: bytes) -> None:
    """`raise_for_error` for an answer read as its status and body."""
    if status < 400:
        return
    try:
        body = json.loads(content)
        error = from_code(body["error"], body["detail"])
    except (ValueError, KeyError, TypeError):
        if status == 401:
            raise AuthError("unauthorized: check the token") from None
        text = content[:200].decode(errors="replace")
        raise CubicleError(f"HTTP {status}: {text}") from None
    error.status_code = status
    raise error
