"""The command line of one `local` sandbox: what it sees, and the chain that starts it.

    sh (joins the desktop's cgroup) → prlimit → setpriv (its own host user, as root)
       → [unshare --user --net: a network namespace slirp4netns can enter unprivileged]
       → bwrap (namespaces, binds, seccomp, no user namespaces inside) → the guest daemon

Each step execs the next, so the process the runtime started is, in the end, bwrap.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import cubicle
from cubicle.protocol.errors import SandboxStartError
from cubicle.server.runtime import priority

if TYPE_CHECKING:
    from cubicle.server.runtime.base import SandboxSpec

GUEST_UID = 1000
"""The user id a desktop's programs have inside the sandbox."""
GUEST_HOME = "/home/user"
GUEST_RUNTIME_DIR = f"/run/user/{GUEST_UID}"
GUEST_SECRET = "/run/cubicle-secret"
"""Where the guest reads its per-desktop secret, when the runtime gives it one."""
FONT_CACHE = Path("/var/cache/fontconfig")
"""The system's font cache (`fc-cache`), shared read-only with every desktop."""

ETC_ALLOWLIST = (
    "alternatives", "bash.bashrc", "ca-certificates", "chromium", "chromium.d",
    "debian_version", "dbus-1", "environment", "fonts", "gai.conf", "gtk-2.0", "gtk-3.0",
    "host.conf", "inputrc", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
    "matplotlibrc", "mime.types", "nsswitch.conf", "os-release", "pango", "profile",
    "protocols", "python3", "python3.11", "services", "shells", "ssl", "timezone", "vim",
    "X11", "xdg",
)  # fmt: skip
"""What of the host's /etc a desktop may read: configuration of the programs it runs."""

CHROMIUM_CONF = """# Written by Cubicle's local runtime (cubicle/server/runtime/bwrap.py).
# Chromium's own sandbox needs user namespaces, which a desktop may not create
# (docs/security.md): the desktop's sandbox is the boundary. The wrapper ignores the
# environment's CHROMIUM_FLAGS; the guest's own flags come in CUBICLE_CHROMIUM_FLAGS.
export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-sandbox --test-type ${CUBICLE_CHROMIUM_FLAGS:-}"
"""
"""Debian's chromium wrapper sources /etc/chromium.d/*: the desktop's copy adds this."""

CODE_ROOT = Path(cubicle.__file__).resolve().parent.parent
RUN_TMPFS_BYTES = 16 * 1024 * 1024
"""/run inside a desktop (its runtime directory lives on the desktop's disk)."""


def sandbox_etc(data_dir: Path) -> dict[str, Path]:
    """Directories of /etc a desktop sees in a version of the runtime's own (made once):
    Debian's /etc/chromium.d, and the runtime's line in it."""
    chromium = data_dir / "sandbox-etc" / "chromium.d"
    chromium.mkdir(parents=True, exist_ok=True)
    for path in (chromium.parent, chromium):
        path.chmod(0o755)  # the service's umask is 077; every desktop's user reads these
    host = Path("/etc/chromium.d")
    files = {
        source.name: source.read_bytes()
        for source in (sorted(host.iterdir()) if host.is_dir() else [])
        if source.is_file()
    }
    files["zz-cubicle"] = CHROMIUM_CONF.encode()
    for name, content in files.items():
        # Replaced whole: runtimes sharing the directory (a Ray node's desktop actors)
        # rewrite it while their neighbours' browsers read it.
        staged = chromium / f".{name}.{os.getpid()}"
        staged.write_bytes(content)
        staged.chmod(0o644)
        os.replace(staged, chromium / name)
    return {"chromium.d": chromium}


def merged_usr_links() -> list[str]:
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    return args


def python_paths() -> list[Path]:
    """What the guest needs bound to run this interpreter and import `cubicle.guest`."""
    paths = [Path(p) for p in {sys.prefix, sys.base_prefix} if not p.startswith("/usr")]
    if not str(CODE_ROOT).startswith((sys.prefix, "/usr")):
        paths.append(CODE_ROOT / "cubicle")
    return paths


def _unreachable(path: Path, uid: int) -> Path | None:
    """The first directory on the way to `path` that user `uid` cannot enter, if any."""
    for parent in [*reversed(path.parents), path]:
        info = parent.stat()
        allowed = 0o100 if info.st_uid == uid else 0o001
        if not info.st_mode & allowed:
            return parent
    return None


class Binds:
    """Bind mount arguments for bwrap, checked to be reachable by the sandbox's user."""

    def __init__(self, uid: int | None) -> None:
        self.args: list[str] = []
        self._uid = uid

    def add(self, source: Path, dest: str, *, writable: bool = False) -> None:
        if self._uid is not None and (blocked := _unreachable(source.parent, self._uid)):
            raise SandboxStartError(
                f"sandbox users cannot enter {blocked} on the way to {source}: "
                "install Cubicle and its data directory under world-traversable paths "
                "(e.g. /opt, /srv, /var/lib) or `chmod o+x` that directory"
            )
        self.args += ["--bind" if writable else "--ro-bind", str(source), dest]


@dataclass(frozen=True)
class Layout:
    """Where a sandbox's writable directories come from."""

    disk: Path | None
    """The desktop's mounted disk (home, tmp, var-tmp, run), or None for plain directories
    and unsized tmpfs (only with the hardening off)."""
    home: Path
    shm_bytes: int
    """Size of /dev/shm (tmpfs, counted in the desktop's memory)."""


def bwrap_argv(
    spec_id: str,
    layout: Layout,
    binds: Binds,
    *,
    network: bool,
    width: int,
    height: int,
    max_file_bytes: int,
    status_fd: int,
    info_fd: int,
    listen_fd: int,
    seccomp_fd: int | None,
    etc: dict[str, Path],
    secret: bool = False,
    env: dict[str, str] | None = None,
    hardened: bool = True,
) -> list[str]:
    """bwrap's arguments; `hardened=False` only to measure what the hardening costs."""
    argv = ["bwrap", "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if not network:
        argv.append("--unshare-net")  # else the namespace `unshare --net` made is kept
    if hardened:
        argv.append("--disable-userns")
    argv += ["--uid", str(GUEST_UID), "--gid", str(GUEST_UID)]
    argv += ["--hostname", f"cubicle-{spec_id}"]
    argv += ["--ro-bind", "/usr", "/usr", *merged_usr_links()]
    for name in ETC_ALLOWLIST:
        if name in etc:
            argv += ["--ro-bind", str(etc[name]), f"/etc/{name}"]
        elif Path("/etc", name).exists():
            argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if hardened:
        argv += ["--size", str(layout.shm_bytes), "--tmpfs", "/dev/shm"]
        argv += ["--size", str(RUN_TMPFS_BYTES), "--tmpfs", "/run"]
    else:
        argv += ["--tmpfs", "/run"]
    if layout.disk is not None:
        argv += ["--bind", str(layout.disk / "tmp"), "/tmp"]
        argv += ["--bind", str(layout.disk / "var-tmp"), "/var/tmp"]
        argv += ["--bind", str(layout.disk / "run"), GUEST_RUNTIME_DIR]
    else:
        argv += ["--tmpfs", "/tmp", "--tmpfs", "/var/tmp", "--dir", GUEST_RUNTIME_DIR]
    if FONT_CACHE.is_dir():  # without it, every GTK program scans each font file at start
        argv += ["--ro-bind", str(FONT_CACHE), str(FONT_CACHE)]
    argv += binds.args
    if hardened:  # nothing writable but the disk's directories and the sized tmpfs
        argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--chdir", GUEST_HOME, "--info-fd", str(info_fd)]
    argv += [
        "--",
        sys.executable,
        "-s",  # no user site: nothing the desktop wrote is imported by the daemon
        "-m",
        "cubicle.guest",
        f"--listen=fd:{listen_fd}",  # a listening socket the host made and passed in
        f"--width={width}",
        f"--height={height}",
        f"--home={GUEST_HOME}",
        f"--status-fd={status_fd}",
        f"--max-file-bytes={max_file_bytes}",
    ]
    if secret:
        argv.append(f"--secret-file={GUEST_SECRET}")
    argv += [f"--env={name}={value}" for name, value in (env or {}).items()]
    return argv


def launcher_argv(
    bwrap: list[str],
    *,
    join_cgroup: list[str],
    rlimits: list[str],
    nice: int = 0,
    host_uid: int | None,
    network: bool,
) -> list[str]:
    """The chain that starts bwrap (module docstring); `join_cgroup` may be empty."""
    run_as = []
    if host_uid is not None:
        run_as = ["setpriv", f"--reuid={host_uid}", f"--regid={host_uid}", "--clear-groups", "--"]
    own_net = []
    if network:
        own_net = ["unshare", f"--map-user={GUEST_UID}", f"--map-group={GUEST_UID}", "--net", "--"]
    niced = priority.nice_argv(nice) if nice else []  # a warm pool's spare boots niced
    return [*niced, *join_cgroup, "prlimit", *rlimits, "--", *run_as, *own_net, *bwrap]


TRUST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
"""Debian's bundle of trusted CAs: OpenSSL's, curl's and (by the environment) Python's,
Node's and requests' default."""
EXTRA_CA = "/etc/cubicle-extra-ca.pem"
"""The desktop's extra CA alone, which the guest adds to Chromium's NSS database."""


def desktop_env(spec: SandboxSpec) -> dict[str, str]:
    """The variables the desktop's programs get from its spec: its own, and with an extra
    CA the variables that make Python's, requests' and Node's clients read the bundle."""
    env = dict(spec.env)
    if spec.trust_pem is not None:
        env |= {
            "SSL_CERT_FILE": TRUST_BUNDLE,
            "REQUESTS_CA_BUNDLE": TRUST_BUNDLE,
            "NODE_EXTRA_CA_CERTS": TRUST_BUNDLE,
            "CUBICLE_EXTRA_CA": EXTRA_CA,
        }
    return env


def etc_files(
    directory: Path,
    spec_id: str,
    network: bool,
    hosts: tuple[tuple[str, str], ...] = (),
    trust_pem: bytes | None = None,
) -> dict[str, Path]:
    """The files of /etc the sandbox gets its own copy of (users, host names, DNS, and
    with `trust_pem` the CA bundle with that CA added)."""
    etc = directory / "etc"
    etc.mkdir()
    etc.chmod(0o755)
    files = {
        "passwd": f"user:x:{GUEST_UID}:{GUEST_UID}:Cubicle:{GUEST_HOME}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"user:x:{GUEST_UID}:\nnogroup:x:65534:\n",
        "hostname": f"cubicle-{spec_id}\n",
        "hosts": f"127.0.0.1 localhost cubicle-{spec_id}\n::1 localhost\n"
        + "".join(f"{address} {name}\n" for name, address in hosts),
        "machine-id": os.urandom(16).hex() + "\n",
        "resolv.conf": "nameserver 10.0.2.3\n" if network else "",
    }
    for name, text in files.items():
        (etc / name).write_text(text)
        (etc / name).chmod(0o644)
    made = {f"/etc/{name}": etc / name for name in files}
    if trust_pem is not None:
        bundle = etc / "ca-certificates.crt"
        system = Path(TRUST_BUNDLE)
        bundle.write_bytes((system.read_bytes() if system.is_file() else b"") + trust_pem)
        bundle.chmod(0o644)
        made[TRUST_BUNDLE] = bundle
        alone = etc / "extra-ca.pem"
        alone.write_bytes(trust_pem)
        alone.chmod(0o644)
        made[EXTRA_CA] = alone
    return made


def guest_env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": GUEST_HOME,
        "USER": "user",
        "LANG": "C.UTF-8",
        "XDG_RUNTIME_DIR": GUEST_RUNTIME_DIR,
        "PYTHONPATH": str(CODE_ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
