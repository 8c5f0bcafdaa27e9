"""Every MCP tool class lists each of its public methods as a tool, once."""

from __future__ import annotations

import inspect

import pytest

from cubicle.mcp import board_tools, code_tools, input_tools, system_tools
from cubicle.mcp.server import build_server
from cubicle.mcp.session import Connection, Desktops

pytestmark = pytest.mark.fast

MODULES = [
    (system_tools, system_tools.SystemTools),
    (input_tools, input_tools.InputTools),
    (board_tools, board_tools.BoardTools),
    (code_tools, code_tools.CodeTools),
]


@pytest.mark.parametrize(("module", "cls"), MODULES, ids=lambda m: getattr(m, "__name__", ""))
def test_each_public_method_is_a_listed_tool(module, cls):
    methods = {
        name
        for name, member in inspect.getmembers(cls, inspect.iscoroutinefunction)
        if not name.startswith("_")
    }
    listed = [tool.__name__ for tool in module.TOOLS]
    assert sorted(listed) == sorted(methods) and len(set(listed)) == len(listed)


async def test_the_server_lists_every_tool_with_its_description():
    server = build_server(Desktops(Connection("http://127.0.0.1:9", None)))
    tools = await server.list_tools()
    expected = [tool.__name__ for module, _ in MODULES for tool in module.TOOLS]
    assert [tool.name for tool in tools] == expected
    for tool in tools:
        assert tool.description and "self" not in tool.input_schema.get("properties", {})
