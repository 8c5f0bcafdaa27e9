"""A microVM desktop: booted cold (to make a template) or restored from a snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from cubicle.protocol.errors import SandboxStartError
from cubicle.server.runtime.base import Usage
from cubicle.server.runtime.microvm import snapshot as snapshots
from cubicle.server.runtime.microvm.channel import DesktopConfig, HostChannel, Identity
from cubicle.server.runtime.microvm.image import Image
from cubicle.server.runtime.microvm.network import DETACHED, Egress, PasstEgress
from cubicle.server.runtime.microvm.qemu import Accel, Machine, Vm, _connect_unix
from cubicle.server.runtime.microvm.snapshot import Shape, Snapshot
from cubicle.server.runtime.network import BUILT_IN, EgressRules

log = logging.getLogger("cubicle.runtime.microvm")

COLD_BOOT_TIMEOUT_S = 600.0
"""Seconds a cold boot (a template's, a parked VM's without memory) may take to draw its
desktop: TCG on a busy host."""


class MicroVm:
    """One running VM, its channel, and its private directory."""

    def __init__(
        self, desktop_id: str, directory: Path, vm: Vm, channel: HostChannel, shape: Shape
    ) -> None:
        self.id = desktop_id
        self.directory = directory
        self.vm = vm
        self.channel = channel
        self.shape = shape
        self.identity: Identity | None = None
        self._failure: str | None = None
        self._stopped = False
        self._release: list = []
        self._watchdog: asyncio.Task | None = None
        self.egress: Egress | None = None
        self.draw_timeout_s: float | None = None
        """Set when it boots cold (a parked VM without memory): how long drawing may take."""
        self.paused = False
        """Set while the VM is paused on purpose (paused by its user, or a snapshot being
        saved): no pings then."""

    @classmethod
    async def launch(
        cls,
        desktop_id: str,
        directory: Path,
        machine: Machine,
        shape: Shape,
        *,
        identity: Identity | None = None,
        rules: EgressRules = BUILT_IN,
        ignore_shared: bool = True,
    ) -> MicroVm:
        """Start QEMU and the channel's session; returns before the desktop is ready. With a
        network, what it may reach is the operator's `rules` (`cubicle.server.runtime.egress`)."""
        identity = identity or Identity.fresh(desktop_id, time.time())
        egress = PasstEgress(rules) if machine.network else None
        try:
            if egress is not None:
                netdev, net_fd = await egress.start(directory)
                machine = replace(machine, netdev=netdev, net_fd=net_fd)
            try:
                vm = await Vm.start(machine, ignore_shared=ignore_shared)
            finally:
                if machine.net_fd is not None:
                    os.close(machine.net_fd)
        except BaseException:
            if egress is not None:
                await egress.stop()
            raise
        channel = HostChannel(machine.channel_socket, directory / "guest.sock")
        try:
            reader, writer = await _connect_unix(machine.channel_socket, vm.process)
            await channel.start(
                Identity(**{**identity.__dict__, "clock": time.time()}),
                DesktopConfig(shape.width, shape.height, shape.max_file_bytes),
                reader,
                writer,
            )
        except BaseException:
            await channel.stop()
            await vm.stop()
            if egress is not None:
                await egress.stop()
            raise
        sandbox = cls(desktop_id, directory, vm, channel, shape)
        sandbox.identity = identity
        sandbox.egress = egress
        return sandbox

    def watch(self, hang_s: float, every_s: float = 2.0) -> None:
        """Ping the VM from now on; one that answers nothing for `hang_s` is hung: the
        desktop fails with that reason and QEMU is killed."""
        self._watchdog = asyncio.create_task(self._watch(hang_s, every_s), name=f"ping-{self.id}")

    async def _watch(self, hang_s: float, every_s: float) -> None:
        self.channel.last_pong = time.monotonic()
        while self.vm.process.returncode is None:
            if self.paused:
                self.channel.last_pong = time.monotonic()
            else:
                self.channel.ping()
            await asyncio.sleep(every_s)
            silent = time.monotonic() - self.channel.last_pong
            if silent > hang_s and not self.paused:
                self._failure = f"the VM stopped answering (hung for {silent:.0f} s): killed"
                log.warning("desktop %s: %s", self.id, self._failure)
                await self.vm.stop()
                return

    def usage(self) -> Usage | None:
        """QEMU's CPU time and resident memory, and the desktop's own disk layer."""
        pid = self.vm.process.pid
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            status = Path(f"/proc/{pid}/status").read_text()
            layer = (self.directory / "data.qcow2").stat().st_blocks * 512
        except (OSError, IndexError):
            return None
        rss = [line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")]
        rss_kb = int(rss[0]) if rss else 0
        ticks = int(stat[11]) + int(stat[12])
        return Usage(
            cpu_s=ticks / os.sysconf("SC_CLK_TCK"),
            memory_bytes=rss_kb * 1024,
            memory_cache_bytes=0,
            disk_bytes=layer,
        )

    async def pause(self) -> None:
        """Stop the VM's CPUs (QEMU's `stop`): its memory stays, nothing in it runs, and
        the watchdog stops pinging until `resume`."""
        self.paused = True
        try:
            await self.vm.qmp.execute("stop")
        except BaseException:
            self.paused = False
            raise

    async def resume(self) -> None:
        await self.vm.qmp.execute("cont")
        self.channel.last_pong = time.monotonic()
        self.paused = False

    async def park(self, into: Path, *, keep_memory: bool, source: str | None) -> None:
        """Stop the VM and keep it in directory `into` (see `unpark`): its disk layer, and
        with `keep_memory` its whole RAM and devices. Without, QEMU just ends: the caller
        has the guest write out its page cache first (`MicroVmSandbox.park`)."""
        await asyncio.to_thread(_private_dir, into)
        self.paused = True  # no pings from here on: it stops on purpose
        try:
            if keep_memory:
                await self.channel.quiesce()
                await self.vm.save(into / PARKED_STATE, ignore_shared=False)
            else:
                await self.vm.qmp.execute("stop")  # drains and flushes the disk
            await self.vm.stop()
            await asyncio.to_thread(os.replace, self.directory / "data.qcow2", into / "data.qcow2")
            assert self.identity is not None
            meta = {
                "shape": asdict(self.shape),
                "source": source,
                "hostname": self.identity.hostname,
                "machine_id": self.identity.machine_id,
            }
            await asyncio.to_thread((into / PARKED_META).write_text, json.dumps(meta))
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, into, True)
            raise
        finally:
            await self.stop()

    async def events(self) -> AsyncIterator[dict]:
        async for event in self.channel.events():
            if event.get("event") == "failed":
                self._failure = event.get("reason")
            yield event

    async def wait(self) -> str:
        await self.vm.process.wait()
        if self._stopped:
            return "stopped"
        return self._failure or self.vm.exit_reason()

    def pids(self) -> list[int]:
        return [self.vm.process.pid] if self.vm.process.returncode is None else []

    def on_stop(self, release) -> None:
        self._release.append(release)

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._watchdog is not None and self._watchdog is not asyncio.current_task():
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        await self.channel.stop()
        await self.vm.stop()
        if self.egress is not None:
            await self.egress.stop()
        await asyncio.to_thread(shutil.rmtree, self.directory, True)
        for release in self._release:
            release()


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True)
    return path


async def wait_ready(sandbox: MicroVm, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        await sandbox.channel.hello()
        async for event in sandbox.events():
            if event.get("event") == "ready":
                return
            if event.get("event") == "failed":
                reason = event.get("reason", "the guest reported a failure")
                raise SandboxStartError(f"{reason} ({sandbox.vm.console_tail()})")
    raise SandboxStartError(await sandbox.wait())


async def make_template(
    image: Image,
    shape: Shape,
    root: Path,
    run_dir: Path,
    accel: Accel,
    *,
    timeout_s: float,
    rules: EgressRules = BUILT_IN,
) -> Snapshot:
    """Cold-boot a VM of this shape until its desktop is drawn, and save it as a template."""
    final = root / shape.key()
    work = root / f".make-{shape.key()}"
    await asyncio.to_thread(snapshots.remove, work)
    await asyncio.to_thread(work.mkdir, parents=True)
    directory = await asyncio.to_thread(_private_dir, run_dir / f"template-{shape.key()}")
    started = time.monotonic()
    sandbox = None
    try:
        await snapshots.make_data_disk(work / "data.raw", shape.disk_mb)
        machine = Machine(
            image=image,
            memory_mb=shape.memory_mb,
            cpus=shape.cpus,
            network=shape.network,
            data_disk=work / "data.raw",
            memory_file=work / "memory",
            shared_memory=True,
            directory=directory,
            accel=accel,
        )
        sandbox = await MicroVm.launch(
            f"template-{shape.key()}", directory, machine, shape, rules=rules
        )
        try:
            await wait_ready(sandbox, timeout_s)
        except TimeoutError:
            raise SandboxStartError(
                f"the template's desktop was not drawn within {timeout_s:.0f} s "
                f"({sandbox.vm.console_tail()})"
            ) from None
        booted = time.monotonic() - started
        await asyncio.sleep(1.0)  # let the panel's last paint land before the picture
        await sandbox.channel.quiesce()
        await sandbox.vm.save(work / "state")
        await sandbox.stop()
        sandbox = None
        snapshots.write_meta(work, shape, shared_memory=True, cold_boot_s=round(booted, 2))
        await asyncio.to_thread(snapshots.seal, work)
        await asyncio.to_thread(work.rename, final)
        log.info("microVM template %s: drawn in %.1f s, saved", shape.key(), booted)
    finally:
        if sandbox is not None:
            await sandbox.stop()
        await asyncio.to_thread(shutil.rmtree, directory, True)
        await asyncio.to_thread(snapshots.remove, work)
    return snapshots.read_snapshot(final)


async def restore(
    snapshot: Snapshot,
    image: Image,
    desktop_id: str,
    directory: Path,
    accel: Accel,
    rules: EgressRules = BUILT_IN,
) -> MicroVm:
    """A new desktop from a snapshot: its own disk layer and memory, a fresh identity."""
    snapshot.check(image)
    await asyncio.to_thread(_private_dir, directory)
    try:
        await snapshots.overlay(snapshot.disk, directory / "data.qcow2")
        state_fd = os.open(snapshot.state, os.O_RDONLY | os.O_CLOEXEC)
        try:
            machine = Machine(
                image=image,
                memory_mb=snapshot.shape.memory_mb,
                cpus=snapshot.shape.cpus,
                network=snapshot.shape.network,
                data_disk=directory / "data.qcow2",
                memory_file=snapshot.memory if snapshot.shared_memory else directory / "memory",
                shared_memory=False,
                directory=directory,
                accel=accel,
                incoming_fd=state_fd,
            )
            return await MicroVm.launch(desktop_id, directory, machine, snapshot.shape, rules=rules)
        finally:
            os.close(state_fd)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, directory, True)
        raise


PARKED_META = "vm.json"
PARKED_STATE = "state"


@dataclass(frozen=True)
class ParkedVm:
    """A VM `MicroVm.park` kept: its disk layer, and its memory when `state` exists."""

    directory: Path
    shape: Shape
    source: str | None
    """The named snapshot its disk builds on, if any (else its shape's template)."""
    hostname: str
    machine_id: str

    @property
    def with_memory(self) -> bool:
        return (self.directory / PARKED_STATE).is_file()

    @classmethod
    def read(cls, directory: Path) -> ParkedVm:
        try:
            meta = json.loads((directory / PARKED_META).read_text())
            return cls(
                directory,
                Shape(**meta["shape"]),
                meta["source"],
                str(meta["hostname"]),
                str(meta["machine_id"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SandboxStartError(
                f"the parked VM in {directory.name} cannot be read ({exc}): delete the desktop"
            ) from exc


async def unpark(
    parked: ParkedVm, image: Image, desktop_id: str, directory: Path, accel: Accel,
    rules: EgressRules = BUILT_IN,
) -> MicroVm:  # fmt: skip
    """Start a parked VM again, taking its files over: from its saved memory (programs run
    on where they stopped), or a cold boot on its disk (`MicroVm.draw_timeout_s`)."""
    if parked.shape.image != image.key:
        raise SandboxStartError(
            f"desktop {desktop_id} was parked by image {parked.shape.image}; this service "
            f"runs image {image.key}, which cannot start it"
        )
    await asyncio.to_thread(_private_dir, directory)
    try:
        await asyncio.to_thread(
            os.replace, parked.directory / "data.qcow2", directory / "data.qcow2"
        )
        state = parked.directory / PARKED_STATE
        state_fd = os.open(state, os.O_RDONLY | os.O_CLOEXEC) if parked.with_memory else None
        identity = replace(
            Identity.fresh(desktop_id, time.time()),
            hostname=parked.hostname,
            machine_id=parked.machine_id,
        )
        try:
            machine = Machine(
                image=image,
                memory_mb=parked.shape.memory_mb,
                cpus=parked.shape.cpus,
                network=parked.shape.network,
                data_disk=directory / "data.qcow2",
                memory_file=directory / "memory",
                shared_memory=False,
                directory=directory,
                accel=accel,
                incoming_fd=state_fd,
            )
            vm = await MicroVm.launch(
                desktop_id, directory, machine, parked.shape, identity=identity, rules=rules,
                ignore_shared=False,
            )  # fmt: skip
        finally:
            if state_fd is not None:
                os.close(state_fd)
    except BaseException:
        # Its disk goes back where it was kept: the desktop stays resumable.
        with contextlib.suppress(OSError):
            os.replace(directory / "data.qcow2", parked.directory / "data.qcow2")
        await asyncio.to_thread(shutil.rmtree, directory, True)
        raise
    if not parked.with_memory:
        vm.draw_timeout_s = COLD_BOOT_TIMEOUT_S
    await asyncio.to_thread(shutil.rmtree, parked.directory, True)
    return vm


async def save_snapshot(
    sandbox: MicroVm, image: Image, root: Path, run_dir: Path, name: str
) -> Snapshot:
    """Save a running desktop as a snapshot named `name`; the desktop goes on after.

    The desktop's RAM is its own (a private mapping), so it travels in the saved stream;
    a second QEMU then loads that stream into a shared memory file and saves its devices
    alone, so that desktops made from the snapshot map its memory as they do a template's
    instead of each loading every page.
    """
    final = root / name
    if final.exists():
        raise snapshots.SnapshotUnusable(f"a snapshot named {name!r} exists: pick another name")
    work = root / f".save-{name}"
    await asyncio.to_thread(snapshots.remove, work)
    await asyncio.to_thread(work.mkdir, parents=True)
    try:
        await sandbox.channel.quiesce()
        sandbox.paused = True
        await sandbox.vm.qmp.execute("stop")
        try:
            # The disk as it is now, while nothing writes to it: a copy of the desktop's
            # own qcow2 layer (its backing file stays the snapshot it came from).
            await asyncio.to_thread(
                shutil.copyfile, sandbox.directory / "data.qcow2", work / "data.qcow2"
            )
            await sandbox.vm.save(work / "stream", resume=True, ignore_shared=False)
        finally:
            with contextlib.suppress(Exception):
                await sandbox.vm.qmp.execute("cont")
            sandbox.paused = False
        await _into_shared_memory(work, sandbox, image, run_dir / f"save-{name}")
        snapshots.write_meta(work, sandbox.shape, shared_memory=True, parent=sandbox.id)
        await asyncio.to_thread(snapshots.seal, work)
        await asyncio.to_thread(work.rename, final)
    finally:
        await asyncio.to_thread(snapshots.remove, work)
    return snapshots.read_snapshot(final)


async def _into_shared_memory(work: Path, sandbox: MicroVm, image: Image, directory: Path) -> None:
    """Load `work/stream` (devices and RAM) into `work/memory`; save devices to `work/state`."""
    await asyncio.to_thread(_private_dir, directory)
    vm = None
    try:
        stream_fd = os.open(work / "stream", os.O_RDONLY | os.O_CLOEXEC)
        try:
            machine = Machine(
                image=image,
                memory_mb=sandbox.shape.memory_mb,
                cpus=sandbox.shape.cpus,
                network=sandbox.shape.network,
                data_disk=work / "data.qcow2",
                memory_file=work / "memory",
                shared_memory=True,
                directory=directory,
                accel=sandbox.vm.machine.accel,
                incoming_fd=stream_fd,
                netdev=DETACHED if sandbox.shape.network else (),
            )
            vm = await Vm.start(machine, run=False, ignore_shared=False)
        finally:
            os.close(stream_fd)
        await vm.save(work / "state")
    finally:
        if vm is not None:
            await vm.stop()
        await asyncio.to_thread(shutil.rmtree, directory, True)
        (work / "stream").unlink(missing_ok=True)
