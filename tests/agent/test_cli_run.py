"""`cubicle run` as users run it: a subprocess against the real service and the scripted
model; then the recorded run through `GET /api/runs`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import httpx

from tests.agent.fake_model import FakeModelServer, Turn
from tests.conftest import Service


def say(thought: str, **action) -> str:
    return json.dumps({"thought": thought, "action": action})


def _env(service: Service) -> dict[str, str]:
    """The environment of a user of `service`, with no model settings of its own."""
    env = {
        **os.environ,
        "CUBICLE_URL": service.url,
        "CUBICLE_TOKEN": service.token,
        "CUBICLE_DATA_DIR": str(service.data_dir),
        "XDG_CONFIG_HOME": str(service.data_dir / "no-config"),
    }
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "CUBICLE_PLANNER_MODEL", "CUBICLE_GROUNDER"):
        env.pop(name, None)
    return env


def cubicle_run(
    service: Service, *args: str, timeout_s: float = 180
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cubicle.cli", "run", *args],
        env=_env(service),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_a_run_prints_its_steps_and_ends_with_done(
    service: Service, api: httpx.Client, fake_model: FakeModelServer
):
    fake_model.script([
        say("Start the text editor.", type="launch", app="mousepad"),
        say("Open the File menu.", type="click", target="the File menu"),
        say("Close the menu.", type="key", keys="Escape"),
        say("Done.", type="done", summary="opened and closed the File menu"),
    ])  # fmt: skip
    done = cubicle_run(
        service, "Open the File menu of the text editor",
        "--model-url", fake_model.url, "--model", "fake-model", "--grounder", "a11y",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    head = re.fullmatch(r"run (\S+) on desktop (\w+) \(1280x800\)", lines[0])
    assert head is not None, done.stdout
    run_id, desktop_id = head.groups()
    assert lines[1] == "planner json:fake-model, grounder a11y"
    assert lines[2].startswith(f"watch live: {service.url}/view/{desktop_id}?token=")
    assert re.search(
        r"^\[1\] launch mousepad · \d+\.\d\d s \(model \d+\.\d\d s\)$", done.stdout, re.M
    )
    assert re.search(
        r'^\[2\] click "the File menu" → \(\d+, \d+\) a11y · \d+\.\d\d s', done.stdout, re.M
    )
    assert "    thought: Open the File menu." in lines
    assert lines[-2] == f"record: {service.data_dir / 'runs' / run_id} (GET /api/runs/{run_id})"
    assert lines[-1] == "done: opened and closed the File menu"

    run = api.get(f"/api/runs/{run_id}")
    assert run.status_code == 200, run.text
    body = run.json()
    assert body["run"]["status"] == "done" and body["run"]["desktop_id"] == desktop_id
    assert [step["outcome"] for step in body["steps"]] == ["acted", "acted", "acted", "done"]
    assert body["steps"][1]["grounded"][0]["source"] == "a11y"
    assert any(item["id"] == run_id for item in api.get("/api/runs").json())
    image = api.get(f"/api/runs/{run_id}/steps/2.png")
    assert image.status_code == 200 and image.content.startswith(b"\x89PNG")
    gone = api.get(f"/api/desktops/{desktop_id}")  # a fresh desktop goes away with the run
    assert gone.status_code == 404 and gone.json()["error"] == "desktop_not_found"


def test_a_failing_model_exits_1_with_the_reason(
    service: Service, fake_model: FakeModelServer, tmp_path
):
    config = tmp_path / "agent.toml"
    config.write_text(
        f'base_url = "{fake_model.url}"\nmax_retries = 1\nretry_backoff_s = 0.05\n'
        '[planner]\nmodel = "fake-model"\n[grounder]\nspec = "a11y"\n'
    )
    fake_model.script([Turn.error(500, "CUDA out of memory")] * 2)
    failed = cubicle_run(service, "anything", "--config", str(config), "--max-steps", "1")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "[1] no action · " in failed.stdout
    assert "    error: the planner model endpoint" in failed.stdout
    assert "answered HTTP 500 on all 2 attempts" in failed.stdout
    last = failed.stdout.splitlines()[-1]
    assert last == "failed: reached the limit of 1 steps before the task was done"


def test_missing_settings_are_reported_before_any_desktop_starts(
    service: Service, api: httpx.Client
):
    before = len(api.get("/api/desktops").json())
    missing = cubicle_run(service, "anything", "--model-url", "http://127.0.0.1:9/v1")
    assert missing.returncode == 1
    assert missing.stderr.startswith("cubicle: no planner model: pass --model")
    assert len(api.get("/api/desktops").json()) == before


def test_the_runs_api_refuses_what_it_cannot_serve(service: Service, api: httpx.Client):
    assert api.get("/api/runs/20990101-000000-abcdef").json()["error"] == "run_not_found"
    assert api.get("/api/runs/20990101-000000-abcdef").status_code == 404
    bad = api.get("/api/runs/..%2F..%2Ftoken")
    assert bad.status_code in (404, 422)
    assert api.get("/api/runs/not-a-run-id").status_code == 422
    assert api.get("/api/runs/20990101-000000-abcdef/steps/1.png").status_code == 404
    assert httpx.get(f"{service.url}/api/runs").status_code == 401


def test_ctrl_c_cancels_the_run_at_once(
    service: Service, api: httpx.Client, fake_model: FakeModelServer
):
    fake_model.script([say("Start the editor.", type="launch", app="mousepad"), Turn.hang(60)])
    process = subprocess.Popen(
        [sys.executable, "-m", "cubicle.cli", "run", "think for a long time",
         "--model-url", fake_model.url, "--model", "fake-model", "--grounder", "a11y"],
        env=_env(service), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        fake_model.wait_for_requests(2, timeout_s=120)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stdout + stderr
    assert stdout.splitlines()[-1] == "cancelled"
    run_id = stdout.split()[1]
    run = api.get(f"/api/runs/{run_id}").json()["run"]
    assert run["status"] == "cancelled" and run["steps"] == 1
    assert len(fake_model.requests) == 2
    # The loop left the desktop alone; the CLI then stops the fresh desktop it made.
    assert api.get(f"/api/desktops/{run['desktop_id']}").status_code == 404
