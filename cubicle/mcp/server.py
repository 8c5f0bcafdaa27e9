"""Cubicle as an MCP server (the official `mcp` SDK): desktops, screenshots, input, windows,
the accessibility tree, commands, files, the clipboard and the task board, as tools.

    cubicle mcp                         stdio, for apps that launch a command (Claude Desktop)
    POST/GET /mcp on the service        streamable HTTP, behind the service's token

Both reach the desktops through the REST API, as the SDK does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer

from cubicle.mcp import board_tools, code_tools, input_tools, system_tools
from cubicle.mcp.board_tools import BoardTools
from cubicle.mcp.code_tools import CodeTools
from cubicle.mcp.input_tools import InputTools
from cubicle.mcp.session import Connection, Desktops
from cubicle.mcp.system_tools import SystemTools

INSTRUCTIONS = """\
Cubicle gives you Linux desktops (XFCE) to operate. create_desktop gives a desktop id; pass \
it to every other tool. Take a screenshot to see the screen (pick max_width/max_height to \
get a smaller image): x and y of click, move, drag and scroll are pixels of the last \
screenshot of that desktop. accessibility_tree lists on-screen elements with their names; \
exec_command runs shell commands; add_task hands a whole task to the built-in agent."""


def build_server(desktops: Desktops) -> MCPServer:
    """An MCP server whose tools act through `desktops` (the caller stops it)."""
    server = MCPServer("cubicle", instructions=INSTRUCTIONS, version="0.1.0", log_level="WARNING")
    handlers: list[tuple[object, Sequence[Callable[..., Any]]]] = [
        (SystemTools(desktops), system_tools.TOOLS),
        (InputTools(desktops), input_tools.TOOLS),
        (BoardTools(desktops), board_tools.TOOLS),
        (CodeTools(desktops), code_tools.TOOLS),
    ]
    for instance, tools in handlers:
        for tool in tools:  # each tool a method, bound to the instance that holds `desktops`
            server.tool()(getattr(instance, tool.__name__))
    return server


async def serve_stdio(connection: Connection) -> None:
    """Serve MCP on stdin/stdout until the client closes it."""
    desktops = Desktops(connection)
    try:
        await build_server(desktops).run_stdio_async()
    finally:
        await desktops.stop()
