"""Cubicle: isolated Linux desktops for computer-use agents, driven through an API.

Import what users need from here; everything else is an implementation detail. Names load
on first use, so code that runs inside a sandbox (`desktop.guest`) starts without paying
for the SDK's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from desktop.actions import Action, ActionsResponse
    from desktop.errors import (
        CubicleError,
        DesktopGone,
        DesktopNotFound,
        InvalidRequest,
        OffScreen,
        PathNotAllowed,
        UnknownKey,
    )
    from desktop.models import DesktopInfo, ExecResult, FileEntry, WindowInfo
    from desktop.sdk import AsyncDesktop, Desktop, list_desktops

_HOMES = {
    "desktop.actions": ("Action", "ActionsResponse"),
    "desktop.errors": (
        "CubicleError",
        "DesktopGone",
        "DesktopNotFound",
        "InvalidRequest",
        "OffScreen",
        "PathNotAllowed",
        "UnknownKey",
    ),
    "desktop.models": ("DesktopInfo", "ExecResult", "FileEntry", "WindowInfo"),
    "desktop.sdk": ("AsyncDesktop", "Desktop", "list_desktops"),
}
_WHERE = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "Action",
    "ActionsResponse",
    "AsyncDesktop",
    "CubicleError",
    "Desktop",
    "DesktopGone",
    "DesktopInfo",
    "DesktopNotFound",
    "ExecResult",
    "FileEntry",
    "InvalidRequest",
    "OffScreen",
    "PathNotAllowed",
    "UnknownKey",
    "WindowInfo",
    "list_desktops",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'desktop' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
