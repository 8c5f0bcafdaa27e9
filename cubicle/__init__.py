"""Cubicle: isolated Linux desktops for computer-use agents, driven through an API.

    from cubicle import Desktop

    with Desktop.create() as d:
        d.left_click(640, 400)

Everything a caller needs is named here: the SDK (`Desktop`, `AsyncDesktop`), the actions,
the answers, and every error it may raise. Each loads on first use: code that runs inside a
sandbox imports `cubicle.protocol` and `cubicle.guest`, and must load nothing of the
control plane with them (nor pydantic before the guest has started its X server).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cubicle.client.code import Execution, ExecutionError, Logs, Result
    from cubicle.client.sdk import (
        AsyncDesktop,
        AsyncServiceClient,
        Desktop,
        Screenshot,
        ServiceClient,
        list_desktops,
    )
    from cubicle.protocol.actions import (
        Action,
        ActionsResponse,
        Click,
        Drag,
        Key,
        KeyDown,
        KeyUp,
        MouseDown,
        MouseUp,
        Move,
        Scroll,
        Type,
        Wait,
        WaitForSettle,
    )
    from cubicle.protocol.code import ContextInfo
    from cubicle.protocol.errors import (
        A11yUnavailable,
        AuthError,
        Busy,
        CapacityReached,
        Conflict,
        CubicleError,
        DesktopGone,
        DesktopNotFound,
        DesktopPaused,
        DesktopStarting,
        DesktopUnavailable,
        DiskFull,
        FileNotFound,
        Forbidden,
        GuestUnreachable,
        InvalidRequest,
        NoNodeAvailable,
        NotFound,
        NotSupported,
        OffScreen,
        PathNotAllowed,
        PayloadTooLarge,
        PortClosed,
        RecordingNotFound,
        SandboxError,
        SandboxStartError,
        ServiceUnreachable,
        UnknownKey,
        ViewerNotFound,
        WindowNotFound,
    )
    from cubicle.protocol.models import (
        A11yNode,
        A11yTree,
        ExecResult,
        FileEntry,
        Launched,
        Screen,
        ScreenshotInfo,
        WindowInfo,
    )
    from cubicle.protocol.service import ActionLog, DesktopInfo, RecordingInfo, ShareLink

_HOMES = {
    **dict.fromkeys(
        (
            "Action",
            "ActionsResponse",
            "Click",
            "Drag",
            "Key",
            "KeyDown",
            "KeyUp",
            "MouseDown",
            "MouseUp",
            "Move",
            "Scroll",
            "Type",
            "Wait",
            "WaitForSettle",
        ),
        "cubicle.protocol.actions",
    ),
    **dict.fromkeys(
        (
            "A11yUnavailable",
            "AuthError",
            "Busy",
            "CapacityReached",
            "Conflict",
            "CubicleError",
            "DesktopGone",
            "DesktopPaused",
            "DesktopNotFound",
            "DesktopStarting",
            "DesktopUnavailable",
            "DiskFull",
            "FileNotFound",
            "Forbidden",
            "GuestUnreachable",
            "InvalidRequest",
            "NoNodeAvailable",
            "NotFound",
            "NotSupported",
            "OffScreen",
            "PathNotAllowed",
            "PayloadTooLarge",
            "PortClosed",
            "RecordingNotFound",
            "SandboxError",
            "SandboxStartError",
            "ServiceUnreachable",
            "UnknownKey",
            "ViewerNotFound",
            "WindowNotFound",
        ),
        "cubicle.protocol.errors",
    ),
    **dict.fromkeys(
        (
            "A11yNode",
            "A11yTree",
            "ExecResult",
            "FileEntry",
            "Launched",
            "Screen",
            "ScreenshotInfo",
            "WindowInfo",
        ),
        "cubicle.protocol.models",
    ),
    **dict.fromkeys(
        (
            "AsyncDesktop",
            "AsyncServiceClient",
            "Desktop",
            "Screenshot",
            "ServiceClient",
            "list_desktops",
        ),
        "cubicle.client.sdk",
    ),
    **dict.fromkeys(
        ("ActionLog", "DesktopInfo", "RecordingInfo", "ShareLink"), "cubicle.protocol.service"
    ),
    **dict.fromkeys(("Execution", "ExecutionError", "Logs", "Result"), "cubicle.client.code"),
    "ContextInfo": "cubicle.protocol.code",
}
"""Each name's module, loaded on first use: a guest daemon starts its X server before it
loads pydantic and the protocol, and code inside a sandbox never loads the SDK."""


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'cubicle' has no attribute {name!r}")


__all__ = [
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
