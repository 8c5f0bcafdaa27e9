"""OSWorld's setup steps (`config[]`, `postconfig[]`), carried out on a Cubicle desktop.

Each step type has a typed model of its parameters (`STEPS`); a step Cubicle does not know
is reported as unsupported before the task runs (`cubicle.evals.check.unsupported`), never
run half-way. The semantics follow OSWorld's `SetupController` and its guest server:
`launch` starts a program and returns (Cubicle also waits, briefly, for its window),
`execute`/`command` runs one to its end, `open` opens a file or URL with its default app.
"""

from __future__ import annotations

import asyncio
import functools
import shlex
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cubicle import CubicleError
from cubicle.evals import chrome
from cubicle.evals.context import GUEST_HOME, TaskContext
from cubicle.evals.errors import SetupFailed
from cubicle.evals.suite import SetupStep

WINDOW_WAIT_S = 10.0
"""Seconds `launch` and `open` wait for a window to appear or change."""
UNTIL_TRIES = 20
"""Times an `execute` with `until` runs its command before giving up."""
DOWNLOAD_TIMEOUT_S = 300.0


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Command = str | list[str]


class Launch(_Params):
    command: Command
    shell: bool = False


class Open(_Params):
    path: str


class Execute(_Params):
    command: Command
    shell: bool = False
    stdout: str = ""
    """A file name in the task's cache that gets the command's output."""
    stderr: str = ""
    until: dict[str, Any] | None = None
    """Run again until `returncode` equals, or `stdout`/`stderr` contains, the value."""


class Sleep(_Params):
    seconds: Annotated[float, Field(ge=0, le=600)]


class Window(_Params):
    window_name: str
    strict: bool = False
    by_class: bool = False


class LocalFile(_Params):
    local_path: str
    path: str


class UploadFile(_Params):
    files: list[LocalFile]


class RemoteFile(_Params):
    url: str
    path: str


class Download(_Params):
    files: list[RemoteFile]


class ChromeOpenTabs(_Params):
    urls_to_open: list[str]


class ChromeCloseTabs(_Params):
    urls_to_close: list[str]


def _command_argv(command: Command, shell: bool) -> list[str]:
    if shell:
        return ["/bin/sh", "-c", command if isinstance(command, str) else " ".join(command)]
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    return [GUEST_HOME + a[1:] if a.startswith("~/") else a for a in argv]


def _placeholders(command: Command, ctx: TaskContext) -> Command:
    """OSWorld's `{SCREEN_WIDTH}`-style placeholders, filled in (the password is empty:
    a Cubicle desktop's user needs none)."""
    screen = ctx.desktop.info.screen
    values = {
        "{CLIENT_PASSWORD}": "",
        "{SCREEN_WIDTH_HALF}": str(screen.width // 2),
        "{SCREEN_HEIGHT_HALF}": str(screen.height // 2),
        "{SCREEN_WIDTH}": str(screen.width),
        "{SCREEN_HEIGHT}": str(screen.height),
    }

    def fill(text: str) -> str:
        for key, value in values.items():
            text = text.replace(key, value)
        return text

    return fill(command) if isinstance(command, str) else [fill(part) for part in command]


async def _launch(ctx: TaskContext, step: Launch) -> None:
    argv = _command_argv(step.command, step.shell)
    if not argv:
        raise SetupFailed("launch: an empty command")
    if chrome.is_browser(argv):
        await chrome.start(ctx, argv[1:])
        return
    before = await ctx.window_marks()
    await ctx.desktop.launch(*argv)
    await ctx.wait_for_window_change(before, WINDOW_WAIT_S)  # a daemon has no window: fine


async def _open(ctx: TaskContext, step: Open) -> None:
    before = await ctx.window_marks()
    await ctx.desktop.open(step.path)
    if await ctx.wait_for_window_change(before, WINDOW_WAIT_S) is None:
        raise SetupFailed(f"open: no window showed {step.path!r} within {WINDOW_WAIT_S:g} s")


async def _execute(ctx: TaskContext, step: Execute) -> None:
    command = _placeholders(step.command, ctx)
    until = step.until or {}
    for _ in range(UNTIL_TRIES if until else 1):
        result = await ctx.run(command, shell=step.shell)
        if step.stdout:
            ctx.cache_path(step.stdout).write_text(result.stdout)
        if step.stderr:
            ctx.cache_path(step.stderr).write_text(result.stderr)
        if not until:
            return
        if (
            ("returncode" in until and result.exit_code == until["returncode"])
            or ("stdout" in until and str(until["stdout"]) in result.stdout)
            or ("stderr" in until and str(until["stderr"]) in result.stderr)
        ):
            return
        await asyncio.sleep(0.3)
    raise SetupFailed(f"execute: {command!r} never gave {until} in {UNTIL_TRIES} tries")


async def _sleep(ctx: TaskContext, step: Sleep) -> None:
    await asyncio.sleep(step.seconds)


async def _activate_window(ctx: TaskContext, step: Window) -> None:
    await _window(ctx, step, "activate")


async def _close_window(ctx: TaskContext, step: Window) -> None:
    await _window(ctx, step, "close")


async def _window(ctx: TaskContext, step: Window, op: str) -> None:
    deadline = time.monotonic() + WINDOW_WAIT_S
    find = functools.partial(
        ctx.find_window, step.window_name, strict=step.strict, by_class=step.by_class
    )
    while (window := await find()) is None:
        if time.monotonic() > deadline:
            raise SetupFailed(f"{op}_window: no window matches {step.window_name!r}")
        await asyncio.sleep(0.2)
    await ctx.desktop.window(window.id, op)  # type: ignore[arg-type]


async def _upload_file(ctx: TaskContext, step: UploadFile) -> None:
    for item in step.files:
        data = await asyncio.to_thread(ctx.local_file(item.local_path).read_bytes)
        await _write(ctx, item.path, data)


async def _download(ctx: TaskContext, step: Download) -> None:
    for item in step.files:
        if item.url.startswith(("http://", "https://")):
            await download_in_desktop(ctx, item.url, item.path)
        else:  # a file of the suite
            local = item.url.removeprefix("file://")
            data = await asyncio.to_thread(ctx.local_file(local).read_bytes)
            await _write(ctx, item.path, data)


_FETCH = """
import pathlib, sys, urllib.request
data = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[3])).read()
path = pathlib.Path(sys.argv[2]).expanduser()
path.parent.mkdir(parents=True, exist_ok=True)
path.write_bytes(data)
"""


async def download_in_desktop(ctx: TaskContext, url: str, path: str) -> None:
    """Fetch `url` from inside the desktop into its `path`. The desktop's own network is
    used, never the service's: a task cannot reach what only the host can."""
    ran = await ctx.python(
        _FETCH, url, path, str(DOWNLOAD_TIMEOUT_S), timeout_s=DOWNLOAD_TIMEOUT_S + 10
    )
    if ran.exit_code != 0:
        raise SetupFailed(
            f"download of {url} inside the desktop failed ({ran.stderr.strip()[-200:]}); a "
            "task that downloads needs a desktop with a network: run it with a board profile "
            "that has network: true"
        )


async def _write(ctx: TaskContext, path: str, data: bytes) -> None:
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent:
        await ctx.run(["mkdir", "-p", parent])
    await ctx.desktop.files.write(path, data)


async def _chrome_open_tabs(ctx: TaskContext, step: ChromeOpenTabs) -> None:
    await chrome.open_tabs(ctx, step.urls_to_open)


async def _chrome_close_tabs(ctx: TaskContext, step: ChromeCloseTabs) -> None:
    for tab in await chrome.tabs(ctx):
        if any(tab.url.rstrip("/") == url.rstrip("/") for url in step.urls_to_close):
            await chrome.close_tab(ctx, tab)


Runner = Callable[[TaskContext, Any], Awaitable[None]]
STEPS: dict[str, tuple[type[_Params], Runner]] = {
    "launch": (Launch, _launch),
    "open": (Open, _open),
    "execute": (Execute, _execute),
    "command": (Execute, _execute),
    "sleep": (Sleep, _sleep),
    "activate_window": (Window, _activate_window),
    "close_window": (Window, _close_window),
    "upload_file": (UploadFile, _upload_file),
    "download": (Download, _download),
    "chrome_open_tabs": (ChromeOpenTabs, _chrome_open_tabs),
    "chrome_close_tabs": (ChromeCloseTabs, _chrome_close_tabs),
}
"""Step type → (its parameters, what carries it out)."""


def check_step(step: SetupStep) -> str | None:
    """Why Cubicle cannot carry out `step` ("unsupported…" or bad parameters), or None."""
    known = STEPS.get(step.type)
    if known is None:
        return f"setup step {step.type!r} is not supported"
    try:
        known[0].model_validate(step.parameters)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"setup step {step.type!r}: {where}: {first['msg']}"
    return None


async def run_steps(ctx: TaskContext, steps: Sequence[SetupStep], *, phase: str = "setup") -> None:
    """Carry out `steps` in order; `SetupFailed` naming the step that failed."""
    for number, step in enumerate(steps, start=1):
        problem = check_step(step)
        if problem is not None:
            raise SetupFailed(f"{phase} step {number}: {problem}")
        model, runner = STEPS[step.type]
        try:
            await runner(ctx, model.model_validate(step.parameters))
        except SetupFailed as exc:
            raise SetupFailed(f"{phase} step {number} ({step.type}): {exc.message}") from exc
        except CubicleError as exc:
            raise SetupFailed(f"{phase} step {number} ({step.type}): {exc.message}") from exc
