"""The guest is a room of its own: it runs without the control plane's code.

A guest daemon runs inside a sandbox, a microVM or on another host, where the control
plane's modules need not exist. A fresh interpreter imports every guest module with those
modules made unimportable, and with the host side of `streaming`, the agent and FastAPI
refused too: reaching any of them fails the import.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import desktop.guest

GUEST = Path(desktop.guest.__file__).parent

REFUSED = [
    "agent",
    "desktop.sdk",
    "desktop.models",
    "desktop.manager",
    "desktop.app",
    "desktop.api",
    "desktop.cli",
    "desktop.runtime",
    "desktop.services",
    "desktop.settings",
    "desktop.events",
    "desktop.guest_client",
    "desktop._http1",
    "streaming.api",
    "streaming.control",
    "streaming.guest_source",
    "streaming.hub",
    "streaming.keys",
    "streaming.live",
    "streaming.mjpeg",
    "streaming.recording",
    "streaming.webrtc",
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
    modules = ["desktop.guest"] + [
        f"desktop.guest.{path.stem}"
        for path in sorted(GUEST.glob("*.py"))
        if path.stem not in ("__init__", "__main__")
    ]
    assert "desktop.guest.daemon" in modules and "desktop.guest.app" in modules
    probe = _PROBE.format(refused=REFUSED, modules=modules)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"imported {len(modules)}"


def test_the_probe_catches_a_guest_that_reaches_the_control_plane():
    probe = _PROBE.format(refused=REFUSED, modules=["desktop.guest.app", "desktop.sdk"])
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode != 0
    assert "the guest reached desktop.sdk" in done.stderr
