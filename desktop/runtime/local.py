"""The `local` runtime: each desktop in a bubblewrap sandbox on this host.

A sandbox gets its own user, pid, mount, ipc, uts, cgroup and network namespaces; sees the
system read-only (`/usr` and a short list of `/etc`), its own writable home and /tmp,
and nothing else of the host; runs as a host user id of its own when the service runs as
root (so even a mount escape meets plain file permissions); and is held to memory,
process and CPU limits through cgroups where the host allows them. Without `network`,
only loopback exists inside; with it, slirp4netns gives a user-mode network that cannot
reach the host's loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import ValidationError

import desktop
from desktop.guest_client import GuestEndpoint
from desktop.protocol.errors import CapacityReached, InvalidRequest, SandboxStartError
from desktop.protocol.models import GuestEvent
from desktop.runtime import cgroups, priority
from desktop.runtime.base import Runtime, Sandbox, SandboxSpec
from desktop.runtime.pipes import PipeReader

log = logging.getLogger("cubicle.runtime.local")

GUEST_UID = 1000
"""The user id a desktop's programs have inside the sandbox."""
GUEST_HOME = "/home/user"
GUEST_RUN = "/run/cubicle"
HOST_UID_BASE = 200_000
"""Host user ids of sandboxes when the service runs as root: base + slot."""
UID_SLOTS = 1000
LOCK_DIR = Path("/run/lock/cubicle")

ETC_ALLOWLIST = (
    "alternatives", "bash.bashrc", "ca-certificates", "chromium", "chromium.d",
    "debian_version", "dbus-1", "environment", "fonts", "gai.conf", "gtk-2.0", "gtk-3.0",
    "host.conf", "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
    "mime.types", "nsswitch.conf", "os-release", "pango", "profile", "protocols",
    "python3", "python3.11", "services", "shells", "ssl", "timezone", "vim", "X11", "xdg",
)  # fmt: skip
"""What of the host's /etc a desktop may read: configuration of the programs it runs."""

FONT_CACHE = Path("/var/cache/fontconfig")
"""The system's font cache (`fc-cache`), shared read-only with every desktop."""

IMAGES = Path(desktop.__file__).resolve().parent.parent / "images"
HOME_SKELETON = IMAGES / "home"


def _merged_usr_links() -> list[str]:
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    return args


def _python_paths() -> tuple[list[Path], Path]:
    """What the guest needs bound to run this interpreter and import `desktop`."""
    paths = [Path(p) for p in {sys.prefix, sys.base_prefix} if not p.startswith("/usr")]
    code_root = Path(desktop.__file__).resolve().parent.parent
    if not str(code_root).startswith((sys.prefix, "/usr")):
        paths += [
            code_root / name for name in ("desktop", "streaming") if (code_root / name).is_dir()
        ]
    return paths, code_root


def _unreachable(path: Path, uid: int) -> Path | None:
    """The first directory on the way to `path` that user `uid` cannot enter, if any."""
    for parent in [*reversed(path.parents), path]:
        info = parent.stat()
        allowed = 0o100 if info.st_uid == uid else 0o001
        if not info.st_mode & allowed:
            return parent
    return None


class _Binds:
    """Bind mount arguments for bwrap, checked to be reachable by the sandbox's user."""

    def __init__(self, uid: int | None) -> None:
        self.args: list[str] = []
        self._uid = uid

    def add(self, source: Path, dest: str, *, writable: bool = False) -> None:
        if self._uid is not None and (blocked := _unreachable(source.parent, self._uid)):
            raise SandboxStartError(
                f"sandbox users cannot enter {blocked} on the way to {source}: "
                "install Cubicle and its data directory under world-traversable paths "
                "(e.g. /opt, /srv, /var/lib) or `chmod o+x` that directory"
            )
        self.args += ["--bind" if writable else "--ro-bind", str(source), dest]


class LocalSandbox(Sandbox):
    def __init__(
        self,
        spec: SandboxSpec,
        directory: Path,
        process: asyncio.subprocess.Process,
        status: PipeReader,
        cgroup: cgroups.Cgroup | None,
        release_slot,
    ) -> None:
        self.id = spec.id
        self.endpoint = GuestEndpoint(uds=str(directory / "run" / "guest.sock"), secret=spec.secret)
        self._directory = directory
        self._process = process
        self._status = status
        self._cgroup = cgroup
        self._release_slot = release_slot
        self._slirp: asyncio.subprocess.Process | None = None
        self._last_failure: str | None = None
        self._stopped = False
        self._niced = spec.nice > 0 and priority.can_raise()

    async def events(self) -> AsyncIterator[GuestEvent]:
        while line := await self._status.readline():
            try:
                event = GuestEvent.model_validate_json(line)
            except ValidationError:
                log.warning("desktop %s: a status line that is no event: %.200r", self.id, line)
                continue
            if event.event == "failed":
                self._last_failure = event.reason
            yield event

    def _log_tail(self) -> str:
        try:
            lines = (self._directory / "sandbox.log").read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return " / ".join(line.strip() for line in lines[-3:] if line.strip())

    async def wait(self) -> str:
        code = await self._process.wait()
        if self._stopped:
            return "stopped"
        if self._last_failure:
            return self._last_failure
        tail = self._log_tail()
        return f"sandbox exited with status {code}" + (f": {tail}" if tail else "")

    def pids(self) -> list[int]:
        if self._cgroup is not None:
            with contextlib.suppress(FileNotFoundError):
                return self._cgroup.pids()
        return [self._process.pid]

    async def foreground(self) -> None:
        if not self._niced:
            return
        self._niced = False

        def everything() -> list[int]:
            if self._cgroup is not None:
                return self.pids()
            return priority.descendants(self._process.pid)

        await asyncio.to_thread(priority.raise_to_normal, everything)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        if self._slirp is not None and self._slirp.returncode is None:
            self._slirp.kill()
            await self._slirp.wait()
        await self._process.wait()
        self._status.close()
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.kill_all)
        await asyncio.to_thread(shutil.rmtree, self._directory, True)
        self._release_slot()

    async def attach_network(self, child_pid: int) -> None:
        """Give the sandbox's network namespace a slirp4netns user-mode network.

        slirp4netns enters the namespace by path: the sandbox's user namespace is nested
        below the one that owns its network namespace, so joining it (slirp's default)
        would leave slirp without the right to enter. That takes root, so slirp confines
        itself (`--enable-sandbox`: empty root, no capabilities; and seccomp).
        """
        ready_r, ready_w = os.pipe()
        try:
            self._slirp = await asyncio.create_subprocess_exec(
                "slirp4netns",
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                "--enable-sandbox",
                "--enable-seccomp",
                f"--ready-fd={ready_w}",
                "--netns-type=path",
                f"/proc/{child_pid}/ns/net",
                "tap0",
                pass_fds=(ready_w,),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise SandboxStartError(
                "slirp4netns is not installed: run scripts/bootstrap.sh"
            ) from exc
        finally:
            os.close(ready_w)
        try:
            ready = await asyncio.wait_for(asyncio.to_thread(os.read, ready_r, 1), 10)
        finally:
            os.close(ready_r)
        if ready != b"1":
            raise SandboxStartError("slirp4netns did not bring up the desktop's network")


class LocalRuntime(Runtime):
    """Starts desktops under bubblewrap on this host."""

    name = "local"

    def __init__(self, data_dir: Path, *, max_sandboxes: int = 64) -> None:
        self.root = data_dir / "desktops"
        self.max_sandboxes = max_sandboxes
        self.as_root = os.geteuid() == 0
        self.limits = "cgroups" if self.as_root and cgroups.available() else "rlimits"
        self._running = 0
        self._python_paths, self._code_root = _python_paths()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_root:  # sandbox users must walk into their own directory, not list others
            for path in (data_dir, self.root):
                path.chmod(0o711)
        missing = [tool for tool in ("bwrap", "Xvfb") if shutil.which(tool) is None]
        if missing:
            raise SandboxStartError(
                f"{', '.join(missing)} not installed: run scripts/bootstrap.sh (or `make setup`)"
            )
        if self.limits == "rlimits":
            log.warning("cgroups not writable here: limits are per-process rlimits only")

    def _etc_files(self, directory: Path, spec: SandboxSpec) -> dict[str, Path]:
        etc = directory / "etc"
        etc.mkdir()
        files = {
            "passwd": f"user:x:{GUEST_UID}:{GUEST_UID}:Cubicle:{GUEST_HOME}:/bin/bash\n"
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            "group": f"user:x:{GUEST_UID}:\nnogroup:x:65534:\n",
            "hostname": f"cubicle-{spec.id}\n",
            "hosts": f"127.0.0.1 localhost cubicle-{spec.id}\n::1 localhost\n",
            "machine-id": os.urandom(16).hex() + "\n",
            "resolv.conf": "nameserver 10.0.2.3\n" if spec.network else "",
        }
        for name, text in files.items():
            (etc / name).write_text(text)
        return {f"/etc/{name}": etc / name for name in files}

    def _prepare(self, spec: SandboxSpec, host_uid: int | None) -> tuple[Path, dict[str, Path]]:
        directory = self.root / spec.id
        directory.mkdir(mode=0o700)
        home, run = directory / "home", directory / "run"
        shutil.copytree(HOME_SKELETON, home, symlinks=True)
        run.mkdir()
        if spec.secret is not None:
            # The guest's own run directory: the desktop's programs may read it, and gain
            # nothing by it (they reach this guest's socket there already).
            (run / "secret").write_text(spec.secret)
            (run / "secret").chmod(0o400)
        if host_uid is not None:
            for path in (directory, home, run, *run.iterdir(), *home.rglob("*")):
                os.lchown(path, host_uid, host_uid)
        return directory, self._etc_files(directory, spec)

    def _bwrap_argv(
        self, spec: SandboxSpec, directory: Path, binds: _Binds, status_fd: int, info_fd: int
    ) -> list[str]:
        argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
        argv += ["--uid", str(GUEST_UID), "--gid", str(GUEST_UID)]
        argv += ["--hostname", f"cubicle-{spec.id}"]
        argv += ["--ro-bind", "/usr", "/usr", *_merged_usr_links()]
        for name in ETC_ALLOWLIST:
            if Path("/etc", name).exists():
                argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]
        argv += ["--dir", "/var/tmp", "--dir", f"/run/user/{GUEST_UID}"]
        if FONT_CACHE.is_dir():  # without it, every GTK program scans each font file at start
            argv += ["--ro-bind", str(FONT_CACHE), str(FONT_CACHE)]
        argv += binds.args
        argv += ["--chdir", GUEST_HOME, "--info-fd", str(info_fd)]
        argv += [
            "--",
            sys.executable,
            "-m",
            "desktop.guest",
            f"--listen=unix:{GUEST_RUN}/guest.sock",
            f"--width={spec.width}",
            f"--height={spec.height}",
            f"--home={GUEST_HOME}",
            f"--status-fd={status_fd}",
            f"--max-file-bytes={spec.max_file_bytes}",
        ]
        if spec.secret is not None:
            argv.append(f"--secret-file={GUEST_RUN}/secret")
        return argv

    def _guest_env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": GUEST_HOME,
            "USER": "user",
            "LANG": "C.UTF-8",
            "XDG_RUNTIME_DIR": f"/run/user/{GUEST_UID}",
            "PYTHONPATH": str(self._code_root),
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def _claim_uid(self) -> tuple[int, int]:
        """A host user id no other sandbox on this host holds, and the lock that holds it.

        Several services may run on one host (tests, benchmarks): a lock file per user id
        keeps two sandboxes from ever sharing one, and the kernel drops the lock when the
        holder dies, so a crash leaks nothing.
        """
        LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        for slot in range(UID_SLOTS):
            uid = HOST_UID_BASE + slot
            fd = os.open(LOCK_DIR / f"uid-{uid}", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return uid, fd
        raise CapacityReached(f"all {UID_SLOTS} sandbox user ids on this host are in use")

    async def start(self, spec: SandboxSpec) -> Sandbox:
        if spec.snapshot is not None:
            raise InvalidRequest(
                "the local runtime has no snapshots: create it with runtime microvm"
            )
        if self._running >= self.max_sandboxes:
            raise CapacityReached(
                f"all {self.max_sandboxes} desktop slots are in use: kill a desktop first"
            )
        if spec.network and not self.as_root:
            raise SandboxStartError(
                "network: true needs the service to run as root (slirp4netns must enter "
                "the sandbox's network namespace); run without network or as root"
            )
        host_uid, lock_fd = self._claim_uid() if self.as_root else (None, None)
        self._running += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._running -= 1
            if lock_fd is not None:
                os.close(lock_fd)

        try:
            return await self._start(spec, host_uid, release)
        except BaseException:
            release()
            with contextlib.suppress(OSError):
                await asyncio.to_thread(shutil.rmtree, self.root / spec.id, True)
            raise

    async def _spawn(
        self,
        spec: SandboxSpec,
        directory: Path,
        binds: _Binds,
        host_uid: int | None,
        cgroup: cgroups.Cgroup | None,
    ) -> tuple[asyncio.subprocess.Process, int, int]:
        """Start bwrap; returns it and the read ends of its status and info pipes."""
        status_r, status_w = os.pipe()
        info_r, info_w = os.pipe()
        bwrap = self._bwrap_argv(spec, directory, binds, status_w, info_w)
        # Join the cgroups first, then set rlimits, then drop to the sandbox's own user,
        # then start bwrap. RLIMIT_NPROC counts per host user: with a user id per sandbox,
        # per sandbox (without one it would count the service user's every process).
        limits = ["--core=0"]
        if host_uid is not None:
            limits.append(f"--nproc={spec.max_pids}")
        if cgroup is None:
            limits.append(f"--as={spec.memory_mb * 4 * 1024 * 1024}")
        run_as = []
        if host_uid is not None:
            run_as = [
                "setpriv",
                f"--reuid={host_uid}",
                f"--regid={host_uid}",
                "--clear-groups",
                "--",
            ]
        launcher = [
            *(priority.nice_argv(spec.nice) if spec.nice and priority.can_raise() else []),
            "/bin/sh",
            "-c",
            'for f in $CUBICLE_CGROUP_PROCS; do echo $$ > "$f" || exit 97; done; exec "$@"',
            "sh",
            "prlimit",
            *limits,
            "--",
            *run_as,
            *bwrap,
        ]
        env = self._guest_env()
        env["CUBICLE_CGROUP_PROCS"] = " ".join(cgroup.procs_files) if cgroup else ""
        log_fd = os.open(directory / "sandbox.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            process = await asyncio.create_subprocess_exec(
                *launcher,
                pass_fds=(status_w, info_w),
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(status_r)
            os.close(info_r)
            raise SandboxStartError(f"could not start bwrap: {exc}") from exc
        finally:
            os.close(status_w)
            os.close(info_w)
            os.close(log_fd)
        return process, status_r, info_r

    async def _start(self, spec: SandboxSpec, host_uid: int | None, release) -> Sandbox:
        directory, etc_files = await asyncio.to_thread(self._prepare, spec, host_uid)
        binds = _Binds(host_uid)
        for dest, source in etc_files.items():
            binds.add(source, dest)
        binds.add(directory / "home", GUEST_HOME, writable=True)
        binds.add(directory / "run", GUEST_RUN, writable=True)
        for path in self._python_paths:
            binds.add(path, str(path))
        cgroup = None
        if self.limits == "cgroups":
            cgroup = await asyncio.to_thread(
                cgroups.Cgroup.create,
                spec.id,
                memory_mb=spec.memory_mb,
                max_pids=spec.max_pids,
                cpu_cores=spec.cpu_cores,
            )
        try:
            process, status_r, info_r = await self._spawn(spec, directory, binds, host_uid, cgroup)
        except BaseException:
            if cgroup is not None:
                await asyncio.to_thread(cgroup.kill_all)
            raise
        status = PipeReader(status_r)
        sandbox = LocalSandbox(spec, directory, process, status, cgroup, release)
        try:
            info = await asyncio.wait_for(asyncio.to_thread(_read_json, info_r), 10)
            if sandbox._niced:  # bwrap's --new-session made a session group at nice 0
                await asyncio.to_thread(priority.lower_group, info["child-pid"], spec.nice)
            if spec.network:
                await sandbox.attach_network(info["child-pid"])
        except BaseException:
            await sandbox.stop()
            raise
        return sandbox


def _read_json(fd: int) -> dict:
    """Read bwrap's `--info-fd` object (it may keep the pipe open after writing it)."""
    data = b""
    try:
        while chunk := os.read(fd, 4096):
            data += chunk
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(data)
    finally:
        os.close(fd)
    raise SandboxStartError("bwrap exited before the sandbox started (see sandbox.log)")
