"""CPU priority of a sandbox's processes: a spare boots at nice 19, and is raised to 0
when someone takes it.

Two niceness apply. Each thread has its own, inherited by the threads and processes it
starts: the boot starts niced (`SandboxSpec.nice`) and everything it spawns follows. And
where the kernel groups processes by session (`sched_autogroup`, on by default on most
distributions), the CPU is first shared between sessions, by each session's own nice:
a sandbox is a session of its own, so without `lower_group` its threads' nice would weigh
only against each other. `raise_to_normal` walks every thread and session of the sandbox
until none is left niced (a thread started during a pass is caught by the next). Lowering
a nice value needs root (CAP_SYS_NICE): elsewhere sandboxes start at normal priority,
since nothing could raise them again.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

NORMAL_NICE = 0
_PASSES = 5


def can_raise() -> bool:
    """Whether this process may give a niced process its normal priority back."""
    return os.geteuid() == 0


def nice_argv(nice: int) -> list[str]:
    """A prefix that starts a command at niceness `nice`."""
    return ["nice", "-n", str(nice)]


def _threads(pid: int) -> list[int]:
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    return []


def descendants(root: int) -> list[int]:
    """`root` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _set_groups(pids: Iterable[int], nice: int) -> None:
    """Set the session-group nice of every group these processes belong to."""
    done: set[str] = set()
    for pid in pids:
        path = Path(f"/proc/{pid}/autogroup")  # "/autogroup-42 nice 0"
        try:
            group, _, value = path.read_text().split()
            if group not in done and int(value) != nice:
                path.write_text(str(nice))
            done.add(group)
        except (OSError, ValueError):  # gone meanwhile, or a kernel without autogroups
            continue


def lower_group(pid: int, nice: int, timeout_s: float = 1.0) -> None:
    """Put the session group of `pid` at `nice`, once `pid` has made its own session
    (bwrap reports its child before the child calls setsid)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            session = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
        except (OSError, IndexError, ValueError):
            return
        if session == pid:
            _set_groups([pid], nice)
            return
        time.sleep(0.002)


def raise_to_normal(pids: Callable[[], Iterable[int]]) -> int:
    """Give every thread and session group of the processes `pids()` lists nice 0;
    returns how many threads changed."""
    changed = 0
    for _ in range(_PASSES):
        this_pass = 0
        listed = list(pids())
        _set_groups(listed, NORMAL_NICE)
        for pid in listed:
            for tid in _threads(pid):
                with contextlib.suppress(ProcessLookupError):
                    if os.getpriority(os.PRIO_PROCESS, tid) != NORMAL_NICE:
                        os.setpriority(os.PRIO_PROCESS, tid, NORMAL_NICE)
                        this_pass += 1
        changed += this_pass
        if not this_pass:
            break
    return changed
