"""The one place where domain errors become HTTP answers, for the guest and the service."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from desktop import errors as e

log = logging.getLogger("cubicle.api")

STATUS: dict[type[e.CubicleError], int] = {
    e.PathNotAllowed: 403,
    e.InvalidRequest: 422,
    e.NotFound: 404,
    e.Conflict: 409,
    e.PayloadTooLarge: 413,
    e.DesktopStarting: 409,
    e.DesktopGone: 410,
    e.DesktopUnavailable: 409,
    e.CapacityReached: 429,
    e.AuthError: 401,
    e.Forbidden: 403,
    e.GuestUnreachable: 502,
    e.SandboxError: 500,
    e.CubicleError: 500,
}
"""HTTP status for each error class; the most specific class in an error's MRO wins."""


def status_for(exc: e.CubicleError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_response(exc: e.CubicleError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, e.AuthError) else None
    return JSONResponse(
        {"error": exc.code, "detail": exc.message}, status_code=status_for(exc), headers=headers
    )


def _describe(error: dict) -> str:
    location = ".".join(str(part) for part in error.get("loc", ()) if part != "body")
    if error.get("type") == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')})"
    message = error.get("msg", "invalid value")
    return f"{location}: {message}" if location else message


def response_for(exc: Exception) -> JSONResponse:
    """The answer to an error raised while serving a request, whatever raised it."""
    if isinstance(exc, e.CubicleError):
        if status_for(exc) >= 500:
            log.warning("%s: %s", exc.code, exc.message)
        return error_response(exc)
    if isinstance(exc, RequestValidationError):
        problems = [_describe(err) for err in exc.errors()[:5]]
        return JSONResponse(
            {"error": "invalid_request", "detail": "; ".join(problems)}, status_code=422
        )
    if isinstance(exc, StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(
            {"error": code, "detail": str(exc.detail)},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )
    log.exception("unexpected error", exc_info=exc)
    return JSONResponse(
        {"error": "internal_error", "detail": f"{type(exc).__name__}: see the service log"},
        status_code=500,
    )


def install(app: FastAPI) -> None:
    """Answer every error with `{"error": code, "detail": message}`."""

    async def handler(_: Request, exc: Exception) -> JSONResponse:
        return response_for(exc)

    for kind in (e.CubicleError, RequestValidationError, Exception, StarletteHTTPException):
        app.add_exception_handler(kind, handler)
