"""README's cluster section, run as printed: `ray start` a head and two workers on this
machine, `cubicle serve` pointed at them, and `cubicle desktop create` twice gives a desktop
on each worker. `ray stop`, as the README says, ends it all."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import start_service, stop_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def snippet(name: str) -> str:
    readme = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- snippet: {name} -->\n```\w+\n(.*?)```", readme, re.S)
    assert found, f"no snippet {name!r} in README.md"
    return found.group(1)


def cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(ROOT / ".venv/bin/cubicle"), *args],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_readme_cluster_gives_a_desktop_on_each_worker():
    *cluster, serve = snippet("ray-cluster").strip().splitlines()
    *settings, program, command = shlex.split(serve)
    assert (program, command) == ("cubicle", "serve")
    try:
        started = subprocess.run(
            ["bash", "-ec", "\n".join(cluster)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert started.returncode == 0, started.stderr[-2000:]
        env = dict(setting.split("=", 1) for setting in settings)
        service = start_service(**env, CUBICLE_WARM_POOL="0")
        try:
            client = {"CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token}
            ids = [cli("desktop", "create", env=client).strip() for _ in range(2)]
            listed = cli("desktop", "ls", env=client)
            nodes = set(re.findall(r"ready .* node \S+ (\w{12})", listed))
            assert len(nodes) == 2, listed  # the head offers none: one on each worker
            for desktop_id in ids:
                assert (
                    cli("desktop", "kill", desktop_id, env=client).strip() == f"killed {desktop_id}"
                )
        finally:
            with service.client() as api:  # the ray runtime's desktops outlive the service
                for desktop in api.get("/api/desktops").json():
                    api.delete(f"/api/desktops/{desktop['id']}")
            stop_service(service)
    finally:
        subprocess.run(
            ["bash", "-c", f"{cluster[0]}\nray stop"], cwd=ROOT, capture_output=True, timeout=120
        )
