"""The folders of `cubicle` are the processes its code runs in, and the imports say so.

`cubicle.guest` runs inside a sandbox (a namespace, a microVM, another host), where the
service's code need not exist: a fresh interpreter imports every guest module with the rest
of the package, FastAPI and httpx made unimportable. `cubicle.protocol` is what both sides
speak and imports nothing else of Cubicle. The client side (the SDK, the vendors' tools, MCP,
the agent, the suites' reader) reaches the service only over its API: it imports nothing of
`cubicle.server`, so `pip install cubicle` without the server's extra works.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import cubicle

pytestmark = pytest.mark.fast

PACKAGE = Path(cubicle.__file__).parent
GUEST = PACKAGE / "guest"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


REFUSED = [
    "cubicle.server",
    "cubicle.client",
    "cubicle.agent",
    "cubicle.mcp",
    "cubicle.tools",
    "cubicle.evals",
    "cubicle.cli",
    "cubicle.protocol.service",
    "aiortc",
    "fastapi",
    "httpx",
]

_PROBE = """
import importlib, importlib.abc, sys
refused = {refused!r}

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == r or name.startswith(r + ".") for r in refused):
            raise ImportError(f"the guest reached {{name}}")
        return None

sys.meta_path.insert(0, Refuse())
for module in {modules!r}:
    importlib.import_module(module)
print("imported", len({modules!r}))
"""


def test_every_guest_module_imports_without_the_control_plane():
    modules = [_module(path) for path in sorted(GUEST.rglob("*.py")) if path.stem != "__main__"]
    assert "cubicle.guest.daemon" in modules and "cubicle.guest.video.encoder" in modules
    probe = _PROBE.format(refused=REFUSED, modules=modules)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"imported {len(modules)}"


def test_the_probe_catches_a_guest_that_reaches_the_control_plane():
    probe = _PROBE.format(refused=REFUSED, modules=["cubicle.guest.app", "cubicle.client.sdk"])
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode != 0
    assert "the guest reached cubicle.client" in done.stderr


CLIENT_SIDE = ["client", "tools", "mcp", "agent", "evals", "cli.py", "__init__.py"]


def _cubicle_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "cubicle" or n.startswith("cubicle.")}


def _files(*names: str) -> list[Path]:
    found: list[Path] = []
    for name in names:
        path = PACKAGE / name
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    assert found
    return found


def test_the_protocol_imports_nothing_else_of_cubicle():
    for path in _files("protocol"):
        bad = {n for n in _cubicle_imports(path) if not n.startswith("cubicle.protocol")}
        assert not bad, f"{path} imports {bad}"


def test_the_client_side_never_imports_the_server_or_the_guest():
    for path in _files(*CLIENT_SIDE):
        bad = {
            n for n in _cubicle_imports(path) if n.startswith(("cubicle.server", "cubicle.guest"))
        }
        # `cubicle serve` and `cubicle mcp` load the server lazily, inside their commands.
        if path.name == "cli.py":
            continue
        assert not bad, f"{path} imports {bad}"


def test_the_check_sees_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cubicle.server.manager import SandboxManager\n")
    assert _cubicle_imports(bad) == {"cubicle.server.manager"}


def test_cubicle_is_the_only_top_level_package():
    found = sorted(
        p.name
        for p in PACKAGE.parent.iterdir()
        if (p / "__init__.py").is_file() and p.name != "tests"
    )
    assert found == ["bench", "cubicle"]
