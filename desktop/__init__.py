"""Cubicle: isolated Linux desktops for computer-use agents, driven through an API.

    from desktop import Desktop

    with Desktop.create() as d:
        d.left_click(640, 400)

Everything a caller needs is named here: the SDK (`Desktop`, `AsyncDesktop`), the actions,
the answers, and every error it may raise. The SDK and the service's models load on first
use: code that runs inside a sandbox imports `desktop.protocol` and `desktop.guest`, and
must load nothing of the control plane with them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from desktop.protocol.actions import (
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
from desktop.protocol.errors import (
    A11yUnavailable,
    AuthError,
    CapacityReached,
    Conflict,
    CubicleError,
    DesktopGone,
    DesktopNotFound,
    DesktopStarting,
    DesktopUnavailable,
    DiskFull,
    FileNotFound,
    Forbidden,
    GuestUnreachable,
    InvalidRequest,
    NotFound,
    OffScreen,
    PathNotAllowed,
    PayloadTooLarge,
    RecordingNotFound,
    SandboxError,
    SandboxStartError,
    ServiceUnreachable,
    UnknownKey,
    ViewerNotFound,
    WindowNotFound,
)
from desktop.protocol.models import (
    A11yNode,
    A11yTree,
    ExecResult,
    FileEntry,
    Launched,
    Screen,
    WindowInfo,
)

if TYPE_CHECKING:
    from desktop.models import ActionLog, DesktopInfo, RecordingInfo, ShareLink
    from desktop.sdk import AsyncDesktop, Desktop, list_desktops

_CLIENT_SIDE = {
    "AsyncDesktop": "desktop.sdk",
    "Desktop": "desktop.sdk",
    "list_desktops": "desktop.sdk",
    "ActionLog": "desktop.models",
    "DesktopInfo": "desktop.models",
    "RecordingInfo": "desktop.models",
    "ShareLink": "desktop.models",
}
"""Names loaded on first use: the SDK and the service's own models, which code inside a
sandbox never needs."""


def __getattr__(name: str) -> Any:
    if name in _CLIENT_SIDE:
        return getattr(importlib.import_module(_CLIENT_SIDE[name]), name)
    raise AttributeError(f"module 'desktop' has no attribute {name!r}")


__all__ = [
    "A11yNode",
    "A11yTree",
    "A11yUnavailable",
    "Action",
    "ActionLog",
    "ActionsResponse",
    "AsyncDesktop",
    "AuthError",
    "CapacityReached",
    "Click",
    "Conflict",
    "CubicleError",
    "Desktop",
    "DesktopGone",
    "DesktopInfo",
    "DesktopNotFound",
    "DesktopStarting",
    "DesktopUnavailable",
    "DiskFull",
    "Drag",
    "ExecResult",
    "FileEntry",
    "FileNotFound",
    "Forbidden",
    "GuestUnreachable",
    "InvalidRequest",
    "Key",
    "KeyDown",
    "KeyUp",
    "Launched",
    "MouseDown",
    "MouseUp",
    "Move",
    "NotFound",
    "OffScreen",
    "PathNotAllowed",
    "PayloadTooLarge",
    "RecordingInfo",
    "RecordingNotFound",
    "SandboxError",
    "SandboxStartError",
    "Screen",
    "Scroll",
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
