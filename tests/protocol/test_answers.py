"""One mapping from an error to its HTTP answer, shared by the guest and the service."""

from __future__ import annotations

import pytest
from starlette.exceptions import HTTPException

from cubicle.protocol import errors as e

pytestmark = pytest.mark.fast


def test_a_cubicle_error_answers_with_its_code_status_and_headers():
    busy = e.answer_for(e.Busy("two screenshots run"), log_hint="the log")
    assert (busy.status, busy.body.error) == (429, "busy")
    assert busy.headers == {"Retry-After": str(e.Busy.retry_after_s)}
    auth = e.answer_for(e.AuthError("no token"), log_hint="the log")
    assert (auth.status, auth.headers) == (401, {"WWW-Authenticate": "Bearer"})
    assert e.ErrorBody.model_validate_json(auth.json()).to_error(401).__class__ is e.AuthError


def test_a_routers_http_error_keeps_its_status_and_stays_valid_json():
    detail = 'no route "/x\\y"'  # quotes and backslashes broke the guest's hand-made JSON
    answer = e.answer_for(HTTPException(404, detail), log_hint="the log")
    assert answer.status == 404
    assert e.ErrorBody.model_validate_json(answer.json()) == e.ErrorBody(
        error="not_found", detail=detail
    )


def test_an_unexpected_error_hides_its_message():
    answer = e.answer_for(RuntimeError("password=hunter2"), log_hint="the desktop's log")
    assert answer.status == 500
    assert answer.body.detail == "RuntimeError: see the desktop's log"
