"""How much CPU the desktop's programs have used: what `wait_for_settle` watches beside DAMAGE.

Run time is read per thread from `/proc/<pid>/task/<tid>/schedstat`, in nanoseconds. A
process's `utime + stime` in `/proc/<pid>/stat` comes in whole clock ticks (10 ms), too
coarse for the settle's window: a tenth of a core over 150 ms is 15 ms, so two processes
that each cross a tick boundary doing a fraction of a millisecond of work looked busy.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable


class CpuMeter:
    """CPU seconds used by the desktop's programs (X server, XFCE, apps) since it started.

    Leaves out this daemon and every process whose session `excluded` names (commands run
    through exec: a build in the background is not the screen being busy). The total only
    grows: each thread adds the run time it gained since the previous reading, a thread new
    since then adds all of its run time, and one that ended keeps what it had added. So the
    difference of two readings is the CPU time used between them, less what threads that
    ended in between ran after they were last read: read often (the settle reads every 20
    ms) and a burst of work by a short-lived thread still shows. Safe to call from any
    thread.
    """

    def __init__(self, excluded: Callable[[int], bool]) -> None:
        self._excluded = excluded
        self._me = os.getpid()
        self._lock = threading.Lock()
        self._threads: dict[int, int] = {}
        """Run time of each thread at the previous reading, nanoseconds, by thread id."""
        self._total_ns = 0

    def __call__(self) -> float:
        """CPU seconds used so far (see the class); blocks for about a millisecond."""
        with self._lock:
            seen: dict[int, int] = {}
            for pid in _numeric(os.scandir("/proc")):
                if pid == self._me:
                    continue
                try:
                    with open(f"/proc/{pid}/stat", "rb") as stat:
                        fields = stat.read().rsplit(b")", 1)[1].split()
                    if self._excluded(int(fields[3])):  # field 6 of stat: the session id
                        continue
                    single = fields[17] == b"1"  # field 20: the number of threads
                    tids = [pid] if single else _numeric(os.scandir(f"/proc/{pid}/task"))
                except (OSError, IndexError):
                    continue  # exited meanwhile
                for tid in tids:
                    try:
                        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as schedstat:
                            seen[tid] = int(schedstat.read().split(None, 1)[0])
                    except (OSError, IndexError, ValueError):
                        continue
            for tid, run_ns in seen.items():
                before = self._threads.get(tid, 0)
                self._total_ns += run_ns - before if run_ns >= before else run_ns  # id reused
            self._threads = seen
            return self._total_ns / 1e9


def _numeric(entries: os.ScandirIterator[os.DirEntry[str]]) -> list[int]:
    with entries:
        return [int(entry.name) for entry in entries if entry.name.isdigit()]
