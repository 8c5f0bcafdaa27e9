"""Volumes: named, size-capped file systems that outlive desktops and the service.

A volume is a sparse ext4 image in `<data>/volumes/<name>.img` (its size is its quota:
ENOSPC inside past it, and the host's disk grows at most that much) with a `<name>.json`
beside it. While a desktop uses it, it is mounted on the host at `volumes/mnt/<name>` and
bound into the desktop by its runtime; it is unmounted once no desktop uses it. One
desktop writes a volume at a time, or any number read it, never both (a 409 says who has
it). A writer gets its files as its own (the volume is handed to its user, as a desktop's
disk is); since every desktop is a user of its own, readers read the files as "others":
the first reader's attach makes every file readable to others and every folder enterable
(owner and group bits unchanged).

The files API reaches a volume without a desktop (`/api/volumes/{name}/files`), walking
each path below the volume's root one component at a time without following links, so a
link a desktop left there cannot lead the service out of the volume.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from cubicle.protocol.errors import (
    Conflict,
    CubicleError,
    DiskFull,
    FileNotFound,
    InvalidRequest,
    NotFound,
)
from cubicle.protocol.service import (
    VOLUME_NAME_PATTERN,
    CreateVolume,
    VolumeInfo,
    VolumeMount,
)
from cubicle.server.runtime import disk

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_VOLUME_NAME = re.compile(VOLUME_NAME_PATTERN)


class VolumeNotFound(NotFound):
    code = "volume_not_found"


@dataclass
class _InUse:
    writer: str | None = None
    readers: set[str] = field(default_factory=set)


class Volumes:
    """The service's volumes, and which desktops use them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fuse = os.geteuid() != 0
        self._lock = threading.Lock()
        self._in_use: dict[str, _InUse] = {}

    # --- the volumes ------------------------------------------------------------------------

    def _image(self, name: str) -> Path:
        return self.root / f"{name}.img"

    def create(self, request: CreateVolume) -> VolumeInfo:
        """Make a volume (blocking: mkfs)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o711)  # desktops' users walk to their volumes' mounts (umask 077)
        image, meta = self._image(request.name), self.root / f"{request.name}.json"
        with self._lock:
            if meta.exists():
                raise Conflict(f"a volume named {request.name!r} exists: pick another name")
            disk.make_image(image, request.size_mb)
            document = {"size_mb": request.size_mb, "created_at": datetime.now(UTC).isoformat()}
            meta.write_text(json.dumps(document))
        return self.get(request.name)

    def get(self, name: str) -> VolumeInfo:
        if not _VOLUME_NAME.match(name):  # a name is a file name in `root`: nothing else
            raise VolumeNotFound(f"no volume {name!r}: list them with GET /api/volumes")
        try:
            document = json.loads((self.root / f"{name}.json").read_text())
        except (FileNotFoundError, NotADirectoryError):
            raise VolumeNotFound(f"no volume {name!r}: list them with GET /api/volumes") from None
        use = self._in_use.get(name, _InUse())
        mounted: dict[str, str] = dict.fromkeys(sorted(use.readers), "read-only")
        if use.writer is not None:
            mounted[use.writer] = "read-write"
        return VolumeInfo(
            name=name,
            size_mb=int(document["size_mb"]),
            used_bytes=self._image(name).stat().st_blocks * 512,
            created_at=datetime.fromisoformat(document["created_at"]),
            mounted_in=mounted,  # type: ignore[arg-type]
        )

    def all(self) -> list[VolumeInfo]:
        if not self.root.is_dir():
            return []
        return [self.get(meta.stem) for meta in sorted(self.root.glob("*.json"))]

    def delete(self, name: str) -> None:
        self.get(name)
        with self._lock:
            use = self._in_use.get(name)
            if use is not None and (use.writer or use.readers):
                users = sorted({*use.readers, *([use.writer] if use.writer else [])})
                raise Conflict(f"volume {name!r} is in use by desktops {', '.join(users)}")
            self._unmount(name)
            (self.root / f"{name}.json").unlink(missing_ok=True)
            self._image(name).unlink(missing_ok=True)

    # --- desktops using them --------------------------------------------------------------

    def attach(self, desktop_id: str, mounts: list[tuple[str, VolumeMount]]) -> list[Path]:
        """Mount the volumes a desktop asks for, all or none: their host paths, in order.
        `Conflict` if one is written by another desktop, or read by others and asked for
        writing."""
        for _, mount in mounts:
            self.get(mount.volume)
        with self._lock:
            for _, mount in mounts:
                use = self._in_use.get(mount.volume, _InUse())
                if use.writer is not None:
                    raise Conflict(
                        f"volume {mount.volume!r} is written by desktop {use.writer}: one desktop "
                        "writes a volume at a time (ask for it read-only once it is done)"
                    )
                if not mount.read_only and use.readers:
                    raise Conflict(
                        f"volume {mount.volume!r} is read by desktops "
                        f"{', '.join(sorted(use.readers))}: it is written only when no one reads"
                    )
            paths = []
            try:
                for _, mount in mounts:
                    paths.append(self._mounted(mount.volume))
                    use = self._in_use.setdefault(mount.volume, _InUse())
                    if mount.read_only:
                        if not use.readers:  # each reader is a user of its own
                            _readable_to_all(paths[-1])
                        use.readers.add(desktop_id)
                    else:  # its writer's alone (the runtime hands it to the writer's user)
                        paths[-1].chmod(0o700)
                        use.writer = desktop_id
            except BaseException:
                self._release(desktop_id)
                raise
            return paths

    def detach(self, desktop_id: str) -> None:
        """The desktop ended: its volumes are free again (unmounted once no one uses them)."""
        with self._lock:
            self._release(desktop_id)

    def _release(self, desktop_id: str) -> None:
        for name, use in list(self._in_use.items()):
            use.readers.discard(desktop_id)
            if use.writer == desktop_id:
                use.writer = None
            if use.writer is None and not use.readers:
                del self._in_use[name]
                with contextlib.suppress(OSError):
                    self._unmount(name)

    def _mountpoint(self, name: str) -> Path:
        return self.root / "mnt" / name

    def _mounted(self, name: str) -> Path:
        mountpoint = self._mountpoint(name)
        if not mountpoint.is_mount():
            mountpoint.mkdir(parents=True, exist_ok=True)
            for directory in (self.root, mountpoint.parent):
                directory.chmod(0o711)
            disk.mount_image(self._image(name), mountpoint, fuse=self._fuse)
        return mountpoint

    def _unmount(self, name: str) -> None:
        mountpoint = self._mountpoint(name)
        disk.unmount(mountpoint, fuse=self._fuse)
        with contextlib.suppress(OSError):
            mountpoint.rmdir()

    def close(self) -> None:
        """Unmount every volume (the service stops; its desktops are gone)."""
        with self._lock:
            for name in list(self._in_use):
                with contextlib.suppress(OSError):
                    self._unmount(name)
            self._in_use.clear()

    # --- files, without a desktop -------------------------------------------------------------

    def read(self, name: str, path: str, limit: int) -> bytes:
        """A file of the volume (blocking); refused while a desktop writes it."""
        with self._files(name) as root:
            fd = _open_below(root, path, os.O_RDONLY)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise InvalidRequest(f"{path} is not a file")
                if os.fstat(fd).st_size > limit:
                    raise InvalidRequest(f"{path} is larger than {limit} bytes")
                with os.fdopen(fd, "rb", closefd=False) as file:
                    return file.read()
            finally:
                os.close(fd)

    def write(self, name: str, path: str, data: bytes) -> None:
        """Write a file of the volume, making its folders (blocking)."""
        with self._files(name) as root:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
            try:
                fd = _open_below(root, path, flags, make_dirs=True)
            except OSError as exc:
                raise _disk_error(exc, name) from exc
            try:
                with os.fdopen(fd, "wb", closefd=False) as file:
                    file.write(data)
            except OSError as exc:
                raise _disk_error(exc, name) from exc
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _files(self, name: str) -> Iterator[Path]:
        self.get(name)
        with self._lock:
            use = self._in_use.get(name)
            if use is not None and use.writer is not None:
                raise Conflict(
                    f"volume {name!r} is written by desktop {use.writer}: use its files API"
                )
            busy = use is not None and bool(use.readers)
            root = self._mounted(name)
            try:
                yield root
            finally:
                if not busy:
                    with contextlib.suppress(OSError):
                        self._unmount(name)


def _readable_to_all(root: Path) -> None:
    """Let every user read the volume's files and enter its folders (its readers are one
    user each): the owner's and group's bits stay as they are."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink() or path.name == "lost+found":
            continue
        mode = path.stat().st_mode
        wanted = mode | stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if wanted != mode:
            path.chmod(stat.S_IMODE(wanted))


def _disk_error(exc: OSError, name: str) -> CubicleError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFull(f"volume {name!r} is full")
    return InvalidRequest(f"cannot write there: {exc.strerror}")


def _open_below(root: Path, path: str, flags: int, *, make_dirs: bool = False) -> int:
    """Open `path` (relative to the volume's root, `/` or not) below `root`, each component
    with O_NOFOLLOW: a link anywhere on the way is refused, never followed."""
    parts = [p for p in path.strip("/").split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise InvalidRequest(f"{path!r} is not a file path inside the volume")
    directory = os.open(root, _DIRECTORY)
    try:
        for part in parts[:-1]:
            if make_dirs:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=directory)
            try:
                inner = os.open(
                    part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory
                )
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise FileNotFound(f"no folder {part!r} on the way to {path}") from exc
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise InvalidRequest(f"{path}: a link on the way is not followed") from exc
                raise
            os.close(directory)
            directory = inner
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW, 0o644, dir_fd=directory)
        except FileNotFoundError as exc:
            raise FileNotFound(f"no file {path} in the volume") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InvalidRequest(f"{path} is a link: it is not followed") from exc
            raise
    finally:
        os.close(directory)
