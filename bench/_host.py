"""A desktop started the way reference products start theirs, on the bare host.

E2B Desktop and Anthropic's computer-use demo start `Xvfb :N`, poll `xdpyinfo` until the
X server answers (E2B: every 0.5 s), then start the desktop session (`startxfce4` here, with
a private session bus from `dbus-run-session`, a fresh HOME and DISPLAY set). Nothing is
sandboxed, which only favours this baseline.

The HOME gets a copy of Cubicle's own XFCE settings (`images/home`), so both desktops look
the same (flat backdrop, same panel) and screenshots of them are comparable. Xvfb gets `-br`
(black root until xfdesktop paints) so that the drawn detector our guest uses,
`cubicle.guest.session.wait_until_drawn`, can tell painted from unpainted (no effect on
timing), and `-noreset`, so that the server does not reset when the xdpyinfo poll
disconnects while XFCE connects (a race that failed about one start in twenty here; this
too only favours the baseline). Every process goes into a cgroup of its own when the host
allows, because `startxfce4` spawns agents (ssh-agent, gpg-agent) that leave the process
group.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cubicle.guest import session as guest_session

POLL_S = 0.5
"""How often a polling product checks readiness (E2B Desktop's interval), seconds."""
HOME_SKELETON = Path(__file__).resolve().parent.parent / "images" / "home"
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "cubicle-bench"
_JOIN_CGROUP = 'for f in $BENCH_CGROUP_PROCS; do echo $$ > "$f" || exit 97; done; exec "$@"'


@dataclass(frozen=True)
class HostCgroup:
    """A pids and a memory cgroup (v1) holding one reference session's processes."""

    pids_dir: Path
    memory_dir: Path

    @classmethod
    def create(cls, name: str) -> HostCgroup | None:
        """The cgroup, or None where this process may not create cgroups."""
        dirs = [CGROUP_ROOT / c / CGROUP_PARENT / name for c in ("pids", "memory")]
        if not all(os.access(d.parent.parent, os.W_OK) for d in dirs):
            return None
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        return cls(*dirs)

    def pids(self) -> list[int]:
        with contextlib.suppress(FileNotFoundError):
            return [int(p) for p in (self.pids_dir / "cgroup.procs").read_text().split()]
        return []

    def memory_bytes(self) -> int:
        """Memory charged to the session (page cache included), bytes."""
        return int((self.memory_dir / "memory.usage_in_bytes").read_text())

    def kill_all(self, timeout_s: float = 3.0) -> None:
        """SIGKILL every process in the cgroup until it is empty, then remove it."""
        deadline = time.monotonic() + timeout_s
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        for d in (self.pids_dir, self.memory_dir):
            with contextlib.suppress(OSError):
                d.rmdir()


@dataclass
class ReferenceSession:
    """A host-side Xvfb + XFCE session and the times its start took."""

    display: str
    width: int
    height: int
    env: dict[str, str]
    """DISPLAY, HOME, … for programs run on this desktop."""
    root: Path
    """Temporary directory holding HOME and XDG_RUNTIME_DIR."""
    cgroup: HostCgroup | None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    x_ready_s: float = math.nan
    """Seconds from starting Xvfb to the first successful `xdpyinfo` poll."""
    drawn_s: float = math.nan
    """Seconds from starting Xvfb until the desktop was drawn (same detector as ours)."""
    polled_ready_s: float = math.nan
    """Seconds until the first 0.5 s readiness poll, counted from `startxfce4`, after drawn."""
    stages_s: dict[str, float] = field(default_factory=dict)
    """Seconds from starting Xvfb to each stage: `x_server` (xdpyinfo answered), then the
    drawn detector's `window_manager`, `shell_mapped` and `desktop_drawn`."""

    def pids(self) -> list[int]:
        if self.cgroup is not None:
            return self.cgroup.pids()
        return [p.pid for p in self.processes if p.poll() is None]

    def stop(self) -> None:
        """Kill every process of the session (process groups, then the cgroup)."""
        for proc in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill_all()
        for proc in self.processes:
            proc.wait()
        if not math.isnan(self.x_ready_s):  # our Xvfb ran: its lock and socket stay behind
            number = self.display.lstrip(":")
            for path in (f"/tmp/.X{number}-lock", f"/tmp/.X11-unix/X{number}"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        shutil.rmtree(self.root, ignore_errors=True)


def _free_display() -> int:
    for number in range(50, 400):
        if not any(
            Path(p).exists() for p in (f"/tmp/.X{number}-lock", f"/tmp/.X11-unix/X{number}")
        ):
            return number
    raise RuntimeError("no free X display number between :50 and :399")


def _spawn(
    argv: list[str], env: dict[str, str], cgroup: HostCgroup | None, log: Path
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new process group, inside `cgroup` when there is one."""
    if cgroup is not None:
        procs = f"{cgroup.pids_dir}/cgroup.procs {cgroup.memory_dir}/cgroup.procs"
        env = {**env, "BENCH_CGROUP_PROCS": procs}
        argv = ["/bin/sh", "-c", _JOIN_CGROUP, "sh", *argv]
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _xdpyinfo_ok(display: str) -> bool:
    done = subprocess.run(
        ["xdpyinfo", "-display", display], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return done.returncode == 0


def _session_env(root: Path, display: str) -> dict[str, str]:
    home, runtime = root / "home", root / "runtime"
    shutil.copytree(HOME_SKELETON, home, symlinks=True)
    runtime.mkdir(mode=0o700)
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "USER": "root",
        "LOGNAME": "root",
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": str(runtime),
        "DISPLAY": display,
    }


def _boot(session: ReferenceSession, timeout_s: float) -> None:
    """Xvfb, poll xdpyinfo every 0.5 s, startxfce4, then wait until drawn; times each step."""
    log = session.root / "session.log"
    geometry = f"{session.width}x{session.height}x24"
    started = time.perf_counter()
    xvfb_argv = ["Xvfb", session.display, "-screen", "0", geometry, "-br", "-noreset"]
    xvfb_argv += ["-nolisten", "tcp"]
    xvfb = _spawn(xvfb_argv, session.env, session.cgroup, log)
    session.processes.append(xvfb)
    while not _xdpyinfo_ok(session.display):
        if xvfb.poll() is not None or time.perf_counter() - started > timeout_s:
            raise RuntimeError(f"Xvfb did not come up: {log.read_text(errors='replace')[-500:]}")
        time.sleep(POLL_S)
    session.x_ready_s = time.perf_counter() - started
    session.stages_s["x_server"] = session.x_ready_s
    xfce_argv = ["dbus-run-session", "--", "startxfce4"]
    xfce = _spawn(xfce_argv, session.env, session.cgroup, log)
    session.processes.append(xfce)
    xfce_started = time.perf_counter()
    watched = guest_session.Session(
        display=session.display,
        width=session.width,
        height=session.height,
        env=session.env,
        xvfb=xvfb,
        processes=[xfce],
    )

    def reached(stage: str) -> None:
        session.stages_s[stage] = time.perf_counter() - started

    guest_session.wait_until_drawn(watched, timeout_s, progress=reached)
    drawn = time.perf_counter()
    session.drawn_s = drawn - started
    polls = math.ceil((drawn - xfce_started) / POLL_S)
    session.polled_ready_s = xfce_started + polls * POLL_S - started


def start_reference_session(
    width: int = 1280, height: int = 800, timeout_s: float = 30.0
) -> ReferenceSession:
    """Start a reference desktop and return once it is drawn; nothing is left on failure."""
    number = _free_display()
    root = Path(tempfile.mkdtemp(prefix=f"cubicle-bench-ref{number}-"))
    session = ReferenceSession(
        display=f":{number}",
        width=width,
        height=height,
        env=_session_env(root, f":{number}"),
        root=root,
        cgroup=HostCgroup.create(f"{os.getpid()}-{number}"),
    )
    try:
        _boot(session, timeout_s)
    except BaseException:
        session.stop()
        raise
    return session


@contextlib.contextmanager
def reference_session(width: int = 1280, height: int = 800) -> Iterator[ReferenceSession]:
    """A drawn reference desktop for the duration of the block."""
    session = start_reference_session(width, height)
    try:
        yield session
    finally:
        session.stop()
