"""Snapshots of drawn desktops, and desktops restored from them.

A snapshot is a directory:

    memory      the guest's RAM, page for page (a template's memory-backend-file)
                or absent when the RAM travels inside `state` (a user's snapshot)
    state       QEMU's saved device state (the migration stream)
    data.*      the desktop's disk as it was (raw for a template, qcow2 over its parent)
    meta.json   what it was made from: image key, VM shape, screen, parent

A *template* is made once per image and desktop shape (screen, memory, vCPUs, disk,
network): a cold boot until the desktop is drawn, then its state saved. Every new desktop
of that shape restores from it: a qcow2 disk over the template's, the template's memory
file mapped privately (pages shared until written), the saved device state loaded, and a
fresh identity given over the channel. A user's snapshot (`POST .../snapshot`) saves a
running desktop the same way; desktops created from it restore from it alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from cubicle.protocol.errors import Conflict, NotFound, SandboxStartError
from cubicle.server.runtime.microvm.image import HOME, Image

GUEST_UID = 1000


class SnapshotNotFound(NotFound):
    """No snapshot of that name."""

    code = "snapshot_not_found"


class SnapshotUnusable(Conflict):
    """A snapshot made by another image, or missing some of its files (or a name taken)."""

    code = "snapshot_unusable"


@dataclass(frozen=True)
class Shape:
    """Everything a restored VM must share with the VM its snapshot was taken from."""

    image: str
    """Image key."""
    width: int
    height: int
    memory_mb: int
    cpus: int
    disk_mb: int
    network: bool
    max_file_bytes: int

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Snapshot:
    name: str
    directory: Path
    shape: Shape
    shared_memory: bool
    """True when `memory` is a file to map (a template), False when RAM is in `state`."""

    @property
    def memory(self) -> Path:
        return self.directory / "memory"

    @property
    def state(self) -> Path:
        return self.directory / "state"

    @property
    def disk(self) -> Path:
        raw = self.directory / "data.raw"
        return raw if raw.exists() else self.directory / "data.qcow2"

    def check(self, image: Image) -> None:
        """Refuse a snapshot this image cannot restore, saying why."""
        if self.shape.image != image.key:
            raise SnapshotUnusable(
                f"snapshot {self.name!r} was made by image {self.shape.image}, this service "
                f"runs image {image.key}: take a new snapshot of a desktop of this image"
            )
        needed = [self.state, self.disk] + ([self.memory] if self.shared_memory else [])
        if missing := [p.name for p in needed if not p.is_file()]:
            raise SnapshotUnusable(
                f"snapshot {self.name!r} is missing {', '.join(missing)}: delete it and "
                "take it again"
            )


def write_meta(directory: Path, shape: Shape, *, shared_memory: bool, **extra) -> None:
    meta = {"shape": asdict(shape), "shared_memory": shared_memory, "created": time.time()}
    (directory / "meta.json").write_text(json.dumps({**meta, **extra}, indent=2) + "\n")


def read_snapshot(directory: Path) -> Snapshot:
    try:
        meta = json.loads((directory / "meta.json").read_text())
        return Snapshot(
            name=directory.name,
            directory=directory,
            shape=Shape(**meta["shape"]),
            shared_memory=bool(meta["shared_memory"]),
        )
    except FileNotFoundError:
        raise SnapshotNotFound(f"no snapshot {directory.name!r}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise SnapshotUnusable(f"snapshot {directory.name!r} has an unreadable meta.json") from exc


async def run_tool(*argv: str) -> None:
    """Run a short host tool (mkfs, qemu-img); its error output becomes the error."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    if process.returncode != 0:
        raise SandboxStartError(
            f"{argv[0]} failed ({process.returncode}): {err.decode(errors='replace').strip()}"
        )


async def make_data_disk(path: Path, disk_mb: int) -> None:
    """A new ext4 disk with the desktop user's home (from images/home) and a /tmp."""
    with tempfile.TemporaryDirectory(prefix="cubicle-disk-") as stage:
        root = Path(stage)
        await asyncio.to_thread(_stage_disk, root)
        await run_tool(
            "mkfs.ext4", "-q", "-F", "-L", "cubicle-data", "-m", "0",
            "-E", "lazy_itable_init=1,lazy_journal_init=1",
            "-d", str(root), str(path), f"{disk_mb}M",
        )  # fmt: skip


def _stage_disk(root: Path) -> None:
    home, tmp = root / "home", root / "tmp"
    shutil.copytree(HOME, home, symlinks=True)
    tmp.mkdir()
    tmp.chmod(0o1777)
    for path in (home, *home.rglob("*")):
        os.lchown(path, GUEST_UID, GUEST_UID)


async def overlay(backing: Path, target: Path) -> None:
    """A qcow2 disk that reads `backing` and keeps its own writes."""
    backing_format = "raw" if backing.suffix == ".raw" else "qcow2"
    await run_tool(
        "qemu-img", "create", "-q", "-f", "qcow2", "-F", backing_format,
        "-b", str(backing), str(target),
    )  # fmt: skip


def seal(directory: Path) -> None:
    """Make a finished snapshot's files read-only (restores must never write to them) and
    the service's alone (its memory file holds whatever the desktop had in RAM)."""
    for path in directory.iterdir():
        path.chmod(0o400)


@contextlib.asynccontextmanager
async def file_lock(path: Path):
    """Held by one process on this host at a time (the kernel drops it if the holder dies)."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def remove(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        for path in directory.iterdir():
            path.chmod(0o644)
    shutil.rmtree(directory, ignore_errors=True)
