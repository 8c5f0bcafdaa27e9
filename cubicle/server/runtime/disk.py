"""A size-capped filesystem per desktop: its home, /tmp, /var/tmp and runtime directory.

Each desktop gets an ext4 image of `disk_mb` (a sparse file, so the host's disk grows only
by what the desktop writes, and never by more than `disk_mb`). Past that size, writes
inside fail with ENOSPC and the desktop keeps running. The image is mounted on the host
and its directories are bound into the sandbox:

- as root, through a loop device (the kernel's ext4);
- as another user, through `fuse2fs` (FUSE, mounted with the setuid `fusermount3`).

A template image per size is made once (`mkfs.ext4 -d` from the home skeleton) and copied
hole by hole for each desktop, which costs a few milliseconds; mounting one costs tens, so
one spare disk of the default size is kept mounted and handed to the next desktop (the
runtime's directory for it is renamed into place, mount and all).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("cubicle.runtime.disk")

SPARE_DELAY_S = 3.0
"""Seconds after a spare disk was taken before the next one is made."""
LAYOUT = ("home", "tmp", "var-tmp", "run")
"""Top directories of a desktop's disk: bound at its home, /tmp (and /var/tmp), and its
XDG runtime directory."""


class DiskUnavailable(Exception):
    """No way to give a desktop a size-capped disk here; the message says what is missing.
    The runtime keeps it as one of its problems (creates then fail with `SandboxStartError`)."""


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return done.stdout + done.stderr


def mount_image(image: Path, mountpoint: Path, *, fuse: bool, barriers: bool = True) -> None:
    """Mount an ext4 image: through a loop device (root), or fuse2fs (FUSE)."""
    if not fuse:
        options = "loop,nosuid,nodev,noatime" + ("" if barriers else ",nobarrier")
        _run("mount", "-o", options, str(image), str(mountpoint))
        return
    said = _run("fuse2fs", str(image), str(mountpoint), "-o", "nosuid,nodev,noatime")
    if not mountpoint.is_mount():  # fuse2fs may exit 0 when fusermount3 failed
        raise OSError(f"fuse2fs could not mount {image.name}: {said.strip()}")


def unmount(mountpoint: Path, *, fuse: bool) -> None:
    """Unmount, not lazily: every write reaches the image first; OSError if still in use."""
    if mountpoint.is_mount():
        _run(*(["fusermount3", "-u"] if fuse else ["umount"]), str(mountpoint))


def make_image(image: Path, size_mb: int, *, content: Path | None = None) -> None:
    """A sparse ext4 image of `size_mb` (with `content` copied in), owned by this user; made
    beside `image` and renamed into place, so it is whole or absent."""
    partial = image.with_name(f".{image.name}-{uuid.uuid4().hex[:8]}.partial")
    with open(partial, "wb") as file:
        file.truncate(size_mb * 1024 * 1024)
    try:
        _run(
            "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode",
            "-E", f"lazy_itable_init=1,nodiscard,root_owner={os.getuid()}:{os.getgid()}",
            "-L", "cubicle", *(["-d", str(content)] if content is not None else []),
            str(partial),
        )  # fmt: skip
        partial.rename(image)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def chown_tree(root: Path, owner: int) -> None:
    """Make everything below `root` (itself included) the host user `owner`'s."""
    for path in [root, *root.rglob("*")]:
        if path.name != "lost+found":
            os.lchown(path, owner, owner)


def sparse_copy(source: Path, dest: Path) -> None:
    """Copy a sparse file's data extents only, keeping its holes and its size."""
    with open(source, "rb") as src, open(dest, "xb") as dst:
        os.fchmod(dst.fileno(), 0o600)
        size = os.fstat(src.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                start = os.lseek(src.fileno(), offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(src.fileno(), start, os.SEEK_HOLE)
            os.lseek(src.fileno(), start, os.SEEK_SET)
            os.lseek(dst.fileno(), start, os.SEEK_SET)
            left = end - start
            while left > 0:
                copied = os.copy_file_range(src.fileno(), dst.fileno(), left)
                if copied == 0:
                    break
                left -= copied
            offset = end
        os.ftruncate(dst.fileno(), size)


def _mounted_under(directory: Path) -> list[Path]:
    """Mount points at or below `directory`, deepest first (from /proc/self/mountinfo)."""
    prefix = str(directory.resolve())
    found = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: -len(p.parts))


def join(desktops: Path) -> int:
    """Join the runtimes that keep desktops in `desktops` and return the lock that says so
    (held while the runtime lives: close it when the runtime closes).

    Several runtimes may share one directory: on a Ray node each desktop actor is a process
    with a runtime of its own. The first to join, finding no other alive, unmounts what
    runtimes that died left mounted; a later one leaves the mounts alone, since they are its
    neighbours' desktops (lazily unmounting them made their sandboxes fail to start)."""
    fd = os.open(desktops / ".runtimes.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another runtime is alive here: what is mounted is its own
        else:
            sweep(desktops)
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


def sweep(desktops: Path) -> None:
    """Unmount everything mounted under `desktops` (lazily): for a directory no runtime
    uses any more (`join` calls it when it finds no other)."""
    command = ["umount", "-l"] if os.geteuid() == 0 else ["fusermount3", "-u", "-z"]
    for point in _mounted_under(desktops):
        with contextlib.suppress(OSError):
            _run(*command, str(point))


@dataclass
class Disk:
    """One desktop's mounted disk."""

    image: Path
    mountpoint: Path
    size_mb: int
    fuse: bool

    def path(self, name: str) -> Path:
        return self.mountpoint / name

    def allocated_bytes(self) -> int:
        """What the image takes on the host's disk now."""
        try:
            return os.stat(self.image).st_blocks * 512
        except FileNotFoundError:
            return 0

    def detach(self, into: Path) -> None:
        """Unmount the image (not lazily: every write reaches the image first) and move it
        to `into`, to be mounted again later (a desktop paused without memory)."""
        unmount(self.mountpoint, fuse=self.fuse)
        into.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.replace(self.image, into)

    def release(self) -> None:
        """Unmount and delete the image; idempotent, and lazy if something still holds it."""
        if self.mountpoint.is_mount():
            command = ["fusermount3", "-u", "-z"] if self.fuse else ["umount", "-l"]
            with contextlib.suppress(OSError):
                _run(*command, str(self.mountpoint))
        with contextlib.suppress(FileNotFoundError):
            self.image.unlink()


class Disks:
    """Makes desktops' disks on this host: loop-mounted as root, FUSE otherwise."""

    def __init__(
        self, root: Path, skeleton: Path, *, spares_in: Path, spare_mb: int | None = None
    ) -> None:
        self.root = root
        """Where templates live (one per size)."""
        self._skeleton = skeleton
        self.as_root = os.geteuid() == 0
        self._templates: dict[int, Path] = {}
        self._making = threading.Lock()
        """Held while a template is made: two desktops starting at once make it once."""
        self._lock = asyncio.Lock()
        self._spares_in = spares_in
        self._spare_mb = spare_mb
        self._spare: Disk | None = None
        self._refilling: asyncio.Task[None] | None = None
        self._unmount = ["umount", "-l"] if self.as_root else ["fusermount3", "-u", "-z"]
        needed = ["mkfs.ext4", self._unmount[0]] + (["mount"] if self.as_root else ["fuse2fs"])
        self.missing = [tool for tool in needed if shutil.which(tool) is None]
        if not self.as_root and not os.path.exists("/dev/fuse"):
            self.missing.append("/dev/fuse")
        self.kind = "loop-mounted ext4" if self.as_root else "ext4 through fuse2fs"

    def check(self) -> None:
        """Raise `DiskUnavailable` unless this host can make capped disks."""
        if self.missing:
            package = "e2fsprogs, mount" if self.as_root else "fuse2fs and fuse3"
            raise DiskUnavailable(
                f"a size-capped disk per desktop needs {', '.join(self.missing)} "
                f"(Debian: {package}; scripts/bootstrap.sh installs them)"
            )

    def _template(self, size_mb: int) -> Path:
        """The empty disk of `size_mb`, with the home skeleton in it (made once)."""
        with self._making:
            if (made := self._templates.get(size_mb)) is not None and made.exists():
                return made
            made = self._make_template(size_mb)
            self._templates[size_mb] = made
            return made

    def _make_template(self, size_mb: int) -> Path:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        mine = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"  # another service may share the root
        stage = self.root / f"stage-{mine}-{size_mb}"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(mode=0o700)
        shutil.copytree(self._skeleton, stage / "home", symlinks=True)
        for name in LAYOUT[1:]:
            (stage / name).mkdir()
        (stage / "tmp").chmod(0o1777)
        (stage / "var-tmp").chmod(0o1777)
        image = self.root / f"template-{size_mb}.img"
        try:
            make_image(image, size_mb, content=stage)  # whoever renames last: it is whole
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return image

    async def create(
        self, directory: Path, size_mb: int, owner: int | None, source: Path | None = None
    ) -> Disk:
        """Make `directory` (it must not exist) with a desktop's disk mounted in it, handed to
        `owner` (a host uid; None: this process's user): a fresh one, or a copy of the
        image `source` (a snapshot's) of `size_mb`."""
        if source is not None:
            await asyncio.to_thread(directory.mkdir)
            disk = await asyncio.to_thread(self._mount, source, directory, size_mb)
            try:
                await asyncio.to_thread(self._hand_over, disk, owner)
            except BaseException:
                await asyncio.to_thread(disk.release)
                raise
            return disk
        spare, self._spare = self._spare, None
        if spare is not None and spare.size_mb == size_mb:
            await asyncio.to_thread(os.rename, spare.image.parent, directory)
            disk = Disk(directory / "disk.img", directory / "disk", size_mb, spare.fuse)
        else:
            if spare is not None:
                self._spare = spare
            await asyncio.to_thread(directory.mkdir)
            disk = await self._build(directory, size_mb)
        try:
            await asyncio.to_thread(self._hand_over, disk, owner)
        except BaseException:
            await asyncio.to_thread(disk.release)
            raise
        self._refill()
        return disk

    def _refill(self) -> None:
        """Mount the next spare in the background, if there is none and none is coming."""
        if self._spare_mb is None or self._spare is not None or self.missing:
            return
        if self._refilling is None or self._refilling.done():
            self._refilling = asyncio.create_task(self._make_spare(), name="spare-disk")

    async def _make_spare(self) -> None:
        # After the desktop that took the last spare has (most likely) booted: the mount
        # must not compete with its start.
        await asyncio.sleep(SPARE_DELAY_S)
        directory = self._spares_in / f".spare-{uuid.uuid4().hex[:8]}"
        await asyncio.to_thread(directory.mkdir)
        try:
            self._spare = await self._build(directory, self._spare_mb or 0)
        except OSError as exc:
            log.warning("no spare disk: %s", exc)
            await asyncio.to_thread(shutil.rmtree, directory, True)

    async def close(self) -> None:
        """Stop refilling and release the spare; idempotent."""
        task, self._refilling = self._refilling, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        spare, self._spare = self._spare, None
        if spare is not None:
            await asyncio.to_thread(spare.release)
            await asyncio.to_thread(shutil.rmtree, spare.image.parent, True)

    async def _build(self, directory: Path, size_mb: int) -> Disk:
        async with self._lock:
            template = await asyncio.to_thread(self._template, size_mb)
        return await asyncio.to_thread(self._mount, template, directory, size_mb)

    def _mount(self, template: Path, directory: Path, size_mb: int) -> Disk:
        image, mountpoint = directory / "disk.img", directory / "disk"
        sparse_copy(template, image)
        mountpoint.mkdir(mode=0o700)
        disk = Disk(image, mountpoint, size_mb, fuse=not self.as_root)
        try:
            # No write barriers: a desktop's disk ends with it, so an fsync inside need not
            # wait for the host's disk (dconf, fontconfig and browsers fsync a lot).
            mount_image(image, mountpoint, fuse=not self.as_root, barriers=False)
        except BaseException:
            disk.release()
            raise
        return disk

    @staticmethod
    def _hand_over(disk: Disk, owner: int | None) -> None:
        mountpoint = disk.mountpoint
        if owner is not None:
            chown_tree(mountpoint, owner)
        # Only its own user enters a desktop's disk: other desktops' users are others.
        for path in (mountpoint, mountpoint / "home", mountpoint / "run"):
            path.chmod(0o700)
