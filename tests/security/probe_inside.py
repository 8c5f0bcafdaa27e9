"""Attacks run inside a desktop by the escape suite: `python3 probe_inside.py NAME [ARGS]`.

Uploaded into the desktop through the files API and run through exec; each prints one
JSON object saying what the kernel or the filesystem answered. Standard library only: it
runs on the desktop's Python, as the desktop's user, under the desktop's limits.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import socket
import struct
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

SYSCALLS = {  # x86-64 numbers
    "ptrace": 101,
    "init_module": 175,
    "kexec_load": 246,
    "add_key": 248,
    "keyctl": 250,
    "perf_event_open": 298,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "clone3": 435,
    "pidfd_getfd": 438,
}


def _call(name: str, *args) -> str:
    """'ok', or the errno name the call failed with."""
    ctypes.set_errno(0)
    result = libc.syscall(SYSCALLS[name], *args)
    if result >= 0:
        if name in ("userfaultfd", "io_uring_setup", "perf_event_open", "bpf"):
            os.close(result)
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def kernel() -> dict:
    found = {
        "io_uring_setup": _call("io_uring_setup", 8, ctypes.create_string_buffer(120)),
        "add_key": _call("add_key", b"user", b"probe", b"secret", 6, -4),
        "keyctl": _call("keyctl", 0, -4, 0),  # KEYCTL_GET_KEYRING_ID
        "bpf": _call("bpf", 0, ctypes.create_string_buffer(64), 64),
        "perf_event_open": _call("perf_event_open", ctypes.create_string_buffer(128), 0, -1, -1, 0),
        "kexec_load": _call("kexec_load", 0, 0, None, 0),
        "init_module": _call("init_module", None, 0, b""),
        "userfaultfd": _call("userfaultfd", 0),
        "clone3": _call("clone3", None, 0),
        "ptrace_traceme": _call("ptrace", 0, 0, 0, 0),
    }
    for name, flag in (("unshare_user", 0x10000000), ("unshare_net", 0x40000000)):
        ctypes.set_errno(0)
        found[name] = "ok" if libc.unshare(flag) == 0 else errno.errorcode[ctypes.get_errno()]
    ctypes.set_errno(0)
    mounted = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
    found["mount"] = "ok" if mounted == 0 else errno.errorcode[ctypes.get_errno()]
    try:
        import fcntl
        import termios

        fd = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)
        try:
            fcntl.ioctl(fd, termios.TIOCSTI, b"x")
            found["tiocsti"] = "ok"
        except OSError as exc:
            found["tiocsti"] = errno.errorcode[exc.errno]
        finally:
            os.close(fd)
    except OSError as exc:
        found["tiocsti"] = f"no pty: {errno.errorcode.get(exc.errno)}"
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    found["seccomp"] = status["Seccomp"].strip()
    found["no_new_privs"] = status["NoNewPrivs"].strip()
    found["cap_eff"] = status["CapEff"].strip()
    pid = os.fork()  # ordinary programs still work: fork, threads, exec
    if pid == 0:
        os._exit(7)
    found["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return found


def _guest_pid() -> int:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"cubicle.guest" in argv and argv[0].endswith((b"python", b"python3")):
                return int(entry)
    raise SystemExit("no guest daemon found")


def trace_guest() -> dict:
    """Try every way a program of the desktop could reach into its guest daemon."""
    pid = _guest_pid()
    found: dict[str, str] = {"pid": str(pid)}
    found["ptrace_attach"] = _call("ptrace", 16, pid, 0, 0)  # PTRACE_ATTACH
    for name in ("mem", "environ", "fd", "maps"):
        try:
            if name == "fd":
                os.listdir(f"/proc/{pid}/fd")
            else:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    f.read(1)
            found[name] = "ok"
        except OSError as exc:
            found[name] = errno.errorcode[exc.errno]
    try:
        pidfd = os.pidfd_open(pid)
        found["pidfd_getfd"] = _call("pidfd_getfd", pidfd, 3, 0)
    except OSError as exc:
        found["pidfd_getfd"] = errno.errorcode[exc.errno]
    sockets = []
    for root in ("/run", "/tmp", "/var/tmp", os.path.expanduser("~")):
        for directory, _, files in os.walk(root):
            sockets += [os.path.join(directory, f) for f in files if f.endswith(".sock")]
    found["guest_sockets_visible"] = json.dumps([s for s in sockets if "guest" in s])
    return found


def fake_guest(paths: list[str]) -> None:
    """Serve an HTML page with a script on every path given, as a fake guest would."""
    page = b"<html><script>window.pwned = 1; document.title = 'pwned'</script>pwned</html>"
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (
        len(page),
        page,
    )
    servers = []
    for path in paths:
        if os.path.exists(path):
            os.unlink(path)
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        server.listen()
        server.setblocking(False)
        servers.append(server)
    print(json.dumps({"listening": paths}), flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for server in servers:
            try:
                client, _ = server.accept()
            except BlockingIOError:
                continue
            client.recv(65536)
            client.sendall(answer)
            client.close()
        time.sleep(0.05)


def fork(count: int) -> dict:
    """Fork `count` sleeping children; how many the kernel allowed."""
    children, failure = [], None
    for _ in range(count):
        try:
            pid = os.fork()
        except OSError as exc:
            failure = errno.errorcode[exc.errno]
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
    forked = len(children)
    for pid in children:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return {"forked": forked, "failure": failure}


def hold(megabytes: int, seconds: float) -> dict:
    """Allocate and touch `megabytes`, hold them, say so."""
    block = bytearray(megabytes * 1024 * 1024)
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    print(json.dumps({"held": megabytes}), flush=True)
    time.sleep(seconds)
    return {"held": megabytes, "kept": True}


def fill(path: str, megabytes: int) -> dict:
    """Write zeros to `path` until `megabytes` or the first error; on ENOSPC, fill what is
    left block by block, so that the filesystem is full to its last block."""
    written, failure = 0, None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        return {"written_mb": 0, "failure": errno.errorcode[exc.errno]}
    try:
        for _ in range(megabytes):
            os.write(fd, b"\0" * (1024 * 1024))
            written += 1
        os.fsync(fd)
    except OSError as exc:
        failure = errno.errorcode[exc.errno]
        if exc.errno == errno.ENOSPC:
            for _ in range(1 << 16):
                try:
                    os.write(fd, b"\0" * 4096)
                except OSError:
                    break
    finally:
        os.close(fd)
    return {"written_mb": written, "failure": failure}


def connect(targets: list[str]) -> dict:
    """TCP connect to each `host:port` (3 s each): 'connected' or the error."""
    found = {}
    for target in targets:
        host, _, port = target.rpartition(":")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(3)
            try:
                s.connect((host.strip("[]"), int(port)))
                s.sendall(b"hello\n")
                found[target] = "connected"
            except OSError as exc:
                found[target] = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return found


def datagram(targets: list[str]) -> dict:
    found = {}
    for target in targets:
        host, _, port = target.rpartition(":")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.sendto(b"hello\n", (host, int(port)))
                found[target] = "sent"
            except OSError as exc:
                found[target] = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    return found


def main() -> None:
    name, args = sys.argv[1], sys.argv[2:]
    if name == "fake-guest":
        fake_guest(args)
        return
    result = {
        "kernel": lambda: kernel(),
        "trace-guest": lambda: trace_guest(),
        "fork": lambda: fork(int(args[0])),
        "hold": lambda: hold(int(args[0]), float(args[1])),
        "fill": lambda: fill(args[0], int(args[1])),
        "connect": lambda: connect(args),
        "datagram": lambda: datagram(args),
    }[name]()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    struct.calcsize("P")  # a 64-bit interpreter: the numbers above are x86-64's
    main()
