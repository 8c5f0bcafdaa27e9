"""Use the desktop as a computer: run commands, move files, open things, launch apps.

Everything here runs inside the sandbox as the desktop's user, so a command sees exactly
what the desktop sees. Paths given to the files API are resolved against the home
directory and must stay inside the home directory or /tmp.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import errno
import os
import secrets
import shlex
import shutil
import signal
import stat
import time
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

from cubicle.guest.cpu import CpuMeter, live_sessions
from cubicle.protocol.errors import (
    CapacityReached,
    DiskFull,
    FileNotFound,
    InvalidRequest,
    PathNotAllowed,
    PayloadTooLarge,
    SandboxError,
)
from cubicle.protocol.models import ExecChunk, ExecRequest, ExecResult, FileEntry, Launched

APPS: dict[str, list[str]] = {
    "terminal": ["xfce4-terminal"],
    "xfce4-terminal": ["xfce4-terminal"],
    "editor": ["mousepad"],
    "text editor": ["mousepad"],
    "mousepad": ["mousepad"],
    "files": ["thunar"],
    "file manager": ["thunar"],
    "thunar": ["thunar"],
    "browser": ["chromium"],
    "web browser": ["chromium"],
    "chromium": ["chromium"],
}
"""Application names `launch` understands, beside desktop-file ids and programs on PATH."""

_OUTPUT_LIMIT = 10 * 1024 * 1024
"""Characters of stdout or stderr kept by a non-streamed exec; the rest is dropped."""
_NAME_MAX = 255
"""Bytes of one file name (a path's component) Linux file systems take."""
_PRUNE_SESSIONS_AT = 64
"""Sessions of exec'd commands kept before those that ended are forgotten."""


def _no_room(directory: Path, size: int) -> bool:
    """Whether the file system holding `directory` lacks room for `size` more bytes.

    A full disk does not always say ENOSPC: fuse2fs (the disk of a service that is not
    root) answers EIO for the library errors it does not translate. A failed write on a
    file system with no room left is a full disk whatever errno it came with."""
    try:
        found = os.statvfs(directory)
    except OSError:
        return False
    return found.f_bavail * found.f_frsize < size + (1 << 20)


class System:
    """Commands, files and applications of one desktop."""

    def __init__(self, home: Path, env: dict[str, str], max_file_bytes: int) -> None:
        self.home = home
        self.env = env
        self.max_file_bytes = max_file_bytes
        self._allowed = (home.resolve(), Path("/tmp").resolve())
        self._children: set[asyncio.Task[int]] = set()
        self._exec_sessions: set[int] = set()
        """Session ids of commands run through exec: background work, not the desktop's."""
        self.desktop_cpu_seconds = CpuMeter(self._exec_sessions.__contains__)
        """Seconds the desktop's programs have run or waited to run, leaving out exec'd
        commands (what `wait_for_settle` watches beside the screen)."""

    # --- exec -----------------------------------------------------------------------------

    async def _spawn(self, request: ExecRequest) -> asyncio.subprocess.Process:
        argv = ["/bin/sh", "-c", request.command] if isinstance(request.command, str) else None
        argv = argv or list(request.command)
        cwd = self.resolve(request.cwd) if request.cwd else self.home
        if not cwd.is_dir():
            raise InvalidRequest(f"cwd {str(cwd)!r} is not a directory inside the desktop")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env={**self.env, **request.env},
                stdin=asyncio.subprocess.PIPE
                if request.stdin is not None
                else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise InvalidRequest(f"command not found: {argv[0]!r}") from exc
        except PermissionError as exc:
            raise InvalidRequest(f"command not executable: {argv[0]!r}") from exc
        except BlockingIOError as exc:
            raise CapacityReached(
                "the desktop is at its process limit (max_pids): end some of its processes, "
                "or create desktops with a higher max_pids"
            ) from exc
        except OSError as exc:
            if exc.errno == errno.E2BIG:
                raise InvalidRequest(
                    "the command line or its environment is too long for Linux (128 KiB per "
                    "string): pass long input through stdin"
                ) from exc
            raise SandboxError(f"could not start {argv[0]!r}: {exc.strerror}") from exc
        if len(self._exec_sessions) >= _PRUNE_SESSIONS_AT:
            # Forget sessions with nobody left in them: their ids come back as new pids.
            self._exec_sessions &= live_sessions()
        self._exec_sessions.add(proc.pid)  # start_new_session: its session id is its pid
        return proc

    @staticmethod
    async def _end_group(proc: asyncio.subprocess.Process) -> None:
        """SIGKILL the command's process group until it is empty.

        One signal is not enough for a fork bomb: children forked while it is delivered
        survive it. The group is empty once killpg finds nobody (bounded at about 1 s).
        """
        for _ in range(50):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                break
            await asyncio.sleep(0.02)
        await proc.wait()

    async def run(self, request: ExecRequest) -> ExecResult:
        """Run a command to completion (or its timeout) and collect its output.

        Output past `_OUTPUT_LIMIT` bytes per stream is read and dropped, so a chatty
        command can neither block on a full pipe nor fill the guest's memory.
        """
        started = time.monotonic()
        kept = {"stdout": [], "stderr": []}
        sizes = {"stdout": 0, "stderr": 0}
        async for chunk in self.stream(request):
            if chunk.stream == "exit":
                return ExecResult(
                    exit_code=chunk.exit_code,
                    stdout="".join(kept["stdout"]),
                    stderr="".join(kept["stderr"]),
                    timed_out=chunk.timed_out,
                    elapsed_ms=(time.monotonic() - started) * 1000,
                )
            if sizes[chunk.stream] < _OUTPUT_LIMIT:
                kept[chunk.stream].append(chunk.data[: _OUTPUT_LIMIT - sizes[chunk.stream]])
                sizes[chunk.stream] += len(chunk.data)
        raise AssertionError("exec stream ended without an exit record")

    async def stream(self, request: ExecRequest) -> AsyncIterator[ExecChunk]:
        """Run a command, yielding output as it arrives and finally its exit status."""
        async for chunk in await self.start(request):
            yield chunk

    async def start(self, request: ExecRequest) -> AsyncGenerator[ExecChunk, None]:
        """Start a command (its errors raise here, before any output) and return its
        output as it will arrive, then its exit status. Closing the generator early ends
        the command's process group."""
        proc = await self._spawn(request)
        return self._follow(proc, request)

    async def _follow(
        self, proc: asyncio.subprocess.Process, request: ExecRequest
    ) -> AsyncGenerator[ExecChunk, None]:
        if request.stdin is not None:
            proc.stdin.write(request.stdin.encode())
            proc.stdin.close()
        queue: asyncio.Queue[ExecChunk | None] = asyncio.Queue()

        async def pump(reader: asyncio.StreamReader, name: str) -> None:
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            while chunk := await reader.read(65536):
                await queue.put(ExecChunk(stream=name, data=decoder.decode(chunk)))
            if tail := decoder.decode(b"", final=True):
                await queue.put(ExecChunk(stream=name, data=tail))
            await queue.put(None)

        pumps = [
            asyncio.create_task(pump(proc.stdout, "stdout")),
            asyncio.create_task(pump(proc.stderr, "stderr")),
        ]
        deadline = time.monotonic() + request.timeout_s
        open_streams, code, timed_out = 2, None, False
        try:
            # Time out each wait rather than the whole block: the generator is suspended
            # at `yield` while the caller works, and a scope timeout would cancel the caller.
            while open_streams:
                item = await asyncio.wait_for(queue.get(), deadline - time.monotonic())
                if item is None:
                    open_streams -= 1
                else:
                    yield item
            code = await asyncio.wait_for(proc.wait(), deadline - time.monotonic())
        except TimeoutError:
            timed_out = True
        finally:
            # A timeout, or a client that went away mid-stream, ends the whole process group.
            if timed_out or proc.returncode is None:
                await self._end_group(proc)
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        yield ExecChunk(stream="exit", exit_code=code, timed_out=timed_out)

    # --- files ----------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """Resolve `~`, relative paths and links; refuse what leaves home and /tmp."""
        if "\x00" in path:
            raise InvalidRequest("path contains a NUL byte")
        too_long = next((part for part in path.split("/") if len(part.encode()) > _NAME_MAX), None)
        if too_long is not None:
            raise InvalidRequest(
                f"the file name {too_long[:40]!r}… is {len(too_long.encode())} bytes long; "
                f"a name may have at most {_NAME_MAX}"
            )
        raw = Path(path.replace("~", str(self.home), 1) if path.startswith("~") else path)
        resolved = (self.home / raw).resolve()
        if not any(resolved == root or root in resolved.parents for root in self._allowed):
            raise PathNotAllowed(
                f"{path!r} resolves to {str(resolved)!r}, outside {self.home} and /tmp; "
                "the files API works there only (use exec for other paths)"
            )
        return resolved

    def entry(self, path: Path) -> FileEntry:
        info = path.lstat()
        kind = (
            "link"
            if stat.S_ISLNK(info.st_mode)
            else "dir"
            if stat.S_ISDIR(info.st_mode)
            else "file"
            if stat.S_ISREG(info.st_mode)
            else "other"
        )
        return FileEntry(
            name=path.name,
            path=str(path),
            type=kind,
            size=info.st_size,
            modified=datetime.fromtimestamp(info.st_mtime, UTC),
        )

    def list_dir(self, path: Path) -> list[FileEntry]:
        return sorted((self.entry(child) for child in path.iterdir()), key=lambda e: e.name)

    def stat_path(self, path: str) -> tuple[Path, FileEntry]:
        resolved = self.resolve(path)
        try:
            return resolved, self.entry(resolved)
        except FileNotFoundError as exc:
            raise FileNotFound(f"no file or directory at {str(resolved)!r}") from exc

    def write(self, path: str, data: bytes) -> FileEntry:
        """Write bytes to a file, creating parent directories; atomic on the same file system."""
        if len(data) > self.max_file_bytes:
            raise PayloadTooLarge(
                f"upload of {len(data)} bytes is over the {self.max_file_bytes}-byte limit"
            )
        target = self.resolve(path)
        if target.is_dir():
            raise InvalidRequest(f"{str(target)!r} is a directory; give a file path")
        partial = target.with_name(f".cubicle-upload-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(data)
            partial.replace(target)
        except OSError as exc:
            with contextlib.suppress(OSError):  # a full disk may refuse this too
                partial.unlink(missing_ok=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) or _no_room(target.parent, len(data)):
                raise DiskFull(
                    f"no room left for {len(data)} bytes at {str(target)!r}: free some space "
                    "in the desktop (or create it with a larger disk_mb)"
                ) from exc
            if isinstance(exc, NotADirectoryError | FileExistsError):
                raise InvalidRequest(f"{str(target.parent)!r} is not a directory") from exc
            raise
        return self.entry(target)

    def delete(self, path: str) -> None:
        target, entry = self.stat_path(path)
        if target in self._allowed:
            raise PathNotAllowed(f"refusing to delete {str(target)!r} itself")
        if entry.type == "dir":
            shutil.rmtree(target)
        else:
            target.unlink()

    # --- applications ---------------------------------------------------------------------

    def _app_argv(self, app: str) -> list[str]:
        name = app.strip().lower()
        if name in APPS:
            return list(APPS[name])
        desktop_file = Path("/usr/share/applications") / f"{app.removesuffix('.desktop')}.desktop"
        if desktop_file.is_file():
            for line in desktop_file.read_text(errors="replace").splitlines():
                if line.startswith("Exec="):
                    return [a for a in shlex.split(line[5:]) if not a.startswith("%")]
        for directory in self.env.get("PATH", "/usr/bin").split(":"):
            candidate = Path(directory) / app
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return [str(candidate)]
        known = ", ".join(sorted({k for k in APPS if " " not in k}))
        raise InvalidRequest(
            f"unknown application {app!r}: use one of {known}, a desktop-file id from "
            "/usr/share/applications, or a program on PATH"
        )

    async def _detach(self, argv: list[str]) -> Launched:
        log = os.open("/tmp/cubicle-apps.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=self.home,
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        except OSError as exc:
            raise InvalidRequest(f"could not start {argv[0]!r}: {exc.strerror}") from exc
        finally:
            os.close(log)
        reaper = asyncio.create_task(proc.wait())
        self._children.add(reaper)
        reaper.add_done_callback(self._children.discard)
        return Launched(pid=proc.pid, command=argv)

    async def launch(self, app: str, args: list[str]) -> Launched:
        """Start a desktop application by name and return at once."""
        return await self._detach([*self._app_argv(app), *args])

    async def open(self, target: str) -> Launched:
        """Open a file or URL with its default application."""
        if "://" not in target:
            path, _ = self.stat_path(target)
            target = str(path)
        return await self._detach(["exo-open", target])

    async def stop(self) -> None:
        for task in list(self._children):
            task.cancel()
        await asyncio.gather(*self._children, return_exceptions=True)
