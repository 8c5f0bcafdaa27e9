"""The one place where errors become the service's HTTP answers (`ErrorBody`).

Statuses come from the protocol's table (`cubicle.protocol.errors.STATUS`), which the guest
answers with too, so an error keeps its class and status from the guest to the SDK.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from cubicle.protocol import errors as e

log = logging.getLogger("cubicle.api")


def _answer(body: e.ErrorBody, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(body.model_dump_json(), status, headers=headers, media_type="application/json")


def response_for(exc: Exception) -> Response:
    """The answer to an error raised while serving a request, whatever raised it."""
    if isinstance(exc, e.CubicleError):
        status = e.status_for(exc)
        if status >= 500:
            log.warning("%s: %s", exc.code, exc.message)
        headers = None
        if isinstance(exc, e.AuthError):
            headers = {"WWW-Authenticate": "Bearer"}
        elif isinstance(exc, e.Busy):
            headers = {"Retry-After": str(exc.retry_after_s)}
        return _answer(e.ErrorBody.of(exc), status, headers)
    if isinstance(exc, RequestValidationError):
        detail = e.describe_validation(list(exc.errors()))
        return _answer(e.ErrorBody(error="invalid_request", detail=detail), 422)
    if isinstance(exc, StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: e.PayloadTooLarge.code}.get(
            exc.status_code, "http_error"
        )
        body = e.ErrorBody(error=code, detail=str(exc.detail))
        return _answer(body, exc.status_code, getattr(exc, "headers", None))
    log.exception("unexpected error", exc_info=exc)
    detail = f"{type(exc).__name__}: see the service log"
    return _answer(e.ErrorBody(error="internal_error", detail=detail), 500)


def install(app: FastAPI) -> None:
    """Answer every error with an `ErrorBody`."""

    async def handler(_: Request, exc: Exception) -> Response:
        return response_for(exc)

    for kind in (e.CubicleError, RequestValidationError, Exception, StarletteHTTPException):
        app.add_exception_handler(kind, handler)
