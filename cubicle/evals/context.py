"""What setup steps, getters and checkers work with: one task's desktop and scratch space.

Everything reaches the desktop through the SDK (`AsyncDesktop`), as any program would.
Python snippets run inside the desktop under the service's own interpreter, whose
virtualenv the sandbox binds (pyautogui, python-xlib and websockets are importable there).
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cubicle import AsyncDesktop, ExecResult, WindowInfo
from cubicle.evals.errors import SetupFailed

GUEST_HOME = "/home/user"
"""The desktop user's home, the same path OSWorld's tasks write (`/home/user/...`)."""
WINDOW_POLL_S = 0.1
"""Seconds between looks for a window."""


def desktop_python() -> str:
    """The interpreter that runs Python inside a desktop: the service's own (its virtualenv
    is bound into every sandbox)."""
    return sys.executable


def desktop_path_env() -> dict[str, str]:
    """Environment for commands that say `python`/`python3`: the virtualenv's bin first, so
    they get pyautogui and the rest of the service's packages."""
    venv_bin = str(Path(desktop_python()).parent)
    return {"PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin"}


@dataclass
class TaskContext:
    """One task's desktop, where its local files come from, and its scratch folder."""

    desktop: AsyncDesktop
    files_root: Path
    """Relative local paths in the task (`upload_file`'s `local_path`) start here."""
    cache_dir: Path
    """OSWorld's per-task cache: fetched files, `execute`'s stdout files."""

    def local_file(self, name: str) -> Path:
        """A local file the task names, relative to `files_root` and inside it; `SetupFailed`
        if it is missing or lies outside (a task never reads the service's own files)."""
        root = self.files_root.resolve()
        path = (root / name).resolve()
        if not path.is_relative_to(root):
            raise SetupFailed(f"{name!r} is not a file of the suite (paths start at its folder)")
        if not path.is_file():
            raise SetupFailed(f"the local file {name!r} does not exist ({path})")
        return path

    def cache_path(self, name: str) -> Path:
        """Where a file named `name` goes in the task's cache (its base name only)."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        return self.cache_dir / (Path(name).name or "file")

    async def run(
        self,
        command: str | Sequence[str],
        *,
        shell: bool = False,
        timeout_s: float = 120.0,
        stdin: str | None = None,
    ) -> ExecResult:
        """Run a command inside the desktop as OSWorld's guest server would: a string is
        split (or handed to `sh -c` with `shell`), `~/` expanded, `python` is the
        service's interpreter."""
        if shell:
            text = command if isinstance(command, str) else " ".join(command)
            argv: list[str] = ["/bin/sh", "-c", text]
        else:
            argv = shlex.split(command) if isinstance(command, str) else list(command)
            argv = [GUEST_HOME + arg[1:] if arg.startswith("~/") else arg for arg in argv]
            if argv and argv[0] in ("python", "python3"):
                argv[0] = desktop_python()
        if not argv:
            raise SetupFailed("an empty command")
        return await self.desktop.exec(
            argv, env=desktop_path_env(), timeout_s=timeout_s, stdin=stdin
        )

    async def python(self, code: str, *args: str, timeout_s: float = 60.0) -> ExecResult:
        """Run `code` with `args` under Python inside the desktop (the code goes on stdin)."""
        return await self.desktop.exec(
            [desktop_python(), "-", *args],
            env=desktop_path_env(),
            timeout_s=timeout_s,
            stdin=code,
        )

    async def find_window(
        self, name: str, *, strict: bool = False, by_class: bool = False
    ) -> WindowInfo | None:
        """The first window whose title (or WM_CLASS with `by_class`) is `name` (`strict`)
        or contains it, case-insensitively unless strict."""
        for window in await self.desktop.get_windows():
            value = window.app if by_class else window.title
            if (value == name) if strict else (name.lower() in value.lower()):
                return window
        return None

    async def wait_for_window_change(
        self, before: set[tuple[int, str]], timeout_s: float
    ) -> WindowInfo | None:
        """A window that is new since `before` (id, title pairs) or has a new title, once
        one shows; None after `timeout_s` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            changed = [w for w in await self.desktop.get_windows() if (w.id, w.title) not in before]
            if changed:
                return changed[0]
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(WINDOW_POLL_S)

    async def window_marks(self) -> set[tuple[int, str]]:
        return {(window.id, window.title) for window in await self.desktop.get_windows()}
