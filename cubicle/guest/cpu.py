"""How much CPU the desktop's programs have wanted: what `wait_for_settle` watches beside DAMAGE.

Each thread's time on a CPU and time waiting for one (runnable, but another process had the
core) are read from `/proc/<pid>/task/<tid>/schedstat`, in nanoseconds. Waiting counts: on a
loaded host an app that has work to do spends more time in the run queue than running
(measured: 2–4× at a load of 8 on 2 cores), and an app that is not running cannot draw. A
process's `utime + stime` in `/proc/<pid>/stat` would also be too coarse, in whole clock
ticks (10 ms): a tenth of a core over 150 ms is 15 ms, so two processes that each crossed a
tick boundary doing a fraction of a millisecond of work looked busy.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

_STATE, _SESSION, _THREADS = 0, 3, 17
"""Indexes in `_stat`'s list of stat fields 3 (state), 6 (session id) and 20 (number of
threads)."""


class CpuMeter:
    """Seconds the desktop's programs (X server, XFCE, apps) have run on a CPU or waited in
    the run queue for one, since the meter was made.

    Leaves out this daemon and every process whose session `excluded` names (commands run
    through exec: a build in the background is not the screen being busy). The total only
    grows: each thread adds the time it gained since the previous reading, a thread new
    since then adds all of its time, and one that ended keeps what it had added. So the
    difference of two readings is the CPU time wanted between them, less what threads that
    ended in between wanted after they were last read: read often (the settle reads every
    20 ms) and a burst of work by a short-lived thread still shows. Safe to call from any
    thread.
    """

    def __init__(self, excluded: Callable[[int], bool]) -> None:
        self._excluded = excluded
        self._me = os.getpid()
        self._lock = threading.Lock()
        self._threads: dict[int, int] = {}
        """Run + wait time of each thread at the previous reading, nanoseconds, by thread id."""
        self._total_ns = 0
        self.wanting = 0
        """Processes that wanted a CPU at the last reading: running or runnable (state R),
        or waiting for a disk (D). A thread waiting in the run queue adds its wait to the
        total only once it runs; this sees it while it waits."""

    def __call__(self) -> float:
        """Seconds run or waited for so far (see the class); blocks for about a millisecond."""
        with self._lock:
            seen: dict[int, int] = {}
            wanting = 0
            for pid in _numeric(os.scandir("/proc")):
                if pid == self._me:
                    continue
                try:
                    fields = _stat(pid)
                    if self._excluded(int(fields[_SESSION])):
                        continue
                    wanting += fields[_STATE] in (b"R", b"D")
                    single = fields[_THREADS] == b"1"
                    tids = [pid] if single else _numeric(os.scandir(f"/proc/{pid}/task"))
                except (OSError, IndexError):
                    continue  # exited meanwhile
                for tid in tids:
                    try:
                        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as schedstat:
                            ran, waited = schedstat.read().split()[:2]  # nanoseconds
                            seen[tid] = int(ran) + int(waited)
                    except (OSError, IndexError, ValueError):
                        continue
            for tid, run_ns in seen.items():
                before = self._threads.get(tid, 0)
                self._total_ns += run_ns - before if run_ns >= before else run_ns  # id reused
            self._threads = seen
            self.wanting = wanting
            return self._total_ns / 1e9


def live_sessions() -> set[int]:
    """The session ids of every process running now."""
    sessions = set()
    for pid in _numeric(os.scandir("/proc")):
        try:
            sessions.add(int(_stat(pid)[_SESSION]))
        except (OSError, IndexError, ValueError):
            continue  # exited meanwhile
    return sessions


def _stat(pid: int) -> list[bytes]:
    """`/proc/<pid>/stat`'s fields after the command name (which may hold spaces)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rsplit(b")", 1)[1].split()


def _numeric(entries: os.ScandirIterator[os.DirEntry[str]]) -> list[int]:
    with entries:
        return [int(entry.name) for entry in entries if entry.name.isdigit()]
