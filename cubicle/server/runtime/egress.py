"""A desktop's way out to the internet: slirp4netns, unprivileged, behind an egress policy.

`python -m cubicle.server.runtime.egress --policy JSON [--uid UID] -- slirp4netns ARGS…` forks
slirp4netns (as `UID` when started as root; the supervisor then becomes `UID` as well)
under a seccomp filter that hands every
`connect`, `sendto`, `sendmsg` and `sendmmsg` it makes to this process (seccomp user
notification), and answers each one: go on, or `EACCES`. The policy refuses the host's own
addresses, loopback, private ranges (RFC 1918, CGNAT, ULA), link-local (cloud metadata),
multicast and reserved blocks, except the host's DNS resolvers on port 53 (slirp forwards
the desktop's DNS there), with the operator's allow and deny lists on top.

A desktop with rules by host name or with secrets has an egress proxy (the service's
`cubicle.server.outbound`): its rules file names the proxy's port and the desktop's token,
and every TCP connection slirp4netns opens to port 80 or 443 is made to the proxy instead.
The supervisor connects to the proxy, writes one line (`CUBICLE-EGRESS <token> <address>
<port>`), and puts that socket in place of slirp's (`SECCOMP_IOCTL_NOTIF_ADDFD`): the proxy
decides by the name the connection carries (TLS SNI, the HTTP Host header). UDP to port 443
(QUIC) is refused then, so browsers fall back to TCP through the proxy.

slirp4netns may not start threads or touch another process's memory (the filter refuses
`clone` with `CLONE_VM`, `clone3`, `ptrace`, `process_vm_*`, io_uring), so the address it
asked for cannot change between the check and the call. If this process dies, the kernel
fails every watched call: the desktop's network closes, it never opens wider.

Standard library only (plus libseccomp's binding in the child): it starts in ~50 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import ipaddress
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass, field

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

BLOCKED = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4",
    "240.0.0.0/4", "::/128", "::1/128", "100::/64", "fc00::/7", "fe80::/10", "fec0::/10",
    "ff00::/8",
)  # fmt: skip
"""Never reached from a desktop unless the operator allows it: this host and its networks
(loopback, RFC 1918, CGNAT, link-local and its metadata services, ULA), multicast and
reserved blocks. IPv4 inside IPv6 (mapped, NAT64) is judged as IPv4."""

_SYSCALLS = {42: "connect", 44: "sendto", 46: "sendmsg", 307: "sendmmsg"}
"""x86-64 numbers of the calls the filter hands over."""
_NOTIF_SIZE, _RESP_FMT = 80, "<QqiI"
_IOCTL_RECV, _IOCTL_SEND, _IOCTL_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
_IOCTL_ADDFD, _ADDFD_SETFD = 0x40182103, 1
_FLAG_CONTINUE = 1
PROXIED_PORTS = (80, 443)
"""TCP ports whose connections go through the egress proxy when the desktop has one."""
_CLONE_VM = 0x00000100
_PR_SET_NO_NEW_PRIVS, _PR_SET_PDEATHSIG = 38, 1


def parse_networks(texts) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(text, strict=False) for text in texts)


def host_addresses() -> set[Address]:
    """Every address of this host's interfaces (from /proc: no subprocess)."""
    found: set[Address] = set()
    try:
        with open("/proc/net/fib_trie") as trie:
            last = None
            for line in trie:
                words = line.split()
                if len(words) >= 2 and words[0] == "|--":
                    last = words[1]
                elif "/32 host LOCAL" in line and last is not None:
                    found.add(ipaddress.ip_address(last))
    except FileNotFoundError:
        pass
    try:
        with open("/proc/net/if_inet6") as inet6:
            for line in inet6:
                found.add(ipaddress.IPv6Address(bytes.fromhex(line.split()[0])))
    except FileNotFoundError:
        pass
    return found


def resolvers(path: str = "/etc/resolv.conf") -> set[Address]:
    found: set[Address] = set()
    try:
        with open(path) as conf:
            for line in conf:
                words = line.split()
                if len(words) >= 2 and words[0] == "nameserver":
                    with contextlib.suppress(ValueError):
                        found.add(ipaddress.ip_address(words[1].split("%")[0]))
    except FileNotFoundError:
        pass
    return found


@dataclass
class Policy:
    """Which destinations a desktop may reach."""

    allow: tuple[Network, ...] = ()
    """The operator's exceptions to the blocked ranges (`CUBICLE_EGRESS_ALLOW`)."""
    deny: tuple[Network, ...] = ()
    """The operator's extra refusals, over everything else (`CUBICLE_EGRESS_DENY`)."""
    blocked: tuple[Network, ...] = field(default_factory=lambda: parse_networks(BLOCKED))
    dns: set[Address] = field(default_factory=resolvers)
    desktop_allow: tuple[Network, ...] = ()
    """The desktop's own allowlist (empty: none): it narrows the policy, never widens it."""
    desktop_deny: tuple[Network, ...] = ()
    """The desktop's own refusals."""
    restricted: bool = False
    """The desktop has an allowlist (maybe of host names only, which the proxy judges):
    what the proxy does not carry must match `desktop_allow`."""
    proxy: tuple[int, str] | None = None
    """The egress proxy's port on this host's loopback and the desktop's token with it."""
    rules_fd: int | None = None
    """The desktop's rules file, which the service rewrites in place (`refresh`)."""
    _rules_raw: bytes | None = None
    _own: set[Address] = field(default_factory=host_addresses)
    _own_at: float = field(default_factory=time.monotonic)

    @classmethod
    def from_json(cls, text: str) -> Policy:
        data = json.loads(text)
        return cls(
            allow=parse_networks(data.get("allow", ())), deny=parse_networks(data.get("deny", ()))
        )

    def refresh(self) -> None:
        """Read the desktop's rules again if the service rewrote them (a few bytes, read
        at every watched call: cheaper than trusting a file's stamp to change)."""
        if self.rules_fd is None:
            return
        raw = os.pread(self.rules_fd, 1 << 16, 0)
        if raw == self._rules_raw:
            return
        try:
            data = json.loads(raw or b"{}")
            allow, deny = (
                parse_networks(data.get("allow", ())),
                parse_networks(data.get("deny", ())),
            )
            proxy = data.get("proxy")
            proxy = (int(proxy["port"]), str(proxy["token"])) if proxy else None
        except (ValueError, KeyError, TypeError):
            return  # caught mid-rewrite: the rules read last stay until it is whole
        self._rules_raw = raw
        self.desktop_allow, self.desktop_deny = allow, deny
        self.restricted = bool(data.get("restricted"))
        self.proxy = proxy

    def own(self) -> set[Address]:
        """This host's addresses, read again every few seconds (they may change)."""
        if time.monotonic() - self._own_at > 5:
            self._own, self._own_at = host_addresses(), time.monotonic()
        return self._own

    def allows(self, address: Address, port: int) -> bool:
        if isinstance(address, ipaddress.IPv6Address):
            embedded = address.ipv4_mapped or (
                ipaddress.IPv4Address(address.packed[-4:])
                if address in ipaddress.IPv6Network("64:ff9b::/96")
                else None
            )
            if embedded is not None:
                return self.allows(embedded, port)
        if not self.operator_allows(address, port):
            return False
        if port == 53 and address in self.dns:
            return True  # the desktop's own rules leave it its name service
        if any(address in net for net in self.desktop_deny):
            return False
        if not (self.restricted or self.desktop_allow):
            return True
        return any(address in net for net in self.desktop_allow)

    def operator_allows(self, address: Address, port: int) -> bool:
        if any(address in net for net in self.deny):
            return False
        if any(address in net for net in self.allow):
            return True
        if port == 53 and address in self.dns:
            return True
        if address in self.own() or address.is_unspecified:
            return False
        return not any(address in net for net in self.blocked)


def parse_sockaddr(data: bytes) -> tuple[int, Address | None, int]:
    """(family, address, port) of a `struct sockaddr`; no address for other families."""
    if len(data) < 2:
        return -1, None, 0
    (family,) = struct.unpack_from("=H", data)
    if family == socket.AF_INET and len(data) >= 8:
        port = struct.unpack_from("!H", data, 2)[0]
        return family, ipaddress.IPv4Address(data[4:8]), port
    if family == socket.AF_INET6 and len(data) >= 24:
        port = struct.unpack_from("!H", data, 2)[0]
        return family, ipaddress.IPv6Address(data[8:24]), port
    return family, None, 0


class Supervisor:
    """Answers the watched calls of one slirp4netns."""

    def __init__(self, listener: int, policy: Policy, log=None) -> None:
        self.listener = listener
        self.policy = policy
        self._memory: dict[int, int] = {}
        self._log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        self.refused = 0

    def _read(self, pid: int, address: int, size: int) -> bytes:
        fd = self._memory.get(pid)
        if fd is None:
            fd = self._memory[pid] = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(fd, size, address)

    def _destinations(self, pid: int, nr: int, args: tuple[int, ...]) -> list[bytes]:
        """The socket addresses a call sends to (none: an already connected socket)."""
        name = _SYSCALLS.get(nr)
        if name == "connect":
            return [self._read(pid, args[1], min(args[2], 128))]
        if name == "sendto":
            return [self._read(pid, args[4], min(args[5], 128))] if args[4] else []
        headers = []
        if name == "sendmsg":
            headers = [self._read(pid, args[1], 16)]
        elif name == "sendmmsg":
            count = min(args[2], 1024)
            block = self._read(pid, args[1], 64 * count)
            headers = [block[i * 64 : i * 64 + 16] for i in range(count)]
        found = []
        for header in headers:
            pointer, length = struct.unpack_from("=QI", header)
            if pointer:
                found.append(self._read(pid, pointer, min(length, 128)))
        return found

    def decide(self, pid: int, nr: int, args: tuple[int, ...]) -> int | socket.socket:
        """0 to let the call go on, the errno it fails with, or (a connection the egress
        proxy carries) the socket to put in place of the caller's."""
        if nr not in _SYSCALLS:
            return errno.EPERM
        self.policy.refresh()
        for raw in self._destinations(pid, nr, args):
            family, address, port = parse_sockaddr(raw)
            if family in (socket.AF_UNSPEC, socket.AF_NETLINK) and address is None:
                continue  # a disconnect, or configuring the desktop's own interface
            if address is not None and self.policy.proxy and port in PROXIED_PORTS:
                if _SYSCALLS[nr] == "connect":  # slirp connects only TCP sockets
                    return self._to_proxy(address, port)
                self.refused += 1  # QUIC would pass the proxy by
                self._log(f"egress: refused UDP to {address}:{port} (the proxy carries TCP)")
                return errno.EACCES
            if address is None or not self.policy.allows(address, port):
                self.refused += 1
                self._log(f"egress: refused {_SYSCALLS[nr]} to {address or family}:{port}")
                return errno.EACCES
        return 0

    def _to_proxy(self, address: Address, port: int) -> int | socket.socket:
        assert self.policy.proxy is not None
        proxy_port, token = self.policy.proxy
        try:
            proxy = socket.create_connection(("127.0.0.1", proxy_port), timeout=2)
            proxy.sendall(f"CUBICLE-EGRESS {token} {address} {port}\n".encode())
        except OSError as exc:
            self._log(f"egress: the egress proxy did not answer ({exc}): refused {address}")
            return errno.ECONNREFUSED
        proxy.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as slirp sets its own
        proxy.setblocking(False)  # slirp's socket was non-blocking
        return proxy

    def handle_one(self) -> None:
        buffer = bytearray(_NOTIF_SIZE)
        try:
            fcntl.ioctl(self.listener, _IOCTL_RECV, buffer, True)
        except InterruptedError:
            return
        except OSError as exc:
            if exc.errno == errno.ENOENT:  # the caller was interrupted meanwhile
                return
            raise
        ident, pid, _flags, nr, _arch, _ip = struct.unpack_from("=QIIiIQ", buffer)
        args = struct.unpack_from("=6Q", buffer, 32)
        try:
            decision = self.decide(pid, nr, args)
        except OSError:
            decision = errno.EACCES  # the caller's memory could not be read: refuse
        try:  # the caller must still be waiting in that very call, or the read meant nothing
            fcntl.ioctl(self.listener, _IOCTL_ID_VALID, struct.pack("=Q", ident))
        except OSError:
            if isinstance(decision, socket.socket):
                decision.close()
            return
        flags, error = _FLAG_CONTINUE, 0
        if isinstance(decision, socket.socket):
            flags, error = 0, self._replace(ident, int(args[0]), decision)
        elif decision:
            flags, error = 0, decision
        answer = struct.pack(_RESP_FMT, ident, 0, -error, flags)
        try:
            fcntl.ioctl(self.listener, _IOCTL_SEND, bytearray(answer), True)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise

    def _replace(self, ident: int, target: int, proxy: socket.socket) -> int:
        """Put `proxy` at the caller's descriptor `target`; its connect then returns 0."""
        request = struct.pack("=QIIII", ident, _ADDFD_SETFD, proxy.fileno(), target, 0)
        try:
            fcntl.ioctl(self.listener, _IOCTL_ADDFD, request)
        except OSError as exc:
            self._log(f"egress: could not hand over the proxy's connection: {exc}")
            return errno.ECONNREFUSED
        finally:
            proxy.close()
        return 0

    def run(self, child: int) -> int:
        """Serve until slirp4netns exits; returns its exit status."""
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        while True:
            for _fd, events in poller.poll(500):
                if events & select.POLLIN:
                    self.handle_one()
                elif events & (select.POLLHUP | select.POLLERR):
                    poller.unregister(self.listener)
            done, status = os.waitpid(child, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)


def _child_filter():
    """The filter slirp4netns runs under (built in the child, after fork)."""
    import seccomp

    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in _SYSCALLS.values():
        f.add_rule(seccomp.NOTIFY, name)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "bpf"):
        f.add_rule(deny, name)
    for name in ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register"):
        f.add_rule(seccomp.ERRNO(errno.ENOSYS), name)
    f.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, _CLONE_VM, _CLONE_VM))
    return f


def _drop_to(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def spawn(argv: list[str], uid: int | None) -> tuple[int, int]:
    """Fork `argv` under the filter; returns its pid and the notification descriptor.

    The child cannot send the descriptor over a socket (sending is what the filter
    watches, and nobody answers yet): it says its number on a pipe, the parent copies it
    with pidfd_getfd, and only then does the child start the command.
    """
    told_r, told_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(told_r)
            os.close(go_w)
            libc = ctypes.CDLL(None, use_errno=True)
            if uid is not None:
                _drop_to(uid)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after: setuid clears it
            libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            f = _child_filter()
            f.load()
            os.write(told_w, str(f.get_notify_fd()).encode())
            os.close(told_w)
            if os.read(go_r, 1) != b"1":
                os._exit(126)
            os.execvp(argv[0], argv)
        except BaseException as exc:
            print(f"egress: could not start {argv[0]}: {exc}", file=sys.stderr, flush=True)
        finally:
            os._exit(127)
    os.close(told_w)
    os.close(go_r)
    try:
        number = os.read(told_r, 32)
        if not number.isdigit():
            os.waitpid(pid, 0)
            raise SystemExit(f"egress: {argv[0]} did not start")
        pidfd = os.pidfd_open(pid)
        try:
            listener = _pidfd_getfd(pidfd, int(number))
        finally:
            os.close(pidfd)
        os.write(go_w, b"1")
    finally:
        os.close(told_r)
        os.close(go_w)
    return pid, listener


def _pidfd_getfd(pidfd: int, target: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(438, pidfd, target, 0)  # pidfd_getfd, x86-64
    if fd < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"pidfd_getfd: {os.strerror(error)}")
    os.set_inheritable(fd, False)
    return fd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cubicle.server.runtime.egress")
    parser.add_argument("--policy", default="{}", help="JSON: {allow: [cidr], deny: [cidr]}")
    parser.add_argument("--uid", type=int, default=None, help="run the command as this user")
    parser.add_argument(
        "--rules-fd", type=int, default=None, help="the desktop's own rules, reread as they change"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    libc = ctypes.CDLL(None)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    policy = Policy.from_json(args.policy)
    if args.rules_fd is not None:
        os.set_inheritable(args.rules_fd, False)  # slirp4netns must not get it
        policy.rules_fd = args.rules_fd
        policy.refresh()
    pid, listener = spawn(command, args.uid)
    if args.uid is not None:  # the supervisor needs no more than slirp's own user either
        _drop_to(args.uid)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # a new user clears it
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    return Supervisor(listener, policy).run(pid)


if __name__ == "__main__":
    sys.exit(main())
