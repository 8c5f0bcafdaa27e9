"""The egress proxy: connections of desktops with host-name rules or secrets pass here.

The egress supervisor of such a desktop hands every TCP connection to port 80 or 443 to
this proxy (`cubicle.server.runtime.egress`), opened by one line: `CUBICLE-EGRESS <token>
<address> <port>`. The token names the desktop (its `Tenant`); the address is where the
desktop wanted to go. Then, per connection, on a thread of its own:

- TLS (the first byte is a handshake record): the ClientHello's server name (SNI) is read
  without taking it off the socket. A desktop without secrets gets the bytes passed through
  untouched, to the address the *proxy* resolves that name to (never the one the desktop
  chose: a forged SNI does not reach another host). A desktop with secrets gets TLS ended
  here with a certificate for that name from its own CA (which it trusts, and no other
  desktop does), and its requests read one by one, as for plain HTTP below; the proxy's own
  connection out verifies the server's certificate against the system's CAs (and the
  operator's `CUBICLE_EGRESS_CA_FILE`), so a value goes only to a server that proves the name.
- Plain HTTP: requests are read one by one (h11), judged by their Host header.

A request to one of a secret's hosts gets the placeholder (`cubicle-secret:<name>`)
replaced by the value in its headers and target, and the secret's header set when it
lacks it; a request carrying a placeholder anywhere else is refused (403) and recorded.
Bodies are passed as they come, not searched. Connections whose name is refused get a
403 (plain HTTP, or TLS ended here) or are closed (TLS passed through).
"""

from __future__ import annotations

import collections
import contextlib
import ipaddress
import logging
import secrets as token_source
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import h11
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from cubicle.protocol.service import DesktopEgress, EgressRefusal, is_cidr
from cubicle.server import certs
from cubicle.server.outbound import hello
from cubicle.server.outbound.secrets import Secret, SecretStore, host_matches
from cubicle.server.runtime.egress import Address, Policy, parse_networks

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 256
"""Connections one desktop may have through the proxy at once."""
_PREAMBLE = b"CUBICLE-EGRESS "
_HANDSHAKE_S = 10.0
_IDLE_S = 300.0
"""A keep-alive connection, or a response, silent this long is closed."""
_CHUNK = 65536


class Refused(Exception):
    """The proxy will not carry this connection or request; the text says why."""


@dataclass
class Tenant:
    """One desktop as the proxy knows it."""

    desktop_id: str
    token: str
    policy: Policy
    rules: DesktopEgress
    secrets: tuple[str, ...]
    hosts: dict[str, str]
    directory: Path
    """Owner-only: the leaf certificates for the names it reached (keys never leave it)."""
    ca_cert: x509.Certificate | None = None
    ca_key: ec.EllipticCurvePrivateKey | None = None
    leaf_key: ec.EllipticCurvePrivateKey | None = None
    refused: collections.deque[EgressRefusal] = field(
        default_factory=lambda: collections.deque(maxlen=100)
    )
    connections: set[socket.socket] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _contexts: dict[str, ssl.SSLContext] = field(default_factory=dict)

    @property
    def trust_pem(self) -> bytes | None:
        """The CA the desktop trusts, when it has secrets (TLS is ended here)."""
        return certs.pem(self.ca_cert) if self.ca_cert is not None else None

    def server_context(self, name: str) -> ssl.SSLContext:
        """TLS towards the desktop for `name`, with a certificate its CA issues once."""
        with self.lock:
            context = self._contexts.get(name)
            if context is not None:
                return context
            assert self.ca_cert is not None and self.ca_key is not None
            cert, key = certs.issue(self.ca_cert, self.ca_key, [name], key=self.leaf_key)
            self.leaf_key = key
            safe = name.replace("/", "_").replace("*", "_")
            cert_path, key_path = self.directory / f"{safe}.pem", self.directory / "leaf-key.pem"
            if not key_path.exists():
                certs.write_private(key_path, certs.key_bytes(key))
            certs.write_private(cert_path, certs.pem(cert))
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(cert_path, key_path)
            context.set_alpn_protocols(["http/1.1"])
            self._contexts[name] = context
            return context

    def refuse(self, host: str, port: int, reason: str) -> Refused:
        self.refused.append(
            EgressRefusal(at=datetime.now(UTC), host=host, port=port, reason=reason)
        )
        log.warning(
            "desktop %s: egress proxy refused %s:%d: %s", self.desktop_id, host, port, reason
        )
        return Refused(reason)

    def named(self, rules: list[str], name: str | None) -> bool:
        return name is not None and any(
            host_matches(rule, name) for rule in rules if not is_cidr(rule)
        )


def policy_for(operator: Policy, rules: DesktopEgress) -> Policy:
    """The operator's policy narrowed by a desktop's CIDR rules."""
    return Policy(
        allow=operator.allow,
        deny=operator.deny,
        desktop_allow=parse_networks(rule for rule in rules.allow if is_cidr(rule)),
        desktop_deny=parse_networks(rule for rule in rules.deny if is_cidr(rule)),
        restricted=bool(rules.allow),
    )


class EgressProxy:
    """The proxy's listener on this host's loopback, and the desktops it serves."""

    def __init__(
        self,
        store: SecretStore,
        operator: Policy,
        directory: Path,
        upstream_ca_file: Path | None = None,
    ) -> None:
        self._store = store
        self._operator = operator
        self._directory = directory
        self._tenants: dict[str, Tenant] = {}
        self._by_id: dict[str, Tenant] = {}
        self._upstream = ssl.create_default_context()
        if upstream_ca_file is not None:
            self._upstream.load_verify_locations(upstream_ca_file)
        self._upstream.set_alpn_protocols(["http/1.1"])
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._closing = False

    @property
    def port(self) -> int:
        if self._listener is None:
            self._start()
        assert self._listener is not None
        return self._listener.getsockname()[1]

    def _start(self) -> None:
        listener = socket.create_server(("127.0.0.1", 0), backlog=256)
        self._listener = listener
        self._acceptor = threading.Thread(target=self._accept, name="egress-proxy", daemon=True)
        self._acceptor.start()

    def close(self) -> None:
        """Stop listening, close every connection, and wait for their threads."""
        self._closing = True
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for tenant in list(self._by_id.values()):
            self.unregister(tenant.desktop_id)
        if self._acceptor is not None:
            self._acceptor.join(5)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(5)

    # --- desktops ------------------------------------------------------------------------

    def register(
        self,
        desktop_id: str,
        rules: DesktopEgress | None,
        secrets: list[str],
        hosts: dict[str, str],
    ) -> Tenant:
        """A desktop's place in the proxy (its CA made when it has secrets)."""
        rules = rules or DesktopEgress()
        directory = self._directory / desktop_id
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        tenant = Tenant(
            desktop_id=desktop_id,
            token=token_source.token_urlsafe(24),
            policy=policy_for(self._operator, rules),
            rules=rules,
            secrets=tuple(secrets),
            hosts=dict(hosts),
            directory=directory,
        )
        if secrets:
            tenant.ca_cert, tenant.ca_key = certs.new_ca(f"Cubicle egress proxy {desktop_id}", 30)
        with self._lock:
            self._tenants[tenant.token] = tenant
            self._by_id[desktop_id] = tenant
        return tenant

    def tenant(self, desktop_id: str) -> Tenant | None:
        return self._by_id.get(desktop_id)

    def update(self, desktop_id: str, rules: DesktopEgress) -> None:
        tenant = self._by_id[desktop_id]
        tenant.rules, tenant.policy = rules, policy_for(self._operator, rules)

    def unregister(self, desktop_id: str) -> None:
        """Forget a desktop and close its connections."""
        with self._lock:
            tenant = self._by_id.pop(desktop_id, None)
            if tenant is not None:
                self._tenants.pop(tenant.token, None)
        if tenant is None:
            return
        with tenant.lock:
            open_now = list(tenant.connections)
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for path in tenant.directory.iterdir():
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            tenant.directory.rmdir()

    # --- connections ---------------------------------------------------------------------

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._closing:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self._threads.add(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        tenant: Tenant | None = None
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # every write goes now
            conn.settimeout(_HANDSHAKE_S)
            tenant, original, port = self._preamble(conn)
            with tenant.lock:
                if len(tenant.connections) >= MAX_CONNECTIONS:
                    raise tenant.refuse(str(original), port, "too many connections at once")
                tenant.connections.add(conn)
            self._carry(tenant, conn, original, port)
        except (Refused, OSError, h11.ProtocolError, ValueError):
            pass
        except Exception:
            log.exception("egress proxy: a connection failed")
        finally:
            if tenant is not None:
                with tenant.lock:
                    tenant.connections.discard(conn)
            conn.close()
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _preamble(self, conn: socket.socket) -> tuple[Tenant, Address, int]:
        line = b""
        while not line.endswith(b"\n"):
            byte = conn.recv(1)
            if not byte or len(line) > 200:
                raise ValueError("no preamble")
            line += byte
        if not line.startswith(_PREAMBLE):
            raise ValueError("not a supervisor")
        token, address, port = line[len(_PREAMBLE) :].decode().split()
        tenant = self._tenants.get(token)
        if tenant is None:
            raise ValueError("unknown token")
        return tenant, ipaddress.ip_address(address), int(port)

    def _carry(self, tenant: Tenant, conn: socket.socket, original: Address, port: int) -> None:
        first = conn.recv(5, socket.MSG_PEEK)
        size = hello.record_length(first) if len(first) == 5 else None
        if size is None:  # plain HTTP (anything else on port 80 or 443 is not carried)
            conn.settimeout(_IDLE_S)
            self._http(tenant, conn, None, original, port, tls=False)
            return
        record = _peek(conn, size)
        name = hello.server_name(record)
        if not tenant.secrets:
            address = self._destination(tenant, name, original, port)
            upstream = _open(address, port)
            with upstream:
                _pump(conn, upstream)
            return
        name = name or str(original)
        client = tenant.server_context(name).wrap_socket(conn, server_side=True)
        client.settimeout(_IDLE_S)
        with client:
            self._http(tenant, client, name, original, port, tls=True)

    def _destination(
        self, tenant: Tenant, name: str | None, original: Address, port: int
    ) -> Address:
        """Where a connection for `name` (else `original`) goes, or `Refused`."""
        shown = name or str(original)
        if tenant.named(tenant.rules.deny, name):
            raise tenant.refuse(shown, port, f"{name} is denied by the desktop's egress rules")
        by_name = tenant.named(tenant.rules.allow, name)
        if name is None:
            candidates: list[Address] = [original]
        elif name in tenant.hosts:
            candidates = [ipaddress.ip_address(tenant.hosts[name])]
        else:
            try:
                found = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise tenant.refuse(shown, port, f"{name} does not resolve: {exc}") from None
            candidates = [ipaddress.ip_address(item[4][0]) for item in found]
        for address in dict.fromkeys(candidates):
            if by_name and not any(address in net for net in tenant.policy.desktop_deny):
                if tenant.policy.operator_allows(address, port):
                    return address
            elif tenant.policy.allows(address, port):
                return address
        raise tenant.refuse(shown, port, "not allowed by the desktop's egress rules")

    def _http(
        self,
        tenant: Tenant,
        client_sock: socket.socket,
        name: str | None,
        original: Address,
        port: int,
        *,
        tls: bool,
    ) -> None:
        """Carry HTTP/1.1 requests one by one, rewriting what the desktop's secrets ask."""
        client = h11.Connection(h11.SERVER)
        upstream_sock: socket.socket | None = None
        upstream: h11.Connection | None = None
        try:
            while True:
                event = _receive(client, client_sock)
                if not isinstance(event, h11.Request):
                    return
                host = _host_of(event) or name
                try:
                    if name is not None and host != name:
                        raise tenant.refuse(
                            host or "?", port, f"Host {host} on a connection to {name}"
                        )
                    target, headers = self._rewrite(tenant, host or str(original), port, event)
                    if upstream_sock is None:
                        upstream_sock = self._connect(tenant, host, original, port, tls)
                        upstream = h11.Connection(h11.CLIENT)
                except Refused as exc:
                    _answer(client, client_sock, 403, f"refused by Cubicle's egress proxy: {exc}")
                    return
                except (OSError, ssl.SSLError) as exc:
                    _answer(
                        client,
                        client_sock,
                        502,
                        f"Cubicle's egress proxy could not reach {host}: {exc}",
                    )
                    return
                assert upstream is not None
                if client.client_is_waiting_for_100_continue:
                    client_sock.sendall(
                        client.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                    )
                request = h11.Request(method=event.method, target=target, headers=headers)
                upstream_sock.sendall(upstream.send(request) or b"")
                while not isinstance(part := _receive(client, client_sock), h11.EndOfMessage):
                    if not isinstance(part, h11.Data):
                        return
                    upstream_sock.sendall(upstream.send(part) or b"")
                upstream_sock.sendall(upstream.send(part) or b"")
                if self._respond(client, client_sock, upstream, upstream_sock):
                    return
                if client.our_state is not h11.DONE or upstream.our_state is not h11.DONE:
                    return
                if client.their_state is not h11.DONE or upstream.their_state is not h11.DONE:
                    return
                client.start_next_cycle()
                upstream.start_next_cycle()
        finally:
            if upstream_sock is not None:
                upstream_sock.close()

    @staticmethod
    def _respond(
        client: h11.Connection,
        client_sock: socket.socket,
        upstream: h11.Connection,
        upstream_sock: socket.socket,
    ) -> bool:
        """Carry one response back; True when the connection switched protocols (and has
        been pumped to its end) or cannot go on."""
        while True:
            event = _receive(upstream, upstream_sock)
            if isinstance(event, h11.InformationalResponse):
                if event.status_code == 100:
                    continue  # the proxy answered the client's own 100-continue
                client_sock.sendall(client.send(event) or b"")
                if event.status_code == 101:
                    up_rest, client_rest = upstream.trailing_data[0], client.trailing_data[0]
                    if up_rest:
                        client_sock.sendall(up_rest)
                    if client_rest:
                        upstream_sock.sendall(client_rest)
                    _pump(client_sock, upstream_sock)
                    return True
                continue
            if isinstance(event, (h11.Response, h11.Data)):
                client_sock.sendall(client.send(event) or b"")
                continue
            if isinstance(event, h11.EndOfMessage):
                client_sock.sendall(client.send(event) or b"")
                return False
            return True

    def _connect(
        self, tenant: Tenant, host: str | None, original: Address, port: int, tls: bool
    ) -> socket.socket:
        address = self._destination(tenant, host, original, port)
        sock = _open(address, port)
        if tls:
            try:
                sock = self._upstream.wrap_socket(sock, server_hostname=host or str(original))
            except BaseException:
                sock.close()
                raise
        sock.settimeout(_IDLE_S)
        return sock

    def _rewrite(
        self, tenant: Tenant, host: str, port: int, request: h11.Request
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The request's target and headers with the desktop's placeholders replaced for a
        host its secrets go to, and their headers set; `Refused` for a placeholder
        anywhere else."""
        found = [s for name in tenant.secrets if (s := self._store.find(name)) is not None]

        def fill(text: str) -> str:
            for secret in found:
                for mark in (secret.placeholder, secret.placeholder.replace(":", "%3A")):
                    if mark in text:
                        if not secret.sent_to(host):
                            raise tenant.refuse(
                                host,
                                port,
                                f"the placeholder of secret {secret.name!r} "
                                f"goes only to {', '.join(secret.hosts)}",
                            )
                        text = text.replace(mark, secret.value)
            return text

        target = fill(request.target.decode("latin-1")).encode("latin-1")
        headers = []
        for key, value in request.headers.raw_items():  # the client's own spelling
            if key.lower() == b"expect":
                continue  # answered here (100-continue): the body follows at once
            headers.append((key, fill(value.decode("latin-1")).encode("latin-1")))
        present = {key.lower() for key, _ in headers}
        for secret in found:
            if secret.sent_to(host) and secret.header.lower().encode() not in present:
                headers.append((secret.header.encode(), _formatted(secret).encode("latin-1")))
        return target, headers


def _open(address: Address, port: int) -> socket.socket:
    sock = socket.create_connection((str(address), port), timeout=_HANDSHAKE_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _peek(conn: socket.socket, size: int) -> bytes:
    """The first `size` bytes waiting on `conn`, left there (less if they do not come
    within the handshake's time)."""
    deadline = time.monotonic() + _HANDSHAKE_S
    while True:
        data = conn.recv(size, socket.MSG_PEEK)
        if len(data) >= size or not data or time.monotonic() > deadline:
            return data
        time.sleep(0.002)


def _formatted(secret: Secret) -> str:
    return secret.format.replace("{value}", secret.value)


def _host_of(request: h11.Request) -> str | None:
    for key, value in request.headers:
        if key == b"host":
            text = value.decode("latin-1").strip().lower()
            if text.startswith("["):
                return text[1 : text.index("]")] if "]" in text else None
            return text.rsplit(":", 1)[0].rstrip(".") if text else None
    return None


def _receive(conn: h11.Connection, sock: socket.socket) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = sock.recv(_CHUNK)
        except (ssl.SSLZeroReturnError, ConnectionResetError):
            data = b""
        conn.receive_data(data)


def _answer(conn: h11.Connection, sock: socket.socket, status: int, text: str) -> None:
    body = (text + "\n").encode()
    headers = [
        ("content-type", "text/plain; charset=utf-8"),
        ("content-length", str(len(body))),
        ("connection", "close"),
    ]
    with contextlib.suppress(OSError, h11.LocalProtocolError):
        sock.sendall(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
        sock.sendall(conn.send(h11.Data(data=body)) or b"")
        sock.sendall(conn.send(h11.EndOfMessage()) or b"")


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Carry bytes both ways until both ends closed (plain sockets close one way at a
    time; a TLS end closes the pair)."""
    a.settimeout(None)
    b.settimeout(None)
    peers = {a: b, b: a}
    with selectors.DefaultSelector() as selector:
        for sock in peers:
            selector.register(sock, selectors.EVENT_READ)
        while peers:
            ready = [s for s in peers if isinstance(s, ssl.SSLSocket) and s.pending()]
            if not ready:
                ready = [key.fileobj for key, _ in selector.select()]  # type: ignore[misc]
            for source in ready:
                if source not in peers:
                    continue
                target = peers[source]
                try:
                    data = source.recv(_CHUNK)
                except (ssl.SSLZeroReturnError, ConnectionResetError):
                    data = b""
                if data:
                    target.sendall(data)
                    continue
                if isinstance(source, ssl.SSLSocket) or isinstance(target, ssl.SSLSocket):
                    return
                selector.unregister(source)
                del peers[source]
                with contextlib.suppress(OSError):
                    target.shutdown(socket.SHUT_WR)
