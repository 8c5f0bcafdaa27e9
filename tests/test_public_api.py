"""The names users import from `desktop` are pinned: changing them is a breaking change."""

import pytest

import cubicle
from cubicle.protocol import errors

pytestmark = pytest.mark.fast


def test_public_names_are_pinned():
    assert cubicle.__all__ == [
        "A11yNode",
        "A11yTree",
        "A11yUnavailable",
        "Action",
        "ActionLog",
        "ActionsResponse",
        "AsyncDesktop",
        "AsyncServiceClient",
        "AuthError",
        "Busy",
        "CapacityReached",
        "Click",
        "Conflict",
        "ContextInfo",
        "CubicleError",
        "Desktop",
        "DesktopGone",
        "DesktopInfo",
        "DesktopNotFound",
        "DesktopPaused",
        "DesktopStarting",
        "DesktopUnavailable",
        "DiskFull",
        "Drag",
        "ExecResult",
        "Execution",
        "ExecutionError",
        "FileEntry",
        "FileNotFound",
        "Forbidden",
        "GuestUnreachable",
        "InvalidRequest",
        "Key",
        "KeyDown",
        "KeyUp",
        "Launched",
        "Logs",
        "MouseDown",
        "MouseUp",
        "Move",
        "NoNodeAvailable",
        "NotFound",
        "NotSupported",
        "OffScreen",
        "PathNotAllowed",
        "PayloadTooLarge",
        "PortClosed",
        "RecordingInfo",
        "RecordingNotFound",
        "Result",
        "SandboxError",
        "SandboxStartError",
        "Screen",
        "Screenshot",
        "ScreenshotInfo",
        "Scroll",
        "ServiceClient",
        "ServiceUnreachable",
        "ShareLink",
        "Type",
        "UnknownKey",
        "ViewerNotFound",
        "Wait",
        "WaitForSettle",
        "WindowInfo",
        "WindowNotFound",
        "list_desktops",
    ]
    for name in cubicle.__all__:
        assert getattr(cubicle, name).__name__ in (name, "Annotated", "Union")


def test_every_error_class_a_caller_can_meet_is_exported():
    exported = {getattr(cubicle, name) for name in cubicle.__all__}
    for cls in errors.error_classes():
        if cls.__module__ == "cubicle.protocol.errors":
            assert cls in exported, cls.__name__


def test_every_error_code_is_unique_and_round_trips():
    classes = errors.error_classes()
    by_code: dict[str, list[str]] = {}
    for cls in classes:
        by_code.setdefault(cls.code, []).append(f"{cls.__module__}.{cls.__qualname__}")
    shared = {code: names for code, names in by_code.items() if len(names) > 1}
    assert not shared, f"error classes sharing a code: {shared}"
    for cls in classes:
        body = errors.ErrorBody.of(cls("message"))
        rebuilt = errors.ErrorBody.model_validate_json(body.model_dump_json()).to_error(418)
        assert type(rebuilt) is cls and rebuilt.message == "message"
        assert rebuilt.status_code == 418
