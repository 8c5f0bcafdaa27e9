"""Per-sandbox limits on memory, processes and CPU with cgroups, v2 or v1.

Desktops' cgroups always sit below the service's own cgroup, never at a hierarchy's root:
`Hierarchy.detect()` reads `/proc/self/cgroup`, checks that this process may create
cgroups there (root, or a subtree delegated to the service's user, e.g. a systemd unit or
scope with `Delegate=yes`), and makes one parent for this service's desktops, which holds
the service-wide caps. Each desktop then gets a cgroup of its own below it.

    cgroup v2    <own>/service   (this process moves here: v2 allows no process in a
                 <own>/desktops   cgroup whose controllers are handed down)
                 <own>/desktops/<id>
    cgroup v1    <controller>/<own>/cubicle-<pid>/<id>, for memory, pids (and cpu), and
                 freezer where it is mounted (pausing a desktop stops its processes there)

CPU: only a service that caps each desktop's CPU (`CUBICLE_CPU_CORES`) puts desktops in
the cpu controller (`cpu.max`, and `cpu.weight` among them). Otherwise a desktop's
processes share the CPU one by one, as any program's do (their number is capped by
`pids.max`): in a cpu cgroup every desktop together would weigh as one process against
the rest of a busy host, and start several times slower there.

This module uses the standard library only, so that the cgroup v2 test can run it on
another kernel (tests/security/test_cgroup_v2.py) without the service's dependencies.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
FREEZER = "freezer"
"""cgroup v1's controller that stops a cgroup's processes; v2 has `cgroup.freeze` built in."""
CPUACCT = "cpuacct"
"""cgroup v1's controller that counts a cgroup's CPU time; v2 counts it in `cpu.stat`."""
OPTIONAL_V1 = (FREEZER, CPUACCT)
"""v1 controllers desktops join where they are mounted and writable (pause, CPU figures)."""
FREEZE_TIMEOUT_S = 5.0


class CgroupUnavailable(Exception):
    """This host gives the service no cgroup it may put limits on; the message says why.

    Not a `CubicleError`: this module stays importable without the service's packages
    (the runtime turns it into `SandboxStartError`)."""


@dataclass(frozen=True)
class Limits:
    """What one cgroup may use."""

    memory_mb: int | None
    """Memory, page cache and tmpfs included; swap is not allowed on top. None: no cap."""
    max_pids: int | None
    """Processes and threads. None: no cap."""
    cpu_cores: float | None = None
    """A hard cap in cores; None shares the CPU by weight only."""
    cpu_weight: int = 100
    """Share of the CPU under contention, 1-10000 (v2's scale; 100 is everyone's default)."""


@dataclass(frozen=True)
class CgroupStats:
    """What the kernel counted for one cgroup."""

    memory_bytes: int
    oom_kills: int
    """Processes the kernel killed for going over the memory limit."""
    pids_refused: int
    """Forks refused at the process limit."""


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _read_int(path: Path, key: str | None = None) -> int:
    """A number file, or one `key value` line of a flat-keyed file; 0 when absent."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0
    if key is None:
        return int(text.split()[0]) if text.strip() and text.split()[0] != "max" else 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def own_cgroups(text: str | None = None) -> dict[str, str]:
    """This process's cgroup path per v1 controller, and `""` for the v2 hierarchy."""
    text = Path("/proc/self/cgroup").read_text() if text is None else text
    found: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            found[name] = path
    return found


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK) and os.access(
        directory / "cgroup.procs", os.W_OK
    )


class Cgroup:
    """The cgroup(s) of one sandbox: one directory (v2), or one per controller (v1)."""

    def __init__(
        self, version: int, paths: tuple[Path, ...], controllers: tuple[str, ...] = CONTROLLERS
    ) -> None:
        self.version = version
        self.paths = paths
        self.controllers = controllers
        """v1: the controller of each path, in order."""

    @property
    def procs_files(self) -> list[str]:
        """The files a process writes its pid into to join every controller."""
        return [str(path / "cgroup.procs") for path in self.paths]

    def join_argv(self) -> list[str]:
        """A command prefix that moves itself into this cgroup, then runs the rest."""
        joins = " ".join(f"'{f}'" for f in self.procs_files)
        script = f'for f in {joins}; do echo $$ > "$f" || exit 97; done; exec "$@"'
        return ["/bin/sh", "-c", script, "sh"]

    def _controller(self, name: str) -> Path:
        return self.paths[0] if self.version == 2 else self.paths[self.controllers.index(name)]

    def pids(self) -> list[int]:
        """Every process in the sandbox's cgroup."""
        text = (self._controller("pids") / "cgroup.procs").read_text()
        return [int(line) for line in text.split()]

    def memory_bytes(self) -> int:
        """Memory charged to the sandbox now, in bytes (page cache and tmpfs included)."""
        name = "memory.current" if self.version == 2 else "memory.usage_in_bytes"
        return _read_int(self._controller("memory") / name)

    def cpu_seconds(self) -> float | None:
        """CPU time every process of the cgroup used so far, ended ones included; None
        where this host does not count it (v1 without cpuacct)."""
        if self.version == 2:
            return _read_int(self.paths[0] / "cpu.stat", "usage_usec") / 1e6
        for path in self.paths:  # its own hierarchy, or mounted with cpu's
            if (path / "cpuacct.usage").exists():
                return _read_int(path / "cpuacct.usage") / 1e9
        return None

    def memory_cache_bytes(self) -> int:
        """The page cache part of `memory_bytes` (files read and written, tmpfs)."""
        memory = self._controller("memory")
        return _read_int(memory / "memory.stat", "file" if self.version == 2 else "cache")

    @property
    def can_freeze(self) -> bool:
        """Whether `freeze` works here: always on v2, with the freezer controller on v1."""
        return self.version == 2 or FREEZER in self.controllers

    def freeze(self, frozen: bool, timeout_s: float = FREEZE_TIMEOUT_S) -> None:
        """Stop every process in the cgroup where it stands (`frozen`), or let them all run
        on; returns once the kernel reports it done. A frozen process uses no CPU and keeps
        its memory; its children are born frozen. `TimeoutError` if the kernel did not
        finish in `timeout_s` (a process stuck in an uninterruptible wait)."""
        if self.version == 2:
            path = self.paths[0]
            _write(path / "cgroup.freeze", "1" if frozen else "0")

            def done() -> bool:
                return _read_int(path / "cgroup.events", "frozen") == int(frozen)
        else:
            state = self._controller(FREEZER) / "freezer.state"
            want = "FROZEN" if frozen else "THAWED"
            _write(state, want)

            def done() -> bool:
                if state.read_text().strip() == want:
                    return True
                _write(state, want)  # v1 retries only when asked again
                return False

        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                word = "freeze" if frozen else "thaw"
                raise TimeoutError(f"the kernel did not {word} {self.paths[0]} in {timeout_s} s")
            time.sleep(0.002)

    def stats(self) -> CgroupStats:
        memory, pids = self._controller("memory"), self._controller("pids")
        if self.version == 2:
            oom = _read_int(memory / "memory.events", "oom_kill")
        else:
            oom = _read_int(memory / "memory.oom_control", "oom_kill")
        return CgroupStats(self.memory_bytes(), oom, _read_int(pids / "pids.events", "max"))

    def kill_all(self, timeout_s: float = 3.0) -> None:
        """SIGKILL everything in the cgroup until it is empty, then remove it."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                _write(self.paths[0] / "cgroup.kill", "1")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pids = self.pids()
            except FileNotFoundError:
                break
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if self.version == 1 and FREEZER in self.controllers:
                # v1 delivers no signal to a frozen process: thaw it to let it die
                with contextlib.suppress(OSError):
                    _write(self._controller(FREEZER) / "freezer.state", "THAWED")
            time.sleep(0.01)
        for path in self.paths:
            _rmdir(path, timeout_s=1.0)


def _rmdir(path: Path, timeout_s: float) -> None:
    """Remove a cgroup once its last process is reaped (EBUSY until then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                return
            time.sleep(0.01)


class Hierarchy:
    """Where this service makes its desktops' cgroups, and how."""

    def __init__(
        self, version: int, parents: tuple[Path, ...], note: str, controllers: tuple[str, ...]
    ) -> None:
        self.version = version
        self.parents = parents
        self.controllers = controllers
        """The controllers desktops are held by: memory, pids, and cpu when capped."""
        """This service's parent of every desktop cgroup: one (v2) or one per controller."""
        self.note = note
        """Where the cgroups live, in words, for the service's log."""

    @classmethod
    def detect(
        cls, *, cpu: bool = True, root: Path = ROOT, proc_cgroup: str | None = None
    ) -> Hierarchy:
        """The hierarchy this host offers; `CgroupUnavailable` names what is missing.
        `cpu`: desktops get a CPU cap, so they join the cpu controller too."""
        own = own_cgroups(proc_cgroup)
        controllers = CONTROLLERS if cpu else CONTROLLERS[:2]
        if (root / "cgroup.controllers").is_file():
            return cls._v2(root, own.get("", "/"), controllers)
        if all((root / name / "cgroup.procs").is_file() for name in controllers):
            return cls._v1(root, own, controllers)
        raise CgroupUnavailable(
            f"no cgroup hierarchy with the {', '.join(controllers)} controllers "
            f"is mounted at {root}"
        )

    # --- v1 --------------------------------------------------------------------------------

    @classmethod
    def _v1(cls, root: Path, own: dict[str, str], controllers: tuple[str, ...]) -> Hierarchy:
        parents = []
        for name in controllers:
            base = root / name / own.get(name, "/").lstrip("/")
            if not _writable(base):
                raise CgroupUnavailable(
                    f"cgroup v1: this service (uid {os.geteuid()}) may not create cgroups in "
                    f"{base}: run it as root, or delegate that cgroup to its user "
                    f"(chown it and its cgroup.procs) for each of {', '.join(controllers)}"
                )
            _sweep(base)
            parents.append(base / f"cubicle-{os.getpid()}")
        for name in OPTIONAL_V1:  # without them desktops cannot pause, or count CPU time
            base = root / name / own.get(name, "/").lstrip("/")
            used = {parent.parent.resolve() for parent in parents}
            if _writable(base) and base.resolve() not in used:  # cpuacct may share cpu's
                _sweep(base)
                parents.append(base / f"cubicle-{os.getpid()}")
                controllers = (*controllers, name)
        for path in parents:
            path.mkdir(exist_ok=True)
        note = "cgroup v1 under " + ", ".join(str(p) for p in parents)
        return cls(1, tuple(parents), note, controllers)

    # --- v2 --------------------------------------------------------------------------------

    @classmethod
    def _v2(cls, root: Path, own_path: str, controllers: tuple[str, ...]) -> Hierarchy:
        own = root / own_path.lstrip("/")
        if not _writable(own):
            raise CgroupUnavailable(
                f"cgroup v2: this service (uid {os.geteuid()}) may not create cgroups in {own}: "
                "run it as root, or in a delegated cgroup (a systemd unit with Delegate=yes, "
                "or `systemd-run --user --scope -p Delegate=yes cubicle serve`)"
            )
        missing = set(controllers) - set((own / "cgroup.controllers").read_text().split())
        if missing:
            raise CgroupUnavailable(
                f"cgroup v2: the {', '.join(sorted(missing))} controller(s) are not handed down "
                f"to {own}: enable them in its parent's cgroup.subtree_control "
                "(systemd: Delegate=yes, or Delegate=memory pids cpu)"
            )
        if own != root:
            others = [pid for pid in _procs(own) if pid != os.getpid()]
            if others and os.geteuid() == 0:
                # A shell's cgroup, shared with other programs: make this service a
                # cgroup of its own beside it, as `systemd-run --scope` would.
                _sweep(own.parent)
                own = own.parent / f"cubicle-{os.getpid()}.scope"
                own.mkdir(exist_ok=True)
            elif others:
                raise CgroupUnavailable(
                    f"cgroup v2: {own} also holds other processes ({len(others)}), so it "
                    "cannot hand controllers down: start the service in a cgroup of its own "
                    "(`systemd-run --user --scope -p Delegate=yes cubicle serve`)"
                )
            service = own / "service"
            service.mkdir(exist_ok=True)
            _write(service / "cgroup.procs", str(os.getpid()))
        enable = " ".join(f"+{name}" for name in controllers)
        _write(own / "cgroup.subtree_control", enable)
        desktops = own / ("desktops" if own != root else f"cubicle-{os.getpid()}")
        desktops.mkdir(exist_ok=True)
        _write(desktops / "cgroup.subtree_control", enable)
        return cls(2, (desktops,), f"cgroup v2 under {desktops}", controllers)

    # --- desktops --------------------------------------------------------------------------

    def cap(self, limits: Limits) -> None:
        """Cap everything this service's desktops use together (service-wide limits)."""
        self._apply(self.parents, limits)

    def create(self, name: str, limits: Limits) -> Cgroup:
        """Make a desktop's cgroup with its limits."""
        paths = tuple(parent / name for parent in self.parents)
        for path in paths:
            path.mkdir()
        cgroup = Cgroup(self.version, paths, self.controllers)
        try:
            self._apply(paths, limits)
        except BaseException:
            cgroup.kill_all()
            raise
        return cgroup

    def _apply(self, paths: Iterable[Path], limits: Limits) -> None:
        paths = tuple(paths)
        if self.version == 2:
            (path,) = paths
            if limits.memory_mb is not None:
                _write(path / "memory.max", str(limits.memory_mb * 1024 * 1024))
                with contextlib.suppress(FileNotFoundError):  # a kernel without swap
                    _write(path / "memory.swap.max", "0")
            if limits.max_pids is not None:
                _write(path / "pids.max", str(limits.max_pids))
            if "cpu" in self.controllers:
                _write(path / "cpu.weight", str(limits.cpu_weight))
                if limits.cpu_cores is not None:
                    _write(path / "cpu.max", f"{int(limits.cpu_cores * 100_000)} 100000")
            return
        by_name = dict(zip(self.controllers, paths, strict=True))
        memory, pids, cpu = by_name["memory"], by_name["pids"], by_name.get("cpu")
        if limits.memory_mb is not None:
            limit = str(limits.memory_mb * 1024 * 1024)
            # memsw (memory + swap) must stay >= the memory limit: raise it first, lower after.
            _write(memory / "memory.limit_in_bytes", limit)
            with contextlib.suppress(OSError):  # absent without swap accounting
                _write(memory / "memory.memsw.limit_in_bytes", limit)
        if limits.max_pids is not None:
            _write(pids / "pids.max", str(limits.max_pids))
        if cpu is None:
            return
        _write(cpu / "cpu.shares", str(max(2, limits.cpu_weight * 1024 // 100)))
        if limits.cpu_cores is not None:
            _write(cpu / "cpu.cfs_period_us", "100000")
            _write(cpu / "cpu.cfs_quota_us", str(int(limits.cpu_cores * 100_000)))

    def close(self) -> None:
        """Remove this service's parent cgroups once its desktops are gone; idempotent."""
        for path in self.parents:
            _rmdir(path, timeout_s=0.5)


def find(desktop_id: str, *, root: Path = ROOT, max_depth: int = 8) -> Cgroup | None:
    """The cgroup(s) of desktop `desktop_id`, wherever its service put them (for tools
    and tests outside the service: benchmarks, the escape suite)."""

    def search(top: Path) -> Path | None:
        for directory, subdirs, _ in os.walk(top):
            depth = len(Path(directory).relative_to(top).parts)
            if depth >= max_depth:
                subdirs.clear()
            if desktop_id in subdirs and Path(directory).name.startswith(("cubicle-", "desktops")):
                return Path(directory, desktop_id)
        return None

    if (root / "cgroup.controllers").is_file():
        found = search(root)
        return Cgroup(2, (found,)) if found else None
    paths = [search(root / name) for name in CONTROLLERS]
    if paths[0] is None or paths[1] is None:
        return None
    found = tuple(p for p in paths if p is not None)
    return Cgroup(1, found, CONTROLLERS[: len(found)])


def _sweep(directory: Path) -> None:
    """Remove the empty cgroups that services which died left in `directory`."""
    for stale in directory.glob("cubicle-*"):
        pid = stale.name.removeprefix("cubicle-").removesuffix(".scope")
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        for path in sorted(stale.rglob("*"), key=lambda p: -len(p.parts)):
            if path.is_dir():
                _rmdir(path, timeout_s=0)
        _rmdir(stale, timeout_s=0)


def _procs(directory: Path) -> list[int]:
    return [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]
