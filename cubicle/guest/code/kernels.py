"""`Contexts`: the desktop's live Jupyter kernels, and runs of code in them.

Each context is one kernel process started as a child of the guest, so it runs as the
desktop's user under the desktop's limits (memory, pids, network). A run is read from the
kernel's IOPub channel and passed on event by event, never collected whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import BaseModel

from cubicle.protocol.code import (
    LANGUAGES,
    ContextInfo,
    CountEvent,
    CreateContext,
    EndEvent,
    ErrorEvent,
    OutputEvent,
    ResultEvent,
    RunCode,
)
from cubicle.protocol.errors import CapacityReached, InvalidRequest, NotFound, SandboxError

MAX_CONTEXTS = 32
"""Contexts one desktop keeps at once (the desktop's memory limit bounds them too)."""
OUTPUT_CAP = 64 * 1024 * 1024
"""Characters of stdout and stderr one run passes on; past it, output is dropped."""
_INTERRUPT_GRACE_S = 5.0
"""Seconds an interrupted run has to stop before its kernel is restarted."""
_POLL_S = 0.5
"""Seconds between checks that the kernel still lives while a run is silent."""
_START_TIMEOUT_S = 60.0
_OOM_SCORE_ADJ = 800
"""A kernel is the first the OOM killer picks in its desktop, before the X server or the
guest: code that eats the desktop's memory ends its own kernel (reported as `KernelDied`)."""
_LAUNCH = (
    f"open('/proc/self/oom_score_adj', 'w').write('{_OOM_SCORE_ADJ}')\n"
    "import sys\n"
    "sys.path[:] = [p for p in sys.path if p]\n"  # as ipykernel_launcher: not the cwd
    "from ipykernel import kernelapp\n"
    "kernelapp.launch_new_instance()\n"
)
"""`python -c` of a kernel: ipykernel_launcher's start, after raising its OOM score."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_FORMATS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


def _python() -> str:
    """The system's Python, whose site-packages hold ipykernel and the data-science stack
    (not a virtualenv the guest may run from)."""
    found = shutil.which("python3", path="/usr/bin:/bin")
    if found is None:
        raise SandboxError("this desktop has no /usr/bin/python3 to run a Python kernel")
    return found


def _now_ns() -> int:
    return time.time_ns()


def result_event(data: dict, is_main: bool) -> ResultEvent:
    """A kernel's MIME bundle as a result: the named formats, the rest under `extra`."""
    named: dict[str, object] = {}
    extra: dict[str, object] = {}
    for mime, value in data.items():
        field = _FORMATS.get(mime)
        if field is None:
            extra[mime] = value
        elif field in ("png", "jpeg", "pdf") and isinstance(value, str):
            named[field] = value.replace("\n", "")
        else:
            named[field] = value
    return ResultEvent(**named, extra=extra or None, is_main_result=is_main)


class Context:
    """One kernel and what runs in it; one run at a time."""

    def __init__(self, context_id: str, language: str, cwd: Path, env: dict[str, str]) -> None:
        self.id = context_id
        self.language = language
        self.cwd = cwd
        self._env = env
        self._manager = None
        self._client = None
        self._dir: str | None = None
        self.lock = asyncio.Lock()
        self.died: str | None = None
        """Why the kernel ended under a run, until the next run restarts it."""

    def info(self) -> ContextInfo:
        return ContextInfo(id=self.id, language=self.language, cwd=str(self.cwd))

    async def start(self) -> None:
        from jupyter_client.kernelspec import KernelSpec
        from jupyter_client.manager import AsyncKernelManager

        self._dir = tempfile.mkdtemp(prefix="cubicle-kernel-")
        manager = AsyncKernelManager(connection_file=f"{self._dir}/kernel.json")
        manager._kernel_spec = KernelSpec(
            argv=[_python(), "-c", _LAUNCH, "-f", "{connection_file}"],
            display_name="Python 3",
            language="python",
        )
        env = {
            **self._env,
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        }
        env.pop("VIRTUAL_ENV", None)
        try:
            await manager.start_kernel(env=env, cwd=str(self.cwd))
        except OSError as exc:
            raise SandboxError(f"could not start a {self.language} kernel: {exc}") from exc
        client = manager.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=_START_TIMEOUT_S)
        except RuntimeError as exc:
            client.stop_channels()
            await manager.shutdown_kernel(now=True)
            raise SandboxError(f"the {self.language} kernel did not start: {exc}") from exc
        self._manager, self._client, self.died = manager, client, None

    async def stop(self) -> None:
        client, manager, self._client, self._manager = self._client, self._manager, None, None
        if client is not None:
            client.stop_channels()
        if manager is not None:
            with contextlib.suppress(Exception):
                await manager.shutdown_kernel(now=True)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def alive(self) -> bool:
        return self._manager is not None and await self._manager.is_alive()

    async def interrupt(self) -> None:
        if await self.alive():
            await self._manager.interrupt_kernel()

    async def _silent(self, code: str) -> None:
        """Run set-up code (environment variables) whose output nobody reads."""
        msg_id = self._client.execute(code, silent=True, store_history=False, stop_on_error=False)
        with contextlib.suppress(queue.Empty):
            while True:
                reply = await self._client.get_shell_msg(timeout=10)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return

    async def run(self, request: RunCode) -> AsyncIterator[BaseModel]:
        """Run code, yielding its events as the kernel sends them, then the end."""
        async with self.lock:
            if not await self.alive():
                why = self.died or "it had ended"
                await self.restart()
                yield OutputEvent(
                    type="stderr",
                    text=f"[the context's kernel was restarted ({why}); its state was lost]\n",
                    timestamp=_now_ns(),
                )
            if request.env_vars:
                await self._silent(
                    "import os as _cubicle_os\n"
                    f"_cubicle_env = {{k: _cubicle_os.environ.get(k) "
                    f"for k in {list(request.env_vars)!r}}}\n"
                    f"_cubicle_os.environ.update({json.dumps(request.env_vars)})\n"
                )
            async for event in self._events(request):
                yield event
            if request.env_vars and await self.alive():
                await self._silent(
                    "for _k, _v in _cubicle_env.items():\n"
                    "    _cubicle_os.environ.pop(_k, None) if _v is None "
                    "else _cubicle_os.environ.__setitem__(_k, _v)\n"
                    "del _k, _v, _cubicle_env, _cubicle_os\n"
                )
            yield EndEvent()

    async def _events(self, request: RunCode) -> AsyncIterator[BaseModel]:
        client = self._client
        # stop_on_error=False: else ipykernel aborts a request that arrives just after an
        # error or an interrupt (it answers busy, idle and nothing else), seen as an empty run.
        msg_id = client.execute(
            request.code, store_history=True, allow_stdin=False, stop_on_error=False
        )
        deadline = time.monotonic() + request.timeout_s
        interrupted_at: float | None = None
        passed = 0
        capped = False
        done = False
        try:
            while True:
                now = time.monotonic()
                if interrupted_at is None and now >= deadline:
                    interrupted_at = now
                    await self.interrupt()
                wait = _POLL_S if interrupted_at is not None else min(_POLL_S, deadline - now)
                try:
                    msg = await client.get_iopub_msg(timeout=max(wait, 0.01))
                except queue.Empty:
                    if not await self.alive():
                        self.died = "the kernel process ended during a run"
                        yield ErrorEvent(
                            name="KernelDied",
                            value="the kernel process ended (os._exit, a crash, or the "
                            "desktop's memory limit); the next run restarts the context "
                            "without its state",
                            traceback="",
                        )
                        done = True
                        return
                    if interrupted_at is not None and now - interrupted_at > _INTERRUPT_GRACE_S:
                        await self.restart()
                        yield self._timeout_error(request, restarted=True)
                        done = True
                        return
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    text = content.get("text", "")
                    if passed >= OUTPUT_CAP:
                        if not capped:
                            capped = True
                            yield OutputEvent(
                                type="stderr",
                                text=f"\n[output past {OUTPUT_CAP} characters dropped]\n",
                                timestamp=_now_ns(),
                            )
                        continue
                    text = text[: OUTPUT_CAP - passed]
                    passed += len(text)
                    name = "stderr" if content.get("name") == "stderr" else "stdout"
                    yield OutputEvent(type=name, text=text, timestamp=_now_ns())
                elif kind == "execute_input":
                    yield CountEvent(execution_count=content.get("execution_count") or 0)
                elif kind in ("execute_result", "display_data"):
                    yield result_event(content.get("data", {}), kind == "execute_result")
                elif kind == "error":
                    if interrupted_at is not None and content.get("ename") == "KeyboardInterrupt":
                        yield self._timeout_error(request, restarted=False)
                    else:
                        yield ErrorEvent(
                            name=content.get("ename", "Error"),
                            value=content.get("evalue", ""),
                            traceback=_ANSI.sub("", "\n".join(content.get("traceback", []))),
                        )
                elif kind == "status" and content.get("execution_state") == "idle":
                    done = True
                    return
        finally:
            if not done:  # the reader went away mid-run: stop the code, keep the context
                with contextlib.suppress(Exception):
                    await self.interrupt()

    @staticmethod
    def _timeout_error(request: RunCode, restarted: bool) -> ErrorEvent:
        after = (
            "the kernel did not stop, so it was restarted without its state"
            if restarted
            else "the context keeps its state"
        )
        return ErrorEvent(
            name="TimeoutError",
            value=f"the run passed its {request.timeout_s:g} s timeout and was interrupted; "
            + after,
            traceback="",
        )


class Contexts:
    """The desktop's contexts by id; each language's default one is made on first use."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self._contexts: dict[str, Context] = {}
        self._creating = asyncio.Lock()

    @staticmethod
    def check_language(language: str) -> str:
        language = language.strip().lower()
        if language not in LANGUAGES:
            raise InvalidRequest(
                f"no kernel for language {language!r}: this desktop runs {', '.join(LANGUAGES)}"
            )
        return language

    async def create(self, request: CreateContext, context_id: str | None = None) -> Context:
        language = self.check_language(request.language)
        cwd = await asyncio.to_thread(self._directory, request.cwd)
        if len(self._contexts) >= MAX_CONTEXTS:
            raise CapacityReached(
                f"this desktop already has {MAX_CONTEXTS} code contexts: delete one first"
            )
        context = Context(context_id or uuid.uuid4().hex, language, cwd, self.env)
        await context.start()
        self._contexts[context.id] = context
        return context

    def _directory(self, cwd: str | None) -> Path:
        if not cwd:
            return self.home
        path = Path(cwd).expanduser()
        path = path if path.is_absolute() else self.home / path
        if not path.is_dir():
            raise InvalidRequest(f"cwd {str(path)!r} is not a directory inside the desktop")
        return path

    def get(self, context_id: str) -> Context:
        try:
            return self._contexts[context_id]
        except KeyError:
            raise NotFound(f"no code context {context_id!r} in this desktop") from None

    async def for_run(self, request: RunCode) -> Context:
        if request.context_id is not None:
            if request.language is not None:
                raise InvalidRequest("give context_id or language, not both")
            return self.get(request.context_id)
        language = self.check_language(request.language or "python")
        async with self._creating:
            if language not in self._contexts:
                await self.create(CreateContext(language=language), context_id=language)
        return self._contexts[language]

    def list(self) -> list[ContextInfo]:
        return [context.info() for context in self._contexts.values()]

    async def restart(self, context_id: str) -> ContextInfo:
        context = self.get(context_id)
        async with context.lock:
            await context.restart()
        return context.info()

    async def interrupt(self, context_id: str) -> None:
        await self.get(context_id).interrupt()

    async def remove(self, context_id: str) -> None:
        context = self._contexts.pop(context_id, None)
        if context is None:
            raise NotFound(f"no code context {context_id!r} in this desktop")
        await context.stop()

    async def stop(self) -> None:
        contexts, self._contexts = list(self._contexts.values()), {}
        await asyncio.gather(*(c.stop() for c in contexts), return_exceptions=True)
