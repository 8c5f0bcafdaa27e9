"""A QEMU guest (TCG) that boots Debian's cloud kernel into an initramfs made from this host.

This machine has cgroup v1 controllers only, so the cgroup v2 path is tested on another
kernel: `linux-image-cloud-amd64` (a test package of scripts/bootstrap.sh; Debian 12 boots
it with the unified hierarchy). Nothing is downloaded: the initramfs is built at test time
from this host's files (busybox-static, this Python and the part of its standard library
the payload needs, `cubicle/server/runtime/cgroups.py`, `v2_inside.py`), as a newc cpio that the
kernel unpacks into its root filesystem. QEMU prints the guest's console on stdout; the
init mounts /proc, /sys, /dev and cgroup2, runs the payload, and powers off.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
CGROUPS = HERE.parents[1] / "cubicle" / "server" / "runtime" / "cgroups.py"
PYTHON = Path("/usr/bin/python3.11")
STDLIB = Path("/usr/lib/python3.11")
SKIP = {
    "test", "idlelib", "tkinter", "ensurepip", "lib2to3", "pydoc_data", "distutils",
    "site-packages", "dist-packages", "__pycache__", "turtledemo", "unittest",
    "config-3.11-x86_64-linux-gnu",
}  # fmt: skip

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo V2BOOTED
cd /test && /usr/bin/python3.11 -E -S v2_inside.py
echo V2EXIT $?
poweroff -f
"""


def kernel() -> Path | None:
    """Debian's cloud kernel, if the test packages are installed."""
    found = sorted(Path("/boot").glob("vmlinuz-*-cloud-amd64"))
    return found[-1] if found else None


def missing() -> list[str]:
    needed = ["qemu-system-x86_64", "busybox"]
    gone = [tool for tool in needed if shutil.which(tool) is None]
    if kernel() is None:
        gone.append("/boot/vmlinuz-*-cloud-amd64 (linux-image-cloud-amd64)")
    return gone


class _Cpio:
    """A newc ("070701") cpio archive, written as the kernel's initramfs reader wants it."""

    def __init__(self, path: Path) -> None:
        self._out = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._inode = 1
        self._seen: set[str] = set()

    def _entry(self, name: str, mode: int, data: bytes = b"") -> None:
        if name in self._seen:
            return
        self._seen.add(name)
        encoded = name.encode() + b"\0"
        fields = [self._inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
        header = b"070701" + b"".join(b"%08X" % value for value in fields)
        self._inode += 1
        self._out.write(header + encoded)
        self._out.write(b"\0" * (-(110 + len(encoded)) % 4))
        self._out.write(data)
        self._out.write(b"\0" * (-len(data) % 4))

    def directory(self, name: str) -> None:
        parts = Path(name).parts
        for depth in range(1, len(parts) + 1):
            self._entry("/".join(parts[:depth]), stat.S_IFDIR | 0o755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self.directory(str(Path(name).parent)) if "/" in name else None
        self._entry(name, stat.S_IFREG | mode, data)

    def symlink(self, name: str, target: str) -> None:
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def copy(self, source: Path, name: str | None = None) -> None:
        """A host file (or a symlink, kept as one) at the same path, or at `name`."""
        name = name or str(source).lstrip("/")
        if source.is_symlink():
            self.directory(str(Path(name).parent))
            self.symlink(name, os.readlink(source))
            self.copy(source.resolve())
        else:
            self.file(name, source.read_bytes(), stat.S_IMODE(source.stat().st_mode))

    def close(self) -> None:
        self._entry("TRAILER!!!", 0)
        self._out.close()


def _libraries(binary: Path) -> list[Path]:
    listed = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True)
    found = []
    for line in listed.stdout.splitlines():
        words = line.split()
        path = words[2] if "=>" in words and len(words) > 2 else words[0]
        if path.startswith("/"):
            found.append(Path(path))
    return found


def build_initramfs(path: Path) -> None:
    archive = _Cpio(path)
    for directory in ("bin", "dev", "proc", "sys", "tmp", "test", "usr/bin", "usr/lib"):
        archive.directory(directory)
    archive.file("init", INIT.encode(), 0o755)
    archive.copy(Path(shutil.which("busybox") or "/bin/busybox"), "bin/busybox")
    archive.copy(PYTHON)
    for library in _libraries(PYTHON):  # where the loader looks: the paths ldd names
        archive.copy(library.resolve(), str(library).lstrip("/"))
    for root, dirs, files in os.walk(STDLIB):
        dirs[:] = [d for d in dirs if d not in SKIP]
        for name in files:
            if not name.endswith((".pyc", ".exe")):
                source = Path(root, name)
                archive.file(str(source).lstrip("/"), source.read_bytes())
    archive.file("test/cgroups.py", CGROUPS.read_bytes())
    archive.file("test/v2_inside.py", (HERE / "v2_inside.py").read_bytes())
    archive.close()


def _clock() -> str:
    """Kernel options that spare the guest a TSC calibration TCG cannot do.

    microvm has no timer to measure the TSC against; under TCG on a busy host the
    calibration fails and the kernel crawls on jiffies. The host's rate, when constant, is
    the guest's (TCG passes the host's TSC through)."""
    text = Path("/proc/cpuinfo").read_text()
    flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split()
    mhz = next((ln for ln in text.splitlines() if ln.startswith("cpu MHz")), "")
    if "constant_tsc" not in flags or ":" not in mhz:
        return "tsc=reliable"
    return f"tsc=reliable tsc_early_khz={round(float(mhz.split(':')[1]) * 1000)}"


def boot(initramfs: Path, timeout_s: float) -> str:
    """Boot the guest under TCG; its console output (QEMU ends when the guest powers off)."""
    argv = [
        "qemu-system-x86_64", "-M", "microvm,acpi=on", "-accel", "tcg", "-cpu", "max",
        "-m", "768", "-smp", "2", "-nodefaults", "-no-user-config", "-display", "none",
        "-serial", "stdio", "-no-reboot", "-kernel", str(kernel()), "-initrd", str(initramfs),
        "-append", f"console=ttyS0 rdinit=/init panic=-1 loglevel=3 {_clock()}",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    return done.stdout + done.stderr
