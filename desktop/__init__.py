"""Cubicle: isolated Linux desktops for computer-use agents, driven through an API.

Import what users need from here; everything else is an implementation detail. Names load
on first use, so code that runs inside a sandbox (`desktop.guest`) starts without paying
for the SDK's imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from desktop._lazy import lazy_names

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


__getattr__ = lazy_names("desktop", _HOMES)
