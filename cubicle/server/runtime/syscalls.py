"""The seccomp filter every process inside a desktop runs under (docs/security.md).

Built once per service with libseccomp (Debian's `python3-seccomp`) and handed to
bubblewrap as a compiled BPF program (`bwrap --seccomp FD`), which loads it just before it
starts the guest daemon, so the daemon and everything it starts inherit it; nothing inside
can remove it. Everything not listed is allowed: the filter takes away the kernel's most
attacked surfaces, which no desktop program needs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from dataclasses import dataclass

NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}
"""Flags of clone() and unshare() that make a new namespace: refused with EPERM."""

TIOCSTI = 0x5412
"""ioctl that pushes characters into a terminal's input (a classic way out of a sandbox)."""
TIOCLINUX = 0x541C

DENIED: dict[str, tuple[str, ...]] = {
    "namespaces and mounts": (
        "setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree",
        "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    ),
    "kernel keyring": ("add_key", "request_key", "keyctl"),
    "BPF and performance counters": ("bpf", "perf_event_open"),
    "kernel images and modules": (
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    ),
    "other processes' memory": (
        "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    ),
    "exploit helpers": ("userfaultfd",),
    "host administration": (
        "acct", "swapon", "swapoff", "reboot", "syslog", "quotactl", "quotactl_fd",
        "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
        "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "uselib", "vhangup",
        "nfsservctl", "_sysctl", "fanotify_init",
    ),
}  # fmt: skip
"""System calls refused with EPERM, by what they would reach."""

UNAVAILABLE = ("io_uring_setup", "io_uring_enter", "io_uring_register", "clone3")
"""System calls that answer ENOSYS, as on a kernel without them: programs fall back (glibc
to clone(), whose namespace flags the filter can read; event loops from io_uring to epoll)."""


@dataclass(frozen=True)
class Filter:
    """A compiled filter: BPF bytes for `bwrap --seccomp`."""

    bpf: bytes

    def pipe(self) -> int:
        """A descriptor to read the program from, for one sandbox (the caller closes it)."""
        read, write = os.pipe()
        try:
            os.write(write, self.bpf)  # a few KiB: fits the pipe's buffer
        finally:
            os.close(write)
        return read


class SeccompUnavailable(Exception):
    """libseccomp's Python binding is missing. The runtime keeps it as one of its problems
    (creates then fail with `SandboxStartError`)."""


def build() -> Filter:
    """Compile the filter for this machine's architecture."""
    try:
        import seccomp
    except ImportError as exc:
        raise SeccompUnavailable(
            "the seccomp filter needs libseccomp's Python binding "
            "(Debian: python3-seccomp; scripts/bootstrap.sh installs it)"
        ) from exc
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for names in DENIED.values():
        for name in names:
            _add(f, deny, name)
    for name in UNAVAILABLE:
        _add(f, seccomp.ERRNO(errno.ENOSYS), name)
    for flag in NAMESPACE_FLAGS.values():
        _add(f, deny, "unshare", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        _add(f, deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    for request in (TIOCSTI, TIOCLINUX):
        _add(f, deny, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return Filter(out.read())


def _add(f, action, name: str, *args) -> None:
    # A name libseccomp cannot resolve is no system call on this architecture: skip it.
    with contextlib.suppress(ValueError, RuntimeError):
        f.add_rule(action, name, *args)


def describe() -> str:
    """The filter in words, for docs/security.md and the service's log."""
    lines = [f"- {what}: {', '.join(names)} (EPERM)" for what, names in DENIED.items()]
    lines.append(f"- {', '.join(UNAVAILABLE)}: ENOSYS")
    lines.append(
        f"- clone and unshare with any namespace flag ({', '.join(NAMESPACE_FLAGS)}): EPERM"
    )
    lines.append("- ioctl TIOCSTI and TIOCLINUX: EPERM")
    return "\n".join(lines)
