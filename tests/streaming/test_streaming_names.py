"""`streaming`'s two sides: the guest's side loads nothing of the host's."""

import ast
import subprocess
import sys


def test_the_guest_side_does_not_import_the_host_side():
    code = (
        "import sys, streaming.source, streaming.capture, streaming.encoder, streaming.frames; "
        "print(sorted(m for m in sys.modules if m.startswith(('aiortc', 'streaming.', 'desktop'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.strip()
    assert "aiortc" not in loaded and "streaming.hub" not in loaded, loaded
    desktop_modules = [m for m in ast.literal_eval(loaded) if m.startswith("desktop")]
    assert all(m == "desktop" or m.startswith("desktop.protocol") for m in desktop_modules)
