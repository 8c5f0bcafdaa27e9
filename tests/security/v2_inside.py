"""Runs inside the cgroup v2 test's QEMU guest, as its init's payload (standard library only).

The guest boots Debian's cloud kernel with the unified hierarchy mounted at
/sys/fs/cgroup and nothing else. This script plays the service twice, with the real
`cubicle/server/runtime/cgroups.py` (copied next to it):

1. as root in a cgroup of its own (`cubicle.service`, as a systemd unit would have it);
2. as an ordinary user (uid 1000) in a cgroup delegated to it (`user.delegate`: the
   directory and its `cgroup.procs`, `cgroup.subtree_control`, `cgroup.threads` are the
   user's, as systemd's `Delegate=yes` makes them).

Each time it makes a desktop's cgroup with the real code, starts a fork bomb and a memory
bomb in it through the real join command, and reports what the kernel counted, as one
line: `V2RESULT {json}`; then it freezes and thaws the desktop with a counting process in
it, and kills it frozen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import cgroups  # cubicle/server/runtime/cgroups.py, copied beside this file

ROOT = Path("/sys/fs/cgroup")
FORK_BOMB = """
import os, time
n = 0
try:
    while n < 5000:
        if os.fork() == 0:
            os.close(1); os.close(2); time.sleep(20); os._exit(0)
        n += 1
except OSError as exc:
    print("forked", n, exc.errno, flush=True)
else:
    print("forked", n, 0, flush=True)
"""
MEMORY_BOMB = """
chunks = []
while len(chunks) < 64:
    chunks.append(bytearray(16 << 20))
    for i in range(0, 16 << 20, 4096):
        chunks[-1][i] = 1
print("held", len(chunks) * 16, flush=True)
"""


TICKER = """
import os, sys, time
n = 0
while True:
    n += 1
    with open(sys.argv[1] + ".new", "w") as f:
        f.write(str(n))
    os.replace(sys.argv[1] + ".new", sys.argv[1])
    time.sleep(0.05)
"""


def check_freeze(desktop, python: list[str], tick: Path) -> dict:
    """Freeze a desktop with a counting process in it, then thaw it: did it stop and go on?"""
    ticker = subprocess.Popen([*desktop.join_argv(), *python, TICKER, str(tick)])
    deadline = time.monotonic() + 30
    while not tick.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    desktop.freeze(True)
    frozen_at = tick.read_text()
    time.sleep(0.5)
    still = tick.read_text() == frozen_at
    desktop.freeze(False)
    time.sleep(0.5)
    moved = int(tick.read_text()) > int(frozen_at)
    desktop.freeze(True)  # left frozen: the end of the test kills a frozen desktop
    return {"ticker_pid": ticker.pid, "frozen_still": still, "thawed_moved": moved}


def play_service(label: str) -> dict:
    """Detect the hierarchy, make a desktop's cgroup, bomb it; what happened."""
    started = time.monotonic()
    hierarchy = cgroups.Hierarchy.detect()
    hierarchy.cap(cgroups.Limits(memory_mb=256, max_pids=512))
    desktop = hierarchy.create("desk1", cgroups.Limits(memory_mb=64, max_pids=32, cpu_cores=0.5))
    made_ms = (time.monotonic() - started) * 1000
    python = [sys.executable, "-I", "-S", "-c"]
    fork = subprocess.run(
        [*desktop.join_argv(), *python, FORK_BOMB], capture_output=True, text=True, timeout=120
    )
    memory = subprocess.run(
        [*desktop.join_argv(), *python, MEMORY_BOMB], capture_output=True, text=True, timeout=120
    )
    stats = desktop.stats()
    frozen = check_freeze(desktop, python, Path(f"/tmp/tick-{label}"))
    own = (ROOT / Path(cgroups.own_cgroups()[""]).relative_to("/")).as_posix()
    result = {
        "label": label,
        "uid": os.getuid(),
        "version": hierarchy.version,
        "parent": str(hierarchy.parents[0]),
        "desktop": str(desktop.paths[0]),
        "service_cgroup": own,
        "made_ms": round(made_ms, 1),
        "fork_out": fork.stdout.strip(),
        "memory_exit": memory.returncode,
        "memory_out": memory.stdout.strip(),
        "oom_kills": stats.oom_kills,
        "pids_refused": stats.pids_refused,
        "memory_max": (desktop.paths[0] / "memory.max").read_text().strip(),
        "pids_max": (desktop.paths[0] / "pids.max").read_text().strip(),
        "cpu_max": (desktop.paths[0] / "cpu.max").read_text().strip(),
        "parent_memory_max": (hierarchy.parents[0] / "memory.max").read_text().strip(),
        **frozen,
    }
    desktop.kill_all()
    result["removed"] = not desktop.paths[0].exists()
    hierarchy.close()
    return result


def enter(cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def main() -> None:
    (ROOT / "cgroup.subtree_control").write_text("+memory +pids +cpu")
    unit = ROOT / "cubicle.service"
    unit.mkdir()
    child = os.fork()
    if child == 0:  # root, in a unit of its own
        enter(unit)
        print("V2RESULT " + json.dumps(play_service("root")), flush=True)
        os._exit(0)
    os.waitpid(child, 0)

    delegated = ROOT / "user.delegate"
    delegated.mkdir()
    for name in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
        os.chown(delegated / name if name else delegated, 1000, 1000)
    child = os.fork()
    if child == 0:  # an ordinary user in a delegated cgroup
        enter(delegated)
        os.setgroups([])
        os.setresgid(1000, 1000, 1000)
        os.setresuid(1000, 1000, 1000)
        print("V2RESULT " + json.dumps(play_service("user")), flush=True)
        os._exit(0)
    os.waitpid(child, 0)
    print("V2DONE", flush=True)


if __name__ == "__main__":
    main()
