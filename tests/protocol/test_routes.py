"""Paths the service builds to call a guest: whatever a caller sent, they stay ASCII."""

from __future__ import annotations

import pytest

from cubicle.protocol.routes import GuestPath, context_path

pytestmark = pytest.mark.fast


def test_a_context_id_is_quoted_into_the_guests_path():
    """A context id of any text (Schemathesis sent '山') once went into the guest's request
    line raw: the guest refused the request and the service answered 500."""
    assert context_path(GuestPath.CONTEXT_INTERRUPT, "山") == "/contexts/%E5%B1%B1/interrupt"
    assert context_path(GuestPath.CONTEXT, "a/b c") == "/contexts/a%2Fb%20c"
    assert context_path(GuestPath.CONTEXT, "py-1") == "/contexts/py-1"
