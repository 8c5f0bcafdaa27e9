"""The guest protocol's request and response models, shared by the guest, the control
plane and the SDK (the wire between host and sandbox; see docs/protocol.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

NO_NUL = r"^[^\x00]*$"
"""Strings that reach a program's argv, environment or a file name: a NUL byte cannot."""
Arg = Annotated[str, Field(pattern=NO_NUL)]
"""A string passed to a program as it is (no NUL byte)."""
EnvName = Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[^\x00=]+$")]
"""An environment variable's name: no NUL byte and no `=`."""


class Screen(BaseModel):
    width: int
    """Screen pixels."""
    height: int
    """Screen pixels."""


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

    command: (
        Annotated[str, Field(min_length=1, pattern=NO_NUL)]
        | Annotated[list[Arg], Field(min_length=1)]
    )
    """A shell command line (run by `/bin/sh -c`) or an argv list."""
    cwd: Annotated[str, Field(max_length=4096, pattern=NO_NUL)] | None = None
    """Working directory inside the desktop; the home directory when absent."""
    env: dict[EnvName, Arg] = Field(default_factory=dict)
    timeout_s: Annotated[float, Field(gt=0, le=604_800)] = 60
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
    target: str = Field(min_length=1, max_length=4096, pattern=NO_NUL)
    """A path inside the desktop or a URL, opened with the default application."""


class LaunchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    app: str = Field(min_length=1, max_length=200, pattern=NO_NUL)
    """An application name: `mousepad`, `terminal`, `files`, `browser`, or a desktop-file id."""
    args: list[Annotated[str, Field(max_length=32_768, pattern=NO_NUL)]] = Field(
        default_factory=list, max_length=64
    )


class Launched(BaseModel):
    pid: int
    command: list[str]


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


class GuestEvent(BaseModel):
    """One line of a desktop's progress report to its runtime, as JSON.

    The guest daemon reports `x_server`, `window_manager`, `shell_mapped`,
    `desktop_drawn`, then `ready` (with the screen) once it answers requests; or `failed`
    (with the reason) when the desktop cannot come up or its session dies. Runtimes may add
    stages of their own before these (a VM's `booting`, say).
    """

    event: str
    reason: str | None = None
    """Why the desktop failed (`failed` only)."""
    screen: Screen | None = None
    """The screen the desktop runs at (`ready` only)."""


class ListeningPort(BaseModel):
    """A TCP port something listens on inside a desktop (`GET /ports`)."""

    port: int
    address: str
    """The address it is bound to inside: `127.0.0.1`, `0.0.0.0`, `::`…"""
    pid: int | None = None
    """The process holding it, as the desktop numbers processes, where it can be told."""
    process: str | None = None
    """That process's name."""


class DevTools(BaseModel):
    """Where the desktop's Chromium serves DevTools inside (`POST /browser/devtools`)."""

    port: int
    browser_path: str
    """The browser target's WebSocket path, `/devtools/browser/<id>`."""


_QUERY = ConfigDict(extra="ignore")
"""Query models ignore names they do not know: a browser link also carries its `token`."""

ImageFormat = Literal["png", "jpeg", "webp"]


class ScreenshotQuery(BaseModel):
    """Query of `GET /screenshot`."""

    model_config = _QUERY

    format: Literal["png", "jpeg", "jpg", "webp"] = "png"
    quality: Annotated[int, Field(ge=1, le=100)] = 80
    """JPEG and WebP quality."""
    max_width: Annotated[int, Field(ge=16, le=16384)] | None = None
    """Shrink (never enlarge) to at most this many image pixels wide."""
    max_height: Annotated[int, Field(ge=16, le=16384)] | None = None
    cursor: bool = False
    """Draw the pointer into the picture (its position comes back in `X-Cursor`)."""

    @property
    def image_format(self) -> ImageFormat:
        return "jpeg" if self.format == "jpg" else self.format


class WindowsQuery(BaseModel):
    """Query of `GET /windows`."""

    model_config = _QUERY

    include_shell: bool = False
    """Also list the panel and the desktop background."""


class WindowOpPath(BaseModel):
    """Path of `POST /windows/{window_id}/{op}`."""

    window_id: Annotated[int, Field(ge=0, le=2**32 - 1)]
    op: WindowOp


class A11yQuery(BaseModel):
    """Query of `GET /a11y`."""

    model_config = _QUERY

    app: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    """Only this application's subtree (its AT-SPI name, e.g. `mousepad`)."""
    max_depth: Annotated[int, Field(ge=1, le=100)] = 30


class FilesQuery(BaseModel):
    """Query of the `/files` calls."""

    model_config = _QUERY

    path: Annotated[str, Field(min_length=1, max_length=4096, pattern=NO_NUL)]
    """A path inside the desktop: absolute, or relative to (or starting with) `~`."""


class FramesQuery(BaseModel):
    """Query of `GET /frames`."""

    model_config = _QUERY

    fps: Annotated[int, Field(ge=1, le=60)] = 30
    """Most frames per second sent; frames go only when the screen changes."""


SCREENSHOT_HEADERS = {
    "screen_width": "x-screen-width",
    "screen_height": "x-screen-height",
    "image_width": "x-image-width",
    "image_height": "x-image-height",
    "scale": "x-scale",
    "capture": "x-capture",
    "cached": "x-screenshot-cache",
    "cursor": "x-cursor",
}
"""Each `ScreenshotInfo` field and the header that carries it beside the image bytes."""


class ScreenshotInfo(BaseModel):
    """How a screenshot's pixels map to the screen, sent as headers beside the image
    (`SCREENSHOT_HEADERS`) and read back by the SDK (`AsyncDesktop.screenshot_with_info`)."""

    model_config = ConfigDict(frozen=True)

    screen_width: int
    """Screen pixels."""
    screen_height: int
    """Screen pixels."""
    image_width: int
    """Image pixels."""
    image_height: int
    """Image pixels."""
    scale: float
    """Screen pixels per image pixel: screen_x = image_x × scale (2.0: a half-size image)."""
    capture: int
    """Which capture of the screen the picture shows: two pictures with the same number show
    the same pixels (nothing was drawn between them)."""
    cached: bool
    """The guest reused its last encoding of an unchanged screen."""
    cursor: tuple[int, int] | None = None
    """Where the pointer was, screen pixels, when it was drawn in (`cursor=True`)."""

    def headers(self) -> dict[str, str]:
        """The headers that carry this beside the image."""
        values = {
            "screen_width": str(self.screen_width),
            "screen_height": str(self.screen_height),
            "image_width": str(self.image_width),
            "image_height": str(self.image_height),
            "scale": f"{self.scale:.6f}",
            "capture": str(self.capture),
            "cached": "hit" if self.cached else "miss",
        }
        if self.cursor is not None:
            values["cursor"] = "{},{}".format(*self.cursor)
        return {SCREENSHOT_HEADERS[name]: value for name, value in values.items()}

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> ScreenshotInfo:
        """Read back from an answer's headers (names in any case, as HTTP allows)."""
        lower = {name.lower(): value for name, value in headers.items()}
        values = {name: lower.get(header) for name, header in SCREENSHOT_HEADERS.items()}
        cursor = values.pop("cursor")
        return cls.model_validate(
            {
                **values,
                "cached": values["cached"] == "hit",
                "cursor": tuple(int(v) for v in cursor.split(",")) if cursor else None,
            }
        )
