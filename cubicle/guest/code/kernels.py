"""`Contexts`: the desktop's live Python processes, and runs of code in them.

Each context is one process running IPython's shell (`shell.py`), a child of the guest,
so it runs as the desktop's user under the desktop's limits (memory, pids, network). A
run's output and results are read from the process's pipes and passed on event by event,
never collected whole.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from cubicle.guest.code import charts, node_shell
from cubicle.protocol.code import (
    ContextInfo,
    CountEvent,
    CreateContext,
    EndEvent,
    ErrorEvent,
    OutputEvent,
    ResultEvent,
    RunCode,
    language_of,
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
"""A context is the first the OOM killer picks in its desktop, before the X server or the
guest: code that eats the desktop's memory ends its own context (reported as `KernelDied`)."""
_PIPE_SIZE = 65536
"""Bytes a pipe holds (Linux's default)."""
_PYTHON_PROGRAMS = {
    "python": (Path(__file__).parent / "shell.py").read_text(),
    "bash": (Path(__file__).parent / "bash_shell.py").read_text(),
}
"""Programs run as `python3 -c` by the desktop's Python: IPython's shell, or the driver
of a persistent bash."""
_CHARTS = Path(__file__).parent / "charts.py"
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
    charts.MIME: "chart",
    charts.DATA_MIME: "data",
}


def _python() -> str:
    """The system's Python, whose site-packages hold IPython and the data-science stack
    (not a virtualenv the guest may run from)."""
    found = shutil.which("python3", path="/usr/bin:/bin")
    if found is None:
        raise SandboxError("this desktop has no /usr/bin/python3 to run a Python kernel")
    return found


def _program(language: str) -> list[str]:
    """The command of a `language` context's process, before its two pipe numbers."""
    if language == "javascript":
        node = shutil.which("node", path="/usr/bin:/bin:/usr/local/bin")
        if node is None:
            raise InvalidRequest("this desktop has no Node.js (`node`) for a JavaScript context")
        return [node, "-e", node_shell.SOURCE]
    if language == "python":  # its figures' charts: `charts.py`, loaded by path
        return [_python(), "-c", _PYTHON_PROGRAMS[language], str(_CHARTS)]
    return [_python(), "-c", _PYTHON_PROGRAMS[language]]


def _choom() -> list[str]:
    """util-linux's `choom`, to start a context with its OOM score raised (nothing if the
    desktop lacks it: the context then shares the desktop's score)."""
    found = shutil.which("choom", path="/usr/bin:/bin")
    return [found, "-n", str(_OOM_SCORE_ADJ), "--"] if found else []


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
    """One process (IPython, bash or Node.js, by language) and what runs in it; one run at
    a time."""

    def __init__(self, context_id: str, language: str, cwd: Path, env: dict[str, str]) -> None:
        self.id = context_id
        self.language = language
        self.cwd = cwd
        self._env = env
        self._process: subprocess.Popen[bytes] | None = None
        self._requests = -1
        self._pipes: _Pipes | None = None
        self._runs = 0
        self._unfinished: int | None = None
        """The run whose end was not read (its caller went away), read before the next."""
        self.lock = asyncio.Lock()
        self.died: str | None = None
        """Why the process ended under a run, until the next run restarts it."""

    def info(self) -> ContextInfo:
        return ContextInfo(id=self.id, language=self.language, cwd=str(self.cwd))

    async def start(self) -> None:
        env = {**self._env, "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
        env.pop("VIRTUAL_ENV", None)
        command = [*_choom(), *_program(self.language)]  # no such program: a clear 4xx
        requests_r, requests_w = os.pipe()
        events_r, events_w = os.pipe()
        try:
            process = await asyncio.to_thread(
                subprocess.Popen,
                [*command, str(requests_r), str(events_w)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(requests_r, events_w),
                cwd=self.cwd,
                env=env,
                start_new_session=True,  # an interrupt or a stop reaches its children too
            )
        except OSError as exc:
            os.close(requests_w)
            os.close(events_r)
            raise SandboxError(f"could not start a {self.language} context: {exc}") from exc
        finally:  # the process's ends of the pipes: it holds them now, or nobody does
            os.close(requests_r)
            os.close(events_w)
        assert process.stdout is not None and process.stderr is not None
        self._process, self._requests, self.died = process, requests_w, None
        self._unfinished = None
        self._pipes = _Pipes(events_r, process.stdout.fileno(), process.stderr.fileno())
        deadline = time.monotonic() + _START_TIMEOUT_S
        while (event := await self._pipes.event(deadline)) is None or event[0] != "ready":
            if event is None or event[0] == "eof" or time.monotonic() > deadline:
                why = self._pipes.stderr_tail()
                await self.stop()
                raise SandboxError(f"the {self.language} context did not start: {why}")

    async def stop(self) -> None:
        process, pipes, self._process, self._pipes = self._process, self._pipes, None, None
        if self._requests >= 0:
            os.close(self._requests)
            self._requests = -1
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
            for output in (process.stdout, process.stderr):
                if output is not None:
                    output.close()
        if pipes is not None:
            pipes.close()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    async def interrupt(self) -> None:
        self._interrupt()

    def _interrupt(self) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGINT)

    async def run(self, request: RunCode) -> AsyncIterator[BaseModel]:
        """Run code, yielding its events as the process sends them, then the end."""
        async with self.lock:
            if self._unfinished is not None:
                await self._finish(self._unfinished)
            if not await self.alive():
                why = self.died or "it had ended"
                await self.restart()
                yield OutputEvent(
                    type="stderr",
                    text=f"[the context's process was restarted ({why}); its state was lost]\n",
                    timestamp=_now_ns(),
                )
            async for event in self._events(request):
                yield event
            yield EndEvent()

    async def _events(self, request: RunCode) -> AsyncIterator[BaseModel]:
        self._runs += 1
        run = self._unfinished = self._runs
        asked = {"run": run, "code": request.code, "env": request.env_vars}
        line = json.dumps(asked).encode() + b"\n"
        try:
            await self._send(line)
        except BrokenPipeError:  # it ended just before this run (bash's `exit`)
            await self.restart()
            self._unfinished = run
            yield OutputEvent(
                type="stderr",
                text="[the context's process had ended; a new one runs this, without state]\n",
                timestamp=_now_ns(),
            )
            await self._send(line)
        pipes = self._pipes
        assert pipes is not None
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
                if interrupted_at is not None and now - interrupted_at > _INTERRUPT_GRACE_S:
                    await self.restart()
                    yield self._timeout_error(request, restarted=True)
                    done = True
                    return
                wait_until = deadline if interrupted_at is None else now + _POLL_S
                got = await pipes.event(wait_until)
                if got is None:
                    continue
                kind, content = got
                if kind in ("stdout", "stderr"):
                    if passed >= OUTPUT_CAP:
                        if not capped:
                            capped = True
                            yield OutputEvent(
                                type="stderr",
                                text=f"\n[output past {OUTPUT_CAP} characters dropped]\n",
                                timestamp=_now_ns(),
                            )
                        continue
                    text = content[: OUTPUT_CAP - passed]
                    passed += len(text)
                    yield OutputEvent(type=kind, text=text, timestamp=_now_ns())
                elif kind == "count":
                    yield CountEvent(execution_count=content.get("n") or 0)
                elif kind == "result":
                    yield result_event(content.get("data", {}), bool(content.get("main")))
                elif kind == "error":
                    if interrupted_at is not None and content.get("name") == "KeyboardInterrupt":
                        yield self._timeout_error(request, restarted=False)
                    else:
                        yield ErrorEvent(
                            name=content.get("name", "Error"),
                            value=content.get("value", ""),
                            traceback=_ANSI.sub("", content.get("traceback", "")),
                        )
                elif kind == "ended":  # the process ends after this run
                    self.died = str(content.get("why") or "it ended")
                elif kind == "done":
                    # What subprocesses wrote before the run ended is in the output pipes
                    # now: it belongs to this run, not the next.
                    for name, text in pipes.drain_output():
                        yield OutputEvent(type=name, text=text, timestamp=_now_ns())
                    self._unfinished = None
                    done = True
                    if self.died is not None:
                        await self.stop()
                    return
                elif kind == "eof":
                    self._unfinished = None
                    await self.stop()
                    self.died = "the context's process ended during a run"
                    yield ErrorEvent(
                        name="KernelDied",
                        value="the context's process ended (os._exit, a crash, or the "
                        "desktop's memory limit); the next run restarts the context "
                        "without its state",
                        traceback="",
                    )
                    done = True
                    return
        finally:
            if not done:  # the reader went away mid-run: stop the code, keep the context
                self._interrupt()

    async def _finish(self, run: int) -> None:
        """Read the rest of `run`, whose caller went away, so the next run starts clean;
        stop the process if the run does not end within the grace period."""
        pipes = self._pipes
        if pipes is None:  # stopped since: nothing is left to read
            self._unfinished = None
            return
        deadline = time.monotonic() + _INTERRUPT_GRACE_S
        while time.monotonic() < deadline:
            got = await pipes.event(deadline)
            if got is not None and got[0] == "eof":
                self.died = "the context's process ended during a run"
                await self.stop()
                return
            if got is not None and got[0] == "done" and got[1].get("run") == run:
                self._unfinished = None
                return
        self.died = "a run whose caller went away did not stop"
        await self.stop()

    @staticmethod
    def _timeout_error(request: RunCode, restarted: bool) -> ErrorEvent:
        after = (
            "the context's process did not stop, so it was restarted without its state"
            if restarted
            else "the context keeps its state"
        )
        return ErrorEvent(
            name="TimeoutError",
            value=f"the run passed its {request.timeout_s:g} s timeout and was interrupted; "
            + after,
            traceback="",
        )

    async def _send(self, line: bytes) -> None:
        if len(line) <= _PIPE_SIZE:  # the process waits for it: the pipe takes it at once
            _write_all(self._requests, line)
        else:
            await asyncio.to_thread(_write_all, self._requests, line)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Pipes:
    """A context process's three outputs, read as one stream of events.

    Read only when asked (`event`), so a flood of output waits in the pipes, not here.
    What the code prints through Python arrives on the events pipe, in order with its
    results; fds 1 and 2 carry what subprocesses write, read when no event is waiting.
    """

    _CHUNK = 1 << 16

    def __init__(self, events: int, stdout: int, stderr: int) -> None:
        self._fds = {"events": events, "stdout": stdout, "stderr": stderr}
        for fd in self._fds.values():
            os.set_blocking(fd, False)
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")(errors="replace")
            for name in ("stdout", "stderr")
        }
        self._lines = b""
        self._ready: collections.deque[tuple[str, dict]] = collections.deque()
        self._eof = False
        self._stderr_tail = ""

    def stderr_tail(self) -> str:
        return self._stderr_tail[-2000:].strip() or "no output"

    async def event(self, deadline: float) -> tuple[str, Any] | None:
        """The next event, `("eof", {})` once the process is gone, or None at `deadline`."""
        while True:
            if not self._ready and not self._eof:
                self._read_events()
            if self._ready:
                return self._ready.popleft()
            for name in ("stdout", "stderr"):
                text = self._read_text(name)
                if text:
                    if name == "stderr":
                        self._stderr_tail = (self._stderr_tail + text)[-4000:]
                    return name, text
            if self._eof:
                return "eof", {}
            if not await self._wait(deadline):
                return None

    def drain_output(self) -> list[tuple[str, str]]:
        """What stdout and stderr hold now, up to a pipe's worth each (a background
        process that keeps writing must not keep the run from ending)."""
        found = []
        for name in ("stdout", "stderr"):
            for _ in range(_PIPE_SIZE // self._CHUNK):
                text = self._read_text(name)
                if not text:
                    break
                found.append((name, text))
        return found

    def _read_text(self, name: str) -> str:
        try:
            data = os.read(self._fds[name], self._CHUNK)
        except (BlockingIOError, OSError):
            return ""
        return self._decoders[name].decode(data, final=not data)

    def _read_events(self) -> None:
        try:
            data = os.read(self._fds["events"], self._CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._eof = True
            return
        self._lines += data
        *whole, self._lines = self._lines.split(b"\n")
        for line in whole:
            try:
                event = json.loads(line)
                kind = event.pop("kind")
            except (ValueError, KeyError, AttributeError):
                continue  # not an event: nothing the process sends on purpose
            if kind == "stream":
                name = "stderr" if event.get("name") == "stderr" else "stdout"
                self._ready.append((name, str(event.get("text", ""))))
            else:
                self._ready.append((kind, event))

    async def _wait(self, deadline: float) -> bool:
        """Wait until a pipe has something to read; False at `deadline`."""
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        readable = loop.create_future()

        def wake() -> None:
            if not readable.done():
                readable.set_result(True)

        for fd in self._fds.values():
            loop.add_reader(fd, wake)
        try:
            async with asyncio.timeout(timeout):
                await readable
            return True
        except TimeoutError:
            return False
        finally:
            for fd in self._fds.values():
                loop.remove_reader(fd)

    def close(self) -> None:
        """Close the events pipe (stdout and stderr belong to the `Popen`, which closes
        them: closing their numbers here too could close another file given the same)."""
        os.close(self._fds["events"])


class Contexts:
    """The desktop's contexts by id; each language's default one is made on first use."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self._contexts: dict[str, Context] = {}
        self._creating = asyncio.Lock()

    @staticmethod
    def check_language(language: str) -> str:
        return language_of(language)

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
