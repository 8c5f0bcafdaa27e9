"""Typed payloads at the HTTP edge, shared by the guest, the control plane and the SDK."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Screen(BaseModel):
    width: int
    """Screen pixels."""
    height: int
    """Screen pixels."""


DesktopStatus = Literal["starting", "ready", "failed", "stopped"]


class CreateDesktop(BaseModel):
    """Body of `POST /api/desktops`. Every field has a default."""

    model_config = ConfigDict(extra="forbid")

    resolution: tuple[
        Annotated[int, Field(ge=320, le=7680)], Annotated[int, Field(ge=240, le=4320)]
    ] = (
        1280,
        800,
    )
    """Screen width and height in pixels."""
    timeout_s: Annotated[int, Field(ge=10, le=86_400)] = 600
    """Seconds without an API call after which the desktop is stopped."""
    network: bool = False
    """Give the desktop a user-mode network (slirp4netns). Off: loopback only."""
    memory_mb: Annotated[int, Field(ge=256, le=65_536)] | None = None
    """Memory limit in MiB; the service default when absent."""
    max_pids: Annotated[int, Field(ge=64, le=65_536)] | None = None
    """Most processes and threads the desktop may run; the service default when absent."""


class DesktopInfo(BaseModel):
    id: str
    status: DesktopStatus
    screen: Screen
    network: bool
    created_at: datetime
    timeout_s: int
    """Idle seconds before the desktop is stopped."""
    expires_at: datetime | None = None
    """When the desktop stops if nothing touches it."""
    reason: str | None = None
    """Why the desktop failed or stopped."""
    startup_ms: float | None = None
    """Milliseconds the desktop took from start to drawn."""
    from_pool: bool = False
    """Taken ready from the warm pool: the create call did not wait for `startup_ms`."""


class SetTimeout(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout_s: Annotated[int, Field(ge=10, le=86_400)]


class Health(BaseModel):
    """What the guest reports about its desktop."""

    ok: bool
    x_server: bool
    window_manager: bool
    desktop_drawn: bool
    screen: Screen
    version: str
    reason: str | None = None


class CursorPosition(BaseModel):
    x: int
    y: int


class WindowInfo(BaseModel):
    id: int
    """X window id."""
    title: str
    app: str
    """The application's WM_CLASS class name, e.g. `Mousepad`."""
    pid: int | None
    x: int
    """Screen pixels of the window frame's content area, left edge."""
    y: int
    width: int
    height: int
    focused: bool
    minimized: bool


WindowOp = Literal["activate", "close", "maximize", "minimize"]


class ExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    command: str | list[str] = Field(min_length=1)
    """A shell command line (run by `/bin/sh -c`) or an argv list."""
    cwd: str | None = None
    """Working directory inside the desktop; the home directory when absent."""
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60
    """Seconds before the command's whole process group is killed."""
    stdin: str | None = None
    stream: bool = False
    """Stream output as NDJSON lines instead of one JSON answer."""


class ExecResult(BaseModel):
    exit_code: int | None
    """The command's exit status; negative for a signal; None when it timed out."""
    stdout: str
    stderr: str
    timed_out: bool = False
    elapsed_ms: float


class ExecChunk(BaseModel):
    """One NDJSON line of a streamed exec: output as it comes, then the result."""

    stream: Literal["stdout", "stderr", "exit"]
    data: str = ""
    exit_code: int | None = None
    timed_out: bool = False


class FileEntry(BaseModel):
    name: str
    path: str
    type: Literal["file", "dir", "link", "other"]
    size: int
    """Bytes."""
    modified: datetime


class ClipboardText(BaseModel):
    text: str


class OpenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str = Field(min_length=1, max_length=4096)
    """A path inside the desktop or a URL, opened with the default application."""


class LaunchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    app: str = Field(min_length=1, max_length=200)
    """An application name: `mousepad`, `terminal`, `files`, `browser`, or a desktop-file id."""
    args: list[str] = Field(default_factory=list, max_length=64)


class Launched(BaseModel):
    pid: int
    command: list[str]


class ErrorBody(BaseModel):
    error: str
    """Stable error code, e.g. `off_screen`."""
    detail: str
    """What went wrong and what to do about it."""


class A11yNode(BaseModel):
    """One element of the accessibility tree (AT-SPI), as its application reports it.

    Application nodes sit at the top and have no box of their own; every other node in a
    snapshot has a box with positive width and height.
    """

    role: str
    """AT-SPI role name, e.g. `application`, `frame`, `push button`, `menu item`, `text`."""
    name: str
    """Accessible name, usually the visible label, without surrounding whitespace; may be empty."""
    description: str = ""
    """Accessible description (often the tooltip); may be empty."""
    states: list[str] = Field(default_factory=list)
    """AT-SPI state names, e.g. `focused`, `showing`, `visible`, `enabled`, `checked`,
    `selected`, `editable`."""
    x: int | None = None
    """Left edge in screen pixels, the coordinates of a full-size screenshot; None only on
    application nodes. May be negative for an element partly left of the screen."""
    y: int | None = None
    """Top edge in screen pixels; None only on application nodes."""
    width: int | None = None
    """Screen pixels; None only on application nodes."""
    height: int | None = None
    """Screen pixels; None only on application nodes."""
    app: str | None = None
    """Name of the application the node belongs to, e.g. `mousepad` (set on every node)."""
    pid: int | None = None
    """Process id of the application; set on application nodes only."""
    text: str | None = None
    """The first characters (at most 200) of an editable text widget's content."""
    children: list[A11yNode] = Field(default_factory=list)


class A11yTree(BaseModel):
    """A snapshot of the accessibility tree: one node per application, windows below."""

    nodes: list[A11yNode]
    """Application nodes, in the order the AT-SPI registry lists them."""
    node_count: int
    """Nodes in the whole tree, application nodes included."""
    elapsed_ms: float
    """Milliseconds the snapshot took."""
    truncated: bool = False
    """True when part of the tree was left out: the node or depth limit was reached, the
    time budget ran out, or an application stopped answering."""
