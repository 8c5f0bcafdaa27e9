"""The `local` runtime: each desktop in a bubblewrap sandbox on this host.

A sandbox gets its own user, pid, mount, ipc, uts, cgroup and network namespaces; sees the
system read-only (`/usr` and a short list of `/etc`) and nothing else of the host; writes
only to its own disk (home, /tmp, /var/tmp, its runtime directory: an ext4 image of
`disk_mb`, `cubicle.server.runtime.disk`) and two small tmpfs (/run, /dev/shm); runs under a
seccomp filter (`cubicle.server.runtime.syscalls`) with no user namespaces of its own; runs as a
host user id of its own when the service runs as root (so even a mount escape meets plain
file permissions); and is held to memory, process and CPU limits by a cgroup below the
service's own (`cubicle.server.runtime.cgroups`, v2 or v1). Its guest daemon serves on a
listening socket the host made and passed in: nothing inside can replace it. Without
`network`, only loopback exists inside; with it, slirp4netns, unprivileged and under the
egress policy (`cubicle.server.runtime.network`).

Where this host cannot enforce a limit, creating a desktop fails with what is missing,
unless the operator opted out with `CUBICLE_UNSAFE_NO_LIMITS=1`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from cubicle.protocol.errors import (
    CapacityReached,
    Conflict,
    NotSupported,
    SandboxError,
    SandboxStartError,
)
from cubicle.protocol.models import GuestEvent
from cubicle.protocol.service import SnapshotInfo
from cubicle.server.guest_client import GuestEndpoint
from cubicle.server.runtime import (
    bwrap,
    cgroups,
    disk,
    disk_snapshots,
    priority,
    syscalls,
    users,
)
from cubicle.server.runtime.base import Runtime, Sandbox, SandboxEgress, SandboxSpec, Usage
from cubicle.server.runtime.network import EgressRules, UserNetwork
from cubicle.server.runtime.pipes import PipeReader

log = logging.getLogger("cubicle.runtime.local")

GUEST_HOME = bwrap.GUEST_HOME
HOME_SKELETON = bwrap.CODE_ROOT / "images" / "home"


@dataclass(frozen=True)
class Hardening:
    """How the runtime holds its desktops (from the service's settings)."""

    unsafe_no_limits: bool = False
    """Start desktops even where a limit cannot be enforced (loudly)."""
    off: bool = False
    """No seccomp, cgroups or disk images at all: only to measure what they cost."""
    total_memory_mb: int | None = None
    """Memory of every desktop together (the kernel's cap on their parent cgroup)."""
    total_pids: int | None = None
    spare_disk_mb: int | None = None
    """The default disk size: one disk of it is kept mounted for the next desktop."""
    cpu_cap: bool = False
    """Desktops get a CPU cap (`CUBICLE_CPU_CORES`), so they join the cpu controller."""
    egress: EgressRules = field(default_factory=EgressRules)


class LocalSandbox(Sandbox):
    def __init__(
        self,
        spec: SandboxSpec,
        directory: Path,
        process: asyncio.subprocess.Process,
        status: PipeReader,
        cgroup: cgroups.Cgroup | None,
        desk: disk.Disk | None,
        release_slot: Callable[[], None],
        info_fd: int,
    ) -> None:
        self.id = spec.id
        self.endpoint = GuestEndpoint(uds=str(directory / "guest.sock"), secret=spec.secret)
        self.directory = directory
        self.cgroup = cgroup
        self.disk = desk
        self.network: UserNetwork | None = None
        self._process = process
        self._status = status
        self._release_slot = release_slot
        self._last_failure: str | None = None
        self._stopped = False
        self.info_fd = info_fd
        """bwrap's `--info-fd`, read once by the runtime as the sandbox starts."""
        self.bwrap_pid = process.pid
        """The launcher exec'd its way to bwrap (`cubicle.server.runtime.bwrap`): same pid."""
        self.niced = spec.nice > 0 and priority.can_raise()
        self.child_pid: int | None = None
        """The sandbox's first process (bwrap's child), once bwrap said it."""
        self.paused = False
        self._park_into: Path | None = None

    def set_egress(self, rules: SandboxEgress) -> None:
        if self.network is None:
            raise Conflict(
                f'desktop {self.id} has no network to rule: create it with "network": true'
            )
        self.network.set_rules(rules)

    def network_namespace(self) -> tuple[int, Path] | None:
        if self.child_pid is None:
            return None
        return self.child_pid, self.directory / "etc" / "hosts"

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
            lines = (self.directory / "sandbox.log").read_text(errors="replace").splitlines()
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
        if self.cgroup is not None:
            with contextlib.suppress(FileNotFoundError):
                return self.cgroup.pids()
        return [self._process.pid]

    def usage(self) -> Usage | None:
        cgroup = self.cgroup
        if cgroup is None:
            return None
        try:
            rx_tx = _net_bytes(self.child_pid) if self.network is not None else (None, None)
            return Usage(
                cpu_s=cgroup.cpu_seconds(),
                memory_bytes=cgroup.memory_bytes(),
                memory_cache_bytes=cgroup.memory_cache_bytes(),
                disk_bytes=self.disk.allocated_bytes() if self.disk is not None else None,
                net_rx_bytes=rx_tx[0],
                net_tx_bytes=rx_tx[1],
            )
        except (OSError, ValueError):  # ended meanwhile
            return None

    async def pause(self) -> None:
        cgroup = self.cgroup
        if cgroup is None or not cgroup.can_freeze:
            raise NotSupported(
                "this host gives desktops no cgroup freezer (cgroup v2, or v1's freezer "
                "controller mounted and writable), so they cannot pause"
            )
        try:
            await asyncio.to_thread(cgroup.freeze, True)
        except (OSError, TimeoutError) as exc:
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.to_thread(cgroup.freeze, False)
            raise SandboxError(f"desktop {self.id} could not be paused: {exc}") from exc
        self.paused = True

    async def resume(self) -> None:
        if not self.paused or self.cgroup is None:
            return
        try:
            await asyncio.to_thread(self.cgroup.freeze, False)
        except (OSError, TimeoutError) as exc:
            raise SandboxError(f"desktop {self.id} could not be resumed: {exc}") from exc
        self.paused = False

    async def foreground(self) -> None:
        if not self.niced:
            return
        self.niced = False

        def everything() -> list[int]:
            if self.cgroup is not None:
                return self.pids()
            return priority.descendants(self._process.pid)

        await asyncio.to_thread(priority.raise_to_normal, everything)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGKILL)
        if self.paused and self.cgroup is not None:  # cgroup v1 kills no frozen process
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.to_thread(self.cgroup.freeze, False)
        if self.network is not None:
            await self.network.stop()
        await self._process.wait()
        self._status.close()
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.kill_all)
        if self.disk is not None and self._park_into is not None:
            await asyncio.to_thread(self.disk.detach, self._park_into)
        elif self.disk is not None:
            await asyncio.to_thread(self.disk.release)
        await asyncio.to_thread(shutil.rmtree, self.directory, True)
        self._release_slot()

    async def park(self, *, keep_memory: bool = False) -> Path:
        if keep_memory:
            raise NotSupported(
                "a local desktop's memory is its processes on this host's kernel: parked, "
                "it keeps its disk only"
            )
        if self.disk is None:
            raise NotSupported(
                f"desktop {self.id} has no disk of its own to keep (hardening is off)"
            )
        self._park_into = self.directory.parent.parent / "parked" / f"{self.id}.img"
        await self.stop()
        return self._park_into


class LocalRuntime(Runtime):
    """Starts desktops under bubblewrap on this host."""

    name = "local"
    joins_networks = True
    desktop_egress = True
    mounts_volumes = True

    def __init__(
        self, data_dir: Path, *, max_sandboxes: int = 64, hardening: Hardening | None = None
    ) -> None:
        self.root = data_dir / "desktops"
        self.max_sandboxes = max_sandboxes
        self.hardening = hardening or Hardening()
        self.as_root = os.geteuid() == 0
        self._running = 0
        self._python_paths = bwrap.python_paths()
        missing = [tool for tool in ("bwrap", "Xvfb", "prlimit") if shutil.which(tool) is None]
        if missing:
            raise SandboxStartError(f"{', '.join(missing)} not installed: run scripts/bootstrap.sh")
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_root:  # sandbox users must walk into their own directory, not list others
            for path in (data_dir, self.root):
                path.chmod(0o711)
        self.disks = disk.Disks(
            data_dir / "disks",
            HOME_SKELETON,
            spares_in=self.root,
            # A runtime for one desktop (a Ray node's desktop actor) would never use a spare.
            spare_mb=None
            if self.hardening.off or max_sandboxes == 1
            else self.hardening.spare_disk_mb,
        )
        self._joined: int | None = disk.join(self.root)
        self.saved = disk_snapshots.DiskSnapshots(data_dir / "snapshots")
        """Named snapshots of desktops' disks (`POST /api/desktops/{id}/snapshot`)."""
        self._etc = bwrap.sandbox_etc(data_dir) if not self.hardening.off else {}
        self.problems: list[str] = []
        """What this host cannot enforce; creating a desktop fails with it (unless unsafe)."""
        self.hierarchy = self._cgroups()
        self.filter = self._filter()
        if not self.hardening.off:
            try:
                self.disks.check()
            except disk.DiskUnavailable as exc:
                self.problems.append(str(exc))
        if self.problems and self.hardening.unsafe_no_limits:
            for problem in self.problems:
                log.warning("UNSAFE (CUBICLE_UNSAFE_NO_LIMITS=1): not enforced: %s", problem)
        if self.hardening.off:
            log.warning("UNSAFE: sandbox hardening is OFF (seccomp, cgroups, disk caps)")

    async def snapshot(self, sandbox: Sandbox, name: str) -> SnapshotInfo:
        """Save a desktop's disk as snapshot `name`, frozen for the copy (it goes on running,
        or stays paused); desktops started from it get a copy of that disk."""
        assert isinstance(sandbox, LocalSandbox)
        if sandbox.disk is None:
            raise Conflict(
                f"desktop {sandbox.id} has no disk of its own to save (hardening is off)"
            )
        was_paused = sandbox.paused
        if not was_paused:
            await sandbox.pause()
        try:
            saved = await asyncio.to_thread(self.saved.save, name, sandbox.id, sandbox.disk)
        finally:
            if not was_paused:
                await sandbox.resume()
        return saved.info()

    def snapshots(self) -> list[SnapshotInfo]:
        return [saved.info() for saved in self.saved.all()]

    async def delete_snapshot(self, name: str) -> bool:
        try:
            await asyncio.to_thread(self.saved.remove, name)
        except disk_snapshots.LocalSnapshotNotFound:
            return False
        return True

    @property
    def can_pause(self) -> bool:  # type: ignore[override]
        hierarchy = self.hierarchy
        return hierarchy is not None and (
            hierarchy.version == 2 or cgroups.FREEZER in hierarchy.controllers
        )

    def _cgroups(self) -> cgroups.Hierarchy | None:
        if self.hardening.off:
            return None
        try:
            hierarchy = cgroups.Hierarchy.detect(cpu=self.hardening.cpu_cap)
            hierarchy.cap(cgroups.Limits(self.hardening.total_memory_mb, self.hardening.total_pids))
        except (cgroups.CgroupUnavailable, OSError) as exc:
            self.problems.append(f"memory, process and CPU limits: {exc}")
            return None
        log.info("desktop limits: %s", hierarchy.note)
        return hierarchy

    def _filter(self) -> syscalls.Filter | None:
        if self.hardening.off:
            return None
        try:
            return syscalls.build()
        except syscalls.SeccompUnavailable as exc:
            self.problems.append(str(exc))
            return None

    async def close(self) -> None:
        await self.disks.close()
        joined, self._joined = self._joined, None
        if joined is not None:
            os.close(joined)
        if self.hierarchy is not None:
            await asyncio.to_thread(self.hierarchy.close)

    def _plain_home(self, directory: Path, host_uid: int | None) -> Path:
        """A home directory on the host's disk, without a cap (hardening off, or unsafe)."""
        home = directory / "home"
        shutil.copytree(HOME_SKELETON, home, symlinks=True)
        if host_uid is not None:
            for path in (home, *home.rglob("*")):
                os.lchown(path, host_uid, host_uid)
        return home

    def _listen(self, directory: Path) -> socket.socket:
        """The guest's listening socket, made here where the sandbox cannot reach it."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = directory / "guest.sock"
        listener.bind(str(path))
        path.chmod(0o600)
        listener.listen(64)
        return listener

    async def start(self, spec: SandboxSpec) -> Sandbox:
        if spec.snapshot is not None:
            saved = await asyncio.to_thread(self.saved.get, spec.snapshot)
            spec = dataclasses.replace(spec, disk_mb=saved.size_mb)
        if self._running >= self.max_sandboxes:
            raise CapacityReached(
                f"all {self.max_sandboxes} desktop slots are in use: kill a desktop first"
            )
        if self.problems and not self.hardening.unsafe_no_limits:
            raise SandboxStartError(
                "this host cannot enforce a desktop's limits: "
                + "; ".join(self.problems)
                + " (or set CUBICLE_UNSAFE_NO_LIMITS=1 to run without them)"
            )
        host_uid, lock_fd = users.claim() if self.as_root else (None, None)
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

    async def _prepare(
        self, spec: SandboxSpec, host_uid: int | None
    ) -> tuple[Path, disk.Disk | None, cgroups.Cgroup | None]:
        directory = self.root / spec.id
        desk = cgroup = None
        try:
            if spec.snapshot is not None or spec.disk_image is not None:
                if self.hardening.off or self.disks.missing:
                    raise SandboxStartError("a saved disk needs desktops' own disks on this host")
                source = spec.disk_image or self.saved.get(spec.snapshot or "").image
                desk = await self.disks.create(directory, spec.disk_mb, host_uid, source)
                await asyncio.to_thread(disk_snapshots.scrub, desk)
                if spec.disk_image is not None:  # taken over: the copy is its disk now
                    await asyncio.to_thread(spec.disk_image.unlink, True)
            elif not self.hardening.off and not self.disks.missing:
                desk = await self.disks.create(directory, spec.disk_mb, host_uid)
            else:
                directory.mkdir()
            # The service's umask is 077: modes are set explicitly.
            directory.chmod(0o711 if host_uid is not None else 0o700)
            if self.hierarchy is not None:
                limits = cgroups.Limits(spec.memory_mb, spec.max_pids, spec.cpu_cores)
                cgroup = await asyncio.to_thread(self.hierarchy.create, spec.id, limits)
        except BaseException as exc:
            if desk is not None:
                await asyncio.to_thread(desk.release)
            await asyncio.to_thread(shutil.rmtree, directory, True)
            if isinstance(exc, OSError):
                raise SandboxStartError(f"could not prepare the desktop's limits: {exc}") from exc
            raise
        return directory, desk, cgroup

    async def _start(self, spec: SandboxSpec, host_uid: int | None, release) -> Sandbox:
        directory, desk, cgroup = await self._prepare(spec, host_uid)
        try:
            sandbox = await self._launch(spec, host_uid, directory, desk, cgroup, release)
        except BaseException:
            if cgroup is not None:
                await asyncio.to_thread(cgroup.kill_all)
            if desk is not None:
                await asyncio.to_thread(desk.release)
            raise
        try:
            info = await asyncio.wait_for(asyncio.to_thread(_read_json, sandbox.info_fd), 10)
            sandbox.child_pid = info.get("child-pid")
            if sandbox.niced:  # bwrap's --new-session made a session group at nice 0
                await asyncio.to_thread(priority.lower_group, info["child-pid"], spec.nice)
            if spec.network:
                log_fd = os.open(directory / "sandbox.log", os.O_WRONLY | os.O_APPEND)
                try:
                    rules = directory / "egress-rules.json"
                    sandbox.network = UserNetwork(self.hardening.egress, log_fd, rules)
                finally:
                    os.close(log_fd)
                await sandbox.network.start(sandbox.bwrap_pid, host_uid)
            log.debug("desktop %s: sandbox pid %s", spec.id, info.get("child-pid"))
        except BaseException:
            await sandbox.stop()
            raise
        return sandbox

    async def _launch(
        self,
        spec: SandboxSpec,
        host_uid: int | None,
        directory: Path,
        desk: disk.Disk | None,
        cgroup: cgroups.Cgroup | None,
        release,
    ) -> LocalSandbox:
        etc_files = await asyncio.to_thread(
            bwrap.etc_files, directory, spec.id, spec.network, spec.hosts, spec.trust_pem
        )
        binds = bwrap.Binds(host_uid)
        for dest, source in etc_files.items():
            binds.add(source, dest)
        if desk is not None:
            home = desk.path("home")
        else:
            home = await asyncio.to_thread(self._plain_home, directory, host_uid)
        binds.add(home, GUEST_HOME, writable=True)
        for host, inside, read_only in spec.volumes:  # after the home: some are inside it
            if not read_only and host_uid is not None:  # its writer's files are its own
                await asyncio.to_thread(disk.chown_tree, Path(host), host_uid)
            binds.add(Path(host), inside, writable=not read_only)
        for path in self._python_paths:
            binds.add(path, str(path))
        secret = None
        if spec.secret is not None:
            # The guest reads it at start; the desktop's programs may read it too, and gain
            # nothing by it: the guest's socket is out of their reach.
            secret = directory / "secret"
            await asyncio.to_thread(secret.write_text, spec.secret)
            secret.chmod(0o400)
            if host_uid is not None:
                os.lchown(secret, host_uid, host_uid)
            binds.add(secret, bwrap.GUEST_SECRET)
        layout = bwrap.Layout(
            disk=desk.mountpoint if desk else None,
            home=home,
            shm_bytes=min(spec.memory_mb // 2, 1024) * 1024 * 1024,
        )
        listener = self._listen(directory)
        listen_fd = listener.fileno()
        status_r, status_w = os.pipe()
        info_r, info_w = os.pipe()
        seccomp_fd = self.filter.pipe() if self.filter is not None else None
        argv = bwrap.bwrap_argv(
            spec.id, layout, binds, network=spec.network, width=spec.width,
            height=spec.height, max_file_bytes=spec.max_file_bytes, status_fd=status_w,
            info_fd=info_w, listen_fd=listen_fd, seccomp_fd=seccomp_fd, etc=self._etc,
            secret=secret is not None,
            env=bwrap.desktop_env(spec),
            hardened=not self.hardening.off,
        )  # fmt: skip
        # RLIMIT_NPROC counts per host user: with a user id per sandbox, per sandbox. Under
        # a cgroup it is only a backstop, a little above the cgroup's own count.
        rlimits = ["--core=0"]
        if host_uid is not None:
            rlimits.append(f"--nproc={spec.max_pids + (64 if cgroup else 0)}")
        if cgroup is None:
            rlimits.append(f"--as={spec.memory_mb * 4 * 1024 * 1024}")
        launcher = bwrap.launcher_argv(
            argv,
            nice=spec.nice if spec.nice and priority.can_raise() else 0,
            join_cgroup=cgroup.join_argv() if cgroup else [],
            rlimits=rlimits,
            host_uid=host_uid,
            network=spec.network,
        )
        log_fd = os.open(directory / "sandbox.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        passed = [status_w, info_w, listen_fd, *([seccomp_fd] if seccomp_fd is not None else [])]
        try:
            process = await asyncio.create_subprocess_exec(
                *launcher,
                pass_fds=passed,
                env=bwrap.guest_env(),
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
            for fd in (status_w, info_w, log_fd, *([seccomp_fd] if seccomp_fd is not None else [])):
                os.close(fd)
            listener.close()
        status = PipeReader(status_r)
        return LocalSandbox(spec, directory, process, status, cgroup, desk, release, info_r)


def _net_bytes(pid: int | None) -> tuple[int | None, int | None]:
    """Bytes received and sent by the network namespace of `pid`, loopback aside."""
    if pid is None:
        return None, None
    rx = tx = 0
    for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]:
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            continue
        fields = counters.split()
        rx, tx = rx + int(fields[0]), tx + int(fields[8])
    return rx, tx


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
