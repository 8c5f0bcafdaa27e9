"""Programs run in the background inside a desktop, through the exec API.

A program started here runs in its own session, so the exec call returns at once and its
timeout does not kill it; its output goes to `$XDG_RUNTIME_DIR/<name>.log`. That directory
lives on the desktop's disk, mounted on the host at `<data_dir>/desktops/<id>/disk/run`,
so the log, and any Unix socket the program makes there, are reachable from the host.
Whatever is left when the desktop is killed goes with it (the service kills its cgroup).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench._service import Service, desktop_pids

GUEST_RUN = "/run/user/1000"


@dataclass(frozen=True)
class InsideProcess:
    """A background program in a desktop."""

    desktop_id: str
    name: str
    pid: int
    """In the sandbox's pid namespace."""
    host_pid: int
    """The same process as the host sees it."""
    argv: tuple[str, ...]


def run_dir(service: Service, desktop_id: str) -> Path:
    """The host directory that is `GUEST_RUN` inside the desktop."""
    return service.data_dir / "desktops" / desktop_id / "disk" / "run"


def guest_socket(service: Service, desktop_id: str) -> Path:
    """The guest daemon's socket on the host (made by the runtime, outside the sandbox)."""
    return service.data_dir / "desktops" / desktop_id / "guest.sock"


def exec_command(
    service: Service, desktop_id: str, command: str | list[str], timeout_s: float = 30
) -> str:
    """Run a command (a shell line or an argv) in the desktop; its stdout. Raises unless it
    exits with 0."""
    response = service.client.post(
        f"/api/desktops/{desktop_id}/exec", json={"command": command, "timeout_s": timeout_s}
    )
    response.raise_for_status()
    result = response.json()
    if result["exit_code"] != 0:
        raise RuntimeError(f"`{command}` in the desktop failed: {result}")
    return result["stdout"]


def write_file(service: Service, desktop_id: str, path: str, content: bytes) -> None:
    response = service.client.put(
        f"/api/desktops/{desktop_id}/files", params={"path": path}, content=content
    )
    response.raise_for_status()


def _host_pid(desktop_id: str, pid: int) -> int | None:
    """The host pid of the desktop's process `pid` (its last `NSpid` is the sandbox's)."""
    for host_pid in desktop_pids(desktop_id):
        try:
            status = Path(f"/proc/{host_pid}/status").read_text()
        except FileNotFoundError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and int(line.split()[-1]) == pid:
                return host_pid
    return None


_LAUNCHER = """
import subprocess, sys
log, argv = sys.argv[1], sys.argv[2:]
with open(log, "ab") as out:
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             start_new_session=True, close_fds=True)
print(child.pid)
"""
"""Starts a program in its own session with no inherited descriptor but its log, and
returns at once. (`setsid -f cmd > log 2>&1 &` is not enough: exec'd commands inherit
descriptors of the guest daemon, among them copies of their own stdout and stderr, so
exec would wait for the background program to end.)"""


def start(service: Service, desktop_id: str, name: str, argv: list[str]) -> InsideProcess:
    """Start `argv` in the background in the desktop; returns once it runs."""
    log = f"{GUEST_RUN}/{name}.log"
    launch = [sys.executable, "-c", _LAUNCHER, log, *argv]
    pid = int(exec_command(service, desktop_id, launch).strip())
    deadline = time.monotonic() + 10
    while (host_pid := _host_pid(desktop_id, pid)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{name} is not running in the desktop: {log_tail(service, desktop_id, name)}"
            )
        time.sleep(0.05)
    return InsideProcess(desktop_id, name, pid, host_pid, tuple(argv))


def log_tail(service: Service, desktop_id: str, name: str, lines: int = 10) -> str:
    path = run_dir(service, desktop_id) / f"{name}.log"
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def alive(process: InsideProcess) -> bool:
    return process.host_pid in desktop_pids(process.desktop_id)


def stop(service: Service, process: InsideProcess, timeout_s: float = 5) -> None:
    """SIGTERM the program (by its pid) and wait until it is gone; SIGKILL if it lingers."""
    if not alive(process):
        return
    exec_command(service, process.desktop_id, f"kill {process.pid} 2>/dev/null || true")
    deadline = time.monotonic() + timeout_s
    while alive(process):
        if time.monotonic() > deadline:
            exec_command(service, process.desktop_id, f"kill -9 {process.pid} 2>/dev/null || true")
            break
        time.sleep(0.05)
