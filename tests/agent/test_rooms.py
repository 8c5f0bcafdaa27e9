"""The agent is a client of the service like any program: it reaches it through the SDK.

Every call the agent's code makes to the service (the board's runner, `cubicle eval`, the
OSWorld provider) goes through the SDK's one request path, whose failures are
`CubicleError`s; a module of `agent/` that imported httpx itself would open a second door
with foreign exceptions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cubicle

pytestmark = pytest.mark.fast

PACKAGE = Path(cubicle.__file__).parent
AGENT_SIDE = ["agent", "evals", "server/board", "server/evals"]
"""The agent, the suites' reader and checker, and the rooms that run them in the service."""


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_agent_module_imports_httpx():
    modules = sorted(path for side in AGENT_SIDE for path in (PACKAGE / side).rglob("*.py"))
    assert len(modules) > 50  # the whole of each was read
    reaching = [
        str(path.relative_to(PACKAGE))
        for path in modules
        if any(name == "httpx" or name.startswith("httpx.") for name in _imported(path))
    ]
    assert reaching == []


def test_the_check_sees_an_httpx_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from httpx import AsyncClient\n")
    assert "httpx" in _imported(sample)
