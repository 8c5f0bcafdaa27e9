"""What a desktop cannot reach: the host's files, other desktops, host processes, the network,
and what one desktop's runaway processes cannot take from the others."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from tests.conftest import create_desktop


def _run(api, desktop_id: str, command: str, timeout_s: float = 30) -> dict:
    response = api.post(
        f"/api/desktops/{desktop_id}/exec", json={"command": command, "timeout_s": timeout_s}
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def second(api):
    info = create_desktop(api, memory_mb=512, max_pids=256)
    yield info
    api.delete(f"/api/desktops/{info['id']}")


def test_host_files_are_invisible(api, desktop, service, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("do not read")
    os.chmod(tmp_path, 0o755)
    checks = [
        f"cat {secret}",
        "ls /root",
        f"ls {service.data_dir}",
        "cat /etc/shadow",
        f"ls {os.getcwd()}/tests",
    ]
    for command in checks:
        result = _run(api, desktop["id"], command)
        assert result["exit_code"] != 0, command
        assert "No such file or directory" in result["stderr"], command
    top = _run(api, desktop["id"], "ls /")["stdout"].split()
    assert "root" not in top and "srv" not in top and "opt" not in top


def test_other_desktops_homes_are_invisible(api, desktop, second):
    _run(api, second["id"], "echo mine > ~/only-in-second.txt")
    found = _run(api, desktop["id"], "find / -name only-in-second.txt -xdev 2>/dev/null")
    assert found["stdout"] == ""
    assert _run(api, second["id"], "cat ~/only-in-second.txt")["stdout"] == "mine\n"


def test_host_processes_are_invisible(api, desktop):
    result = _run(api, desktop["id"], "ps -eo pid,comm --no-headers")
    commands = [line.split(None, 1)[1] for line in result["stdout"].splitlines()]
    assert "Xvfb" in commands
    assert not {"pytest", "cubicle", "process_api", "systemd"} & set(commands)
    assert len(commands) < 40
    assert str(os.getpid()) not in result["stdout"].split()


def test_no_network_without_network_flag(api, desktop):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    try:
        probe = (
            'python3 -c "import socket,sys\n'
            f"for host in ['127.0.0.1', '10.0.2.2', '1.1.1.1']:\n"
            "    s = socket.socket(); s.settimeout(2)\n"
            f"    try: s.connect((host, {port})); print('connected', host)\n"
            "    except OSError as e: print('refused', host, e.errno)\n\""
        )
        result = _run(api, desktop["id"], probe)
        assert "connected" not in result["stdout"], result
        assert result["stdout"].count("refused") == 3
        interfaces = _run(api, desktop["id"], "cat /proc/net/dev")["stdout"]
        assert "lo:" in interfaces and "eth0" not in interfaces and "tap0" not in interfaces
        assert accepted == []
    finally:
        server.close()


def test_network_flag_gives_a_user_mode_network(api):
    info = create_desktop(api, network=True)
    try:
        interfaces = _run(api, info["id"], "cat /proc/net/route /proc/net/dev")["stdout"]
        assert "tap0" in interfaces
        assert "10.0.2.3" in _run(api, info["id"], "cat /etc/resolv.conf")["stdout"]
    finally:
        api.delete(f"/api/desktops/{info['id']}")


def test_fork_bomb_is_contained(api, desktop, second):
    bomb = _run(api, second["id"], "bomb() { bomb | bomb & }; bomb; sleep 3", timeout_s=8)
    # It did explode: forks failed at the desktop's process limit (or it ran into its timeout).
    assert bomb["timed_out"] or "fork" in bomb["stderr"].lower(), bomb
    # The bomb's desktop recovers: its processes are gone and new commands start.
    assert _run(api, second["id"], "echo recovered")["stdout"] == "recovered\n"
    # The service and the other desktop carry on.
    assert _run(api, desktop["id"], "echo alive")["stdout"] == "alive\n"
    assert api.get(f"/api/desktops/{desktop['id']}/screenshot").status_code == 200
    assert api.get("/api/desktops").status_code == 200


def test_memory_hog_is_contained(api, desktop, second):
    hog = _run(
        api,
        second["id"],
        'python3 -c "chunks = []\nwhile True: chunks.append(bytearray(64 << 20))"',
        timeout_s=60,
    )
    assert hog["exit_code"] != 0
    assert _run(api, desktop["id"], "echo alive")["stdout"] == "alive\n"
    assert api.get(f"/api/desktops/{desktop['id']}/screenshot").status_code == 200


def test_commands_hold_no_descriptor_of_the_guest(api, desktop):
    """Only stdin, stdout and stderr: not the guest's status pipe to the host, nor its log."""
    fds = _run(api, desktop["id"], "ls /proc/self/fd")["stdout"].split()
    assert sorted(fds, key=int) == ["0", "1", "2", "3"]  # 3 is ls reading the directory
    background = _run(api, desktop["id"], "sleep 30 > /dev/null 2>&1 & echo started", 10)
    assert background["stdout"] == "started\n" and not background["timed_out"]
