"""Apps a desktop had open, opened again where its memory could not follow.

A local desktop's snapshot or fork keeps its disk, not its processes, and so does a pause
without memory in any runtime: the desktop that boots on that disk is drawn afresh. Just
before such a copy or park, the service writes down the apps whose windows are open (each
one's command line, read from /proc inside the desktop) in a note in the desktop's own
home (`NOTE`), so the note travels with the disk; a desktop that boots on such a disk
opens them again and deletes the note. Files they had open come back (their command lines
name them); what was only in their memory (unsaved text) does not.
"""

from __future__ import annotations

import json
import logging
import os

from pydantic import BaseModel, TypeAdapter, ValidationError

from cubicle.protocol.errors import CubicleError, FileNotFound
from cubicle.protocol.models import ExecRequest, ExecResult, LaunchRequest, WindowInfo
from cubicle.protocol.routes import GuestPath
from cubicle.server.guest_client import GuestClient

log = logging.getLogger("cubicle.reopen")

NOTE = "~/.cache/cubicle/reopen.json"
MAX_APPS = 16
_SEPARATOR = "\x1f"
_COMMAND_LINES = 'for p; do tr "\\0" "\\037" < /proc/$p/cmdline 2>/dev/null; echo; done'
"""Each pid's command line on a line of its own, its arguments split by `_SEPARATOR`."""
_WINDOWS = TypeAdapter(list[WindowInfo])


class OpenApp(BaseModel):
    window: str
    """The window's app class (`Mousepad`), for the log."""
    argv: list[str]


class Note(BaseModel):
    apps: list[OpenApp]


async def note(client: GuestClient) -> int:
    """Write down the apps whose windows are open now; returns how many."""
    answer = await client.request("GET", GuestPath.WINDOWS)
    windows = _WINDOWS.validate_json(answer.content)
    pids: dict[int, str] = {}
    for window in windows:
        if window.pid is not None and len(pids) < MAX_APPS:
            pids.setdefault(window.pid, window.app)
    if not pids:
        await forget(client)
        return 0
    run = ExecRequest(command=["sh", "-c", _COMMAND_LINES, "sh", *map(str, pids)], timeout_s=10)
    lines = (await client.request("POST", GuestPath.EXEC, json=run)).model(ExecResult)
    apps = [
        OpenApp(window=app, argv=line.rstrip(_SEPARATOR).split(_SEPARATOR))
        for app, line in zip(pids.values(), lines.stdout.splitlines(), strict=False)
        if line.strip(_SEPARATOR)
    ]
    body = Note(apps=apps).model_dump_json().encode()
    await client.request("PUT", GuestPath.FILES, params={"path": NOTE}, content=body)
    return len(apps)


async def forget(client: GuestClient) -> None:
    """Delete the note (from a desktop that goes on running: its copy keeps it)."""
    run = ExecRequest(command=["rm", "-f", NOTE.replace("~", "/home/user", 1)], timeout_s=10)
    await client.request("POST", GuestPath.EXEC, json=run)


async def reopen(client: GuestClient, desktop_id: str) -> None:
    """Open again the apps the note of this desktop's disk names, and delete it; a desktop
    without a note opens nothing. Never fails the desktop: an app that does not start is
    logged."""
    try:
        answer = await client.request("GET", GuestPath.FILES, params={"path": NOTE})
        await forget(client)
    except FileNotFound:
        return
    except CubicleError as exc:
        log.warning("desktop %s: its note of open apps was not read: %s", desktop_id, exc)
        return
    try:
        found = Note.model_validate(json.loads(answer.content))
    except (ValueError, ValidationError) as exc:
        log.warning("desktop %s: its note of open apps is unreadable (%s)", desktop_id, exc)
        return
    for app in found.apps[:MAX_APPS]:
        try:
            launch = LaunchRequest(app=os.path.basename(app.argv[0]), args=app.argv[1:])
            await client.request("POST", GuestPath.LAUNCH, json=launch)
        except (CubicleError, ValidationError, IndexError) as exc:
            log.warning("desktop %s: %s did not open again: %s", desktop_id, app.window, exc)
    if found.apps:
        opened = ", ".join(app.window for app in found.apps)
        log.info("desktop %s: opened again what was open before: %s", desktop_id, opened)
