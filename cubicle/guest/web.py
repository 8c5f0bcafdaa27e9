"""Reading requests into protocol models and answering with them, for the guest's routes."""

from __future__ import annotations

import logging
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from cubicle.protocol.errors import (
    InvalidRequest,
    answer_for,
    describe_validation,
)

M = TypeVar("M", bound=BaseModel)
log = logging.getLogger("cubicle.guest")


def query(request: Request, model: type[M]) -> M:
    """The request's query parameters as `model`; 422 with what is wrong otherwise."""
    try:
        return model.model_validate(dict(request.query_params))
    except ValidationError as exc:
        raise InvalidRequest(describe_validation(exc.errors())) from None


async def body(request: Request, model: type[M]) -> M:
    """The request's JSON body as `model`; 422 with what is wrong otherwise."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise InvalidRequest(describe_validation(exc.errors())) from None


def answer(model: BaseModel, status_code: int = 200) -> Response:
    return Response(model.model_dump_json(), status_code, media_type="application/json")


def error_answer(exc: BaseException) -> Response:
    """The answer to any error a route raised (`answer_for`); an unexpected one is logged
    with its traceback, since its answer names only its type."""
    answer = answer_for(exc, log_hint="the desktop's log")
    if answer.body.error == "internal_error":
        log.error("unexpected error", exc_info=exc)
    return Response(answer.json(), answer.status, answer.headers, media_type="application/json")
