"""CPU time of groups of processes over a window, from `/proc/<pid>/stat` (utime + stime).

A `CpuWindow` names each group by a function that lists its pids now; it reads every
member's CPU time at the start and at the end, and a group's figure is the sum of its
members' growth (a process that started inside the window counts from zero; one that
ended inside it loses what it used since the start: none of ours come or go mid-window).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

Lister = Callable[[], Iterable[int]]


def _stat(pid: int) -> list[str] | None:
    """The fields after the command name of /proc/<pid>/stat, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rpartition(")")[2].split()


def cpu_ticks(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[11]) + int(fields[12])


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def descendants(root: int) -> set[int]:
    """`root` and every process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids():
        fields = _stat(pid)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def process_group(pgid: int) -> set[int]:
    """Every live process of process group `pgid` (zombies left out)."""
    members = set()
    for pid in _all_pids():
        fields = _stat(pid)
        if fields is not None and int(fields[2]) == pgid and fields[0] != "Z":
            members.add(pid)
    return members


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except FileNotFoundError:
        return ""


class CpuWindow:
    """CPU used by named groups of processes between `start()` and `stop()`, in cores."""

    def __init__(self, groups: dict[str, Lister]) -> None:
        self._groups = groups
        self._start: dict[str, dict[int, int]] = {}
        self._started = 0.0

    def _read(self) -> dict[str, dict[int, int]]:
        readings: dict[str, dict[int, int]] = {}
        for name, lister in self._groups.items():
            readings[name] = {}
            for pid in lister():
                ticks = cpu_ticks(pid)
                if ticks is not None:
                    readings[name][pid] = ticks
        return readings

    def start(self) -> None:
        self._start = self._read()
        self._started = time.monotonic()

    def stop(self) -> dict[str, float]:
        """Cores each group used since `start()` (1.0 = one core busy all the time)."""
        end = self._read()
        elapsed = time.monotonic() - self._started
        cores = {}
        for name, now in end.items():
            before = self._start.get(name, {})
            ticks = sum(t - before.get(pid, 0) for pid, t in now.items())
            cores[name] = round(ticks / CLOCK_TICKS / elapsed, 4)
        return cores
