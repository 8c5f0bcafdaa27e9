"""OSWorld's result and expected getters: the state a metric compares, read off a desktop.

`evaluator.result = {"type": "vm_file", "path": "/home/user/a.txt", "dest": "a.txt"}` is
`GETTERS["vm_file"]`. Values are what OSWorld's getters return (a local file path, a
command's output, a dict of the active tab…), so its metrics apply unchanged. Besides
OSWorld's names, Cubicle has a few of its own for what its apps make easy to ask:
`vm_file_exists`, `vm_window_titles`, `vm_active_window_title`, `active_tab_text`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from cubicle import FileNotFound, PathNotAllowed
from cubicle.evals import chrome
from cubicle.evals.a11y_xml import tree_to_xml
from cubicle.evals.context import TaskContext
from cubicle.evals.errors import CheckerError
from cubicle.evals.setup import download_in_desktop


class _Config(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    type: str


class FileConfig(_Config):
    path: str | list[str]
    dest: str | list[str] = ""
    multi: bool = False
    gives: list[int] = [0]


class RuleConfig(_Config):
    rules: Any = None


class CommandConfig(_Config):
    command: str | list[str]
    shell: bool = False


class PathConfig(_Config):
    path: str


class WindowSizeConfig(_Config):
    app_class_name: str


class NoConfig(_Config):
    pass


def _pairs(config: FileConfig) -> list[tuple[str, str]]:
    if not config.multi:
        path = config.path if isinstance(config.path, str) else config.path[0]
        dest = config.dest if isinstance(config.dest, str) else config.dest[0]
        return [(path, dest or path.rsplit("/", 1)[-1])]
    paths = [config.path] if isinstance(config.path, str) else config.path
    dests = [config.dest] if isinstance(config.dest, str) else config.dest
    return list(zip(paths, dests, strict=False))


def _given(config: FileConfig, values: list[str | None]) -> Any:
    picked = [values[i] for i in config.gives if i < len(values)]
    return picked[0] if len(picked) == 1 else picked


async def vm_file(ctx: TaskContext, config: FileConfig) -> Any:
    """The desktop's file copied into the task's cache: its local path, None if missing."""
    found: list[str | None] = []
    for path, dest in _pairs(config):
        try:
            data = await ctx.desktop.files.read(path)
        except (FileNotFound, PathNotAllowed):
            found.append(None)
            continue
        local = ctx.cache_path(dest)
        await asyncio.to_thread(local.write_bytes, data)
        found.append(str(local))
    return _given(config, found)


async def cloud_file(ctx: TaskContext, config: FileConfig) -> Any:
    """A reference file: a URL (fetched inside the desktop, which needs a network) or a
    file of the suite."""
    found: list[str | None] = []
    for url, dest in _pairs(config):
        if url.startswith(("http://", "https://")):
            inside = f"/tmp/cubicle-evals/{Path(dest).name or 'file'}"
            await download_in_desktop(ctx, url, inside)
            local = ctx.cache_path(dest)
            await asyncio.to_thread(local.write_bytes, await ctx.desktop.files.read(inside))
            found.append(str(local))
        else:
            found.append(str(ctx.local_file(url.removeprefix("file://"))))
    return _given(config, found)


async def cache_file(ctx: TaskContext, config: PathConfig) -> str:
    """A file an earlier `execute` wrote to the task's cache (`stdout: "name"`)."""
    return str(ctx.cache_path(config.path))


async def rule(ctx: TaskContext, config: RuleConfig) -> Any:
    return config.rules


async def vm_command_line(ctx: TaskContext, config: CommandConfig) -> str:
    """The command's standard output, run inside the desktop."""
    return (await ctx.run(config.command, shell=config.shell)).stdout


async def vm_command_error(ctx: TaskContext, config: CommandConfig) -> str:
    return (await ctx.run(config.command, shell=config.shell)).stderr


async def vm_file_exists(ctx: TaskContext, config: PathConfig) -> bool:
    """Cubicle's: whether the path exists in the desktop (file or folder)."""
    result = await ctx.run(["test", "-e", config.path])
    return result.exit_code == 0


async def accessibility_tree(ctx: TaskContext, config: NoConfig) -> str:
    """The whole accessibility tree as OSWorld's XML (roles as tags, `st:` states…)."""
    return tree_to_xml(await ctx.desktop.accessibility_tree())


async def list_directory(ctx: TaskContext, config: PathConfig) -> dict[str, Any]:
    """The folder's tree as OSWorld's server gives it: name, type, children."""
    code = (
        "import json, os, sys\n"
        "def walk(p):\n"
        "    if not os.path.isdir(p):\n"
        "        return {'name': os.path.basename(p), 'type': 'file'}\n"
        "    kids = [walk(os.path.join(p, n)) for n in sorted(os.listdir(p))]\n"
        "    return {'name': os.path.basename(p), 'type': 'directory', 'children': kids}\n"
        "print(json.dumps(walk(os.path.expanduser(sys.argv[1]))))\n"
    )
    result = await ctx.python(code, config.path)
    if result.exit_code != 0:
        raise CheckerError(f"list_directory {config.path}: {result.stderr.strip()[-300:]}")
    return json.loads(result.stdout)


async def vm_screen_size(ctx: TaskContext, config: NoConfig) -> dict[str, int]:
    screen = ctx.desktop.info.screen
    return {"width": screen.width, "height": screen.height}


async def vm_window_size(ctx: TaskContext, config: WindowSizeConfig) -> dict[str, int] | None:
    window = await ctx.find_window(config.app_class_name, by_class=True)
    return None if window is None else {"width": window.width, "height": window.height}


async def vm_window_titles(ctx: TaskContext, config: NoConfig) -> list[str]:
    """Cubicle's: the title of every window, in stacking order."""
    return [window.title for window in await ctx.desktop.get_windows()]


async def vm_active_window_title(ctx: TaskContext, config: NoConfig) -> str | None:
    """Cubicle's: the focused window's title."""
    for window in await ctx.desktop.get_windows():
        if window.focused:
            return window.title
    return None


async def active_tab_info(ctx: TaskContext, config: NoConfig) -> dict[str, str] | None:
    """The tab in front: title, url, content (its HTML). Unlike OSWorld's, the page is
    read as it is, not reloaded."""
    tab = await chrome.active_tab(ctx)
    page = await chrome.page(ctx, tab) if tab is not None else None
    if page is None:
        return None
    return {"title": page.title, "url": page.url, "content": page.html}


async def active_url_from_accessTree(ctx: TaskContext, config: NoConfig) -> str | None:
    """The URL of the tab in front (read from the browser, not its address bar)."""
    tab = await chrome.active_tab(ctx)
    return tab.url if tab is not None else None


async def active_tab_text(ctx: TaskContext, config: NoConfig) -> str | None:
    """Cubicle's: the rendered text of the tab in front."""
    tab = await chrome.active_tab(ctx)
    page = await chrome.page(ctx, tab) if tab is not None else None
    return page.text if page is not None else None


async def open_tabs_info(ctx: TaskContext, config: NoConfig) -> list[dict[str, str]]:
    return [{"title": tab.title, "url": tab.url} for tab in await chrome.tabs(ctx)]


Getter = Callable[[TaskContext, Any], Awaitable[Any]]
GETTERS: dict[str, tuple[type[_Config], Getter]] = {
    "vm_file": (FileConfig, vm_file),
    "cloud_file": (FileConfig, cloud_file),
    "cache_file": (PathConfig, cache_file),
    "rule": (RuleConfig, rule),
    "vm_command_line": (CommandConfig, vm_command_line),
    "vm_command_error": (CommandConfig, vm_command_error),
    "vm_file_exists": (PathConfig, vm_file_exists),
    "accessibility_tree": (NoConfig, accessibility_tree),
    "list_directory": (PathConfig, list_directory),
    "vm_screen_size": (NoConfig, vm_screen_size),
    "vm_window_size": (WindowSizeConfig, vm_window_size),
    "vm_window_titles": (NoConfig, vm_window_titles),
    "vm_active_window_title": (NoConfig, vm_active_window_title),
    "active_tab_info": (NoConfig, active_tab_info),
    "active_url_from_accessTree": (NoConfig, active_url_from_accessTree),
    "active_tab_text": (NoConfig, active_tab_text),
    "open_tabs_info": (NoConfig, open_tabs_info),
}
"""Getter type → (its config, what reads the value)."""


def check_getter(config: dict[str, Any]) -> str | None:
    """Why Cubicle cannot run this getter config, or None."""
    kind = config.get("type")
    known = GETTERS.get(kind) if isinstance(kind, str) else None
    if known is None:
        return f"getter {kind!r} is not supported"
    try:
        known[0].model_validate(config)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"getter {kind!r}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return None


async def get(ctx: TaskContext, config: dict[str, Any]) -> Any:
    """The value getter `config` names; `CheckerError` when it cannot be read."""
    problem = check_getter(config)
    if problem is not None:
        raise CheckerError(problem)
    model, getter = GETTERS[config["type"]]
    return await getter(ctx, model.model_validate(config))
