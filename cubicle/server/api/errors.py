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


def response_for(exc: Exception) -> Response:
    """The answer to an error raised while serving a request, whatever raised it
    (`cubicle.protocol.errors.answer_for`, as the guest answers)."""
    if isinstance(exc, RequestValidationError):
        exc = e.InvalidRequest(e.describe_validation(list(exc.errors())))
    answer = e.answer_for(exc, log_hint="the service log")
    if isinstance(exc, e.CubicleError) and answer.status >= 500:
        log.warning("%s: %s", exc.code, exc.message)
    elif answer.body.error == "internal_error":
        log.exception("unexpected error", exc_info=exc)
    return Response(answer.json(), answer.status, answer.headers, media_type="application/json")


def install(app: FastAPI) -> None:
    """Answer every error with an `ErrorBody`."""

    async def handler(_: Request, exc: Exception) -> Response:
        return response_for(exc)

    for kind in (e.CubicleError, RequestValidationError, Exception, StarletteHTTPException):
        app.add_exception_handler(kind, handler)
