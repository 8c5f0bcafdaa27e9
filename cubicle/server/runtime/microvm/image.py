"""The microVM image: a Debian 12 root filesystem, a kernel and its initrd, built once.

An image is two read-only layers, each built only when its own inputs change:

- the base: `mmdebstrap` over `images/packages.txt` (what every desktop ships) and
  `images/microvm/packages.txt` (what a VM needs beyond that: Debian's cloud kernel and
  its initrd, the init's tools), finished by `images/microvm/setup.sh`, packed into an
  ext4 file; the kernel and initrd beside it. Minutes; rebuilt when a package list changes.
- the guest: this checkout installed by pip (a wheel of the checkout, its dependencies
  from the package index, nothing copied by hand) into an ext4 file that the VM mounts at
  /opt/cubicle. Seconds; rebuilt when the guest's code changes.

Each layer is named by the hash of its inputs and reused while they stay the same; the
image is the pair. Debian packages downloaded by one build are kept for the next.

Layout under the data directory (`images/`):

    base-<key>/rootfs.ext4  vmlinuz  initrd.img  manifest.json
    guest-<key>/guest.ext4  manifest.json
    apt-cache/              .debs kept between builds
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cubicle.protocol.errors import SandboxStartError

CHECKOUT = Path(__file__).resolve().parents[4]
"""The source tree this module belongs to: its packages become the guest's wheel."""
IMAGES = CHECKOUT / "images"
PACKAGES = (IMAGES / "packages.txt", IMAGES / "microvm" / "packages.txt")
INIT = IMAGES / "microvm" / "cubicle-init"
SETUP = IMAGES / "microvm" / "setup.sh"
HOME = IMAGES / "home"
GUEST_SOURCES = ("cubicle/guest", "cubicle/protocol", "cubicle/*.py")
"""The modules the guest runs: a change to one of them makes a new guest layer (the wheel
holds the host's modules too; the VM never runs them)."""
HOST_ONLY = frozenset(
    {
        "openai",
        "anthropic",
        "openai-agents",
        "mcp",
        "rapidocr-onnxruntime",
        "aiortc",
        "pyautogui",
        "pydantic-settings",
    }
)
"""The project's dependencies the guest never imports (the agent, MCP, WebRTC, settings)."""
BUILDER_VERSION = "1"
"""Bumped when this module builds a different image from the same inputs."""
GUEST_UID = 1000
SUITE = "bookworm"

Progress = Callable[[str], None]
_NOISE = ("WARNING: Location",)
"""Output lines of build tools that say nothing about the build (pip's unused indexes)."""


class ImageBuildError(SandboxStartError):
    """The microVM image could not be built; the message says which step and why."""

    code = "image_build_failed"


@dataclass(frozen=True)
class Image:
    """A built image: the files QEMU boots, named by the hash of their inputs."""

    key: str
    """Hash of both layers' keys (hex, 16 characters): what snapshots are tied to."""
    base: Path
    """Directory of the base layer: `rootfs.ext4`, `vmlinuz`, `initrd.img`."""
    guest: Path
    """Directory of the guest layer: `guest.ext4`."""

    @property
    def rootfs(self) -> Path:
        return self.base / "rootfs.ext4"

    @property
    def kernel(self) -> Path:
        return self.base / "vmlinuz"

    @property
    def initrd(self) -> Path:
        return self.base / "initrd.img"

    @property
    def guest_disk(self) -> Path:
        return self.guest / "guest.ext4"


def _package_names() -> list[str]:
    names: list[str] = []
    for path in PACKAGES:
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and line not in names:
                names.append(line)
    return names


def _guest_requirements() -> list[str]:
    """The bare package's dependencies and the `guest` extra's, less the host-only ones, as
    pip requirement strings."""
    import tomllib

    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
    keep = []
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["guest"]]:
        name = requirement.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip()
        if name.lower().replace("_", "-") not in HOST_ONLY:
            keep.append(requirement)
    return keep


def _hash(label: str, files: list[Path]) -> str:
    digest = hashlib.sha256(f"cubicle-{label} {BUILDER_VERSION} {SUITE}\n".encode())
    for path in files:
        digest.update(str(path.relative_to(CHECKOUT)).encode() + b"\0")
        digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _tree(root: Path, pattern: str = "*") -> list[Path]:
    return sorted(
        p
        for p in root.rglob(pattern)
        if (p.is_file() or p.is_symlink()) and "__pycache__" not in p.parts
    )


def base_key() -> str:
    """Hash of the base layer's inputs: package lists, init, setup script."""
    return _hash("base", [*PACKAGES, INIT, SETUP])


def guest_key() -> str:
    """Hash of the guest layer's inputs: the guest's modules, dependencies, home defaults."""
    files = [CHECKOUT / "pyproject.toml", Path(__file__), *_tree(HOME)]
    for source in GUEST_SOURCES:
        folder, _, pattern = source.partition("/*")
        if pattern:
            files += sorted((CHECKOUT / folder).glob("*" + pattern))
        elif (CHECKOUT / folder).is_dir():
            files += _tree(CHECKOUT / folder)
    return _hash("guest", files)


def _image(images_dir: Path, base: str, guest: str) -> Image:
    key = hashlib.sha256(f"{base} {guest}".encode()).hexdigest()[:16]
    return Image(key=key, base=images_dir / f"base-{base}", guest=images_dir / f"guest-{guest}")


def _built(directory: Path) -> bool:
    return (directory / "manifest.json").is_file()


def cached_image(images_dir: Path) -> Image | None:
    """The built image of the current inputs, if both its layers are built."""
    image = _image(images_dir, base_key(), guest_key())
    return image if _built(image.base) and _built(image.guest) else None


_UMASK_022 = ["/bin/sh", "-c", 'umask 022 && exec "$@"', "sh"]
"""Runs a command with umask 022. Not `create_subprocess_exec(umask=...)`: uvloop, the loop
`cubicle serve` runs on, refuses that argument (a microVM desktop asked of a running service
answered 500 on a fresh machine)."""


async def _run(step: str, argv: list[str], progress: Progress, **kwargs) -> None:
    """Run one build step, passing its output on as progress lines. Steps run with umask
    022: what they make is read inside the VM by its user, and the service's own umask
    (077, `cubicle.server.at_rest`) would make every file of the image root's alone."""
    if shutil.which(argv[0]) is None:
        raise ImageBuildError(
            f"image build ({step}): {argv[0]} is not installed: run "
            "`CUBICLE_RUNTIME=microvm scripts/bootstrap.sh`"
        )
    process = await asyncio.create_subprocess_exec(
        *_UMASK_022,
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        **kwargs,
    )
    tail: list[str] = []
    try:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            if line and not line.startswith(_NOISE):
                tail = [*tail[-4:], line]
                progress(f"  {step}: {line}")
        code = await process.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if code != 0:
        raise ImageBuildError(
            f"image build ({step}) exited with status {code}: " + " / ".join(tail[-3:])
        )


def _mirror() -> str:
    """The host's Debian sources when it has them (same mirror, same security updates)."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    return str(sources) if sources.is_file() else SUITE


def _mmdebstrap_argv(rootfs: Path, apt_cache: Path) -> list[str]:
    return [
        "mmdebstrap",
        "--variant=apt",
        "--aptopt=APT::Install-Recommends false",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        "--include=" + ",".join(_package_names()),
        f'--setup-hook=mkdir -p "$1/var/cache/apt/archives" && '
        f'find {apt_cache} -name "*.deb" -exec cp -t "$1/var/cache/apt/archives" {{}} +',
        f'--customize-hook=find "$1/var/cache/apt/archives" -name "*.deb" '
        f"-exec cp -n -t {apt_cache} {{}} +",
        f"--customize-hook=copy-in {INIT} {SETUP} /sbin",
        '--customize-hook=chroot "$1" /sbin/setup.sh && rm "$1/sbin/setup.sh"',
        '--customize-hook=rm -rf "$1/var/cache/apt/archives/"*.deb "$1/var/lib/apt/lists/"*',
        SUITE,
        str(rootfs),
        _mirror(),
    ]


def _copy_boot_files(rootfs: Path, directory: Path) -> None:
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise ImageBuildError("image build: the root filesystem has no kernel or initrd in /boot")
    shutil.copyfile(kernels[-1], directory / "vmlinuz")
    shutil.copyfile(initrds[-1], directory / "initrd.img")


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


@contextlib.contextmanager
def _build_lock(images_dir: Path):
    """One build at a time per data directory (two services may start together)."""
    fd = os.open(images_dir / ".build.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


async def _mkfs(label: str, tree: Path, target: Path, progress: Progress) -> int:
    """Pack `tree` into a new ext4 file with some room to spare; returns its size in MiB."""
    size_mb = int(await asyncio.to_thread(_tree_bytes, tree) * 1.15 / 2**20) + 64
    await _run(
        "mkfs",
        ["mkfs.ext4", "-q", "-F", "-L", label, "-d", str(tree), str(target), f"{size_mb}M"],
        progress,
    )
    return size_mb


def _seal(work: Path, final: Path, manifest: dict) -> None:
    """Write the manifest, make the files read-only and move the layer into place."""
    (work / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for path in work.iterdir():
        path.chmod(0o400)
    work.rename(final)


async def build_image(images_dir: Path, progress: Progress = print) -> Image:
    """The image of the current inputs: each layer reused when built before, else built."""
    await asyncio.to_thread(images_dir.mkdir, parents=True, exist_ok=True)
    base, guest = await asyncio.to_thread(lambda: (base_key(), guest_key()))
    image = _image(images_dir, base, guest)
    if _built(image.base) and _built(image.guest):
        progress(f"microVM image {image.key}: cached")
        return image
    lock = _build_lock(images_dir)
    await asyncio.to_thread(lock.__enter__)
    try:
        if os.geteuid() != 0:
            raise ImageBuildError(
                "building the microVM image takes root (mmdebstrap, chroot): run the "
                "service as root once, or `sudo cubicle image build`"
            )
        started = time.monotonic()
        progress(f"microVM image {image.key}: building what changed (once per change)")
        if not _built(image.base):
            await _build_base(image.base, images_dir, progress)
        if not _built(image.guest):
            await _build_guest(image.guest, progress)
        await asyncio.to_thread(_prune, images_dir, {image.base.name, image.guest.name})
        progress(f"microVM image {image.key}: ready in {time.monotonic() - started:.0f} s")
        return image
    finally:
        lock.__exit__(None, None, None)


def _prune(images_dir: Path, keep: set[str]) -> None:
    """Remove the layers a new build replaced (one images directory serves one checkout)."""
    for directory in images_dir.glob("*-*"):
        if directory.name.startswith(("base-", "guest-")) and directory.name not in keep:
            for path in directory.iterdir():
                path.chmod(0o644)
            shutil.rmtree(directory, ignore_errors=True)


async def _build_base(final: Path, images_dir: Path, progress: Progress) -> None:
    started = time.monotonic()
    scratch = final.with_name(f".build-{final.name}")
    shutil.rmtree(scratch, ignore_errors=True)
    rootfs, work = scratch / "rootfs", scratch / "layer"
    work.mkdir(parents=True)
    apt_cache = images_dir / "apt-cache"
    apt_cache.mkdir(exist_ok=True)
    try:
        progress(f"[base 1/3] Debian {SUITE} root filesystem (mmdebstrap, a few minutes)")
        await _run("mmdebstrap", _mmdebstrap_argv(rootfs, apt_cache), progress)
        progress("[base 2/3] kernel and initrd")
        await asyncio.to_thread(_copy_boot_files, rootfs, work)
        progress("[base 3/3] read-only ext4 root filesystem")
        size_mb = await _mkfs("cubicle-root", rootfs, work / "rootfs.ext4", progress)
        manifest = {
            "layer": "base",
            "suite": SUITE,
            "packages": _package_names(),
            "size_mb": size_mb,
            "build_seconds": round(time.monotonic() - started, 1),
        }
        await asyncio.to_thread(_seal, work, final, manifest)
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)


async def _build_guest(final: Path, progress: Progress) -> None:
    started = time.monotonic()
    scratch = final.with_name(f".build-{final.name}")
    shutil.rmtree(scratch, ignore_errors=True)
    wheels, tree, work = scratch / "wheels", scratch / "tree", scratch / "layer"
    for path in (wheels, tree, work):
        path.mkdir(parents=True)
    tree.chmod(0o755)  # the layer's root: /opt/cubicle in the VM, read by its user
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    try:
        progress("[guest 1/3] a wheel of this checkout")
        await _run(
            "wheel", [*pip, "wheel", "-q", "--no-deps", "-w", str(wheels), str(CHECKOUT)], progress
        )
        progress("[guest 2/3] its dependencies (pip)")
        await _run(
            "pip",
            [*pip, "download", "-q", "--only-binary=:all:", "-d", str(wheels),
             *_guest_requirements()],
            progress,
        )  # fmt: skip
        await _run(
            "pip",
            [*pip, "install", "-q", "--no-index", "--no-deps", "--target", str(tree),
             *map(str, sorted(wheels.glob("*.whl")))],
            progress,
        )  # fmt: skip
        progress("[guest 3/3] read-only ext4 layer")
        size_mb = await _mkfs("cubicle-guest", tree, work / "guest.ext4", progress)
        manifest = {
            "layer": "guest",
            "wheels": sorted(p.name for p in wheels.glob("*.whl")),
            "size_mb": size_mb,
            "build_seconds": round(time.monotonic() - started, 1),
        }
        await asyncio.to_thread(_seal, work, final, manifest)
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, True)
