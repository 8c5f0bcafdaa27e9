"""MCP tools for the rest of a desktop: create, list and kill desktops; windows, the
accessibility tree, commands, files, applications and the clipboard."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from mcp.types import CallToolResult
from pydantic import Field

from cubicle.mcp.input_tools import DesktopId
from cubicle.mcp.session import Desktops, cut, guarded, result
from cubicle.protocol.a11y_text import a11y_text


class SystemTools:
    """Desktops, windows, the accessibility tree, commands, files, the clipboard: MCP tools."""

    def __init__(self, desktops: Desktops) -> None:
        self.desktops = desktops

    async def create_desktop(
        self,
        width: Annotated[int, Field(ge=320, le=7680)] = 1280,
        height: Annotated[int, Field(ge=240, le=4320)] = 800,
        timeout_s: Annotated[int, Field(ge=10, le=86_400)] = 600,
        network: bool = False,
    ) -> CallToolResult:
        """Start a fresh Linux desktop (XFCE: terminal, text editor, file manager, browser);
        answers its id once it is drawn. It stops after timeout_s seconds without a call."""
        async with guarded(self.desktops):
            entry = await self.desktops.create(
                resolution=(width, height), timeout_s=timeout_s, network=network
            )
            info = entry.desktop.info
            text = f"desktop {info.id} is ready: {width}×{height}, stops after {timeout_s} s idle"
            return result(text, {"desktop_id": info.id} | info.model_dump(mode="json"))

    async def list_desktops(self) -> CallToolResult:
        """Every desktop of the service, with its status and screen size."""
        async with guarded(self.desktops):
            found = await self.desktops.call("GET", "/api/desktops")
            lines = [
                f"{d['id']} {d['status']} {d['screen']['width']}×{d['screen']['height']}"
                for d in found
            ]
            return result("\n".join(lines) or "no desktops", {"desktops": found})

    async def kill_desktop(self, desktop_id: DesktopId) -> CallToolResult:
        """Stop a desktop for good."""
        async with guarded(self.desktops, desktop_id):
            await self.desktops.call("DELETE", f"/api/desktops/{desktop_id}")
            await self.desktops.forget(desktop_id)
            return result(f"desktop {desktop_id} stopped", {"desktop_id": desktop_id})

    async def list_windows(self, desktop_id: DesktopId) -> CallToolResult:
        """The desktop's windows: id, title, application, geometry (screen pixels), focus."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            windows = [w.model_dump() for w in await entry.desktop.get_windows()]
            lines = [
                f"{w['id']} {w['app']!r} {w['title']!r}{' (focused)' if w['focused'] else ''}"
                for w in windows
            ]
            text = f"desktop {desktop_id}: " + ("\n".join(lines) or "no windows")
            return result(text, {"desktop_id": desktop_id, "windows": windows})

    async def window_action(
        self,
        desktop_id: DesktopId,
        window_id: int,
        action: Literal["activate", "close", "maximize", "minimize"],
    ) -> CallToolResult:
        """Activate (raise and focus), close, maximize or minimize a window."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            await entry.desktop.window(window_id, action)
            data = {"desktop_id": desktop_id, "window_id": window_id, "action": action}
            return result(f"desktop {desktop_id}: window {window_id} {action}d", data)

    async def accessibility_tree(
        self,
        desktop_id: DesktopId,
        app: str | None = None,
        format: Literal["text", "json"] = "text",
    ) -> CallToolResult:
        """The accessibility tree (roles, names, states; boxes in screen pixels) of every
        application, or of `app`: as compact text, or as JSON."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            tree = await entry.desktop.accessibility_tree(app)
            if format == "json":
                data = {"desktop_id": desktop_id} | tree.model_dump(mode="json")
                return result(f"desktop {desktop_id}: {tree.node_count} elements", data)
            text = a11y_text(tree, max_lines=400)
            data = {"desktop_id": desktop_id, "node_count": tree.node_count}
            return result(f"desktop {desktop_id}:\n{text}", data)

    async def exec_command(
        self,
        desktop_id: DesktopId,
        command: str,
        cwd: str | None = None,
        timeout_s: Annotated[float, Field(gt=0, le=3600)] = 60,
        stdin: str | None = None,
    ) -> CallToolResult:
        """Run a shell command inside the desktop; its exit code, stdout and stderr."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            ran = await entry.desktop.exec(command, cwd=cwd, timeout_s=timeout_s, stdin=stdin)
            status = "timed out" if ran.timed_out else f"exit code {ran.exit_code}"
            text = f"desktop {desktop_id}: {status}\n{cut(ran.stdout)}"
            if ran.stderr:
                text += f"\n[stderr]\n{cut(ran.stderr)}"
            data = {"desktop_id": desktop_id} | ran.model_dump()
            data["stdout"], data["stderr"] = cut(ran.stdout), cut(ran.stderr)
            return result(text, data)

    async def read_file(self, desktop_id: DesktopId, path: str) -> CallToolResult:
        """A file's text (UTF-8; paths under ~ and /tmp)."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            content = await entry.desktop.files.read(path)
            text = content.decode("utf-8", errors="replace")
            data = {"desktop_id": desktop_id, "path": path, "size": len(content)}
            return result(f"desktop {desktop_id}: {path} ({len(content)} bytes)\n{cut(text)}", data)

    async def write_file(self, desktop_id: DesktopId, path: str, content: str) -> CallToolResult:
        """Write text to a file (created with its directories, or replaced)."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            written = await entry.desktop.files.write(path, content)
            data = {"desktop_id": desktop_id} | written.model_dump(mode="json")
            return result(
                f"desktop {desktop_id}: wrote {written.size} bytes to {written.path}", data
            )

    async def list_files(self, desktop_id: DesktopId, path: str = "~") -> CallToolResult:
        """A directory's entries: name, type, size."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            entries = [e.model_dump(mode="json") for e in await entry.desktop.files.list(path)]
            lines = [f"{e['type']:4} {e['size']:>10} {e['name']}" for e in entries]
            text = f"desktop {desktop_id}: {path}\n" + ("\n".join(lines) or "(empty)")
            return result(text, {"desktop_id": desktop_id, "path": path, "entries": entries})

    async def launch(
        self, desktop_id: DesktopId, app: str, args: list[str] | None = None
    ) -> CallToolResult:
        """Start an application: terminal, editor (mousepad), files, browser, a desktop-file
        id or a program name."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            launched = await entry.desktop.launch(app, *(args or []))
            data = {"desktop_id": desktop_id} | launched.model_dump()
            return result(f"desktop {desktop_id}: started {app} (pid {launched.pid})", data)

    async def open(self, desktop_id: DesktopId, target: str) -> CallToolResult:
        """Open a file path or URL with its default application."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            launched = await entry.desktop.open(target)
            data = {"desktop_id": desktop_id} | launched.model_dump()
            return result(f"desktop {desktop_id}: opened {target} (pid {launched.pid})", data)

    async def get_clipboard(self, desktop_id: DesktopId) -> CallToolResult:
        """The clipboard's text."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            text = await entry.desktop.get_clipboard()
            return result(
                f"desktop {desktop_id} clipboard:\n{cut(text)}",
                {"desktop_id": desktop_id, "text": text},
            )

    async def set_clipboard(self, desktop_id: DesktopId, text: str) -> CallToolResult:
        """Put text on the clipboard."""
        async with guarded(self.desktops, desktop_id):
            entry = await self.desktops.get(desktop_id)
            await entry.desktop.set_clipboard(text)
            return result(f"desktop {desktop_id}: clipboard set", {"desktop_id": desktop_id})


TOOLS: list[Callable[..., Awaitable[CallToolResult]]] = [
    SystemTools.create_desktop,
    SystemTools.list_desktops,
    SystemTools.kill_desktop,
    SystemTools.list_windows,
    SystemTools.window_action,
    SystemTools.accessibility_tree,
    SystemTools.exec_command,
    SystemTools.read_file,
    SystemTools.write_file,
    SystemTools.list_files,
    SystemTools.launch,
    SystemTools.open,
    SystemTools.get_clipboard,
    SystemTools.set_clipboard,
]
"""The tools, in the order a client lists them."""
