"""E2B's own SDKs, unmodified, against a Cubicle service (issue "Speak E2B").

The three variables are the contract (`E2B_API_URL`, `E2B_SANDBOX_URL`: the service;
`E2B_API_KEY`: its token). Everything below is the released `e2b` and
`e2b-code-interpreter` packages talking to a real service and real desktops: the control
plane, envd's processes and files over Connect RPC, a port reached as E2B reaches it, and
the code interpreter on port 49999.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    NotFoundException,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b_code_interpreter import Sandbox as CodeSandbox


@pytest.fixture(scope="module")
def sandbox(e2b_env) -> Iterator[Sandbox]:
    sbx = Sandbox.create(envs={"GREETING": "hello"}, metadata={"suite": "e2b-sdk"}, timeout=300)
    try:
        yield sbx
    finally:
        sbx.kill()


def test_commands_run_as_on_e2b(sandbox):
    done = sandbox.commands.run("echo $GREETING from $(whoami) in $(pwd); echo oops >&2")
    assert (done.stdout, done.stderr, done.exit_code) == (
        "hello from user in /home/user\n",
        "oops\n",
        0,
    )
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "partial\n"
    moved = sandbox.commands.run("pwd; echo $X $GREETING", cwd="/tmp", envs={"X": "y"})
    assert moved.stdout == "/tmp\ny hello\n"
    pieces: list[str] = []
    started = time.monotonic()
    sandbox.commands.run("for i in 1 2 3; do echo $i; sleep 0.3; done", on_stdout=pieces.append)
    assert "".join(pieces) == "1\n2\n3\n" and len(pieces) >= 2  # as they came, not at the end
    assert time.monotonic() - started >= 0.6
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30", timeout=1)


def test_a_background_command_is_listed_and_killed(sandbox):
    handle = sandbox.commands.run("sleep 120", background=True)
    assert handle.pid in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(handle.pid)
    with pytest.raises(CommandExitException):
        handle.wait()
    deadline = time.monotonic() + 10
    while handle.pid in [p.pid for p in sandbox.commands.list()]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert sandbox.commands.run("pgrep -x sleep || echo none").stdout == "none\n"


def test_files_as_on_e2b(sandbox):
    info = sandbox.files.write("notes/a.txt", "first line\n")  # relative: the user's home
    assert info.path == "/home/user/notes/a.txt"
    assert sandbox.files.read("/home/user/notes/a.txt") == "first line\n"
    sandbox.files.write("/tmp/blob.bin", b"\x00\xff" * 1000)
    assert sandbox.files.read("/tmp/blob.bin", format="bytes") == b"\x00\xff" * 1000
    assert sandbox.files.exists("/tmp/blob.bin") and not sandbox.files.exists("/tmp/nothing")
    assert sandbox.files.make_dir("/tmp/made/deep")
    assert not sandbox.files.make_dir("/tmp/made/deep")  # already there
    listed = {entry.name: entry for entry in sandbox.files.list("/home/user/notes")}
    assert listed["a.txt"].size == len("first line\n") and listed["a.txt"].type.value == "file"
    moved = sandbox.files.rename("/home/user/notes/a.txt", "/tmp/made/b.txt")
    assert moved.path == "/tmp/made/b.txt" and sandbox.files.get_info("/tmp/made/b.txt").size == 11
    sandbox.files.remove("/tmp/made")
    assert not sandbox.files.exists("/tmp/made/b.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.read("/tmp/made/b.txt")
    # the desktop's own commands see what the SDK wrote
    assert sandbox.commands.run("wc -c < /tmp/blob.bin").stdout == "2000\n"


def test_the_control_plane_lists_extends_and_reconnects(sandbox, service):
    found = Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b-sdk"})).next_items()
    assert [s.sandbox_id for s in found] == [sandbox.sandbox_id]
    assert Sandbox.list(query=SandboxQuery(metadata={"suite": "other"})).next_items() == []
    info = sandbox.get_info()
    assert info.metadata == {"suite": "e2b-sdk"} and info.template_id == "base"
    sandbox.set_timeout(600)
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.commands.run("echo $GREETING").stdout == "hello\n"
    # the same desktop, seen through Cubicle's own API
    desktop = httpx.get(
        f"{service.url}/api/desktops/{sandbox.sandbox_id}",
        headers={"Authorization": f"Bearer {service.token}"},
    )
    assert desktop.status_code == 200 and desktop.json()["status"] == "ready"


def test_a_port_is_reached_as_e2b_reaches_it(sandbox, service):
    sandbox.files.write("/tmp/site/index.html", "<h1>from the sandbox</h1>")
    sandbox.commands.run("cd /tmp/site && python3 -m http.server 3000", background=True)
    host = sandbox.get_host(3000)
    assert host == f"3000-{sandbox.sandbox_id}.{sandbox.sandbox_domain}"
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "3000"}
    assert httpx.get(service.url, headers=headers).status_code == 401  # ports are private
    headers["E2B-Traffic-Access-Token"] = sandbox.traffic_access_token or ""
    deadline = time.monotonic() + 20
    while (answer := httpx.get(service.url, headers=headers)).status_code != 200:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.2)
    assert "from the sandbox" in answer.text


def test_the_code_interpreter_keeps_state_and_draws(e2b_env):
    with CodeSandbox.create() as sbx:
        assert sbx.run_code("x = 41").error is None
        assert sbx.run_code("x + 1").text == "42"
        chart = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        assert chart.results and chart.results[0].png
        failed = sbx.run_code("1 / 0")
        assert failed.error is not None and failed.error.name == "ZeroDivisionError"
        context = sbx.create_code_context(cwd="/tmp")
        assert sbx.run_code("import os; os.getcwd()", context=context).text == "'/tmp'"
        assert sbx.commands.run("echo shell too").stdout == "shell too\n"


def test_the_async_sdk_works_too(e2b_env):
    async def main() -> tuple[str, bool]:
        sbx = await AsyncSandbox.create()
        try:
            done = await sbx.commands.run("echo async")
            await sbx.files.write("/tmp/x", "y")
            return done.stdout + await sbx.files.read("/tmp/x"), await sbx.is_running()
        finally:
            await sbx.kill()

    assert asyncio.run(main()) == ("async\ny", True)


def test_a_sandbox_token_opens_its_own_sandbox_only(sandbox, e2b_env, service):
    token = sandbox.traffic_access_token or ""
    other = Sandbox.create(timeout=60)
    try:
        for port in ("49983", "49999", "3000"):
            headers = {"E2b-Sandbox-Id": other.sandbox_id, "E2b-Sandbox-Port": port}
            path = "/contexts" if port == "49999" else "/envs"
            refused = httpx.get(
                f"{service.url}{path}", headers={**headers, "X-Access-Token": token}
            )
            assert refused.status_code == 401, (port, refused.text)
        own = {
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "E2b-Sandbox-Port": "49999",
            "X-Access-Token": token,
        }
        for path in ("/../../api/secrets", "/contexts/../../../api/desktops", "/nothing"):
            escaped = httpx.get(f"{service.url}{path}", headers=own)
            assert escaped.status_code == 404, (path, escaped.text)
        assert (
            httpx.get(f"{service.url}/api/desktops", headers={"X-Access-Token": token}).status_code
            == 401
        )
    finally:
        other.kill()


def test_pause_and_connect_resume_where_it_stopped(e2b_env, service):
    sbx = Sandbox.create(timeout=120, metadata={"suite": "pause"})
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        sbx.commands.run(
            "sh -c 'n=0; while :; do n=$((n+1)); echo $n > /tmp/n; sleep 0.2; done'",
            background=True,
        )
        time.sleep(0.5)
        assert sbx.pause() is True
        assert sbx.pause() is False  # paused already: E2B's 409
        paused = Sandbox.list(
            query=SandboxQuery(metadata={"suite": "pause"}, state=[SandboxState.PAUSED])
        )
        assert [s.sandbox_id for s in paused.next_items()] == [sbx.sandbox_id]
        assert sbx.get_info().state.value == "paused"
        with pytest.raises(SandboxException):  # E2B's SDK words a 502 as "not found"
            sbx.commands.run("true")
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
        envd = httpx.get(f"{service.url}/health", headers=headers)
        assert envd.status_code == 502 and "is paused" in envd.text
        again = Sandbox.connect(sbx.sandbox_id)  # resumes it
        assert again.get_info().state.value == "running"
        assert again.files.read("/home/user/kept.txt") == "kept"
        first = int(again.commands.run("cat /tmp/n").stdout)
        time.sleep(0.5)
        assert int(again.commands.run("cat /tmp/n").stdout) > first  # the loop runs on
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_filesystem_pause_keeps_files_and_boots_again_on_connect(e2b_env):
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/kept.txt", "kept on disk")
        sbx.commands.run("sleep 600", background=True)
        assert sbx.pause(mode="filesystem") is True
        assert sbx.get_info().state.value == "paused"
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.files.read("/home/user/kept.txt") == "kept on disk"
        assert again.commands.run("pgrep -x sleep || echo none").stdout == "none\n"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_sandbox_pauses_on_timeout_and_resumes_when_used(e2b_env):
    sbx = Sandbox.create(timeout=10, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sbx.files.write("/home/user/kept.txt", "kept")
        deadline = time.monotonic() + 40
        while sbx.get_info().state.value != "paused":
            assert time.monotonic() < deadline, "the sandbox did not pause at its timeout"
            time.sleep(0.5)
        assert sbx.commands.run("cat ~/kept.txt").stdout == "kept"  # envd's call resumes it
        assert sbx.get_info().state.value == "running"
    finally:
        Sandbox.kill(sbx.sandbox_id)


def test_a_snapshot_through_e2b_starts_sandboxes_with_its_files(e2b_env):
    """A local sandbox's snapshot keeps its filesystem (E2B's `mode="filesystem"`): made,
    listed page by page, started from by its id, deleted; a full (memory) snapshot of a
    local sandbox is refused by name, never faked."""
    sbx = Sandbox.create(timeout=120)
    made: list[Sandbox] = []
    try:
        sbx.files.write("/home/user/kept.txt", "in the snapshot")
        with pytest.raises(SandboxException, match="filesystem only"):
            sbx.create_snapshot()  # E2B's default: memory too
        first = sbx.create_snapshot(name="e2b-snap-a", mode="filesystem")
        second = Sandbox.create_snapshot(sbx.sandbox_id, mode="filesystem")
        assert first.snapshot_id == "e2b-snap-a" and first.names == ["e2b-snap-a"]
        pages = sbx.list_snapshots(limit=1)
        listed = pages.next_items()
        assert len(listed) == 1 and pages.has_next
        listed += pages.next_items()
        assert {s.snapshot_id for s in listed} == {first.snapshot_id, second.snapshot_id}
        assert [s.snapshot_id for s in Sandbox.list_snapshots(name="e2b-snap-a").next_items()] == [
            "e2b-snap-a"
        ]
        child = Sandbox.create(first.snapshot_id, timeout=120)
        made.append(child)
        assert child.files.read("/home/user/kept.txt") == "in the snapshot"
        assert child.get_info().template_id == "e2b-snap-a"
        sbx.files.write("/home/user/kept.txt", "changed after")
        assert child.files.read("/home/user/kept.txt") == "in the snapshot"
        assert Sandbox.delete_snapshot(first.snapshot_id) is True
        assert Sandbox.delete_snapshot(first.snapshot_id) is False
        assert Sandbox.delete_snapshot(second.snapshot_id) is True
        assert child.files.read("/home/user/kept.txt") == "in the snapshot"  # its own copy
    finally:
        for each in [sbx, *made]:
            Sandbox.kill(each.sandbox_id)


def test_what_cubicle_cannot_do_is_refused_by_name(e2b_env, service):
    with pytest.raises(SandboxException, match="custom templates"):
        Sandbox.create(template="my-own-template")
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-the-token")
    sbx = Sandbox.create(timeout=60)
    try:
        with pytest.raises(SandboxException, match="fork their disk only"):
            sbx.fork(count=1)
    finally:
        assert Sandbox.kill(sbx.sandbox_id)
    assert not Sandbox.kill(sbx.sandbox_id)  # gone: E2B's answer is False
    assert not sbx.is_running()
    headers = {"E2b-Sandbox-Id": "nosuchsandbox", "E2b-Sandbox-Port": "49983"}
    gone = httpx.get(f"{service.url}/health", headers=headers)
    assert gone.status_code == 502 and "was not found" in gone.text
    assert httpx.get(f"{service.url}/healthz").status_code == 200


def test_cubicle_e2b_env_prints_what_the_sdks_read(service):
    """The user's path: `eval "$(cubicle e2b env)"`, then an unmodified E2B program."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env |= {"CUBICLE_URL": service.url, "CUBICLE_TOKEN": service.token}
    cli = f"{shlex.quote(sys.executable)} -m cubicle.cli e2b env"
    program = (
        "from e2b import Sandbox\n"
        "sbx = Sandbox.create()\n"
        "print(sbx.commands.run('echo through the exports').stdout, end='')\n"
        "sbx.kill()\n"
    )
    script = f'eval "$({cli})" && {shlex.quote(sys.executable)} -c {shlex.quote(program)}'
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "through the exports\n"


JS = Path(__file__).resolve().parents[1] / "e2b_js"


def test_the_javascript_sdk_runs_its_quickstart(service):
    """npm's `e2b` (pinned in tests/e2b_js/package.json), under Node, unmodified."""
    assert (JS / "node_modules" / "e2b").is_dir(), "scripts/bootstrap.sh test installs it"
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env |= {
        "E2B_API_URL": service.url,
        "E2B_SANDBOX_URL": service.url,
        "E2B_API_KEY": service.token,
    }
    done = subprocess.run(
        ["node", "sandbox.mjs"], cwd=JS, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["stdout"] == "hello from user in /home/user\n"
    assert seen["streamed"] == "1\n2\n3\n" and seen["exitCode"] == 4
    assert seen["text"] == "written by node" and seen["listed"] == ["note.txt"]
    assert seen["found"] == [seen["id"]]
    assert seen["host"] == f"3000-{seen['id']}.cubicle.localhost:{service.url.rsplit(':', 1)[1]}"
