"""The `microvm` runtime: each desktop in a QEMU microVM with its own kernel.

On first use it builds (or finds) the image, probes once whether KVM works, and makes a
template snapshot for each desktop shape it is asked for (a cold boot until drawn, saved
once). Every desktop then restores from the template of its shape, or from a user's
snapshot by name, with its own copy-on-write disk and memory and a fresh identity.

Limits map onto the VM: `memory_mb` is its RAM, `cpu_cores` its vCPUs (rounded up; two
when unset), `disk_mb` the size of its own disk (home and /tmp; the root filesystem is
the shared read-only image). `network: false` gives the VM no network device at all;
`network: true` a user-mode NIC (passt) under the local runtime's egress policy: the
internet, never this host, its networks or cloud metadata (`cubicle.server.runtime.egress`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import shutil
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

from cubicle.protocol.errors import CapacityReached, Conflict, CubicleError, InvalidRequest
from cubicle.protocol.models import ExecRequest, GuestEvent
from cubicle.protocol.routes import GuestPath
from cubicle.protocol.service import SNAPSHOT_NAME, SnapshotInfo, snapshot_name
from cubicle.server.guest_client import GuestClient, GuestEndpoint
from cubicle.server.runtime.base import Runtime, Sandbox, SandboxSpec, Usage
from cubicle.server.runtime.microvm import snapshot as snapshots
from cubicle.server.runtime.microvm.image import Image, build_image
from cubicle.server.runtime.microvm.qemu import Accel, probe_accel
from cubicle.server.runtime.microvm.sandbox import (
    COLD_BOOT_TIMEOUT_S,
    MicroVm,
    ParkedVm,
    make_template,
    restore,
    save_snapshot,
    unpark,
)
from cubicle.server.runtime.microvm.snapshot import Shape, Snapshot
from cubicle.server.runtime.network import BUILT_IN, EgressRules

log = logging.getLogger("cubicle.runtime.microvm")

DEFAULT_CPUS = 2


class MicroVmSandbox(Sandbox):
    """The manager's view of one microVM desktop."""

    def __init__(self, vm: MicroVm, parked_dir: Path, source: str | None = None) -> None:
        self.id = vm.id
        self.vm = vm
        self.parked_dir = parked_dir
        self.source = source
        """The named snapshot it started from, if any (its disk and memory build on it)."""
        assert vm.identity is not None
        self.endpoint = GuestEndpoint(uds=str(vm.channel.guest_socket), secret=vm.identity.secret)
        self.draw_timeout_s = vm.draw_timeout_s

    async def events(self) -> AsyncIterator[GuestEvent]:
        async for event in self.vm.events():
            yield GuestEvent.model_validate(event)

    async def wait(self) -> str:
        return await self.vm.wait()

    async def stop(self) -> None:
        await self.vm.stop()

    def usage(self) -> Usage | None:
        return self.vm.usage()

    async def pause(self) -> None:
        await self.vm.pause()

    async def resume(self) -> None:
        await self.vm.resume()

    async def park(self, *, keep_memory: bool = False) -> Path:
        """Keep it in `parked/<id>.vm/` (`MicroVm.park`), for `SandboxSpec.disk_image`."""
        into = self.parked_dir / f"{self.id}.vm"
        await asyncio.to_thread(snapshots.remove, into)  # left by a park that failed
        if not keep_memory:
            await self._sync_guest()
        await self.vm.park(into, keep_memory=keep_memory, source=self.source)
        return into

    async def _sync_guest(self) -> None:
        """Have the guest write its page cache to the disk before its VM ends."""
        if self.vm.paused:
            await self.vm.resume()
        client = GuestClient(self.endpoint, timeout_s=120.0)
        try:
            await client.request(
                "POST", GuestPath.EXEC, json=ExecRequest(command=["sync"], timeout_s=110)
            )
        except CubicleError as exc:
            log.warning("desktop %s: sync before parking failed: %s", self.id, exc.message)
        finally:
            await client.close()

    def pids(self) -> list[int]:
        return self.vm.pids()


class MicroVmRuntime(Runtime):
    """Starts desktops in QEMU microVMs restored from snapshots."""

    name = "microvm"
    can_pause = True
    parks_memory = True
    snapshots_memory = True

    def __init__(
        self,
        data_dir: Path,
        *,
        images_dir: Path | None = None,
        max_sandboxes: int = 64,
        hang_s: float = 60.0,
        egress: EgressRules = BUILT_IN,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.images_dir = images_dir or data_dir / "images"
        self.templates_dir = self.images_dir / "templates"
        """Templates belong to their image: services sharing images share them too."""
        self.snapshots_dir = data_dir / "microvm" / "snapshots"
        self.parked_dir = data_dir / "parked"
        """Where paused desktops are kept (`MicroVmSandbox.park`), beside the local ones."""
        self.run_dir = data_dir / "microvm" / "run"
        self.max_sandboxes = max_sandboxes
        self.hang_s = hang_s
        """Seconds a VM may answer no ping before it counts as hung and is killed."""
        self.egress = egress
        """What a VM with a network may reach (`CUBICLE_EGRESS_ALLOW`/`_DENY` on top)."""
        self._progress = progress or (lambda line: log.info("%s", line))
        self._running = 0
        self._image: Image | None = None
        self._accel: Accel | None = None
        self._preparing = asyncio.Lock()
        self._templates: dict[str, asyncio.Lock] = {}
        self._sandboxes: set[MicroVmSandbox] = set()
        if shutil.which("qemu-system-x86_64") is None:
            raise InvalidRequest(
                "the microvm runtime needs QEMU: run `CUBICLE_RUNTIME=microvm scripts/bootstrap.sh`"
            )

    async def prepare(self) -> Image:
        """Build or find the image and choose the accelerator, once."""
        async with self._preparing:
            if self._image is None:
                for path in (self.templates_dir, self.snapshots_dir, self.run_dir):
                    await asyncio.to_thread(path.mkdir, mode=0o700, parents=True, exist_ok=True)
                image = await build_image(self.images_dir, self._progress)
                await asyncio.to_thread(self._forget_templates_of_other_images, image)
                self._accel = await probe_accel(image, self.run_dir / "probe")
                self._image = image
            return self._image

    def _forget_templates_of_other_images(self, image: Image) -> None:
        """Templates of an older image can never be restored again: free their disk."""
        for directory in self.templates_dir.iterdir():
            if directory.name.startswith("."):
                continue
            try:
                stale = snapshots.read_snapshot(directory).shape.image != image.key
            except CubicleError:
                stale = True
            if stale:
                snapshots.remove(directory)

    def shape(self, spec: SandboxSpec, image: Image) -> Shape:
        cpus = math.ceil(spec.cpu_cores) if spec.cpu_cores else DEFAULT_CPUS
        return Shape(
            image=image.key,
            width=spec.width,
            height=spec.height,
            memory_mb=spec.memory_mb,
            cpus=cpus,
            disk_mb=spec.disk_mb,
            network=spec.network,
            max_file_bytes=spec.max_file_bytes,
        )

    async def template(self, shape: Shape) -> Snapshot:
        """The template of this shape, made now (a cold boot) if there is none yet."""
        lock = self._templates.setdefault(shape.key(), asyncio.Lock())
        directory = self.templates_dir / shape.key()
        async with lock:
            if await asyncio.to_thread((directory / "meta.json").is_file):
                return snapshots.read_snapshot(directory)
            async with snapshots.file_lock(self.templates_dir / f".{shape.key()}.lock"):
                if await asyncio.to_thread((directory / "meta.json").is_file):
                    return snapshots.read_snapshot(directory)  # another service made it
                return await self._make_template(shape)

    async def _make_template(self, shape: Shape) -> Snapshot:
        image = await self.prepare()
        assert self._accel is not None
        self._progress(
            f"microVM: first desktop of shape {shape.width}x{shape.height}, "
            f"{shape.memory_mb} MiB, {shape.cpus} vCPU: cold boot to make its template"
        )
        return await make_template(
                image, shape, self.templates_dir, self.run_dir, self._accel,
                timeout_s=COLD_BOOT_TIMEOUT_S, rules=self.egress,
            )  # fmt: skip

    def named_snapshot(self, name: str) -> Snapshot:
        return snapshots.read_snapshot(self.snapshots_dir / snapshot_name(name))

    async def start(self, spec: SandboxSpec) -> Sandbox:
        if self._running >= self.max_sandboxes:
            raise CapacityReached(
                f"all {self.max_sandboxes} microVM slots are in use: kill a desktop first"
            )
        self._running += 1
        try:
            image = await self.prepare()
            assert self._accel is not None
            directory, source_name = self.run_dir / spec.id, spec.snapshot
            if spec.disk_image is not None:
                parked = await asyncio.to_thread(ParkedVm.read, spec.disk_image)
                source_name = parked.source
                vm = await unpark(parked, image, spec.id, directory, self._accel, self.egress)
            else:
                if spec.snapshot is not None:
                    source = await asyncio.to_thread(self.named_snapshot, spec.snapshot)
                else:
                    source = await self.template(self.shape(spec, image))
                vm = await restore(source, image, spec.id, directory, self._accel, self.egress)
        except BaseException:
            self._running -= 1
            raise
        vm.watch(self.hang_s)
        sandbox = MicroVmSandbox(vm, self.parked_dir, source_name)
        self._sandboxes.add(sandbox)

        def release() -> None:
            self._running -= 1
            self._sandboxes.discard(sandbox)

        vm.on_stop(release)
        return sandbox

    async def snapshot(self, sandbox: Sandbox, name: str) -> SnapshotInfo:
        """Save a running desktop as snapshot `name` (it goes on running)."""
        if not isinstance(sandbox, MicroVmSandbox):
            raise Conflict("only microvm desktops can be snapshotted")
        snapshot_name(name)
        image = await self.prepare()
        saved = await save_snapshot(sandbox.vm, image, self.snapshots_dir, self.run_dir, name)
        listed = {info.name: info for info in self.snapshots()}
        return listed.get(saved.name) or SnapshotInfo(name=saved.name, parent=sandbox.id)

    def snapshots(self) -> list[SnapshotInfo]:
        if not self.snapshots_dir.is_dir():
            return []
        found = []
        for directory in sorted(self.snapshots_dir.iterdir()):
            if directory.name.startswith(".") or not (directory / "meta.json").is_file():
                continue
            meta = directory / "meta.json"
            size = sum(f.stat().st_blocks * 512 for f in directory.iterdir() if f.is_file())
            try:
                parent = json.loads(meta.read_text()).get("parent") or ""
            except (OSError, ValueError):
                continue
            created = datetime.fromtimestamp(meta.stat().st_mtime, UTC)
            found.append(
                SnapshotInfo(
                    name=directory.name,
                    parent=str(parent),
                    runtime=self.name,
                    created_at=created,
                    size_bytes=size,
                )
            )
        return found

    async def delete_snapshot(self, name: str) -> bool:
        if not SNAPSHOT_NAME.match(name) or not (self.snapshots_dir / name).is_dir():
            return False
        users = sorted(s.id for s in self._sandboxes if s.source == name)
        users += await asyncio.to_thread(self._parked_on, name)
        if users:
            raise Conflict(
                f"snapshot {name!r} holds the disk and memory of desktops {', '.join(users)}: "
                "delete it once they are gone"
            )
        await asyncio.to_thread(snapshots.remove, self.snapshots_dir / name)
        return True

    def _parked_on(self, name: str) -> list[str]:
        """Parked desktops whose disk builds on snapshot `name`."""
        found = []
        for directory in self.parked_dir.glob("*.vm") if self.parked_dir.is_dir() else []:
            with contextlib.suppress(CubicleError):
                if ParkedVm.read(directory).source == name:
                    found.append(directory.name.removesuffix(".vm"))
        return sorted(found)

    async def close(self) -> None:
        await asyncio.gather(*(s.stop() for s in list(self._sandboxes)))
