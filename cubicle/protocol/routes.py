"""`GuestPath`: the paths of the guest's HTTP routes, one copy for the guest app that serves
them and the service (its desktop routes, manager and live view) that calls them."""

from __future__ import annotations

from enum import StrEnum
from urllib.parse import quote


class GuestPath(StrEnum):
    """A route of the guest app inside a desktop."""

    HEALTH = "/health"
    ACTIONS = "/actions"
    SCREENSHOT = "/screenshot"
    CURSOR = "/cursor"
    WINDOWS = "/windows"
    WINDOW_OP = "/windows/{window_id}/{op}"
    A11Y = "/a11y"
    EXEC = "/exec"
    FILES = "/files"
    CLIPBOARD = "/clipboard"
    OPEN = "/open"
    LAUNCH = "/launch"
    FRAMES = "/frames"
    FRAMES_KEYFRAME = "/frames/keyframe"
    FRAMES_STATS = "/frames/stats"
    CODE = "/code"
    CONTEXTS = "/contexts"
    CONTEXT = "/contexts/{context_id}"
    CONTEXT_RESTART = "/contexts/{context_id}/restart"
    CONTEXT_INTERRUPT = "/contexts/{context_id}/interrupt"
    PORTS = "/ports"
    DEVTOOLS = "/browser/devtools"
    RELAY = "/relay/{port}"


RELAY_UPGRADE = b"cubicle-relay"
"""The `Upgrade` token of `GuestPath.RELAY`: the connection becomes a byte stream to the
port (`cubicle.guest.relay`)."""


def window_op_path(window_id: int | str, op: str) -> str:
    """The path of `GuestPath.WINDOW_OP` for one window and operation."""
    return GuestPath.WINDOW_OP.format(window_id=window_id, op=op)


def context_path(path: GuestPath, context_id: str) -> str:
    """The path of a `GuestPath.CONTEXT…` route for one code context (the id quoted: a
    caller's id may hold anything, and an HTTP request line only ASCII)."""
    return path.format(context_id=quote(context_id, safe=""))
