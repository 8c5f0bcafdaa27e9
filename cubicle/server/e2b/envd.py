"""E2B's envd (port 49983 of a sandbox), answered by the service for a Cubicle desktop.

Reached through the port proxy with E2B's headers (`E2b-Sandbox-Id`, `E2b-Sandbox-Port:
49983`, `X-Access-Token`: the sandbox's `envdAccessToken`). Every call becomes a call to
the desktop's guest, so it runs as the desktop's user, inside its sandbox and limits:

- `GET /health` (204, no token), `GET /envs`;
- `GET /files?path=` and `POST /files` (multipart, or octet-stream with `?path=`);
- Connect RPC with the JSON codec: `process.Process/Start` (server stream: `start`, then
  `data` as output comes, then `end`), `Connect`, `List`, `SendSignal` (ends the
  command's process group); `filesystem.Filesystem/Stat`, `ListDir`, `MakeDir`, `Remove`, `Move`.

A command outlives the stream that started it, as on E2B (a background command whose
handle is dropped keeps running; `Connect` follows it again by pid); it ends by itself, by
`SendSignal`, at its deadline (`Connect-Timeout-Ms`; without one, a week), or with its
desktop. Not served (a Connect `unimplemented` naming the method): stdin and PTYs
(`SendInput`, `StreamInput`, `Update`, `CloseStdin`), directory watches.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import struct
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from cubicle.protocol.errors import CubicleError, FileNotFound, answer_for
from cubicle.protocol.models import ExecChunk, ExecRequest, ExecResult
from cubicle.protocol.routes import GuestPath
from cubicle.protocol.streams import until
from cubicle.server.e2b.sandboxes import Sandbox
from cubicle.server.guest_client import GuestClient

HOME = "/home/user"
_STATUS = {
    "invalid_argument": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "already_exists": 409,
    "resource_exhausted": 429,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "deadline_exceeded": 504,
}
_CUBICLE_TO_CONNECT = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "already_exists",
    413: "resource_exhausted",
    422: "invalid_argument",
    429: "resource_exhausted",
    507: "resource_exhausted",
}
_FS_OPS = {
    "Stat": "stat",
    "ListDir": "list",
    "MakeDir": "mkdir",
    "Remove": "remove",
    "Move": "move",
}
_MAX_COMMAND_S = 604_800.0
"""A command without a deadline (`timeout=0`) runs at most a week, or until its desktop ends."""
_END_STREAM = 0x02
_STREAM = "application/connect+json"
_BACKLOG = 4096
"""Events a stream may fall behind its command before it is ended."""
_FS_SCRIPT = r"""
import json, os, stat, sys, pwd, grp, datetime
op, args = sys.argv[1], sys.argv[2:]
def info(path):
    st = os.lstat(path)
    kind = "FILE_TYPE_DIRECTORY" if stat.S_ISDIR(st.st_mode) else (
        "FILE_TYPE_FILE" if stat.S_ISREG(st.st_mode) else "FILE_TYPE_UNSPECIFIED")
    target = None
    if stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(path)
        try:
            kind = "FILE_TYPE_DIRECTORY" if os.path.isdir(path) else "FILE_TYPE_FILE"
        except OSError:
            pass
    def name(get, key):
        try: return get(key)[0]
        except KeyError: return str(key)
    entry = {"name": os.path.basename(path) or path, "type": kind, "path": path,
        "size": str(st.st_size), "mode": st.st_mode & 0o7777,
        "permissions": stat.filemode(st.st_mode), "owner": name(pwd.getpwuid, st.st_uid),
        "group": name(grp.getgrgid, st.st_gid),
        "modifiedTime": datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
            .isoformat().replace("+00:00", "Z")}
    if target: entry["symlinkTarget"] = target
    return entry
def fail(code, message):
    print(json.dumps({"error": code, "message": message})); sys.exit(0)
try:
    if op == "stat":
        print(json.dumps({"entry": info(args[0])}))
    elif op == "list":
        root, depth = args[0], int(args[1])
        if not os.path.isdir(root): fail("invalid_argument", f"{root} is not a directory")
        found = []
        def walk(folder, level):
            for item in sorted(os.listdir(folder)):
                full = os.path.join(folder, item)
                found.append(info(full))
                if level < depth and os.path.isdir(full) and not os.path.islink(full):
                    walk(full, level + 1)
        walk(root, 1)
        print(json.dumps({"entries": found}))
    elif op == "mkdir":
        if os.path.isdir(args[0]): fail("already_exists", f"{args[0]} already exists")
        os.makedirs(args[0]); print(json.dumps({"entry": info(args[0])}))
    elif op == "remove":
        if os.path.isdir(args[0]) and not os.path.islink(args[0]):
            import shutil; shutil.rmtree(args[0])
        else: os.remove(args[0])
        print("{}")
    elif op == "move":
        os.makedirs(os.path.dirname(args[1]) or ".", exist_ok=True)
        if not os.path.lexists(args[0]): fail("not_found", f"{args[0]} was not found")
        import shutil; shutil.move(args[0], args[1]); print(json.dumps({"entry": info(args[1])}))
except FileNotFoundError as exc:
    fail("not_found", f"{exc.filename} was not found")
except FileExistsError as exc:
    fail("already_exists", f"{exc.filename} already exists")
except PermissionError as exc:
    fail("permission_denied", str(exc))
except OSError as exc:
    fail("invalid_argument", str(exc))
"""


class ConnectError(Exception):
    """An error in Connect's terms: its code (`not_found`…) and message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _from_cubicle(exc: CubicleError) -> ConnectError:
    answer = answer_for(exc, log_hint="the service's log")
    return ConnectError(_CUBICLE_TO_CONNECT.get(answer.status, "internal"), answer.body.detail)


def _path(text: str | None) -> str:
    """An envd path: relative ones are the user's home's."""
    if not text:
        return HOME
    path = PurePosixPath(text)
    return str(path if path.is_absolute() else PurePosixPath(HOME) / path)


@dataclass
class _Process:
    """A command envd started, and the streams that follow it."""

    pid: int
    tag: str | None
    cmd: str
    args: list[str]
    cwd: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by `SendSignal`: the guest's stream closes, and the command ends with it."""
    listeners: set[asyncio.Queue[bytes | None]] = field(default_factory=set)
    task: asyncio.Task | None = None

    def listen(self) -> asyncio.Queue[bytes | None]:
        listener: asyncio.Queue[bytes | None] = asyncio.Queue(_BACKLOG)
        self.listeners.add(listener)
        return listener

    def tell(self, envelope: bytes) -> None:
        """Hand an event to every stream; one that fell `_BACKLOG` events behind is ended
        (its reader stopped reading) rather than held in memory."""
        for listener in list(self.listeners):
            try:
                listener.put_nowait(envelope)
            except asyncio.QueueFull:
                self.listeners.discard(listener)
                _close(listener)

    def finish(self, *envelopes: bytes) -> None:
        """The last events, then the end of every stream."""
        for envelope in envelopes:
            self.tell(envelope)
        for listener in list(self.listeners):
            _close(listener)
        self.listeners.clear()


def _close(listener: asyncio.Queue[bytes | None]) -> None:
    while True:
        try:
            listener.put_nowait(None)
            return
        except asyncio.QueueFull:
            listener.get_nowait()  # the end matters more than a lagging reader's backlog


@dataclass
class Envd:
    """envd for one sandbox: its running processes."""

    sandbox: Sandbox
    processes: dict[int, _Process] = field(default_factory=dict)
    _pids: itertools.count = field(default_factory=lambda: itertools.count(1000))
    _tasks: set[asyncio.Task] = field(default_factory=set)

    async def __call__(
        self, guest: GuestClient, scope: Scope, receive: Receive, send: Send
    ) -> None:
        request = Request(scope, receive)
        path = scope["path"]
        try:
            if path == "/health":
                response: Response = Response(status_code=204)
            elif path == "/envs" and request.method == "GET":
                response = JSONResponse(self.sandbox.env)
            elif path == "/files":
                response = await self._files(guest, request)
            elif path == "/process.Process/Start":
                response = await self._start(guest, request)
            elif path == "/process.Process/Connect":
                response = await self._connect(request)
            elif path.startswith(("/process.Process/", "/filesystem.Filesystem/")):
                response = await self._unary(guest, request, path.rsplit("/", 1)[1])
            else:
                response = _connect_error(ConnectError("not_found", f"envd has no {path}"))
        except ConnectError as exc:
            response = _connect_error(exc)
        except CubicleError as exc:
            response = _connect_error(_from_cubicle(exc))
        await response(scope, receive, send)

    # --- files ---------------------------------------------------------------------------

    async def _files(self, guest: GuestClient, request: Request) -> Response:
        query = request.query_params
        if request.method == "GET":
            path = _path(query.get("path"))
            try:
                answer = await guest.request("GET", GuestPath.FILES, params={"path": path})
            except FileNotFound:
                return _plain_error(404, f"path '{path}' does not exist")
            if answer.headers.get("content-type") == "application/json":
                return _plain_error(400, f"path '{path}' is a directory")
            return Response(answer.content, media_type="application/octet-stream")
        if request.method != "POST":
            return _plain_error(405, "use GET or POST on /files")
        written = []
        content_type = request.headers.get("content-type", "")
        if content_type.startswith("multipart/form-data"):
            form = await request.form(max_part_size=1 << 30)
            for _name, part in form.multi_items():
                if isinstance(part, str):
                    continue
                path = _path(query.get("path") or part.filename)
                data = await part.read()
                await guest.request("PUT", GuestPath.FILES, params={"path": path}, content=data)
                written.append({"name": PurePosixPath(path).name, "type": "file", "path": path})
        else:
            path = _path(query.get("path"))
            data = await request.body()
            await guest.request("PUT", GuestPath.FILES, params={"path": path}, content=data)
            written.append({"name": PurePosixPath(path).name, "type": "file", "path": path})
        return JSONResponse(written)

    # --- processes -----------------------------------------------------------------------

    async def _start(self, guest: GuestClient, request: Request) -> Response:
        message = _first_envelope(await request.body())
        process = message.get("process") or {}
        cmd = str(process.get("cmd") or "")
        if not cmd:
            raise ConnectError("invalid_argument", "process.cmd is empty")
        if message.get("pty"):
            raise ConnectError("unimplemented", "PTY processes are not served by Cubicle yet")
        args = [str(a) for a in process.get("args") or []]
        cwd = _path(process.get("cwd"))
        env = {
            **self.sandbox.env,
            **{str(k): str(v) for k, v in (process.get("envs") or {}).items()},
        }
        timeout_ms = request.headers.get("connect-timeout-ms", "")
        timeout_s = (
            min(int(timeout_ms) / 1000, _MAX_COMMAND_S) if timeout_ms.isdigit() else _MAX_COMMAND_S
        )
        exec_request = ExecRequest(
            command=[cmd, *args], cwd=cwd, env=env, timeout_s=max(timeout_s, 0.001), stream=True
        )
        entry = _Process(next(self._pids), message.get("tag"), cmd, args, cwd)
        listener = entry.listen()
        self.processes[entry.pid] = entry
        entry.task = asyncio.create_task(self._run(guest, exec_request, entry))
        self._tasks.add(entry.task)
        entry.task.add_done_callback(self._tasks.discard)
        return StreamingResponse(self._follow(entry, listener), media_type=_STREAM)

    async def _connect(self, request: Request) -> Response:
        """`process.Process/Connect`: the events of a running command from now on."""
        message = _first_envelope(await request.body())
        entry = self._find(message.get("process") or {})
        return StreamingResponse(self._follow(entry, entry.listen()), media_type=_STREAM)

    async def _follow(
        self, entry: _Process, listener: asyncio.Queue[bytes | None]
    ) -> AsyncIterator[bytes]:
        """One stream of a command's events; the command outlives it (as on E2B)."""
        try:
            yield _envelope({"event": {"start": {"pid": entry.pid}}})
            while (envelope := await listener.get()) is not None:
                yield envelope
        finally:
            entry.listeners.discard(listener)

    async def _run(self, guest: GuestClient, request: ExecRequest, entry: _Process) -> None:
        """Run the command to its end, handing its events to whoever listens; `SendSignal`
        (`entry.stop`) closes the guest's stream, which ends its process group."""
        try:
            result: ExecChunk | None = None
            try:
                async with guest.stream(
                    "POST", GuestPath.EXEC, json=request, read_timeout_s=request.timeout_s + 30
                ) as output:
                    async for chunk in until(_lines(output.chunks()), entry.stop.wait()):
                        if chunk.stream == "exit":
                            result = chunk
                            continue
                        data = base64.b64encode(chunk.data.encode()).decode()
                        entry.tell(_envelope({"event": {"data": {chunk.stream: data}}}))
            except CubicleError as exc:
                error = _from_cubicle(exc)
                entry.finish(_end_stream({"error": {"code": error.code, "message": error.message}}))
                return
            if entry.stop.is_set():
                entry.finish(_envelope({"event": {"end": _ended(-9, "signal: killed")}}), _END)
            elif result is None or result.timed_out:
                timed_out = {"code": "deadline_exceeded", "message": "the command timed out"}
                entry.finish(_end_stream({"error": timed_out}))
            else:
                code = result.exit_code if result.exit_code is not None else -1
                status = f"exit status {code}" if code >= 0 else f"signal: {-code}"
                entry.finish(_envelope({"event": {"end": _ended(code, status)}}), _END)
        finally:
            self.processes.pop(entry.pid, None)
            entry.finish()

    async def aclose(self) -> None:
        """End every command this envd started, and wait for them."""
        for entry in list(self.processes.values()):
            entry.stop.set()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _unary(self, guest: GuestClient, request: Request, method: str) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            raise ConnectError("invalid_argument", "the body is not JSON") from None
        service = request.url.path.split("/")[1]
        if service == "process.Process":
            return JSONResponse(self._process_call(method, body))
        op = _FS_OPS.get(method)
        if op is None:
            raise ConnectError(
                "unimplemented", f"filesystem.Filesystem/{method} is not served by Cubicle yet"
            )
        if op == "move":
            args = [_path(body.get("source")), _path(body.get("destination"))]
        elif op == "list":
            args = [_path(body.get("path")), str(max(1, int(body.get("depth") or 1)))]
        else:
            args = [_path(body.get("path"))]
        exec_request = ExecRequest(command=["python3", "-c", _FS_SCRIPT, op, *args], timeout_s=60)
        answer = await guest.request("POST", GuestPath.EXEC, json=exec_request, timeout_s=90)
        result = ExecResult.model_validate_json(answer.content)
        try:
            found = json.loads(result.stdout)
        except ValueError:
            raise ConnectError(
                "internal", f"filesystem {op} failed: {result.stderr[-500:]}"
            ) from None
        if "error" in found:
            raise ConnectError(found["error"], found["message"])
        return JSONResponse(found)

    def _process_call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        if method == "List":
            return {
                "processes": [
                    {
                        "config": {"cmd": p.cmd, "args": p.args, "envs": {}, "cwd": p.cwd},
                        "pid": p.pid,
                        **({"tag": p.tag} if p.tag else {}),
                    }
                    for p in self.processes.values()
                ]
            }
        if method == "SendSignal":
            selector = body.get("process") or {}
            self._find(selector).stop.set()
            return {}
        raise ConnectError(
            "unimplemented", f"process.Process/{method} is not served by Cubicle yet"
        )

    def _find(self, selector: dict[str, Any]) -> _Process:
        for entry in self.processes.values():
            if ("pid" in selector and int(selector["pid"]) == entry.pid) or (
                "tag" in selector and selector["tag"] == entry.tag
            ):
                return entry
        raise ConnectError("not_found", f"process {selector} was not found")


async def _lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[ExecChunk, None]:
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *whole, pending = pending.split(b"\n")
        for line in whole:
            if line.strip():
                yield ExecChunk.model_validate_json(line)
    if pending.strip():
        yield ExecChunk.model_validate_json(pending)


def _ended(code: int, status: str) -> dict[str, Any]:
    return {"exitCode": code, "exited": code >= 0, "status": status}


def _envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(data)) + data


def _end_stream(message: dict[str, Any]) -> bytes:
    return _envelope(message, _END_STREAM)


_END = _end_stream({})


def _first_envelope(body: bytes) -> dict[str, Any]:
    if len(body) < 5:
        raise ConnectError("invalid_argument", "a Connect stream starts with an envelope")
    flags, size = struct.unpack(">BI", body[:5])
    if flags & 0x01:
        raise ConnectError("unimplemented", "compressed Connect messages are not served")
    try:
        message = json.loads(body[5 : 5 + size])
    except ValueError:
        raise ConnectError("invalid_argument", "the message is not JSON") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "the message is not a JSON object")
    return message


def _connect_error(exc: ConnectError) -> Response:
    return JSONResponse({"code": exc.code, "message": exc.message}, _STATUS.get(exc.code, 500))


def _plain_error(status: int, message: str) -> Response:
    return JSONResponse({"code": status, "message": message}, status)
