"""Turning error answers back into `CubicleError`s, for every client of the API."""

from __future__ import annotations

import httpx

from desktop.errors import AuthError, CubicleError, from_code


def raise_for_error(response: httpx.Response) -> None:
    """Raise the error an answer carries as `{"error": code, "detail": message}`."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
        error = from_code(body["error"], body["detail"])
    except (ValueError, KeyError, TypeError):
        if response.status_code == 401:
            raise AuthError("unauthorized: check the token") from None
        raise CubicleError(f"HTTP {response.status_code}: {response.text[:200]}") from None
    error.status_code = response.status_code
    raise error
