"""Named snapshots of local desktops: a copy of a desktop's disk, taken while it is frozen.

A local desktop's state worth keeping lives on its disk (`cubicle.server.runtime.disk`:
home, /tmp, /var/tmp, its runtime directory); its memory cannot be copied into another
desktop. `DiskSnapshots.save` copies the disk image (hole by hole) while the desktop's
cgroup is frozen and after the host flushed the filesystem, so the copy is what a clean
stop would have left; a desktop started from the snapshot gets its own copy of it, handed
to its own user, with what belonged to the processes of the old desktop (X's lock and
sockets, the runtime directory) cleared away. Layout, in the service's data directory:

    snapshots/<name>/disk.img   the disk image
    snapshots/<name>/meta.json  {"parent", "size_mb", "created_at"}
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cubicle.protocol.errors import Conflict, InvalidRequest, NotFound
from cubicle.protocol.service import SnapshotInfo, snapshot_name
from cubicle.server.runtime.disk import Disk, sparse_copy

RUNTIME_LEFTOVERS = (".X11-unix", ".ICE-unix", ".XIM-unix", ".font-unix")
"""Directories of /tmp that hold the old desktop's sockets."""


class LocalSnapshotNotFound(NotFound):
    code = "snapshot_not_found"


@dataclass(frozen=True)
class DiskSnapshot:
    name: str
    directory: Path
    parent: str
    size_mb: int
    created_at: datetime

    @property
    def image(self) -> Path:
        return self.directory / "disk.img"

    def info(self) -> SnapshotInfo:
        size = self.image.stat().st_blocks * 512
        return SnapshotInfo(
            name=self.name,
            parent=self.parent,
            runtime="local",
            created_at=self.created_at,
            size_bytes=size,
            memory=False,
        )


class DiskSnapshots:
    """The named disk snapshots in one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _directory(self, name: str) -> Path:
        return self.root / snapshot_name(name)

    def save(self, name: str, parent: str, disk: Disk) -> DiskSnapshot:
        """Copy `disk` as snapshot `name` (blocking). The caller keeps the desktop frozen
        meanwhile; nothing half-written is left if the copy fails."""
        final = self._directory(name)
        if final.exists():
            raise Conflict(f"a snapshot named {name!r} exists: pick another name")
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        work = self.root / f".save-{name}-{uuid.uuid4().hex[:8]}"
        work.mkdir(mode=0o700)
        try:
            os.sync()  # the desktop's writes, from the host's page cache into its image
            sparse_copy(disk.image, work / "disk.img")
            created = datetime.now(UTC)
            meta = {"parent": parent, "size_mb": disk.size_mb, "created_at": created.isoformat()}
            (work / "meta.json").write_text(json.dumps(meta))
            try:
                work.rename(final)
            except OSError as exc:  # another save of the same name won the race
                raise Conflict(f"a snapshot named {name!r} exists: pick another name") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return self.get(name)

    def get(self, name: str) -> DiskSnapshot:
        directory = self._directory(name)
        try:
            meta = json.loads((directory / "meta.json").read_text())
            return DiskSnapshot(
                name=name,
                directory=directory,
                parent=str(meta["parent"]),
                size_mb=int(meta["size_mb"]),
                created_at=datetime.fromisoformat(meta["created_at"]),
            )
        except FileNotFoundError:
            raise LocalSnapshotNotFound(
                f"no snapshot {name!r}: list them with GET /api/snapshots"
            ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise Conflict(f"snapshot {name!r} has an unreadable meta.json") from exc

    def all(self) -> list[DiskSnapshot]:
        if not self.root.is_dir():
            return []
        found = []
        for directory in sorted(self.root.iterdir()):
            if directory.name.startswith("."):
                continue
            try:
                found.append(self.get(directory.name))
            except (NotFound, Conflict, InvalidRequest):
                continue
        return found

    def remove(self, name: str) -> None:
        snapshot = self.get(name)
        shutil.rmtree(snapshot.directory)


def scrub(disk: Disk) -> None:
    """Clear from a disk copied out of a snapshot what belonged to the old desktop's
    processes: X's lock files and sockets in /tmp, and its runtime directory."""
    tmp = disk.path("tmp")
    for lock in tmp.glob(".X*-lock"):
        lock.unlink(missing_ok=True)
    for name in RUNTIME_LEFTOVERS:
        shutil.rmtree(tmp / name, ignore_errors=True)
    run = disk.path("run")
    for entry in list(run.iterdir()) if run.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
