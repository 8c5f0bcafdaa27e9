"""`pip install cubicle` with no extras is the SDK and the CLI's client commands: it drives
a running service, and it brings nothing of the server along."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from bench._bare import make_bare_venv
from cubicle.server.launcher import ServiceProcess

DRIVE = textwrap.dedent(
    """
    import importlib.util, sys
    from cubicle import Desktop, NotFound

    with Desktop.create() as d:
        print("echo:", d.commands.run("echo bare client").stdout.strip())
        png = d.screenshot()
        print("png:", png[:8] == b"\\x89PNG\\r\\n\\x1a\\n", len(png) > 1000)
        d.left_click(10, 10)
    try:
        Desktop.connect("no-such-desktop").screenshot()
    except NotFound as exc:
        print("missing:", exc.code)
    print("server modules:", [m for m in ("fastapi", "uvicorn", "PIL", "aiortc")
                              if importlib.util.find_spec(m)])
    """
)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python, _ = make_bare_venv(tmp_path_factory.mktemp("bare"))
    return python


def test_the_bare_client_drives_a_desktop(bare_python: Path, service: ServiceProcess):
    env = {**os.environ, "CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token}
    done = subprocess.run(
        [str(bare_python), "-c", DRIVE], capture_output=True, text=True, env=env, timeout=180
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "echo: bare client",
        "png: True True",
        "missing: desktop_not_found",
        "server modules: []",
    ]


def test_the_bare_cli_lists_desktops_and_names_the_extra_it_lacks(
    bare_python: Path, service: ServiceProcess
):
    cli = bare_python.parent / "cubicle"
    env = {**os.environ, "CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token}
    listed = subprocess.run([str(cli), "desktop", "ls"], capture_output=True, text=True, env=env)
    assert listed.returncode == 0, listed.stderr
    serve = subprocess.run([str(cli), "serve"], capture_output=True, text=True, env=env)
    assert serve.returncode == 2
    assert "pip install 'cubicle[server]'" in serve.stderr
