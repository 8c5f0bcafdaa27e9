"""CPU priority of a sandbox's processes: a spare boots at nice 19, and is raised to 0
when someone takes it.

Niceness belongs to each thread, and a new thread or process inherits its creator's: the
boot starts niced (`BACKGROUND_NICE`) and everything it spawns follows; `raise_to_normal`
walks every thread of the sandbox until none is left niced (a thread started during a pass
is caught by the next). Lowering a nice value needs root (CAP_SYS_NICE): elsewhere
sandboxes start at normal priority, since nothing could raise them again.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

BACKGROUND_NICE = 19
NORMAL_NICE = 0
_PASSES = 5


def can_raise() -> bool:
    """Whether this process may give a niced process its normal priority back."""
    return os.geteuid() == 0


def nice_argv() -> list[str]:
    """A prefix that starts a command at background priority."""
    return ["nice", "-n", str(BACKGROUND_NICE)]


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


def raise_to_normal(pids: Callable[[], Iterable[int]]) -> int:
    """Give every thread of the processes `pids()` lists nice 0; returns how many changed."""
    changed = 0
    for _ in range(_PASSES):
        this_pass = 0
        for pid in pids():
            for tid in _threads(pid):
                with contextlib.suppress(ProcessLookupError):
                    if os.getpriority(os.PRIO_PROCESS, tid) != NORMAL_NICE:
                        os.setpriority(os.PRIO_PROCESS, tid, NORMAL_NICE)
                        this_pass += 1
        changed += this_pass
        if not this_pass:
            break
    return changed
