"""The desktop's CPU meter on real processes: run and run-queue time, and never falling."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from cubicle.guest.cpu import CpuMeter, live_sessions

_SPIN = """
import sys, threading, time

def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

worker = threading.Thread(target=spin, args=(float(sys.argv[1]),))
worker.start()
print("started", flush=True)
worker.join()
spin(float(sys.argv[2]))
print(time.process_time(), flush=True)
sys.stdin.readline()
"""
"""Spins a thread for argv[1] CPU seconds, then its main thread for argv[2]; prints the
process's CPU seconds, then waits for a line (alive and idle, so that it can be read)."""


def _spinner(in_thread: float, in_main: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _SPIN, str(in_thread), str(in_main)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its session id is its pid
    )


def test_counts_what_the_watched_sessions_ran_and_waited_for():
    sessions: set[int] = set()
    meter = CpuMeter(lambda session: session not in sessions)
    assert meter() == 0.0
    started = time.monotonic()
    watched, other = _spinner(0, 0.3), _spinner(0, 0.3)  # two at once: they compete for cores
    try:
        sessions.add(watched.pid)
        assert watched.stdout.readline() == "started\n"
        used = float(watched.stdout.readline())  # its CPU, start-up included
        other.stdout.readline()
        wanted = meter()
        # Its one thread ran for `used` and waited in the run queue for some of the rest of
        # the time it existed; the other spinner's 0.3 s would push past that.
        assert used - 0.001 <= wanted <= time.monotonic() - started
    finally:
        for spinner in (watched, other):
            spinner.kill()
            spinner.wait()


def test_a_thread_that_ends_keeps_what_it_added():
    spinner = _spinner(0.4, 0)
    try:
        meter = CpuMeter(lambda session: session != spinner.pid)
        meter()
        assert spinner.stdout.readline() == "started\n"
        time.sleep(0.2)
        during = meter()
        spinner.stdout.readline()  # the spinning thread has ended
        after = meter()
        assert 0.05 < during <= after
        assert os.path.exists(f"/proc/{spinner.pid}")
    finally:
        spinner.kill()
        spinner.wait()


def test_live_sessions_holds_running_sessions_only():
    spinner = _spinner(0, 0)
    try:
        assert spinner.stdout.readline() == "started\n"
        assert {os.getsid(0), spinner.pid} <= live_sessions()
    finally:
        spinner.stdin.close()
        spinner.wait()
    assert spinner.pid not in live_sessions()
