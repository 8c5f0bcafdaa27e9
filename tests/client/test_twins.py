"""The blocking SDK is the async one, method for method: each blocking class wraps its twin's
coroutines (`_blocking`), and this keeps the two surfaces from drifting apart."""

from __future__ import annotations

import inspect

import pytest

from cubicle.client import sdk

pytestmark = pytest.mark.fast

TWINS = [
    (sdk.AsyncDesktop, sdk.Desktop),
    (sdk.AsyncCommands, sdk.Commands),
    (sdk.AsyncFiles, sdk.Files),
    (sdk.AsyncBrowser, sdk.Browser),
    (sdk.AsyncServiceClient, sdk.ServiceClient),
]


def _public(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (callable(member) or isinstance(member, property))
    }


def _differences(async_cls: type, blocking_cls: type) -> list[str]:
    """What the blocking class lacks, or wraps other than its twin's method."""
    problems = []
    blocking = _public(blocking_cls)
    for name, member in _public(async_cls).items():
        if name not in blocking:
            problems.append(f"{blocking_cls.__name__}.{name} is missing")
        # create, connect and fork return desktops: the blocking side wraps them in its own
        elif inspect.iscoroutinefunction(member) and name not in ("create", "connect", "fork"):
            wrapped = getattr(blocking[name], "__wrapped__", None)
            if wrapped is not member:
                problems.append(f"{blocking_cls.__name__}.{name} does not wrap its twin")
    return problems


@pytest.mark.parametrize(("async_cls", "blocking_cls"), TWINS, ids=lambda c: c.__name__)
def test_every_async_method_has_its_blocking_twin(async_cls: type, blocking_cls: type):
    assert _differences(async_cls, blocking_cls) == []


def test_create_and_connect_take_the_same_arguments():
    for name in ("create", "connect"):
        theirs = inspect.signature(getattr(sdk.AsyncDesktop, name)).parameters
        ours = inspect.signature(getattr(sdk.Desktop, name)).parameters
        assert all(p in theirs for p in ours if p not in ("kwargs",)), name
        assert any(p.kind is p.VAR_KEYWORD for p in ours.values()), name


def test_the_check_sees_a_missing_or_foreign_twin():
    class Lacking:
        _async = None
        left_click = sdk.Desktop.right_click

    problems = _differences(sdk.AsyncDesktop, Lacking)
    assert "Lacking.left_click does not wrap its twin" in problems
    assert "Lacking.screenshot is missing" in problems
